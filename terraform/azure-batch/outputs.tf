output "manager_command" {
  description = "The cl-worker-manager command line the manager VM runs (in its container), as one shell line."
  value       = local.manager_command
}

output "manager_argv" {
  description = "The same command line as a list."
  value       = local.manager_argv
}

output "set_password_command" {
  description = "How to put the CodaLab password into Key Vault without Terraform seeing it (reads ./codalab-password.txt); the manager VM reads it at each start of its service, a pool node at each start or reboot."
  value       = "az keyvault secret set --vault-name ${azurerm_key_vault.this.name} --name ${local.password_secret} --file codalab-password.txt --output none && az vm restart -g ${azurerm_resource_group.this.name} -n ${azurerm_linux_virtual_machine.manager.name}"
}

output "batch_account_url" {
  description = "The Batch account's URL (--service-url)."
  value       = "https://${azurerm_batch_account.this.account_endpoint}"
}

output "job_id" {
  description = "The Batch job the manager adds a task per worker to (--job-id)."
  value       = azurerm_batch_job.workers.name
}

output "pool_id" {
  description = "The workers' autoscale pool (--pool-id)."
  value       = azurerm_batch_pool.workers.name
}

output "log_container_url" {
  description = "Blob container of the workers' stdout/stderr, written by the pool's identity (--log-container-url; no SAS)."
  value       = local.log_container_id
}

output "credentials_file" {
  description = "The CodaLab credentials file (--password-file) on the manager VM and on every pool node, on their own disks: written from Key Vault, never on the share."
  value       = local.credentials_file
}

output "outbound_ip" {
  description = "The one public address the manager VM and the pool's nodes connect out from (the NAT gateway's), e.g. for a CodaLab server that filters by address."
  value       = azurerm_public_ip.nat.ip_address
}

output "shared_work_dir" {
  description = "Where the pool's nodes mount the NFS share (--worker-work-dir-prefix)."
  value       = local.shared_work_dir
}

output "manager_identity_client_id" {
  description = "Client id of the manager's user-assigned identity (AZURE_CLIENT_ID)."
  value       = azurerm_user_assigned_identity.manager.client_id
}

output "manager_private_ip" {
  description = "Private address of the manager VM (its /status is on 127.0.0.1:9464 there)."
  value       = azurerm_network_interface.manager.private_ip_address
}
