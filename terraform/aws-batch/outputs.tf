output "manager_command" {
  description = "The cl-worker-manager command line the ECS service runs, as one shell line."
  value       = local.manager_command
}

output "manager_argv" {
  description = "The same command line as a list (the task's container command)."
  value       = local.manager_argv
}

output "password_secret_arn" {
  description = "ARN of the Secrets Manager secret for the CodaLab password (its value is set out of band)."
  value       = aws_secretsmanager_secret.password.arn
}

output "set_password_command" {
  description = "How to put the CodaLab password into the secret without Terraform seeing it."
  value       = "aws secretsmanager put-secret-value --region ${local.region} --secret-id ${aws_secretsmanager_secret.password.arn} --secret-string file://codalab-password.txt"
}

output "job_queue_name" {
  description = "Name of the AWS Batch job queue of the workers."
  value       = aws_batch_job_queue.workers.name
}

output "job_queue_arn" {
  description = "ARN of the AWS Batch job queue of the workers."
  value       = aws_batch_job_queue.workers.arn
}

output "job_definition_name" {
  description = "Name of the job definition cl-worker-manager registers (also the prefix of its job names)."
  value       = local.job_definition_name
}

output "compute_environment_arn" {
  description = "ARN of the workers' AWS Batch compute environment."
  value       = aws_batch_compute_environment.workers.arn
}

output "efs_file_system_id" {
  description = "The shared work dir's EFS file system."
  value       = aws_efs_file_system.work.id
}

output "efs_access_point_id" {
  description = "The EFS access point the instances mount the shared work dir through (as shared_work_dir_uid:gid, never as root)."
  value       = aws_efs_access_point.work.id
}

output "shared_work_dir" {
  description = "Where the worker instances mount the shared work dir (--worker-work-dir-prefix)."
  value       = var.shared_work_dir
}

output "worker_job_role_arn" {
  description = "Role for the worker containers (no permissions)."
  value       = aws_iam_role.worker_job.arn
}

output "worker_execution_role_arn" {
  description = "Execution role that may read the password secret for the worker containers."
  value       = aws_iam_role.worker_execution.arn
}

output "manager_log_group" {
  description = "CloudWatch Logs group of the manager."
  value       = aws_cloudwatch_log_group.manager.name
}

output "ecs_cluster_name" {
  description = "ECS cluster of the manager service."
  value       = aws_ecs_cluster.manager.name
}

output "ecs_service_name" {
  description = "ECS service running the manager."
  value       = aws_ecs_service.manager.name
}

output "kms_key_arn" {
  description = "KMS key encrypting the secret, the shared work dir and the manager's logs."
  value       = aws_kms_key.this.arn
}
