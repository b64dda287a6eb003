# A root module that runs CodaLab workers on AWS Batch with the manager on Fargate.
#
#   terraform init && terraform apply -var-file=codalab.tfvars
#   aws secretsmanager put-secret-value --secret-id "$(terraform output -raw password_secret_arn)" \
#     --secret-string file://codalab-password.txt
#
# or, instead of the second step (Terraform >= 1.11; the password is in no state or plan file):
#
#   TF_VAR_codalab_password="$(cat codalab-password.txt)" terraform apply \
#     -var-file=codalab.tfvars -var codalab_password_version=1
#
# (increase codalab_password_version to write a new password).

terraform {
  required_version = ">= 1.11"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.0"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = { project = "codalab" }
  }
}

module "codalab_workers" {
  source = "../.."

  name           = "codalab"
  codalab_server = var.codalab_server
  vpc_id         = var.vpc_id
  subnet_ids     = var.subnet_ids

  cpus         = 4
  memory_mb    = 15360
  max_workers  = 8
  compute_type = "SPOT"
  search       = ["request_gpus=0"]
}

# Optional: the password from an ephemeral variable, written but never stored by Terraform.
resource "aws_secretsmanager_secret_version" "password" {
  count                    = var.codalab_password_version > 0 ? 1 : 0
  secret_id                = module.codalab_workers.password_secret_arn
  secret_string_wo         = var.codalab_password
  secret_string_wo_version = var.codalab_password_version
}
