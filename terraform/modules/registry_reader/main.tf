# The read-only account of this environment's MLflow registry, handed to the downstream deployment
# (sit -> uat, uat -> prod) as the Airflow Connection it reads the upstream registry with
# (release.upstream_registry.conn_id, docs/release.md "Import across registries"). The secret is
# named under the downstream's connections prefix, so the downstream's Secrets Manager backend finds
# it as that Connection; only the downstream's pod role may read it, nobody may read it otherwise.
# The account itself can read this registry and write nothing (MLflow's basic-auth permissions,
# created by the cd4ml-mlflow-reader job: tasks/ops/registry_accounts.py).
resource "aws_secretsmanager_secret" "reader" {
  name                    = "cd4ml-${var.downstream}/connections/${var.conn_id}"
  description             = "Airflow Connection ${var.conn_id} of cd4ml-${var.downstream}: ${var.name_prefix}'s read-only registry account"
  recovery_window_in_days = 7
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "reader" {
  secret_id = aws_secretsmanager_secret.reader.id
  secret_string = jsonencode({
    conn_type = "http"
    login     = var.reader_username
    password  = var.reader_password
  })
}

data "aws_iam_policy_document" "reader" {
  statement {
    sid       = "DownstreamReads"
    actions   = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = [var.consumer_role_arn]
    }
  }
  statement {
    sid       = "NobodyElseReads"
    effect    = "Deny"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = ["*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "StringNotEquals"
      variable = "aws:PrincipalArn"
      values   = [var.consumer_role_arn]
    }
  }
}

resource "aws_secretsmanager_secret_policy" "reader" {
  secret_arn = aws_secretsmanager_secret.reader.arn
  policy     = data.aws_iam_policy_document.reader.json
}
