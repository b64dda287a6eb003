# The workers' compute environment (min 0 vCPUs: no instance, no EC2 cost while idle) and job
# queue. cl-worker-manager registers the job definition itself (--job-definition-name).

locals {
  # Containers on the instances' Docker bridges: docker0 (Docker's default network) and br-*
  # (the networks cl-worker makes for its runs, <prefix>_ext and <prefix>_int). The worker's own
  # Batch job runs in the host's network namespace (AWS Batch starts EC2 jobs with ECS network
  # mode "host") and is not on a bridge: none of this applies to it, nor to the instance's own
  # EFS mount.
  #
  # Through Docker's DOCKER-USER chain (forwarded traffic): no link-local address (the instance
  # metadata service 169.254.169.254, the ECS agent's credentials and metadata endpoint
  # 169.254.170.2, Amazon Time Sync 169.254.169.123) except Amazon DNS (169.254.169.253) on port
  # 53, and no NFS (2049) anywhere, the shared work dir's mount targets included. Through INPUT
  # (traffic to the instance itself): nothing the host rewrote from a link-local address (the
  # ECS agent DNATs 169.254.170.2:80 to its credentials endpoint on 127.0.0.1:51679), and not
  # the ECS agent's ports 51678-51680 (its introspection API listens on every interface; the
  # agent blocks it on the primary interface only). The rules live in chains of their own,
  # rebuilt at each start: running the script again changes nothing.
  container_firewall = <<-EOT
    #!/bin/bash
    set -euo pipefail
    ipt() { iptables -w 30 "$@"; }
    for chain in CODALAB-FORWARD CODALAB-INPUT; do
      ipt -N "$chain" 2>/dev/null || true
      ipt -F "$chain"
    done

    ipt -A CODALAB-FORWARD -i docker0 -d 169.254.169.254/32 -j DROP
    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.254/32 -j DROP
    ipt -A CODALAB-FORWARD -i docker0 -d 169.254.169.253/32 -p udp --dport 53 -j RETURN
    ipt -A CODALAB-FORWARD -i docker0 -d 169.254.169.253/32 -p tcp --dport 53 -j RETURN
    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.253/32 -p udp --dport 53 -j RETURN
    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.253/32 -p tcp --dport 53 -j RETURN
    ipt -A CODALAB-FORWARD -i docker0 -d 169.254.0.0/16 -j DROP
    ipt -A CODALAB-FORWARD -i br-+ -d 169.254.0.0/16 -j DROP
    ipt -A CODALAB-FORWARD -i docker0 -p tcp --dport 2049 -j DROP
    ipt -A CODALAB-FORWARD -i docker0 -p udp --dport 2049 -j DROP
    ipt -A CODALAB-FORWARD -i br-+ -p tcp --dport 2049 -j DROP
    ipt -A CODALAB-FORWARD -i br-+ -p udp --dport 2049 -j DROP

    ipt -A CODALAB-INPUT -i docker0 -m conntrack --ctorigdst 169.254.0.0/16 -j DROP
    ipt -A CODALAB-INPUT -i br-+ -m conntrack --ctorigdst 169.254.0.0/16 -j DROP
    ipt -A CODALAB-INPUT -i docker0 -p tcp --dport 51678:51680 -j DROP
    ipt -A CODALAB-INPUT -i br-+ -p tcp --dport 51678:51680 -j DROP

    ipt -C DOCKER-USER -j CODALAB-FORWARD 2>/dev/null || ipt -I DOCKER-USER 1 -j CODALAB-FORWARD
    ipt -C INPUT -j CODALAB-INPUT 2>/dev/null || ipt -I INPUT 1 -j CODALAB-INPUT
  EOT

  # Runs the script after every start of Docker (which makes DOCKER-USER), before the ECS agent:
  # no job lands on an instance whose rules are not in place (if the script fails, the agent
  # does not start and the instance takes no job).
  container_firewall_unit = <<-EOT
    [Unit]
    Description=CodaLab: containers on Docker bridges reach no link-local address and no NFS server
    After=docker.service
    Requires=docker.service
    PartOf=docker.service

    [Service]
    Type=oneshot
    RemainAfterExit=yes
    ExecStart=/usr/local/sbin/codalab-container-firewall

    [Install]
    WantedBy=docker.service
  EOT

  # Batch user data must be MIME multi-part. It installs the container firewall above, mounts
  # the shared work dir through the EFS access point (amazon-efs-utils: TLS and IAM
  # authorization) and lets ECS drain Spot instances, so workers get SIGTERM and hand their runs
  # back before the instance goes.
  user_data = <<-EOT
    MIME-Version: 1.0
    Content-Type: multipart/mixed; boundary="==CODALAB=="

    --==CODALAB==
    Content-Type: text/x-shellscript; charset="us-ascii"

    #!/bin/bash
    set -euo pipefail
    cat > /usr/local/sbin/codalab-container-firewall <<'FIREWALL'
    ${local.container_firewall}FIREWALL
    chmod 0755 /usr/local/sbin/codalab-container-firewall
    cat > /etc/systemd/system/codalab-container-firewall.service <<'UNIT'
    ${local.container_firewall_unit}UNIT
    mkdir -p /etc/systemd/system/ecs.service.d
    cat > /etc/systemd/system/ecs.service.d/10-codalab-container-firewall.conf <<'DROPIN'
    [Unit]
    Requires=codalab-container-firewall.service
    After=codalab-container-firewall.service
    DROPIN
    systemctl daemon-reload
    systemctl enable codalab-container-firewall.service
    systemctl start --no-block codalab-container-firewall.service

    echo ECS_ENABLE_SPOT_INSTANCE_DRAINING=true >> /etc/ecs/ecs.config
    yum install -y amazon-efs-utils
    mkdir -p ${var.shared_work_dir}
    echo "${aws_efs_file_system.work.id}:/ ${var.shared_work_dir} efs _netdev,noresvport,tls,iam,accesspoint=${aws_efs_access_point.work.id} 0 0" >> /etc/fstab
    for i in $(seq 1 30); do mount ${var.shared_work_dir} && break; sleep 10; done
    mountpoint -q ${var.shared_work_dir}

    --==CODALAB==--
  EOT
}

resource "aws_launch_template" "workers" {
  name_prefix            = "${var.name}-workers-"
  description            = "CodaLab worker instances: shared work dir on EFS, encrypted root volume, IMDSv2, containers kept from metadata and NFS"
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

  # IMDSv2 only, and one hop: a token's answer does not survive the hop to a container on a
  # Docker bridge, so containers cannot reach the instance role's credentials (and the user
  # data's firewall drops their packets to the metadata service before that).
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
