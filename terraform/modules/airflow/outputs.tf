output "namespace" {
  description = "Where Airflow and MLflow run."
  value       = kubernetes_namespace.this.metadata[0].name
}

output "mlflow_tracking_uri" {
  description = "MLFLOW_TRACKING_URI inside the cluster."
  value       = "http://mlflow.${var.namespace}.svc:5000"
}
