output "manager_command" {
  description = "The command line the manager VM runs."
  value       = module.codalab_workers.manager_command
}

output "set_password_command" {
  description = "Puts ./codalab-password.txt into Key Vault and restarts the manager VM."
  value       = module.codalab_workers.set_password_command
}

output "outbound_ip" {
  description = "The one address the manager VM and the workers connect out from (allow it on the CodaLab server if it filters)."
  value       = module.codalab_workers.outbound_ip
}
