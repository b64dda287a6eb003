# The Batch account (pools allocated by the Batch service, Microsoft Entra ID only), the
# workers' autoscale pool and the job the manager adds one task per worker to.

resource "azurerm_batch_account" "this" {
  #checkov:skip=CKV_AZURE_76:Customer-managed keys would add a Key Vault key to rotate; the account holds task definitions without secrets (the password is in no task).
  #checkov:skip=CKV2_AZURE_31:Reached by the manager with Microsoft Entra ID over the public endpoint; no shared key is enabled.
  name                                = local.batch_account
  resource_group_name                 = azurerm_resource_group.this.name
  location                            = azurerm_resource_group.this.location
  pool_allocation_mode                = "BatchService"
  allowed_authentication_modes        = ["AAD"]
  public_network_access_enabled       = true
  storage_account_authentication_mode = "BatchAccountManagedIdentity"
  tags                                = local.tags

  identity {
    type = "SystemAssigned"
  }
}

resource "azurerm_batch_pool" "workers" {
  name                = local.pool_id
  account_name        = azurerm_batch_account.this.name
  resource_group_name = azurerm_resource_group.this.name
  display_name        = "CodaLab workers"
  vm_size             = var.vm_size
  # Ubuntu 22.04 HPC image of the Data Science VM team: Moby (Docker) and, on N-series sizes,
  # the NVIDIA driver and container toolkit.
  node_agent_sku_id = "batch.node.ubuntu 22.04"
  # One worker per node: the worker sizes its runs to the node (cpus, memory_mb).
  max_tasks_per_node = 1
  # The nodes only connect out to the Batch service: no inbound management ports.
  target_node_communication_mode = "Simplified"

  storage_image_reference {
    publisher = "microsoft-dsvm"
    offer     = "ubuntu-hpc"
    sku       = "2204"
    version   = "latest"
  }

  # The worker image is pulled when a node starts, not when a worker starts.
  container_configuration {
    type                  = "DockerCompatible"
    container_image_names = [var.worker_image]
  }

  auto_scale {
    evaluation_interval = "PT5M"
    formula             = local.autoscale_formula
  }

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.pool.id]
  }

  network_configuration {
    subnet_id                        = azurerm_subnet.pool.id
    public_address_provisioning_type = "BatchManaged"
  }

  # The shared work dir: the NFS share at $AZ_BATCH_NODE_MOUNTS_DIR/codalab.
  mount {
    nfs_mount {
      source              = local.nfs_source
      relative_mount_path = "codalab"
      mount_options       = "-o vers=4,minorversion=1,sec=sys"
    }
  }

  lifecycle {
    precondition {
      condition     = var.max_workers >= var.min_workers
      error_message = "max_workers must be at least min_workers."
    }
  }
}

resource "azurerm_batch_job" "workers" {
  name               = local.job_id
  batch_pool_id      = azurerm_batch_pool.workers.id
  display_name       = "CodaLab workers (cl-worker-manager)"
  task_retry_maximum = 0
}
