# The CodaLab password's only home. Terraform creates the vault, never the secret's value:
# output set_password_command puts it there from a file. The manager VM and the pool's nodes
# copy it, each with its own identity, into a mode-600 file on their own disk.

resource "azurerm_key_vault" "this" {
  #checkov:skip=CKV2_AZURE_32:Reached over the subnets' service endpoints; a private endpoint would add a private DNS zone for the same isolation.
  name                          = local.key_vault_name
  location                      = azurerm_resource_group.this.location
  resource_group_name           = azurerm_resource_group.this.name
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "standard"
  rbac_authorization_enabled    = true
  purge_protection_enabled      = true
  soft_delete_retention_days    = 7
  public_network_access_enabled = true
  tags                          = local.tags

  network_acls {
    default_action = "Deny"
    bypass         = "AzureServices"
    # The manager VM and the pool's nodes (their start task) read the secret; runs on the nodes
    # reach the vault too, but with no token (no metadata service for them, no key anywhere).
    virtual_network_subnet_ids = [azurerm_subnet.manager.id, azurerm_subnet.pool.id]
    ip_rules                   = var.admin_ip_ranges
  }
}
