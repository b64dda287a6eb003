output "manager_command" {
  description = "The command line the manager's ECS service runs."
  value       = module.codalab_workers.manager_command
}

output "password_secret_arn" {
  description = "The secret to put the CodaLab password into."
  value       = module.codalab_workers.password_secret_arn
}

output "set_password_command" {
  description = "How to put the password into the secret out of band."
  value       = module.codalab_workers.set_password_command
}

output "job_queue_name" {
  description = "The workers' AWS Batch job queue."
  value       = module.codalab_workers.job_queue_name
}

output "manager_log_group" {
  description = "CloudWatch Logs group of the manager."
  value       = module.codalab_workers.manager_log_group
}
