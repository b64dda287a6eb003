# What an untrusted run cannot turn against the operator, with a mock AWS provider (no AWS
# account, no network): the shared work dir has no root (an EFS access point with a dedicated
# owner), containers on the instances' Docker bridges reach neither the metadata service nor
# NFS, and the manager's role can stop only its own jobs and pass its roles only to Batch jobs.

mock_provider "aws" {
  override_data {
    target = data.aws_region.current
    values = { region = "us-east-1" }
  }
  override_data {
    target = data.aws_caller_identity.current
    values = { account_id = "123456789012" }
  }
  override_data {
    target = data.aws_partition.current
    values = { partition = "aws" }
  }
  override_data {
    target = data.aws_ssm_parameter.gpu_ami
    values = { insecure_value = "ami-0123456789abcdef0" }
  }
  override_resource {
    target = aws_iam_role.worker_execution
    values = { arn = "arn:aws:iam::123456789012:role/codalab-worker-execution" }
  }
  override_resource {
    target = aws_iam_role.worker_job
    values = { arn = "arn:aws:iam::123456789012:role/codalab-worker-job" }
  }
  override_resource {
    target = aws_efs_file_system.work
    values = { id = "fs-0123456789abcdef0", arn = "arn:aws:elasticfilesystem:us-east-1:123456789012:file-system/fs-0123456789abcdef0" }
  }
  override_resource {
    target = aws_efs_access_point.work
    values = { id = "fsap-0123456789abcdef0", arn = "arn:aws:elasticfilesystem:us-east-1:123456789012:access-point/fsap-0123456789abcdef0" }
  }
}

variables {
  codalab_server = "https://worksheets.example.org"
  vpc_id         = "vpc-0123456789abcdef0"
  subnet_ids     = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]
}

run "nfs_has_no_root_and_a_dedicated_owner" {
  command = apply

  assert {
    condition     = aws_efs_access_point.work.file_system_id == "fs-0123456789abcdef0" && aws_efs_access_point.work.posix_user[0].uid == 61000 && aws_efs_access_point.work.posix_user[0].gid == 61000
    error_message = "the shared work dir must be reached through an EFS access point acting as the dedicated uid:gid 61000:61000"
  }
  assert {
    condition     = aws_efs_access_point.work.root_directory[0].path == "/codalab" && aws_efs_access_point.work.root_directory[0].creation_info[0].owner_uid == 61000 && aws_efs_access_point.work.root_directory[0].creation_info[0].owner_gid == 61000 && contains(["0755", "0750"], aws_efs_access_point.work.root_directory[0].creation_info[0].permissions)
    error_message = "the access point's root directory must be created owned by the dedicated uid:gid, mode 0755 or 0750"
  }
  assert {
    condition = alltrue([
      for st in data.aws_iam_policy_document.efs.statement :
      st.effect == "Deny" || !anytrue([for a in st.actions : contains(["*", "elasticfilesystem:*", "elasticfilesystem:ClientRootAccess"], a)])
    ])
    error_message = "the file system policy must not grant elasticfilesystem:ClientRootAccess"
  }
  assert {
    condition = alltrue([
      for st in data.aws_iam_policy_document.efs.statement :
      st.effect == "Deny" || anytrue([
        for c in st.condition :
        c.test == "StringEquals" && c.variable == "elasticfilesystem:AccessPointArn" && toset(c.values) == toset([aws_efs_access_point.work.arn])
      ])
    ])
    error_message = "the file system policy must allow mounting only through the access point (elasticfilesystem:AccessPointArn)"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "\necho \"fs-0123456789abcdef0:/ /mnt/codalab efs _netdev,noresvport,tls,iam,accesspoint=fsap-0123456789abcdef0 0 0\" >> /etc/fstab\n")
    error_message = "the instances must mount the shared work dir through the access point (accesspoint= in the efs mount options)"
  }
  assert {
    condition     = aws_vpc_security_group_ingress_rule.efs_from_workers.security_group_id == aws_security_group.efs.id && aws_vpc_security_group_ingress_rule.efs_from_workers.referenced_security_group_id == aws_security_group.workers.id && aws_vpc_security_group_ingress_rule.efs_from_workers.ip_protocol == "tcp" && aws_vpc_security_group_ingress_rule.efs_from_workers.from_port == 2049 && aws_vpc_security_group_ingress_rule.efs_from_workers.to_port == 2049
    error_message = "the mount targets must take NFS (2049) from the worker instances' security group only"
  }
}

run "another_owner" {
  command = apply

  variables {
    shared_work_dir_uid = 1000
    shared_work_dir_gid = 1001
  }

  assert {
    condition     = aws_efs_access_point.work.posix_user[0].uid == 1000 && aws_efs_access_point.work.posix_user[0].gid == 1001 && aws_efs_access_point.work.root_directory[0].creation_info[0].owner_uid == 1000 && aws_efs_access_point.work.root_directory[0].creation_info[0].owner_gid == 1001
    error_message = "shared_work_dir_uid and shared_work_dir_gid must be the access point's identity and its root directory's owner"
  }
}

run "the_owner_is_never_root" {
  command = plan

  variables {
    shared_work_dir_uid = 0
  }

  expect_failures = [var.shared_work_dir_uid]
}

run "containers_reach_no_metadata_and_no_nfs" {
  command = apply

  assert {
    condition     = aws_launch_template.workers.metadata_options[0].http_endpoint == "enabled" && aws_launch_template.workers.metadata_options[0].http_tokens == "required" && aws_launch_template.workers.metadata_options[0].http_put_response_hop_limit == 1
    error_message = "the instances must require IMDSv2 tokens with a hop limit of 1"
  }
  assert {
    condition     = startswith(base64decode(aws_launch_template.workers.user_data), "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"==CODALAB==\"\n\n--==CODALAB==\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\n\n#!/bin/bash\nset -euo pipefail\n") && endswith(base64decode(aws_launch_template.workers.user_data), "\n--==CODALAB==--\n") && strcontains(base64decode(aws_launch_template.workers.user_data), "\nipt -C INPUT -j CODALAB-INPUT 2>/dev/null || ipt -I INPUT 1 -j CODALAB-INPUT\nFIREWALL\n") && strcontains(base64decode(aws_launch_template.workers.user_data), "\nWantedBy=docker.service\nUNIT\n")
    error_message = "the user data must stay one MIME multi-part shell script with the firewall script and its unit as whole here-documents"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "\nipt -C DOCKER-USER -j CODALAB-FORWARD 2>/dev/null || ipt -I DOCKER-USER 1 -j CODALAB-FORWARD\n")
    error_message = "the containers' rules must be reached from Docker's DOCKER-USER chain"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "\nipt -A CODALAB-FORWARD -i docker0 -d 169.254.169.254/32 -j DROP\nipt -A CODALAB-FORWARD -i br-+ -d 169.254.169.254/32 -j DROP\n")
    error_message = "containers on docker0 and br-* must be dropped on their way to the instance metadata service (169.254.169.254)"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "\nipt -A CODALAB-FORWARD -i docker0 -d 169.254.0.0/16 -j DROP\nipt -A CODALAB-FORWARD -i br-+ -d 169.254.0.0/16 -j DROP\n") && can(regex("(?s)-i br-\\+ -d 169\\.254\\.169\\.253/32 -p udp --dport 53 -j RETURN\n.*-i br-\\+ -d 169\\.254\\.0\\.0/16 -j DROP\n", base64decode(aws_launch_template.workers.user_data)))
    error_message = "containers on docker0 and br-* must reach no link-local address (169.254.0.0/16) but Amazon DNS on port 53"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "\nipt -A CODALAB-INPUT -i docker0 -m conntrack --ctorigdst 169.254.0.0/16 -j DROP\nipt -A CODALAB-INPUT -i br-+ -m conntrack --ctorigdst 169.254.0.0/16 -j DROP\n") && strcontains(base64decode(aws_launch_template.workers.user_data), "\nipt -A CODALAB-INPUT -i br-+ -p tcp --dport 51678:51680 -j DROP\n") && strcontains(base64decode(aws_launch_template.workers.user_data), "\nipt -C INPUT -j CODALAB-INPUT 2>/dev/null || ipt -I INPUT 1 -j CODALAB-INPUT\n")
    error_message = "containers on docker0 and br-* must not reach the ECS agent's credentials endpoint (169.254.170.2, DNAT to the host) or its ports"
  }
  assert {
    condition = alltrue([
      for r in [
        "ipt -A CODALAB-FORWARD -i docker0 -p tcp --dport 2049 -j DROP",
        "ipt -A CODALAB-FORWARD -i docker0 -p udp --dport 2049 -j DROP",
        "ipt -A CODALAB-FORWARD -i br-+ -p tcp --dport 2049 -j DROP",
        "ipt -A CODALAB-FORWARD -i br-+ -p udp --dport 2049 -j DROP",
      ] : strcontains(base64decode(aws_launch_template.workers.user_data), "\n${r}\n")
    ])
    error_message = "containers on docker0 and br-* must reach no NFS server (TCP and UDP 2049)"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.workers.user_data), "\n[Unit]\nRequires=codalab-container-firewall.service\nAfter=codalab-container-firewall.service\nDROPIN\n") && strcontains(base64decode(aws_launch_template.workers.user_data), "\nAfter=docker.service\nRequires=docker.service\nPartOf=docker.service\n") && strcontains(base64decode(aws_launch_template.workers.user_data), "\nsystemctl enable codalab-container-firewall.service\n")
    error_message = "the firewall must be applied after every start of Docker and before the ECS agent takes jobs"
  }
}

run "the_manager_stops_only_its_own_jobs" {
  command = apply

  assert {
    condition     = anytrue([for st in data.aws_iam_policy_document.manager_task.statement : contains(st.actions, "batch:TerminateJob")])
    error_message = "the manager must be allowed batch:TerminateJob (it cancels the workers no bundle needs)"
  }
  assert {
    condition = alltrue([
      for st in data.aws_iam_policy_document.manager_task.statement :
      length(setintersection(st.actions, ["batch:TerminateJob", "batch:CancelJob"])) == 0 || (
        toset(st.resources) == toset(["arn:aws:batch:us-east-1:123456789012:job/*"]) &&
        anytrue([for c in st.condition : c.test == "StringEquals" && c.variable == "aws:ResourceTag/codalab-worker-manager" && toset(c.values) == toset(["codalab"])])
      )
    ])
    error_message = "batch:TerminateJob and batch:CancelJob must be allowed only on jobs tagged codalab-worker-manager=<name>"
  }
  assert {
    condition = !anytrue(flatten([
      for st in data.aws_iam_policy_document.manager_task.statement : [for a in st.actions : endswith(a, "*")]
    ]))
    error_message = "the manager's policy must name its actions, without wildcards"
  }
}

run "the_manager_passes_its_roles_to_batch_jobs_only" {
  command = apply

  assert {
    condition = alltrue([
      for st in data.aws_iam_policy_document.manager_task.statement :
      !contains(st.actions, "iam:PassRole") || toset(st.resources) == toset(["arn:aws:iam::123456789012:role/codalab-worker-job", "arn:aws:iam::123456789012:role/codalab-worker-execution"])
    ])
    error_message = "iam:PassRole must be allowed on the two worker roles only"
  }
  assert {
    condition = alltrue([
      for st in data.aws_iam_policy_document.manager_task.statement :
      !contains(st.actions, "iam:PassRole") || anytrue([
        for c in st.condition :
        c.test == "StringEquals" && c.variable == "iam:PassedToService" && contains(c.values, "ecs-tasks.amazonaws.com") && length(setsubtract(c.values, ["ecs-tasks.amazonaws.com", "batch.amazonaws.com"])) == 0
      ])
    ])
    error_message = "iam:PassRole must be conditioned on iam:PassedToService (ecs-tasks.amazonaws.com, the Batch job's containers)"
  }
}
