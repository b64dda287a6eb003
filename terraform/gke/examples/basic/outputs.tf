output "manager_command" {
  description = "The command line of the manager's Deployment."
  value       = module.gke.manager_command
}

output "get_credentials_command" {
  description = "Points kubectl at the cluster."
  value       = module.gke.get_credentials_command
}

output "set_password_command" {
  description = "Puts ./codalab-password.txt into the credentials Secret."
  value       = module.gke.set_password_command
}
