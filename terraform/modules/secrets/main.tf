# Alert channel secrets (values set out of band, never by Terraform) and the role Airflow's and
# the trainer's pods assume (IRSA): read the buckets, the KMS key and this environment's secrets.
# Airflow reads its Connections (cd4ml_slack, cd4ml_pagerduty, cd4ml_smtp) from Secrets Manager
# through the secrets backend, prefix cd4ml/<env>/connections.
locals {
  connections = ["cd4ml_slack", "cd4ml_pagerduty", "cd4ml_smtp"]
  prefix      = "${var.name_prefix}/connections"
}

resource "aws_secretsmanager_secret" "connection" {
  for_each                = toset(local.connections)
  name                    = "${local.prefix}/${each.value}"
  description             = "Airflow Connection ${each.value}: set the value with `aws secretsmanager put-secret-value`"
  recovery_window_in_days = 7
  tags                    = var.tags
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }
    condition {
      test     = "StringLike"
      variable = "${var.oidc_issuer}:sub"
      values   = ["system:serviceaccount:${var.namespace}:*"]
    }
  }
}

data "aws_iam_policy_document" "access" {
  statement {
    sid       = "Buckets"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "s3:GetBucketLocation"]
    resources = flatten([for arn in var.bucket_arns : [arn, "${arn}/*"]])
  }
  statement {
    sid       = "Key"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey", "kms:Encrypt"]
    resources = [var.kms_key_arn]
  }
  statement {
    sid       = "Secrets"
    actions   = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    resources = concat([for s in aws_secretsmanager_secret.connection : s.arn], var.extra_secret_arns)
  }
  dynamic "statement" {
    for_each = length(var.queue_receive_arns) > 0 ? [var.queue_receive_arns] : []
    content {
      sid       = "UpstreamChampionQueue"
      actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"]
      resources = statement.value
    }
  }
  statement {
    sid       = "ListConnections"
    actions   = ["secretsmanager:ListSecrets"]
    resources = ["*"]
  }
}

resource "aws_iam_role" "pods" {
  name               = "${var.name_prefix}-pods"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "pods" {
  name   = "cd4ml-data-and-secrets"
  role   = aws_iam_role.pods.id
  policy = data.aws_iam_policy_document.access.json
}
