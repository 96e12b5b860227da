output "lake_uri" {
  description = "storage.lake_uri for the pipeline (Delta tables)."
  value       = "s3://${aws_s3_bucket.this["lake"].id}/lake"
}

output "artifacts_uri" {
  description = "The MLflow server's --artifacts-destination."
  value       = "s3://${aws_s3_bucket.this["artifacts"].id}"
}

output "bucket_arns" {
  description = "ARNs of both buckets, for IAM policies."
  value       = [for b in aws_s3_bucket.this : b.arn]
}

output "kms_key_arn" {
  description = "The key both buckets are encrypted with."
  value       = aws_kms_key.data.arn
}
