# A root module: CodaLab workers on an Azure Batch autoscale pool, the manager on a small VM.
#
#   az login && terraform init && terraform apply -var-file=codalab.tfvars
#   $(terraform output -raw set_password_command)     # reads ./codalab-password.txt
#   terraform output -raw manager_command               # what the manager runs

terraform {
  required_version = ">= 1.7"

  required_providers {
    azurerm = {
      source  = "hashicorp/azurerm"
      version = "~> 4.0"
    }
  }
}

provider "azurerm" {
  features {}
  subscription_id     = var.subscription_id
  storage_use_azuread = true
}

module "codalab_workers" {
  source = "../.."

  location             = var.location
  codalab_server       = var.codalab_server
  admin_ssh_public_key = var.admin_ssh_public_key
  admin_ip_ranges      = var.admin_ip_ranges

  vm_size     = "Standard_D8s_v5"
  cpus        = 8
  memory_mb   = 30720
  max_workers = 10
  search      = ["request_gpus=0"]
}
