# The manager's command line, and what must hold around it, with a mock AWS provider (no AWS
# account, no network).

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
    target = aws_secretsmanager_secret.password
    values = { arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:codalab/codalab-password-AbCdEf" }
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
    target = aws_batch_job_queue.workers
    values = { arn = "arn:aws:batch:us-east-1:123456789012:job-queue/codalab-workers" }
  }
}

variables {
  codalab_server = "https://worksheets.example.org"
  vpc_id         = "vpc-0123456789abcdef0"
  subnet_ids     = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]
}

run "manager_command" {
  command = apply

  assert {
    condition     = output.manager_command == "cl-worker-manager --server https://worksheets.example.org --min-workers 0 --max-workers 10 --worker-work-dir-prefix /mnt/codalab --worker-max-work-dir-size 10g --worker-idle-seconds 600 --worker-delete-work-dir-on-exit --worker-run-as-user 61000:61000 aws-batch --region us-east-1 --job-queue codalab-workers --job-definition-name codalab --cpus 1 --gpus 0 --memory-mb 2048 --worker-image codalab/worker:latest --password-secret-arn arn:aws:secretsmanager:us-east-1:123456789012:secret:codalab/codalab-password-AbCdEf --execution-role-arn arn:aws:iam::123456789012:role/codalab-worker-execution --job-role-arn arn:aws:iam::123456789012:role/codalab-worker-job"
    error_message = "unexpected manager command: ${output.manager_command}"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.manager.container_definitions)[0].command == output.manager_argv
    error_message = "the ECS task does not run the manager_command"
  }
  assert {
    condition     = aws_ecs_service.manager.desired_count == 1 && aws_ecs_service.manager.deployment_maximum_percent == 100
    error_message = "the manager must run as exactly one task"
  }
  assert {
    condition     = strcontains(output.manager_command, " --worker-run-as-user 61000:61000 ") && aws_efs_access_point.work.posix_user[0].uid == 61000 && aws_efs_access_point.work.posix_user[0].gid == 61000
    error_message = "by default the workers run every bundle as the EFS access point's owner, with no capabilities (--worker-run-as-user shared_work_dir_uid:gid)"
  }
}

run "run_as_user_follows_the_access_point" {
  command = apply

  variables {
    shared_work_dir_uid = 62000
    shared_work_dir_gid = 62001
  }

  assert {
    condition     = strcontains(output.manager_command, " --worker-run-as-user 62000:62001 ")
    error_message = "the default run user follows shared_work_dir_uid:gid"
  }
}

run "run_as_user_left_out" {
  command = apply

  variables {
    worker_run_as_user = ""
  }

  assert {
    condition     = !strcontains(output.manager_command, "--worker-run-as-user")
    error_message = "worker_run_as_user = \"\" must leave --worker-run-as-user out"
  }
}

run "run_as_user_never_root" {
  command = plan

  variables {
    worker_run_as_user = "61000:0"
  }

  expect_failures = [var.worker_run_as_user]
}

run "password_only_through_the_secret" {
  command = apply

  assert {
    condition     = jsondecode(aws_ecs_task_definition.manager.container_definitions)[0].secrets == [{ name = "CODALAB_PASSWORD", valueFrom = "arn:aws:secretsmanager:us-east-1:123456789012:secret:codalab/codalab-password-AbCdEf" }]
    error_message = "the manager must get CODALAB_PASSWORD from the secret"
  }
  assert {
    condition     = !contains([for e in jsondecode(aws_ecs_task_definition.manager.container_definitions)[0].environment : e.name], "CODALAB_PASSWORD")
    error_message = "CODALAB_PASSWORD must not be in the plain environment"
  }
  assert {
    condition     = data.aws_iam_policy_document.read_password.statement[0].actions == toset(["secretsmanager:GetSecretValue"]) && data.aws_iam_policy_document.read_password.statement[0].resources == toset([aws_secretsmanager_secret.password.arn])
    error_message = "the execution roles may read the password secret and nothing else"
  }
}

run "the_manager_tags_only_with_its_own_tags" {
  command = apply

  assert {
    condition = alltrue([
      for st in data.aws_iam_policy_document.manager_task.statement :
      !contains(st.actions, "batch:TagResource") || (
        length(st.condition) == 2 &&
        anytrue([for c in st.condition : c.variable == "aws:RequestTag/codalab-worker-manager" && c.test == "StringEquals"]) &&
        anytrue([for c in st.condition : c.variable == "aws:TagKeys" && c.test == "ForAllValues:StringEquals" && toset(c.values) == toset(["codalab-worker-manager", "codalab-worker-shape"])])
      )
    ])
    error_message = "batch:TagResource must be conditioned on this manager's tag value and its own tag keys"
  }
  assert {
    condition = alltrue([
      for st in data.aws_iam_policy_document.manager_task.statement :
      !contains(st.actions, "batch:TerminateJob") || anytrue([for c in st.condition : c.variable == "aws:ResourceTag/codalab-worker-manager"])
    ])
    error_message = "batch:TerminateJob must be conditioned on this manager's tag"
  }
}

run "idle_costs_nothing" {
  command = apply

  assert {
    condition     = aws_batch_compute_environment.workers.compute_resources[0].min_vcpus == 0 && aws_batch_compute_environment.workers.compute_resources[0].max_vcpus == 10
    error_message = "the compute environment must scale from 0 to cpus * max_workers vCPUs"
  }
  assert {
    condition     = aws_batch_compute_environment.workers.compute_resources[0].ec2_configuration[0].image_type == "ECS_AL2" && aws_batch_compute_environment.workers.compute_resources[0].type == "EC2"
    error_message = "CPU workers run On-Demand on the ECS AMI by default"
  }
  assert {
    condition     = aws_efs_file_system.work.encrypted && length(aws_efs_mount_target.work) == 2
    error_message = "the shared work dir is encrypted and mounted in every subnet"
  }
}

run "gpu_spot_workers" {
  command = apply

  variables {
    cpus                 = 8
    gpus                 = 1
    memory_mb            = 30720
    min_workers          = 1
    max_workers          = 4
    compute_type         = "SPOT"
    instance_types       = ["g5.2xlarge", "g4dn.2xlarge"]
    search               = ["request_gpus>=1"]
    worker_tag           = "gpu pool"
    worker_tag_exclusive = true
    codalab_server       = "http://codalab.internal:2900"
  }

  assert {
    condition     = output.manager_command == "cl-worker-manager --server http://codalab.internal:2900 --search 'request_gpus>=1' --min-workers 1 --max-workers 4 --worker-work-dir-prefix /mnt/codalab --worker-max-work-dir-size 10g --worker-idle-seconds 600 --worker-delete-work-dir-on-exit --worker-tag 'gpu pool' --worker-tag-exclusive --worker-run-as-user 61000:61000 aws-batch --region us-east-1 --job-queue codalab-workers --job-definition-name codalab --cpus 8 --gpus 1 --memory-mb 30720 --worker-image codalab/worker:latest --password-secret-arn arn:aws:secretsmanager:us-east-1:123456789012:secret:codalab/codalab-password-AbCdEf --execution-role-arn arn:aws:iam::123456789012:role/codalab-worker-execution --job-role-arn arn:aws:iam::123456789012:role/codalab-worker-job"
    error_message = "unexpected manager command: ${output.manager_command}"
  }
  assert {
    condition     = aws_batch_compute_environment.workers.compute_resources[0].ec2_configuration[0].image_type == "ECS_AL2_NVIDIA" && aws_batch_compute_environment.workers.compute_resources[0].ec2_configuration[0].image_id_override == "ami-0123456789abcdef0"
    error_message = "GPU workers need the ECS GPU-optimised AMI"
  }
  assert {
    condition     = aws_batch_compute_environment.workers.compute_resources[0].type == "SPOT" && aws_batch_compute_environment.workers.compute_resources[0].max_vcpus == 32
    error_message = "Spot compute environment of 8 * 4 vCPUs expected"
  }
  assert {
    condition     = length(aws_vpc_security_group_egress_rule.manager_codalab) == 1 && aws_vpc_security_group_egress_rule.manager_codalab[0].from_port == 2900
    error_message = "the manager must reach the CodaLab server's port"
  }
}

run "max_workers_below_min_workers" {
  command = plan

  variables {
    min_workers = 5
    max_workers = 2
  }

  expect_failures = [aws_batch_compute_environment.workers]
}

run "gpus_need_gpu_instance_types" {
  command = plan

  variables {
    gpus = 1
  }

  expect_failures = [aws_batch_compute_environment.workers]
}

run "cpus_at_least_one" {
  command = plan

  variables {
    cpus = 0
  }

  expect_failures = [var.cpus]
}
