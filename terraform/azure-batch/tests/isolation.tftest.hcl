# What a run on the pool's nodes cannot reach or read, and what the manager and the nodes'
# identities may do, with a mock azurerm provider (no subscription, no network). One run per
# property; tests/terraform/lib/negative_isolation_azure.py breaks each and expects its message.

mock_provider "azurerm" {
  override_data {
    target = data.azurerm_client_config.current
    values = { subscription_id = "00000000-0000-0000-0000-000000000001", tenant_id = "00000000-0000-0000-0000-000000000002" }
  }
  override_resource {
    target = azurerm_batch_account.this
    values = { account_endpoint = "codalabbatchabc123.westus2.batch.azure.com" }
  }
  override_resource {
    target = azurerm_user_assigned_identity.pool
    values = {
      id           = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/codalab-workers/providers/Microsoft.ManagedIdentity/userAssignedIdentities/codalab-pool"
      client_id    = "99999999-8888-7777-6666-555555555555"
      principal_id = "aaaaaaaa-0000-0000-0000-000000000001"
    }
  }
  override_resource {
    target = azurerm_user_assigned_identity.manager
    values = { client_id = "11111111-2222-3333-4444-555555555555", principal_id = "aaaaaaaa-0000-0000-0000-000000000002" }
  }
  override_resource {
    target = azurerm_key_vault.this
    values = {
      id        = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/codalab-workers/providers/Microsoft.KeyVault/vaults/codalab-kv-abc123"
      vault_uri = "https://codalab-kv-abc123.vault.azure.net/"
    }
  }
  override_resource {
    target = azurerm_subnet.pool
    values = { id = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/codalab-workers/providers/Microsoft.Network/virtualNetworks/codalab-vnet/subnets/pool" }
  }
  override_resource {
    target = azurerm_subnet.manager
    values = { id = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/codalab-workers/providers/Microsoft.Network/virtualNetworks/codalab-vnet/subnets/manager" }
  }
}

variables {
  location             = "westus2"
  codalab_server       = "https://worksheets.example.org"
  admin_ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0eXhhbXBsZWtleWZvcnRlc3RzMDEyMzQ1Njc4OQ"
}

# The start task writes the CodaLab credentials to a file on the node's own disk, mode 600,
# replaced atomically, with the pool's identity; as root, before any worker, at every start.
run "credentials_are_node_local" {
  command = apply

  assert {
    condition = (
      !startswith(output.credentials_file, "/mnt/batch/tasks/fsmounts/") &&
      !startswith(output.credentials_file, "${output.shared_work_dir}/") &&
      strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), "mv -f \"$tmp\" ${output.credentials_file}\n")
    )
    error_message = "the start task must write the workers' credentials to a node-local file, not under the NFS share"
  }
  assert {
    condition = alltrue([
      for line in [
        "umask 077\n",
        "tmp=$(mktemp ${output.credentials_file}.XXXXXX)\n",
        "printf '%s\\n%s\\n' 'codalab' \"$password\" >\"$tmp\"\n",
        "chown root:root \"$tmp\"\n",
        "chmod 600 \"$tmp\"\n",
        "&client_id=99999999-8888-7777-6666-555555555555\"",
        "curl -sSf --retry 5 -H @- \"https://codalab-kv-abc123.vault.azure.net/secrets/codalab-password?api-version=7.4\"",
      ] : strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), line)
    ])
    error_message = "the credentials file is written with umask 077, mode 600 and an atomic rename, from Key Vault with the pool's identity, the token on curl's standard input"
  }
  assert {
    condition = (
      !can(regex("(?m)^\\s*set -[a-z]*x", base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]))) &&
      !strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), "-H \"Authorization") &&
      !can(regex("echo[^\\n]*\\$password", base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0])))
    )
    error_message = "the start task must print no secret and put none on a command line"
  }
  assert {
    condition = (
      azurerm_batch_pool.workers.start_task[0].wait_for_success &&
      azurerm_batch_pool.workers.start_task[0].user_identity[0].auto_user[0].elevation_level == "Admin" &&
      azurerm_batch_pool.workers.start_task[0].user_identity[0].auto_user[0].scope == "Pool"
    )
    error_message = "the start task runs as the pool's admin auto-user and must succeed before any worker task"
  }
}

# The manager reads the same node-local path (--password-file) and so never writes the share;
# its VM does not even mount the share.
run "manager_uses_the_node_local_credentials_file" {
  command = apply

  assert {
    condition = (
      strcontains(output.manager_command, " --password-file ${output.credentials_file}") &&
      !strcontains(output.manager_command, "--password-file ${output.shared_work_dir}") &&
      length([for a in output.manager_argv : a if startswith(a, output.shared_work_dir)]) == 1
    )
    error_message = "the manager must be given --password-file with the node-local credentials file, never a file on the share"
  }
  assert {
    condition = (
      !strcontains(base64decode(azurerm_linux_virtual_machine.manager.custom_data), "nfs") &&
      !strcontains(base64decode(azurerm_linux_virtual_machine.manager.custom_data), "-v ${output.shared_work_dir}") &&
      azurerm_storage_account.nfs.network_rules[0].virtual_network_subnet_ids == toset([azurerm_subnet.pool.id])
    )
    error_message = "only the pool's nodes may reach and mount the NFS share: not the manager VM"
  }
  assert {
    condition     = strcontains(base64decode(azurerm_linux_virtual_machine.manager.custom_data), "chown 65532:65532 \"$tmp\"") && strcontains(base64decode(azurerm_linux_virtual_machine.manager.custom_data), "mv -f \"$tmp\" ${output.credentials_file}\n")
    error_message = "the manager VM writes the same credentials file, at the same path, for the manager image's user"
  }
}

# Runs (containers on the Docker bridges) cannot reach the instance metadata service (the pool
# identity's tokens), the WireServer but for DNS, NFS anywhere, or the virtual network; the
# rules come back after every start of Docker.
run "runs_cannot_reach_metadata_wireserver_or_nfs" {
  command = apply

  assert {
    condition     = strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), "iptables -C CODALAB-ISOLATION -d 169.254.0.0/16 -j DROP 2>/dev/null || iptables -A CODALAB-ISOLATION -d 169.254.0.0/16 -j DROP\n")
    error_message = "runs must not reach the instance metadata service 169.254.169.254 (link-local dropped from the Docker bridges)"
  }
  assert {
    condition = (
      length(regexall("iptables -A CODALAB-ISOLATION [^\n]*-j (RETURN|ACCEPT)\n", base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]))) == 2 &&
      can(regex("(?s)iptables -A CODALAB-ISOLATION -d 168\\.63\\.129\\.16 -p udp --dport 53 -j RETURN\n.*iptables -A CODALAB-ISOLATION -d 168\\.63\\.129\\.16 -p tcp --dport 53 -j RETURN\n.*iptables -A CODALAB-ISOLATION -d 168\\.63\\.129\\.16 -j DROP\n", base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0])))
    )
    error_message = "runs must not reach the WireServer 168.63.129.16 but for DNS (port 53, the only traffic let through, before the drop)"
  }
  assert {
    condition = (
      strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), "iptables -A CODALAB-ISOLATION -p tcp --dport 2049 -j DROP\n") &&
      strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), "iptables -A CODALAB-ISOLATION -p udp --dport 2049 -j DROP\n")
    )
    error_message = "runs must not reach NFS (TCP and UDP port 2049) anywhere"
  }
  assert {
    condition     = strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), "iptables -A CODALAB-ISOLATION -d 10.42.0.0/16 -j DROP\n")
    error_message = "runs must not reach the virtual network (other nodes, the manager VM)"
  }
  assert {
    condition = alltrue([
      for bridge in ["docker0", "br-+"] : strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), "iptables -C DOCKER-USER -i ${bridge} -j CODALAB-ISOLATION 2>/dev/null || iptables -I DOCKER-USER -i ${bridge} -j CODALAB-ISOLATION\n")
    ])
    error_message = "traffic from every Docker bridge (docker0, br-*) must pass the isolation rules"
  }
  assert {
    condition = alltrue([
      for line in ["After=docker.service\n", "PartOf=docker.service\n", "WantedBy=docker.service\n", "systemctl enable codalab-isolation.service\n", "systemctl restart codalab-isolation.service\n"] :
      strcontains(base64decode(regex("echo ([A-Za-z0-9+/=]+) \\| base64 -d", azurerm_batch_pool.workers.start_task[0].command_line)[0]), line)
    ])
    error_message = "the isolation rules must be applied now and after every start of docker.service"
  }
  assert {
    condition     = strcontains(azurerm_batch_pool.workers.mount[0].nfs_mount[0].mount_options, ",nosuid,nodev")
    error_message = "the nodes mount the share nosuid,nodev"
  }
}

# The nodes have no public address; they connect out through the NAT gateway.
run "nodes_have_no_public_address" {
  command = apply

  assert {
    condition     = azurerm_batch_pool.workers.network_configuration[0].public_address_provisioning_type == "NoPublicIPAddresses"
    error_message = "the pool's nodes must get no public IP address"
  }
  assert {
    condition = (
      azurerm_subnet_nat_gateway_association.pool.subnet_id == azurerm_subnet.pool.id &&
      azurerm_subnet_nat_gateway_association.pool.nat_gateway_id == azurerm_nat_gateway.this.id &&
      azurerm_nat_gateway_public_ip_association.this.public_ip_address_id == azurerm_public_ip.nat.id
    )
    error_message = "the pool's subnet connects out through the NAT gateway and its one address"
  }
}

# The pool's identity reads the password secret and nothing else in the vault; the vault lets
# the pool's subnet in.
run "pool_identity_reads_the_one_secret" {
  command = apply

  assert {
    condition = (
      azurerm_role_assignment.pool_password.role_definition_name == "Key Vault Secrets User" &&
      azurerm_role_assignment.pool_password.scope == "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/codalab-workers/providers/Microsoft.KeyVault/vaults/codalab-kv-abc123/secrets/codalab-password" &&
      azurerm_role_assignment.pool_password.principal_id == "aaaaaaaa-0000-0000-0000-000000000001"
    )
    error_message = "the pool's identity may read the password secret only (Key Vault Secrets User on that secret, not the vault)"
  }
  assert {
    condition     = contains(azurerm_key_vault.this.network_acls[0].virtual_network_subnet_ids, azurerm_subnet.pool.id) && azurerm_key_vault.this.network_acls[0].default_action == "Deny"
    error_message = "the vault denies by default and lets the pool's subnet in"
  }
  assert {
    condition     = azurerm_role_assignment.pool_logs.scope == azurerm_storage_container.logs.id && azurerm_role_assignment.manager_batch.scope == azurerm_batch_account.this.id && azurerm_role_definition.manager.assignable_scopes == tolist([azurerm_batch_account.this.id])
    error_message = "the log role is scoped to the log container, the manager's Batch role to the Batch account"
  }
}
