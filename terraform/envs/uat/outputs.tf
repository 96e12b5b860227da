output "lake_uri" {
  description = "CD4ML_LAKE_URI of this environment."
  value       = module.storage.lake_uri
}

output "mlflow_tracking_uri" {
  description = "MLFLOW_TRACKING_URI inside the cluster."
  value       = module.airflow.mlflow_tracking_uri
}

output "cluster_name" {
  description = "aws eks update-kubeconfig --name <this>."
  value       = module.cluster.name
}

output "connections_prefix" {
  description = "Where Airflow Connections live in Secrets Manager."
  value       = module.secrets.connections_prefix
}
