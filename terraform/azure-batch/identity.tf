# Two user-assigned identities, Microsoft Entra ID only: no account key or SAS anywhere.
#
#   manager: adds, lists and deletes tasks of the one job and reads the pool (a custom role of
#            exactly those Batch actions on the Batch account), reads the password secret
#   pool:    uploads the workers' logs to the log container, reads the password secret (the
#            start task, on the node; runs cannot reach the metadata service for its tokens)
#
# Every assignment is at the narrowest scope Azure offers for what it grants:
#   - the Batch role on the account: jobs and tasks are objects of the Batch service, not ARM
#     resources, so no role can be scoped to one job, and Batch checks job and task calls
#     against the account; a pool is an ARM resource, but a pool-scoped assignment would not
#     cover the job's tasks. The custom role holds only the calls the manager makes.
#   - the secret roles on the one secret (Key Vault RBAC scopes down to a secret), not the vault
#   - the log role on the one container, not the account

resource "azurerm_user_assigned_identity" "manager" {
  name                = "${var.name}-manager"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = local.tags
}

resource "azurerm_user_assigned_identity" "pool" {
  name                = "${var.name}-pool"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = local.tags
}

# What `cl-worker-manager azure-batch` calls: list/add/terminate/delete tasks (job write and
# read) and get the pool (pool read). No account keys, no pool changes.
resource "azurerm_role_definition" "manager" {
  name        = "${var.name}-cl-worker-manager"
  scope       = azurerm_batch_account.this.id
  description = "cl-worker-manager: tasks of its Batch job, and the pool's state."

  permissions {
    actions = [
      "Microsoft.Batch/batchAccounts/read",
      "Microsoft.Batch/batchAccounts/jobs/read",
      "Microsoft.Batch/batchAccounts/jobs/write",
      "Microsoft.Batch/batchAccounts/pools/read",
    ]
    not_actions = []
  }

  assignable_scopes = [azurerm_batch_account.this.id]
}

resource "azurerm_role_assignment" "manager_batch" {
  scope              = azurerm_batch_account.this.id
  role_definition_id = azurerm_role_definition.manager.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.manager.principal_id
  principal_type     = "ServicePrincipal"
}

resource "azurerm_role_assignment" "manager_password" {
  scope                = "${azurerm_key_vault.this.id}/secrets/${local.password_secret}"
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.manager.principal_id
  principal_type       = "ServicePrincipal"
}

# The start task reads the password into the node-local credentials file (node-start.sh.tftpl).
resource "azurerm_role_assignment" "pool_password" {
  scope                = "${azurerm_key_vault.this.id}/secrets/${local.password_secret}"
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.pool.principal_id
  principal_type       = "ServicePrincipal"
}

resource "azurerm_role_assignment" "pool_logs" {
  scope                = azurerm_storage_container.logs.id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_user_assigned_identity.pool.principal_id
  principal_type       = "ServicePrincipal"
}
