variable "project" {
  description = "Google Cloud project id."
  type        = string
}

variable "zone" {
  description = "Zone of the cluster (one with L4 GPUs)."
  type        = string
  default     = "us-central1-a"
}

variable "codalab_server" {
  description = "URL of the CodaLab server."
  type        = string
}

variable "authorized_networks" {
  description = "CIDR blocks that may reach the cluster's API (where Terraform and kubectl run)."
  type        = list(string)
}

variable "worker_image" {
  description = "Worker image in Artifact Registry, fixed tag."
  type        = string
}

variable "manager_image" {
  description = "Manager image in Artifact Registry, fixed tag."
  type        = string
}
