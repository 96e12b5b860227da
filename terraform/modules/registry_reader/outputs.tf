output "arn" {
  description = "The secret's ARN: the downstream's upstream_registry_secret_arn."
  value       = aws_secretsmanager_secret.reader.arn
}
