# cl-worker-manager on a small Linux VM. Not Azure Container Instances: the VM reads the password
# from Key Vault with its own identity into a file at start, so that no container definition and
# no Terraform state holds it. No public address (outbound through the NAT gateway); SSH by key
# only, from the virtual network. The VM does not mount the NFS share: the manager passes the
# share's path to the workers and writes nothing there.

locals {
  # The manager image's own non-root user (docker/Dockerfile): the container runs as it, and the
  # credentials file is its own.
  manager_uid = 65532

  cloud_init = templatefile("${path.module}/cloud-init.yaml.tftpl", {
    manager_client_id = azurerm_user_assigned_identity.manager.client_id
    manager_uid       = local.manager_uid
    credentials_file  = local.credentials_file
    credentials = templatefile("${path.module}/credentials.sh.tftpl", merge(local.credentials_vars, {
      client_id = azurerm_user_assigned_identity.manager.client_id
      owner     = "${local.manager_uid}:${local.manager_uid}"
    }))
    manager_image = var.manager_image
    # The image has no entrypoint: the whole command line, shell-quoted; systemd would expand
    # `%` specifiers and `$` variables in it, so those are doubled.
    manager_command = replace(replace(local.manager_command, "%", "%%"), "$", "$$")
  })
}

#trivy:ignore:AVD-AZU-0068 The NIC's subnet carries the network security group (azurerm_subnet_network_security_group_association.manager).
resource "azurerm_network_interface" "manager" {
  name                = "${var.name}-manager"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = local.tags

  ip_configuration {
    name                          = "internal"
    subnet_id                     = azurerm_subnet.manager.id
    private_ip_address_allocation = "Dynamic"
  }
}

resource "azurerm_linux_virtual_machine" "manager" {
  #checkov:skip=CKV_AZURE_50:cloud-init (custom_data) is the only extension-like setup; no VM extension is installed.
  name                            = "${var.name}-manager"
  location                        = azurerm_resource_group.this.location
  resource_group_name             = azurerm_resource_group.this.name
  size                            = var.manager_vm_size
  admin_username                  = "codalab"
  disable_password_authentication = true
  network_interface_ids           = [azurerm_network_interface.manager.id]
  custom_data                     = base64encode(local.cloud_init)
  encryption_at_host_enabled      = true
  allow_extension_operations      = false
  tags                            = local.tags

  admin_ssh_key {
    username   = "codalab"
    public_key = var.admin_ssh_public_key
  }

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.manager.id]
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "Standard_LRS"
    disk_size_gb         = 30
  }

  source_image_reference {
    publisher = "Canonical"
    offer     = "0001-com-ubuntu-server-jammy"
    sku       = "22_04-lts-gen2"
    version   = "latest"
  }

  # The secret must be readable before the service starts, the network reachable before
  # cloud-init installs Docker.
  depends_on = [
    azurerm_role_assignment.manager_password,
    azurerm_role_assignment.manager_batch,
    azurerm_subnet_nat_gateway_association.manager,
  ]
}
