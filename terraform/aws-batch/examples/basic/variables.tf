variable "region" {
  description = "AWS region."
  type        = string
  default     = "us-east-1"
}

variable "codalab_server" {
  description = "URL of the CodaLab server."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the workers and the manager."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets (with a NAT gateway), one per Availability Zone."
  type        = list(string)
}

variable "codalab_password" {
  description = "The CodaLab password, only when codalab_password_version > 0 (e.g. TF_VAR_codalab_password). Ephemeral: never in state or plan files."
  type        = string
  default     = null
  sensitive   = true
  ephemeral   = true
}

variable "codalab_password_version" {
  description = "0: the password is put into the secret out of band (aws secretsmanager put-secret-value). 1 or more: written from codalab_password; increase it to write a new one."
  type        = number
  default     = 0

  validation {
    condition     = var.codalab_password_version >= 0 && floor(var.codalab_password_version) == var.codalab_password_version
    error_message = "codalab_password_version: a whole number >= 0."
  }
}
