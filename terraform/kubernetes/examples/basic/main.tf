# A root module that runs CodaLab workers in an existing Kubernetes cluster (nodes with Docker,
# --bundle-runtime docker), with the work dir on an NFS export.
#
#   terraform init && terraform apply -var codalab_server=https://worksheets.example.org \
#     -var nfs_server=10.0.0.2
#   $(terraform output -raw set_password_command)     # reads ./codalab-password.txt
#   terraform output -raw manager_command               # what the manager runs

terraform {
  required_version = ">= 1.7"

  required_providers {
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.38"
    }
  }
}

provider "kubernetes" {
  config_path    = var.kubeconfig
  config_context = var.kube_context
}

module "codalab_workers" {
  source = "../.."

  codalab_server    = var.codalab_server
  create_nfs_volume = true
  nfs_server        = var.nfs_server
  nfs_path          = var.nfs_path

  cpus        = 4
  memory_mb   = 15360
  max_workers = 8
  search      = ["request_gpus=0"]
}
