# Two storage accounts: one for the workers' logs (blob, Entra ID only, no account keys), one
# Premium FileStorage account with the NFS share of the shared work dir (NFS needs its own
# account kind, and it is reached from the pool's subnet only).

#trivy:ignore:AVD-AZU-0057 Queue logging: the account has no queues (blob logs only).
#trivy:ignore:AVD-AZU-0058 Worker logs are re-creatable diagnostics; geo-redundant replication would only add cost (LRS).
#trivy:ignore:AVD-AZU-0060 Customer-managed keys would add a Key Vault key to rotate for worker logs; Microsoft-managed encryption at rest applies (twice: infrastructure encryption).
resource "azurerm_storage_account" "logs" {
  #checkov:skip=CKV_AZURE_43:The name is var.name (3 to 12 lowercase letters or digits, validated), "logs" and 6 hex digits: at most 22 valid characters; the scanner does not evaluate it.
  #checkov:skip=CKV_AZURE_59:Public network access is limited by network_rules (default Deny) to the subnets and admin_ip_ranges.
  #checkov:skip=CKV_AZURE_33:Queue logging: the account has no queues (blob logs only).
  #checkov:skip=CKV2_AZURE_1:Customer-managed keys would add a Key Vault key to rotate for worker logs; Microsoft-managed encryption at rest applies.
  #checkov:skip=CKV_AZURE_206:Worker logs are re-creatable diagnostics; zone-redundant replication would only add cost (LRS).
  #checkov:skip=CKV2_AZURE_33:Reached over the pool's and the manager's service endpoints; a private endpoint would add a private DNS zone for the same isolation.
  name                              = local.logs_account
  resource_group_name               = azurerm_resource_group.this.name
  location                          = azurerm_resource_group.this.location
  account_kind                      = "StorageV2"
  account_tier                      = "Standard"
  account_replication_type          = "LRS"
  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = true
  allow_nested_items_to_be_public   = false
  shared_access_key_enabled         = false
  default_to_oauth_authentication   = true
  infrastructure_encryption_enabled = true
  public_network_access_enabled     = true
  local_user_enabled                = false
  tags                              = local.tags

  network_rules {
    default_action             = "Deny"
    bypass                     = ["AzureServices"]
    virtual_network_subnet_ids = [azurerm_subnet.pool.id, azurerm_subnet.manager.id]
    # Where Terraform runs, to create the container.
    ip_rules = var.admin_ip_ranges
  }

  blob_properties {
    delete_retention_policy {
      days = 7
    }
    container_delete_retention_policy {
      days = 7
    }
  }

  sas_policy {
    expiration_period = "01.00:00:00"
  }
}

resource "azurerm_storage_container" "logs" {
  #checkov:skip=CKV2_AZURE_21:Blob read logging of worker logs would log every read of a log.
  name                  = local.log_container
  storage_account_id    = azurerm_storage_account.logs.id
  container_access_type = "private"
}

#trivy:ignore:AVD-AZU-0008 Azure Files NFS requires secure transfer to be off (NFS 4.1 has no TLS); the share is reachable only from the virtual network's subnets.
#trivy:ignore:AVD-AZU-0059 Azure Files NFS requires secure transfer to be off (see above); min_tls_version still applies to the account's HTTPS endpoints.
#trivy:ignore:AVD-AZU-0057 Queue logging: the account has no queues (an NFS share only).
#trivy:ignore:AVD-AZU-0058 Scratch space that the workers rebuild from the CodaLab server; geo-redundant replication would only add cost.
resource "azurerm_storage_account" "nfs" {
  #checkov:skip=CKV_AZURE_43:The name is var.name (3 to 12 lowercase letters or digits, validated), "nfs" and 6 hex digits: at most 21 valid characters; the scanner does not evaluate it.
  #checkov:skip=CKV_AZURE_3:Azure Files NFS requires secure transfer to be off (NFS 4.1 has no TLS); the share is reachable only from the virtual network's subnets.
  #checkov:skip=CKV_AZURE_33:Queue logging: the account has no queues (an NFS share only).
  #checkov:skip=CKV2_AZURE_1:Customer-managed keys would add a Key Vault key to rotate for scratch data; Microsoft-managed encryption at rest applies.
  #checkov:skip=CKV_AZURE_206:Scratch space (dependency cache, run directories) that the workers rebuild from the CodaLab server; zone-redundant replication would only add cost.
  #checkov:skip=CKV2_AZURE_33:Reached over the subnets' service endpoints; a private endpoint would add a private DNS zone for the same isolation.
  #checkov:skip=CKV2_AZURE_38:Soft delete keeps deleted scratch files and bills for them; the work dir is rebuilt from the CodaLab server.
  #checkov:skip=CKV_AZURE_190:No blobs in this account (an NFS share only).
  #checkov:skip=CKV_AZURE_59:Public network access is limited by network_rules to the subnets; NFS clients must reach the account's endpoint.
  #checkov:skip=CKV2_AZURE_40:Shared keys are not used by NFS clients; the account is file-only and reached from the subnets only.
  #checkov:skip=CKV2_AZURE_41:No SAS is issued for this account.
  #checkov:skip=CKV_AZURE_244:No local users (the attribute applies to SFTP on blob accounts).
  name                              = local.nfs_account
  resource_group_name               = azurerm_resource_group.this.name
  location                          = azurerm_resource_group.this.location
  account_kind                      = "FileStorage"
  account_tier                      = "Premium"
  account_replication_type          = "LRS"
  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = false
  allow_nested_items_to_be_public   = false
  infrastructure_encryption_enabled = true
  tags                              = local.tags

  network_rules {
    default_action = "Deny"
    bypass         = ["AzureServices"]
    # The pool's nodes only: the manager VM does not mount the share.
    virtual_network_subnet_ids = [azurerm_subnet.pool.id]
    ip_rules                   = var.admin_ip_ranges
  }
}

# Root squash (Azure's rootSquash: NoRootSquash, RootSquash, AllSquash) is no argument of
# azurerm_storage_share in azurerm 4.55 (the schema checked here): the share keeps Azure's
# default, NoRootSquash. Runs cannot reach NFS themselves (port 2049 is dropped from the nodes'
# Docker bridges), only the pool's subnet may reach the account, and the nodes mount the share
# nosuid,nodev; README.md, "Root squash", says why RootSquash would add little here and what
# setting it by hand takes.
resource "azurerm_storage_share" "nfs" {
  name               = local.nfs_share
  storage_account_id = azurerm_storage_account.nfs.id
  enabled_protocol   = "NFS"
  quota              = var.nfs_quota_gb
}
