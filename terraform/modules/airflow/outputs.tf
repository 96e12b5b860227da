output "namespace" {
  description = "Where Airflow and MLflow run."
  value       = kubernetes_namespace.this.metadata[0].name
}

output "mlflow_tracking_uri" {
  description = "MLFLOW_TRACKING_URI inside the cluster."
  value       = "http://mlflow.${var.namespace}.svc:5000"
}

output "reader_username" {
  description = "The read-only account of this environment's MLflow server."
  value       = local.reader_username
}

output "reader_password" {
  description = "Its generated password (handed to the downstream through modules/registry_reader)."
  value       = random_password.mlflow_reader.result
  sensitive   = true
}
