output "manager_command" {
  description = "The command line of the manager's Deployment."
  value       = module.codalab_workers.manager_command
}

output "set_password_command" {
  description = "Puts ./codalab-password.txt into the credentials Secret."
  value       = module.codalab_workers.set_password_command
}
