output "broker_url" {
  description = "AIRFLOW__CELERY__BROKER_URL (TLS, with the AUTH token)."
  sensitive   = true
  value       = "rediss://:${random_password.auth.result}@${aws_elasticache_replication_group.this.primary_endpoint_address}:6379/0"
}

output "auth_secret_arn" {
  description = "Secrets Manager secret with the AUTH token."
  value       = aws_secretsmanager_secret.auth.arn
}
