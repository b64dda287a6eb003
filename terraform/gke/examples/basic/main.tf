# A root module: a GKE cluster with a Spot GPU pool that scales from zero, Filestore for the
# shared work dir, and cl-worker-manager in it.
#
#   terraform init && terraform apply -var-file=codalab.tfvars
#   $(terraform output -raw get_credentials_command)
#   $(terraform output -raw set_password_command)       # reads ./codalab-password.txt
#   terraform output -raw manager_command                 # what the manager runs

terraform {
  required_version = ">= 1.7"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.0"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.38"
    }
  }
}

provider "google" {
  project = var.project
}

data "google_client_config" "current" {}

# The cluster's API, with the caller's own Google credentials (no key file).
provider "kubernetes" {
  host                   = "https://${module.gke.cluster_endpoint}"
  token                  = data.google_client_config.current.access_token
  cluster_ca_certificate = base64decode(module.gke.cluster_ca_certificate)
}

module "gke" {
  source = "../.."

  project             = var.project
  zone                = var.zone
  codalab_server      = var.codalab_server
  authorized_networks = var.authorized_networks
  worker_image        = var.worker_image
  manager_image       = var.manager_image
  max_workers         = 4
}
