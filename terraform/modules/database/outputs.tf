output "address" {
  description = "Host name of the instance."
  value       = aws_db_instance.this.address
}

output "master_secret_arn" {
  description = "Secrets Manager secret with the administrator's credentials."
  value       = aws_secretsmanager_secret.master.arn
}

output "connection_uris" {
  description = "SQLAlchemy URIs per database (the password comes with them: keep in state and secrets only)."
  sensitive   = true
  value = {
    for db in ["airflow", "mlflow", "mlflow_auth", "optuna"] :
    db => "postgresql+psycopg2://${var.master_username}:${random_password.master.result}@${aws_db_instance.this.address}:${aws_db_instance.this.port}/cd4ml_${db}"
  }
}
