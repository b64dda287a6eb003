# The Batch account (pools allocated by the Batch service, Microsoft Entra ID only), the
# workers' autoscale pool and the job the manager adds one task per worker to.

locals {
  # The pool's start task (node-start.sh.tftpl): the isolation of runs, then the credentials
  # file, read with the pool's identity and owned by root (the worker container runs as root).
  node_start_script = templatefile("${path.module}/node-start.sh.tftpl", {
    rules   = local.node_isolation_rules
    bridges = local.node_isolation_bridges
    credentials = templatefile("${path.module}/credentials.sh.tftpl", merge(local.credentials_vars, {
      client_id = azurerm_user_assigned_identity.pool.client_id
      owner     = "root:root"
    }))
  })
}

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

  # No public address: outbound through the subnet's NAT gateway, nothing inbound.
  network_configuration {
    subnet_id                        = azurerm_subnet.pool.id
    public_address_provisioning_type = "NoPublicIPAddresses"
  }

  # The shared work dir: the NFS share at $AZ_BATCH_NODE_MOUNTS_DIR/codalab. No set-user-id
  # programs or device files from it (runs write what is on it).
  mount {
    nfs_mount {
      source              = local.nfs_source
      relative_mount_path = "codalab"
      mount_options       = "-o vers=4,minorversion=1,sec=sys,nosuid,nodev"
    }
  }

  # At every node start and reboot, before any worker: the rules that keep runs off the
  # metadata service, the WireServer, NFS and the virtual network, and the credentials file
  # (node-start.sh.tftpl). The script travels base64-encoded: one shell word, no quoting.
  start_task {
    command_line       = "/bin/bash -c 'umask 077 && echo ${base64encode(local.node_start_script)} | base64 -d >/usr/local/sbin/codalab-node-start && exec /bin/bash /usr/local/sbin/codalab-node-start'"
    wait_for_success   = true
    task_retry_maximum = 2

    user_identity {
      auto_user {
        elevation_level = "Admin"
        scope           = "Pool"
      }
    }
  }

  lifecycle {
    precondition {
      condition     = var.max_workers >= var.min_workers
      error_message = "max_workers must be at least min_workers."
    }
  }

  # Outbound traffic before the first node, the secret readable before the first start task.
  depends_on = [azurerm_subnet_nat_gateway_association.pool, azurerm_role_assignment.pool_password]
}

resource "azurerm_batch_job" "workers" {
  name               = local.job_id
  batch_pool_id      = azurerm_batch_pool.workers.id
  display_name       = "CodaLab workers (cl-worker-manager)"
  task_retry_maximum = 0
}
