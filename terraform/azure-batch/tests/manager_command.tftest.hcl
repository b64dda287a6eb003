# The manager's command line, and what must hold around it, with a mock azurerm provider (no
# subscription, no network).

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
    values = { id = "/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/codalab-workers/providers/Microsoft.ManagedIdentity/userAssignedIdentities/codalab-pool" }
  }
  override_resource {
    target = azurerm_user_assigned_identity.manager
    values = { client_id = "11111111-2222-3333-4444-555555555555" }
  }
  override_resource {
    target = azurerm_key_vault.this
    values = { vault_uri = "https://codalab-kv-abc123.vault.azure.net/" }
  }
}

variables {
  location             = "westus2"
  codalab_server       = "https://worksheets.example.org"
  admin_ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0eXhhbXBsZWtleWZvcnRlc3RzMDEyMzQ1Njc4OQ"
}

run "manager_command" {
  command = apply

  assert {
    condition     = output.manager_command == "cl-worker-manager --server https://worksheets.example.org --min-workers 0 --max-workers 10 --worker-work-dir-prefix /mnt/batch/tasks/fsmounts/codalab --worker-run-as-user 65534:65534 --metrics-addr 127.0.0.1:9464 azure-batch --account-name ${azurerm_batch_account.this.name} --service-url https://codalabbatchabc123.westus2.batch.azure.com --log-container-url https://${azurerm_storage_account.logs.name}.blob.core.windows.net/worker-logs --log-container-identity /subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/codalab-workers/providers/Microsoft.ManagedIdentity/userAssignedIdentities/codalab-pool --job-id codalab-workers --pool-id codalab-pool --cpus 4 --gpus 0 --memory-mb 14336 --worker-image codalab/worker:0.1.0 --password-file /etc/codalab/worker-credentials"
    error_message = "unexpected manager command: ${output.manager_command}"
  }
  assert {
    condition     = can(regex("^codalabbatch[0-9a-f]{6}$", azurerm_batch_account.this.name)) && can(regex("^codalablogs[0-9a-f]{6}$", azurerm_storage_account.logs.name))
    error_message = "account names are the name prefix and a stable suffix"
  }
  assert {
    condition     = strcontains(output.manager_command, " --worker-run-as-user 65534:65534 ")
    error_message = "by default the workers run every bundle as nobody (--worker-run-as-user 65534:65534)"
  }
  assert {
    condition     = strcontains(base64decode(azurerm_linux_virtual_machine.manager.custom_data), "ExecStart=/usr/bin/docker run --rm --name cl-worker-manager --network host --user 65532:65532 --env AZURE_CLIENT_ID=11111111-2222-3333-4444-555555555555 -v /etc/codalab/worker-credentials:/etc/codalab/worker-credentials:ro codalab/cl-worker-manager:0.1.0 ${output.manager_command}\n")
    error_message = "the manager VM must run the manager_command, as the image's user, with the credentials file mounted read-only"
  }
}

run "no_secret_anywhere" {
  command = apply

  assert {
    condition     = azurerm_batch_account.this.allowed_authentication_modes == toset(["AAD"]) && !azurerm_storage_account.logs.shared_access_key_enabled
    error_message = "Microsoft Entra ID only: no Batch shared key, no storage account key"
  }
  assert {
    condition     = !strcontains(base64decode(azurerm_linux_virtual_machine.manager.custom_data), "CODALAB_PASSWORD") && strcontains(base64decode(azurerm_linux_virtual_machine.manager.custom_data), "printf '%s\\n%s\\n' 'codalab' \"$password\" >\"$tmp\"")
    error_message = "the manager's password comes from Key Vault at start, not from Terraform"
  }
  assert {
    condition     = azurerm_role_assignment.manager_password.role_definition_name == "Key Vault Secrets User" && endswith(azurerm_role_assignment.manager_password.scope, "/secrets/codalab-password")
    error_message = "the manager may read the password secret and nothing else in the vault"
  }
  assert {
    condition     = azurerm_role_definition.manager.permissions[0].actions == tolist(["Microsoft.Batch/batchAccounts/read", "Microsoft.Batch/batchAccounts/jobs/read", "Microsoft.Batch/batchAccounts/jobs/write", "Microsoft.Batch/batchAccounts/pools/read"])
    error_message = "the manager's Batch role is its calls only"
  }
}

run "pool_scales_from_zero_with_the_example_formula" {
  command = apply

  variables {
    min_workers = 1
    max_workers = 25
  }

  assert {
    condition     = strcontains(azurerm_batch_pool.workers.auto_scale[0].formula, "maxNodes = 25;") && strcontains(azurerm_batch_pool.workers.auto_scale[0].formula, "minNodes = 1;") && strcontains(azurerm_batch_pool.workers.auto_scale[0].formula, "$NodeDeallocationOption = taskcompletion;")
    error_message = "the pool's formula is examples/azure/autoscale.formula with this module's bounds"
  }
  assert {
    condition     = azurerm_batch_pool.workers.container_configuration[0].container_image_names == toset(["codalab/worker:0.1.0"]) && azurerm_batch_pool.workers.max_tasks_per_node == 1
    error_message = "the worker image is prefetched, one worker per node"
  }
  assert {
    condition     = azurerm_batch_pool.workers.mount[0].nfs_mount[0].relative_mount_path == "codalab" && azurerm_storage_share.nfs.enabled_protocol == "NFS"
    error_message = "the shared work dir is the NFS share at fsmounts/codalab"
  }
}

run "max_workers_below_min_workers" {
  command = plan

  variables {
    min_workers = 5
    max_workers = 2
  }

  expect_failures = [azurerm_batch_pool.workers]
}

run "latest_is_not_a_version" {
  command = plan

  variables {
    worker_image = "codalab/worker:latest"
  }

  expect_failures = [var.worker_image]
}

run "run_as_user_left_out" {
  command = apply

  variables {
    worker_run_as_user = ""
  }

  assert {
    condition     = !strcontains(output.manager_command, "--worker-run-as-user")
    error_message = "worker_run_as_user = \"\" must leave --worker-run-as-user out"
  }
}

run "run_as_user_never_root" {
  command = plan

  variables {
    worker_run_as_user = "nobody"
  }

  expect_failures = [var.worker_run_as_user]
}
