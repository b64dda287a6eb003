# The shared work dir: an encrypted EFS file system mounted by every worker instance at
# var.shared_work_dir (the manager's --worker-work-dir-prefix), over TLS with IAM authorization.

resource "aws_efs_file_system" "work" {
  #checkov:skip=CKV2_AWS_18:Scratch space (dependency cache, run directories) that the workers rebuild from the CodaLab server; backing it up would only add cost.
  creation_token   = "${var.name}-codalab-work"
  encrypted        = true
  kms_key_id       = aws_kms_key.this.arn
  performance_mode = "generalPurpose"
  throughput_mode  = "elastic"
  tags             = merge(local.tags, { Name = "${var.name}-codalab-work" })
}

resource "aws_efs_mount_target" "work" {
  for_each        = toset(var.subnet_ids)
  file_system_id  = aws_efs_file_system.work.id
  subnet_id       = each.value
  security_groups = [aws_security_group.efs.id]
}

data "aws_iam_policy_document" "efs" {
  # Only the worker instances may mount, over TLS (root access: the worker and Docker run as root).
  statement {
    sid       = "WorkerInstancesMount"
    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", "elasticfilesystem:ClientRootAccess"]
    resources = [aws_efs_file_system.work.arn]
    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.instance.arn]
    }
    condition {
      test     = "Bool"
      variable = "elasticfilesystem:AccessedViaMountTarget"
      values   = ["true"]
    }
  }
  statement {
    sid       = "DenyUnencryptedTransport"
    effect    = "Deny"
    actions   = ["*"]
    resources = [aws_efs_file_system.work.arn]
    principals {
      type        = "AWS"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_efs_file_system_policy" "work" {
  file_system_id = aws_efs_file_system.work.id
  policy         = data.aws_iam_policy_document.efs.json
}
