output "pod_role_arn" {
  description = "IAM role for the Airflow and trainer service accounts."
  value       = aws_iam_role.pods.arn
}

output "connections_prefix" {
  description = "connections_prefix of Airflow's Secrets Manager backend."
  value       = local.prefix
}
