# CodaLab workers on AWS Batch, and cl-worker-manager as a one-task ECS service on Fargate.
#
#   manager (Fargate) --SubmitJob--> job queue --> compute environment (EC2 or Spot, min 0 vCPUs)
#                                                   instances mount EFS at var.shared_work_dir
#
# The CodaLab password lives only in the Secrets Manager secret (value put there out of band);
# the manager gets it through ECS `secrets`, the workers through their job definition's `secrets`.

data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

# The ECS GPU-optimised Amazon Linux 2 AMI (NVIDIA driver and container runtime), for GPU workers.
data "aws_ssm_parameter" "gpu_ami" {
  count = var.gpus > 0 ? 1 : 0
  name  = "/aws/service/ecs/optimized-ami/amazon-linux-2/gpu/recommended/image_id"
}

locals {
  region     = data.aws_region.current.region
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  codalab_url  = regex("^(https?)://[^/:]+(?::([0-9]+))?", var.codalab_server)
  codalab_port = local.codalab_url[1] != null ? tonumber(local.codalab_url[1]) : (local.codalab_url[0] == "https" ? 443 : 80)

  job_queue_name      = coalesce(var.job_queue_name, "${var.name}-workers")
  job_definition_name = var.name
  max_vcpus           = coalesce(var.max_vcpus, var.cpus * var.max_workers)

  tags = merge(var.tags, { "codalab-worker-manager" = var.name })

  # The directory of the EFS file system the access point exposes as the shared work dir.
  efs_root_directory = "/codalab"

  # Who runs the bundles (--worker-run-as-user): by default the access point's owner, the user
  # every NFS call of the instances acts as anyway. The workers give each bundle directory to
  # that user, and through the access point nobody can give it to anyone else.
  worker_run_as_user = var.worker_run_as_user != null ? var.worker_run_as_user : "${var.shared_work_dir_uid}:${var.shared_work_dir_gid}"

  # cl-worker-manager's command line: global flags, then the backend and its flags. Only flags
  # of cl-worker-manager (`cl-worker-manager aws-batch --help`).
  manager_global_args = concat(
    ["--server", var.codalab_server],
    length(var.search) > 0 ? concat(["--search"], var.search) : [],
    [
      "--min-workers", tostring(var.min_workers),
      "--max-workers", tostring(var.max_workers),
      "--worker-work-dir-prefix", var.shared_work_dir,
      "--worker-max-work-dir-size", var.worker_max_work_dir_size,
      "--worker-idle-seconds", tostring(var.worker_idle_seconds),
    ],
    var.worker_delete_work_dir_on_exit ? ["--worker-delete-work-dir-on-exit"] : [],
    var.worker_tag != null ? ["--worker-tag", var.worker_tag] : [],
    var.worker_tag_exclusive ? ["--worker-tag-exclusive"] : [],
    local.worker_run_as_user != "" ? ["--worker-run-as-user", local.worker_run_as_user] : [],
  )
  manager_backend_args = [
    "aws-batch",
    "--region", local.region,
    "--job-queue", aws_batch_job_queue.workers.name,
    "--job-definition-name", local.job_definition_name,
    "--cpus", tostring(var.cpus),
    "--gpus", tostring(var.gpus),
    "--memory-mb", tostring(var.memory_mb),
    "--worker-image", var.worker_image,
    "--password-secret-arn", aws_secretsmanager_secret.password.arn,
    "--execution-role-arn", aws_iam_role.worker_execution.arn,
    "--job-role-arn", aws_iam_role.worker_job.arn,
  ]
  manager_argv = concat(["cl-worker-manager"], local.manager_global_args, local.manager_backend_args)
  # The same as one shell line: arguments with characters outside a safe set are single-quoted.
  manager_command = join(" ", [
    for a in local.manager_argv :
    can(regex("^[A-Za-z0-9_./:=@%+,-]+$", a)) ? a : "'${replace(a, "'", "'\\''")}'"
  ])
}
