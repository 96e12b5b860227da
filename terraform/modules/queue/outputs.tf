output "url" {
  description = "The hop's queue URL: the downstream's upstream_queue_url."
  value       = aws_sqs_queue.hop.id
}

output "arn" {
  description = "The hop's queue ARN: the downstream's upstream_queue_arn."
  value       = aws_sqs_queue.hop.arn
}
