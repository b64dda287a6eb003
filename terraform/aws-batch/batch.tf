# The workers' compute environment (min 0 vCPUs: no instance, no EC2 cost while idle) and job
# queue. cl-worker-manager registers the job definition itself (--job-definition-name).

locals {
  # Batch user data must be MIME multi-part. It mounts the shared work dir (amazon-efs-utils:
  # TLS and IAM authorization) and lets ECS drain Spot instances, so workers get SIGTERM and
  # hand their runs back before the instance goes.
  user_data = <<-EOT
    MIME-Version: 1.0
    Content-Type: multipart/mixed; boundary="==CODALAB=="

    --==CODALAB==
    Content-Type: text/x-shellscript; charset="us-ascii"

    #!/bin/bash
    set -euo pipefail
    echo ECS_ENABLE_SPOT_INSTANCE_DRAINING=true >> /etc/ecs/ecs.config
    yum install -y amazon-efs-utils
    mkdir -p ${var.shared_work_dir}
    echo "${aws_efs_file_system.work.id}:/ ${var.shared_work_dir} efs _netdev,noresvport,tls,iam 0 0" >> /etc/fstab
    for i in $(seq 1 30); do mount ${var.shared_work_dir} && break; sleep 10; done
    mountpoint -q ${var.shared_work_dir}

    --==CODALAB==--
  EOT
}

resource "aws_launch_template" "workers" {
  name_prefix            = "${var.name}-workers-"
  description            = "CodaLab worker instances: shared work dir on EFS, encrypted root volume, IMDSv2"
  update_default_version = true
  user_data              = base64encode(local.user_data)
  tags                   = local.tags

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  # IMDSv2 only, and one hop: containers cannot reach the instance role's credentials.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${var.name}-worker" })
  }
  tag_specifications {
    resource_type = "volume"
    tags          = local.tags
  }
}

resource "aws_batch_compute_environment" "workers" {
  name         = "${var.name}-workers"
  type         = "MANAGED"
  service_role = aws_iam_role.batch_service.arn
  tags         = local.tags

  compute_resources {
    type                = var.compute_type
    allocation_strategy = var.compute_type == "SPOT" ? "SPOT_PRICE_CAPACITY_OPTIMIZED" : "BEST_FIT_PROGRESSIVE"
    bid_percentage      = var.compute_type == "SPOT" ? var.spot_bid_percentage : null
    min_vcpus           = 0
    max_vcpus           = local.max_vcpus
    instance_type       = var.instance_types
    instance_role       = aws_iam_instance_profile.instance.arn
    security_group_ids  = [aws_security_group.workers.id]
    subnets             = var.subnet_ids
    tags                = merge(local.tags, { Name = "${var.name}-worker" })

    ec2_configuration {
      image_type        = var.gpus > 0 ? "ECS_AL2_NVIDIA" : "ECS_AL2"
      image_id_override = var.gpus > 0 ? data.aws_ssm_parameter.gpu_ami[0].insecure_value : null
    }

    launch_template {
      launch_template_id = aws_launch_template.workers.id
      version            = aws_launch_template.workers.latest_version
    }
  }

  lifecycle {
    # Batch moves desired_vcpus itself.
    ignore_changes = [compute_resources[0].desired_vcpus]

    precondition {
      condition     = var.max_workers >= var.min_workers
      error_message = "max_workers (${var.max_workers}) must be >= min_workers (${var.min_workers})."
    }
    precondition {
      condition     = local.max_vcpus >= var.cpus
      error_message = "max_vcpus (${local.max_vcpus}) is below one worker's cpus (${var.cpus}): no worker could ever start."
    }
    precondition {
      condition     = var.gpus == 0 || !contains(var.instance_types, "optimal")
      error_message = "GPU workers need GPU instance types in instance_types (e.g. [\"g5.xlarge\"]); \"optimal\" has none."
    }
    precondition {
      condition     = var.worker_tag != null || !var.worker_tag_exclusive
      error_message = "worker_tag_exclusive needs worker_tag."
    }
  }

  depends_on = [aws_iam_role_policy_attachment.batch_service, aws_efs_mount_target.work]
}

resource "aws_batch_job_queue" "workers" {
  name     = local.job_queue_name
  state    = "ENABLED"
  priority = 1
  tags     = local.tags

  compute_environment_order {
    order               = 1
    compute_environment = aws_batch_compute_environment.workers.arn
  }
}
