# CodaLab workers on an Azure Batch autoscale pool, and cl-worker-manager on a small VM.
#
#   manager VM (user-assigned identity, Entra ID) --add task--> Batch job --> autoscale pool
#     pool nodes: no public address (outbound through the NAT gateway), one worker container
#     per node, the NFS share at the shared work dir, logs uploaded by the pool's own identity
#     to the log container (no SAS, no account key)
#
# The CodaLab password lives only in the Key Vault secret (value put there out of band). The
# manager VM (cloud-init) and every pool node (the pool's start task) read it with their own
# identity into the same mode-600 file on their own disk, local.credentials_file, which the
# manager names as --password-file: nothing is written on the share. The start task also keeps
# runs (containers on the nodes' Docker bridges) away from the instance metadata service, the
# WireServer, NFS and the virtual network (local.node_isolation_rules).

data "azurerm_client_config" "current" {}

locals {
  tags = merge(var.tags, { "codalab-worker-manager" = var.name })

  # Where Batch mounts the pool's file systems on Ubuntu nodes ($AZ_BATCH_NODE_MOUNTS_DIR), and
  # the share under it. Only the pool's nodes mount it: the manager passes the path on.
  mounts_dir      = "/mnt/batch/tasks/fsmounts"
  shared_work_dir = "${local.mounts_dir}/codalab"

  # The CodaLab credentials file (--password-file: the username on line 1, the password on line
  # 2, mode 600): the same path on the manager VM and on every node, on each machine's own disk,
  # never under the NFS share that every node mounts read-write and every run's bundle lives on.
  credentials_file = "/etc/codalab/worker-credentials"

  # What writes local.credentials_file (credentials.sh.tftpl), less the identity and the owner.
  credentials_vars = {
    key_vault_uri    = azurerm_key_vault.this.vault_uri
    password_secret  = local.password_secret
    credentials_file = local.credentials_file
    credentials_dir  = dirname(local.credentials_file)
    # One shell word, whatever the name holds.
    codalab_username = "'${replace(var.codalab_username, "'", "'\\''")}'"
  }

  # What runs may not reach: rules of the chain CODALAB-ISOLATION, which Docker's DOCKER-USER
  # chain jumps to for traffic coming in from the node's Docker bridges (the worker's run
  # networks are br-*, the default bridge docker0). In this order: DNS to Azure's resolver
  # passes, the rest to 168.63.129.16 (the WireServer) is dropped; so is link-local, with the
  # instance metadata service 169.254.169.254 (tokens of the pool's identity); NFS (port 2049),
  # wherever it is; and the virtual network (other nodes, the manager VM). Traffic of the node
  # itself (the Batch agent, the NFS mount, the start task's token) is not forwarded: untouched.
  node_isolation_bridges = ["docker0", "br-+"]
  node_isolation_rules = [
    "-d 168.63.129.16 -p udp --dport 53 -j RETURN",
    "-d 168.63.129.16 -p tcp --dport 53 -j RETURN",
    "-d 168.63.129.16 -j DROP",
    "-d 169.254.0.0/16 -j DROP",
    "-p tcp --dport 2049 -j DROP",
    "-p udp --dport 2049 -j DROP",
    "-d ${var.address_space} -j DROP",
  ]

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
    ],
    var.worker_run_as_user != "" ? ["--worker-run-as-user", var.worker_run_as_user] : [],
    ["--metrics-addr", "127.0.0.1:9464"],
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
    "--password-file", local.credentials_file,
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

# The pool's nodes: reach the share, the log storage and the vault over service endpoints.
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

# Outbound traffic of both subnets (the pool's nodes and the manager VM have no public address):
# one NAT gateway with one static address, the one a CodaLab server that filters by address must
# allow (output outbound_ip).
resource "azurerm_public_ip" "nat" {
  name                = "${var.name}-nat"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  allocation_method   = "Static"
  sku                 = "Standard"
  tags                = local.tags
}

resource "azurerm_nat_gateway" "this" {
  name                    = "${var.name}-nat"
  location                = azurerm_resource_group.this.location
  resource_group_name     = azurerm_resource_group.this.name
  sku_name                = "Standard"
  idle_timeout_in_minutes = 10
  tags                    = local.tags
}

resource "azurerm_nat_gateway_public_ip_association" "this" {
  nat_gateway_id       = azurerm_nat_gateway.this.id
  public_ip_address_id = azurerm_public_ip.nat.id
}

resource "azurerm_subnet_nat_gateway_association" "pool" {
  subnet_id      = azurerm_subnet.pool.id
  nat_gateway_id = azurerm_nat_gateway.this.id
}

resource "azurerm_subnet_nat_gateway_association" "manager" {
  subnet_id      = azurerm_subnet.manager.id
  nat_gateway_id = azurerm_nat_gateway.this.id
}

# The pool's nodes take no inbound connections: they have no public address, and with simplified
# node communication they only connect out to the Batch service (through the NAT gateway).
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
