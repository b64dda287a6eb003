# Roles, each with the least it needs:
#   instance         EC2 worker instances: the ECS agent, and mounting the shared file system
#   batch_service    AWS Batch managing the compute environment
#   worker_job       the worker containers' own AWS identity: no permissions (CodaLab needs none)
#   worker_execution ECS reading the password secret for the worker containers
#   manager_task     cl-worker-manager: its AWS Batch calls, passing the two worker roles to Batch jobs
#   manager_execution ECS reading the password secret and writing the manager's logs

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "assume_batch" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["batch.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "assume_ecs_tasks" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

# --- Worker instances ---------------------------------------------------------------------------

resource "aws_iam_role" "instance" {
  name               = "${var.name}-batch-instance"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "instance_ecs" {
  role       = aws_iam_role.instance.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
}

resource "aws_iam_instance_profile" "instance" {
  name = "${var.name}-batch-instance"
  role = aws_iam_role.instance.name
  tags = local.tags
}

# --- AWS Batch service --------------------------------------------------------------------------

resource "aws_iam_role" "batch_service" {
  name               = "${var.name}-batch-service"
  assume_role_policy = data.aws_iam_policy_document.assume_batch.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "batch_service" {
  role       = aws_iam_role.batch_service.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AWSBatchServiceRole"
}

# --- Worker jobs --------------------------------------------------------------------------------

# The worker talks to CodaLab and the host's Docker only: no AWS permissions at all.
resource "aws_iam_role" "worker_job" {
  name               = "${var.name}-worker-job"
  assume_role_policy = data.aws_iam_policy_document.assume_ecs_tasks.json
  tags               = local.tags
}

resource "aws_iam_role" "worker_execution" {
  name               = "${var.name}-worker-execution"
  assume_role_policy = data.aws_iam_policy_document.assume_ecs_tasks.json
  tags               = local.tags
}

data "aws_iam_policy_document" "read_password" {
  statement {
    sid       = "ReadThePasswordSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.password.arn]
  }
  statement {
    sid       = "DecryptThroughSecretsManager"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.this.arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${local.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "worker_execution" {
  name   = "read-codalab-password"
  role   = aws_iam_role.worker_execution.id
  policy = data.aws_iam_policy_document.read_password.json
}

# --- The manager --------------------------------------------------------------------------------

resource "aws_iam_role" "manager_task" {
  name               = "${var.name}-manager-task"
  assume_role_policy = data.aws_iam_policy_document.assume_ecs_tasks.json
  tags               = local.tags
}

# Exactly the calls of cl-worker-manager's aws-batch backend.
data "aws_iam_policy_document" "manager_task" {
  # Read-only calls AWS Batch does not scope to a resource.
  statement {
    sid = "ListAndDescribe"
    actions = [
      "batch:DescribeJobDefinitions", "batch:ListJobs", "batch:DescribeJobs",
      # At start-up: whether the queue's compute environments launch GPU instances.
      "batch:DescribeJobQueues", "batch:DescribeComputeEnvironments",
    ]
    resources = ["*"]
  }
  # Registering revisions of the one job definition (tagged codalab-worker-manager=<name>).
  statement {
    sid     = "RegisterTheJobDefinition"
    actions = ["batch:RegisterJobDefinition"]
    resources = [
      "arn:${local.partition}:batch:${local.region}:${local.account_id}:job-definition/${local.job_definition_name}",
      "arn:${local.partition}:batch:${local.region}:${local.account_id}:job-definition/${local.job_definition_name}:*",
    ]
  }
  # Submitting jobs of that definition to the one queue.
  statement {
    sid     = "SubmitToTheQueue"
    actions = ["batch:SubmitJob"]
    resources = [
      aws_batch_job_queue.workers.arn,
      "arn:${local.partition}:batch:${local.region}:${local.account_id}:job-definition/${local.job_definition_name}:*",
      "arn:${local.partition}:batch:${local.region}:${local.account_id}:job/*",
    ]
  }
  # Tagging, which registration and submission do with the tags they carry: only this manager's
  # tag (codalab-worker-manager=<name>) and the shape's, so that no other Batch job or definition
  # can be tagged as this manager's (TerminateOwnJobs trusts that tag).
  statement {
    sid     = "TagWithOwnTagsOnly"
    actions = ["batch:TagResource"]
    resources = [
      "arn:${local.partition}:batch:${local.region}:${local.account_id}:job-definition/${local.job_definition_name}",
      "arn:${local.partition}:batch:${local.region}:${local.account_id}:job-definition/${local.job_definition_name}:*",
      "arn:${local.partition}:batch:${local.region}:${local.account_id}:job/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/codalab-worker-manager"
      values   = [local.job_definition_name]
    }
    condition {
      test     = "ForAllValues:StringEquals"
      variable = "aws:TagKeys"
      values   = ["codalab-worker-manager", "codalab-worker-shape"]
    }
  }
  # Terminating only jobs this manager submitted (it tags them codalab-worker-manager=<name>).
  statement {
    sid       = "TerminateOwnJobs"
    actions   = ["batch:TerminateJob"]
    resources = ["arn:${local.partition}:batch:${local.region}:${local.account_id}:job/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/codalab-worker-manager"
      values   = [local.job_definition_name]
    }
  }
  # A job definition may name the worker roles; nothing else can be passed, and only to the
  # containers of Batch jobs. ECS tasks assume a job definition's job and execution roles
  # (ecs-tasks.amazonaws.com: the one principal both roles trust, and the service AWS Batch's
  # own service role passes them on to: AWSBatchServiceRole allows iam:PassRole only with
  # iam:PassedToService ecs-tasks.amazonaws.com or ec2.amazonaws.com). AWS Batch's documentation
  # does not say which value its RegisterJobDefinition check carries, so batch.amazonaws.com,
  # the service receiving the definition, is allowed too; no other service can get the roles.
  statement {
    sid       = "PassTheWorkerRolesToBatchJobsOnly"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.worker_job.arn, aws_iam_role.worker_execution.arn]
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ecs-tasks.amazonaws.com", "batch.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "manager_task" {
  name   = "aws-batch-backend"
  role   = aws_iam_role.manager_task.id
  policy = data.aws_iam_policy_document.manager_task.json
}

resource "aws_iam_role" "manager_execution" {
  name               = "${var.name}-manager-execution"
  assume_role_policy = data.aws_iam_policy_document.assume_ecs_tasks.json
  tags               = local.tags
}

data "aws_iam_policy_document" "manager_logs" {
  statement {
    sid       = "WriteTheManagerLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.manager.arn}:*"]
  }
}

resource "aws_iam_role_policy" "manager_execution_password" {
  name   = "read-codalab-password"
  role   = aws_iam_role.manager_execution.id
  policy = data.aws_iam_policy_document.read_password.json
}

resource "aws_iam_role_policy" "manager_execution_logs" {
  name   = "write-manager-logs"
  role   = aws_iam_role.manager_execution.id
  policy = data.aws_iam_policy_document.manager_logs.json
}
