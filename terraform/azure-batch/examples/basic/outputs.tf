output "manager_command" {
  description = "The command line the manager VM runs."
  value       = module.codalab_workers.manager_command
}

output "set_password_command" {
  description = "Puts ./codalab-password.txt into Key Vault and restarts the manager VM."
  value       = module.codalab_workers.set_password_command
}
