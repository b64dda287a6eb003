# One customer managed key for the password secret, the shared file system and the manager's
# logs (about 1 USD a month).
resource "aws_kms_key" "this" {
  description             = "${var.name}: CodaLab password secret, shared work dir (EFS), manager logs"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
  tags                    = local.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}-codalab"
  target_key_id = aws_kms_key.this.key_id
}

data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_109:A key policy's Resource "*" is this key only; the account root statement is AWS's default key administration, which IAM policies then narrow.
  #checkov:skip=CKV_AWS_111:A key policy's Resource "*" is this key only; CloudWatch Logs may use it only for the manager's log group (encryption context condition).
  #checkov:skip=CKV_AWS_356:A key policy's Resource "*" is this key only.
  # The account administers the key and delegates its use to IAM policies (the roles below get
  # kms:Decrypt only through Secrets Manager).
  statement {
    sid       = "AccountAdministration"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }

  # CloudWatch Logs encrypts the manager's log group, and nothing else, with the key.
  statement {
    sid       = "CloudWatchLogs"
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnEquals"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:${local.manager_log_group}"]
    }
  }
}
