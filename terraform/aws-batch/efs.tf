# The shared work dir: an encrypted EFS file system mounted by every worker instance at
# var.shared_work_dir (the manager's --worker-work-dir-prefix), over TLS with IAM authorization,
# through one access point: no client is root on the file system.

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

# The one way in. Every NFS call through it acts as the work dir's dedicated owner
# (var.shared_work_dir_uid:gid), whoever makes it: the worker (root in its container), the Docker
# daemon and the runs alike. Root squash and more: no client is root on the file system, and
# the instances see local.efs_root_directory as the file system's root.
resource "aws_efs_access_point" "work" {
  file_system_id = aws_efs_file_system.work.id
  tags           = merge(local.tags, { Name = "${var.name}-codalab-work" })

  posix_user {
    uid = var.shared_work_dir_uid
    gid = var.shared_work_dir_gid
  }

  root_directory {
    path = local.efs_root_directory
    # Made by EFS at the first mount, owned by the dedicated uid.
    creation_info {
      owner_uid   = var.shared_work_dir_uid
      owner_gid   = var.shared_work_dir_gid
      permissions = "0755"
    }
  }
}

data "aws_iam_policy_document" "efs" {
  # Only the worker instances may mount, over TLS, through the access point, and none as root
  # (no elasticfilesystem:ClientRootAccess: the access point's uid is the owner of everything).
  statement {
    sid       = "WorkerInstancesMountThroughTheAccessPoint"
    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
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
    condition {
      test     = "StringEquals"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [aws_efs_access_point.work.arn]
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
