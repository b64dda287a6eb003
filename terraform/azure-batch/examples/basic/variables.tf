variable "subscription_id" {
  description = "Azure subscription id."
  type        = string
}

variable "location" {
  description = "Azure region."
  type        = string
  default     = "westus2"
}

variable "codalab_server" {
  description = "URL of the CodaLab server."
  type        = string
}

variable "admin_ssh_public_key" {
  description = "SSH public key of the manager VM's admin user."
  type        = string
}

variable "admin_ip_ranges" {
  description = "Public IP ranges of where Terraform runs."
  type        = list(string)
  default     = []
}
