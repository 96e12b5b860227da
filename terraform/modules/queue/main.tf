# The release hand-off of one hop (sit -> uat, uat -> prod): the upstream's Airflow announces each new
# champion here, the downstream's Airflow receives it (docs/release.md, "The hand-off as an event").
# Only the upstream's pod role may send, only the downstream's may receive; nothing else, and no
# request without TLS. A message nobody receives in time is kept in the dead-letter queue; the
# downstream's cd4ml_reconcile imports the champion anyway.
resource "aws_sqs_queue" "dead_letter" {
  name                      = "${var.name_prefix}-to-${var.downstream}-champion-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = true
  tags                      = var.tags
}

resource "aws_sqs_queue" "hop" {
  name                       = "${var.name_prefix}-to-${var.downstream}-champion"
  message_retention_seconds  = var.retention_seconds
  max_message_size           = 4096
  visibility_timeout_seconds = 300
  receive_wait_time_seconds  = 20
  sqs_managed_sse_enabled    = true
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dead_letter.arn
    maxReceiveCount     = 5
  })
  tags = var.tags
}

data "aws_iam_policy_document" "hop" {
  statement {
    sid       = "UpstreamSends"
    actions   = ["sqs:SendMessage", "sqs:GetQueueUrl"]
    resources = [aws_sqs_queue.hop.arn]
    principals {
      type        = "AWS"
      identifiers = [var.publisher_role_arn]
    }
  }
  statement {
    sid       = "DownstreamReceives"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"]
    resources = [aws_sqs_queue.hop.arn]
    principals {
      type        = "AWS"
      identifiers = [var.consumer_role_arn]
    }
  }
  statement {
    sid       = "TlsOnly"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.hop.arn]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "hop" {
  queue_url = aws_sqs_queue.hop.id
  policy    = data.aws_iam_policy_document.hop.json
}
