# cl-worker-manager as one task of an ECS service on Fargate. Its CodaLab password comes from
# the secret through ECS `secrets`, never from plain environment.

locals {
  manager_log_group = "/codalab/${var.name}/worker-manager"
}

resource "aws_cloudwatch_log_group" "manager" {
  name              = local.manager_log_group
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.this.arn
  tags              = local.tags
}

#trivy:ignore:AVD-AWS-0034 The cluster runs one small task; Container Insights would cost more than the task (logs: CloudWatch Logs; state: the manager's /status).
resource "aws_ecs_cluster" "manager" {
  #checkov:skip=CKV_AWS_65:The cluster runs one small task; Container Insights would cost more than the task. Its logs are in CloudWatch Logs and its state in the manager's /status.
  name = "${var.name}-worker-manager"
  tags = local.tags

  setting {
    name  = "containerInsights"
    value = "disabled"
  }
}

resource "aws_ecs_task_definition" "manager" {
  family                   = "${var.name}-worker-manager"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = tostring(var.manager_cpu)
  memory                   = tostring(var.manager_memory_mb)
  execution_role_arn       = aws_iam_role.manager_execution.arn
  task_role_arn            = aws_iam_role.manager_task.arn
  tags                     = local.tags

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  # A writable /tmp on the task's own storage; the root file system is read-only.
  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([{
    name                   = "cl-worker-manager"
    image                  = var.manager_image
    essential              = true
    command                = local.manager_argv
    readonlyRootFilesystem = true
    environment = [
      { name = "CODALAB_USERNAME", value = var.codalab_username },
    ]
    secrets = [
      { name = "CODALAB_PASSWORD", valueFrom = aws_secretsmanager_secret.password.arn },
    ]
    mountPoints = [
      { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
    ]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.manager.name
        awslogs-region        = local.region
        awslogs-stream-prefix = "manager"
      }
    }
  }])
}

resource "aws_ecs_service" "manager" {
  name             = "${var.name}-worker-manager"
  cluster          = aws_ecs_cluster.manager.id
  task_definition  = aws_ecs_task_definition.manager.arn
  launch_type      = "FARGATE"
  platform_version = "LATEST"
  desired_count    = 1
  tags             = local.tags

  # Exactly one manager at a time, also during deployments: two would both launch workers.
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.manager.id]
    assign_public_ip = var.assign_public_ip
  }

  depends_on = [
    aws_iam_role_policy.manager_task,
    aws_iam_role_policy.manager_execution_password,
    aws_iam_role_policy.manager_execution_logs,
  ]
}
