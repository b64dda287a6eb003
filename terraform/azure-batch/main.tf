# CodaLab workers on an Azure Batch autoscale pool, and cl-worker-manager on a small VM.
#
#   manager VM (user-assigned identity, Entra ID) --add task--> Batch job --> autoscale pool
#     pool nodes: one worker container per node, the NFS share at the shared work dir, logs
#     uploaded by the pool's own identity to the log container (no SAS, no account key)
#
# The CodaLab password lives only in the Key Vault secret (value put there out of band); the
# manager VM reads it with its identity at start into a root-only file; the workers read the
# mode-600 file the manager writes on the share (--password-file's default).

data "azurerm_client_config" "current" {}

locals {
  tags = merge(var.tags, { "codalab-worker-manager" = var.name })

  # Where Batch mounts the pool's file systems on Ubuntu nodes ($AZ_BATCH_NODE_MOUNTS_DIR), and
  # the share under it; the manager VM mounts the same share at the same path.
  mounts_dir      = "/mnt/batch/tasks/fsmounts"
  shared_work_dir = "${local.mounts_dir}/codalab"

  suffix           = substr(sha256("${data.azurerm_client_config.current.subscription_id}/${var.name}/${var.location}"), 0, 6)
  batch_account    = "${var.name}batch${local.suffix}"
  logs_account     = "${var.name}logs${local.suffix}"
  nfs_account      = "${var.name}nfs${local.suffix}"
  key_vault_name   = "${var.name}-kv-${local.suffix}"
  pool_id          = "${var.name}-pool"
  job_id           = "${var.name}-workers"
  log_container    = "worker-logs"
  password_secret  = "codalab-password"
  nfs_share        = "codalab"
  log_container_id = "https://${azurerm_storage_account.logs.name}.blob.core.windows.net/${azurerm_storage_container.logs.name}"
  # The NFS share, as the pool's nodes and the manager VM mount it.
  nfs_source = "${azurerm_storage_account.nfs.name}.file.core.windows.net:/${azurerm_storage_account.nfs.name}/${azurerm_storage_share.nfs.name}"

  # The pool's autoscale formula: examples/azure/autoscale.formula (this module's copy is checked
  # against it) with this module's bounds.
  autoscale_formula = replace(replace(file("${path.module}/autoscale.formula"),
    "maxNodes = 10;", "maxNodes = ${var.max_workers};"),
  "minNodes = 0;", "minNodes = ${var.min_workers};")

  # cl-worker-manager's command line: global flags, then `azure-batch` and its flags. Only flags
  # of cl-worker-manager (`cl-worker-manager azure-batch --help`; checked by a test).
  manager_global_args = concat(
    ["--server", var.codalab_server],
    length(var.search) > 0 ? concat(["--search"], var.search) : [],
    [
      "--min-workers", tostring(var.min_workers),
      "--max-workers", tostring(var.max_workers),
      "--worker-work-dir-prefix", local.shared_work_dir,
      "--metrics-addr", "127.0.0.1:9464",
    ],
  )
  manager_backend_args = [
    "azure-batch",
    "--account-name", azurerm_batch_account.this.name,
    "--service-url", "https://${azurerm_batch_account.this.account_endpoint}",
    "--log-container-url", local.log_container_id,
    "--log-container-identity", azurerm_user_assigned_identity.pool.id,
    "--job-id", azurerm_batch_job.workers.name,
    "--pool-id", azurerm_batch_pool.workers.name,
    "--cpus", tostring(var.cpus),
    "--gpus", tostring(var.gpus),
    "--memory-mb", tostring(var.memory_mb),
    "--worker-image", var.worker_image,
  ]
  manager_argv = concat(["cl-worker-manager"], local.manager_global_args, local.manager_backend_args)
  # The same as one shell line: arguments with characters outside a safe set are single-quoted.
  manager_command = join(" ", [
    for a in local.manager_argv :
    can(regex("^[A-Za-z0-9_./:=@%+,-]+$", a)) ? a : "'${replace(a, "'", "'\\''")}'"
  ])
}

resource "azurerm_resource_group" "this" {
  name     = "${var.name}-workers"
  location = var.location
  tags     = local.tags
}

# --- Network ------------------------------------------------------------------------------------

resource "azurerm_virtual_network" "this" {
  name                = "${var.name}-vnet"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  address_space       = [var.address_space]
  tags                = local.tags
}

# The pool's nodes: reach the share and the log storage over service endpoints.
resource "azurerm_subnet" "pool" {
  name                 = "pool"
  resource_group_name  = azurerm_resource_group.this.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = [cidrsubnet(var.address_space, 2, 0)]
  service_endpoints    = ["Microsoft.Storage", "Microsoft.KeyVault"]
}

resource "azurerm_subnet" "manager" {
  name                 = "manager"
  resource_group_name  = azurerm_resource_group.this.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = [cidrsubnet(var.address_space, 6, 16)]
  service_endpoints    = ["Microsoft.Storage", "Microsoft.KeyVault"]
}

# The manager takes no inbound connections; only the virtual network may reach it (SSH for an
# operator through Bastion or a peered network).
resource "azurerm_network_security_group" "manager" {
  name                = "${var.name}-manager"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = local.tags

  security_rule {
    name                       = "ssh-from-vnet"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = "22"
    source_address_prefix      = "VirtualNetwork"
    destination_address_prefix = "*"
  }
  security_rule {
    name                       = "deny-other-inbound"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "*"
    destination_address_prefix = "*"
  }
}

resource "azurerm_subnet_network_security_group_association" "manager" {
  subnet_id                 = azurerm_subnet.manager.id
  network_security_group_id = azurerm_network_security_group.manager.id
}

# The pool's nodes take no inbound connections: with simplified node communication they only
# connect out to the Batch service.
resource "azurerm_network_security_group" "pool" {
  name                = "${var.name}-pool"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = local.tags

  security_rule {
    name                       = "deny-inbound-from-internet"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "Internet"
    destination_address_prefix = "*"
  }
}

resource "azurerm_subnet_network_security_group_association" "pool" {
  subnet_id                 = azurerm_subnet.pool.id
  network_security_group_id = azurerm_network_security_group.pool.id
}
