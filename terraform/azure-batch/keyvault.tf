# The CodaLab password's only home. Terraform creates the vault, never the secret's value:
# output set_password_command puts it there from a file.

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
    default_action             = "Deny"
    bypass                     = "AzureServices"
    virtual_network_subnet_ids = [azurerm_subnet.manager.id]
    ip_rules                   = var.admin_ip_ranges
  }
}
