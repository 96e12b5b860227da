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

output "hop_queue_url" {
  description = "The queue this environment announces its champion on: the downstream's upstream_queue_url (null for prod)."
  value       = one(module.hop_queue[*].url)
}

output "hop_queue_arn" {
  description = "The downstream's upstream_queue_arn (null for prod)."
  value       = one(module.hop_queue[*].arn)
}

output "upstream_queue_url" {
  description = "The queue this environment's Airflow receives the upstream's champion from (null for sit)."
  value       = var.upstream_queue_url
}

output "registry_reader_secret_arn" {
  description = "The downstream's upstream_registry_secret_arn: this environment's read-only registry account (null for prod)."
  value       = one(module.registry_reader[*].arn)
}
