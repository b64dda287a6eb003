# --- Naming and network -------------------------------------------------------------------------

variable "name" {
  description = "Prefix of every resource name (lowercase letters and digits; storage account and Batch account names derive from it)."
  type        = string
  default     = "codalab"

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{2,11}$", var.name))
    error_message = "name: 3 to 12 lowercase letters or digits, starting with a letter."
  }
}

variable "location" {
  description = "Azure region, e.g. westus2."
  type        = string
}

variable "address_space" {
  description = "Address space of the virtual network (a /16 is split into the pool's and the manager's subnets)."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.address_space, 0)) && tonumber(split("/", var.address_space)[1]) <= 22
    error_message = "address_space must be a CIDR block of /22 or larger."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}

# --- CodaLab ------------------------------------------------------------------------------------

variable "codalab_server" {
  description = "URL of the CodaLab server (the manager's and the workers' --server)."
  type        = string

  validation {
    condition     = can(regex("^https?://[^\\s/]+(/[^\\s]*)?$", var.codalab_server))
    error_message = "codalab_server must be an http(s) URL such as https://worksheets.example.org."
  }
}

variable "codalab_username" {
  description = "CodaLab user of the manager and its workers. Its password goes into the Key Vault secret this module creates the vault for, never into Terraform (output set_password_command)."
  type        = string
  default     = "codalab"

  validation {
    condition     = length(var.codalab_username) > 0 && !can(regex("\\s", var.codalab_username))
    error_message = "codalab_username must be non-empty, without whitespace."
  }
}

variable "search" {
  description = "Extra `cl search` terms for the staged bundles this manager serves (--search)."
  type        = list(string)
  default     = []
}

# --- Workers ------------------------------------------------------------------------------------

variable "vm_size" {
  description = "VM size of the pool's nodes (one worker per node), e.g. Standard_D4s_v5, or Standard_NC4as_T4_v3 for a GPU."
  type        = string
  default     = "Standard_D4s_v5"
}

variable "cpus" {
  description = "CPUs of each worker (--cpus), at most the VM size's."
  type        = number
  default     = 4

  validation {
    condition     = var.cpus >= 1 && floor(var.cpus) == var.cpus
    error_message = "cpus must be a whole number >= 1."
  }
}

variable "gpus" {
  description = "GPUs of each worker (--gpus); the VM size must have them."
  type        = number
  default     = 0

  validation {
    condition     = var.gpus >= 0 && var.gpus <= 8 && floor(var.gpus) == var.gpus
    error_message = "gpus must be a whole number from 0 to 8."
  }
}

variable "memory_mb" {
  description = "Memory of each worker in MiB (--memory-mb), below the VM size's."
  type        = number
  default     = 14336

  validation {
    condition     = var.memory_mb >= 1024 && floor(var.memory_mb) == var.memory_mb
    error_message = "memory_mb must be a whole number >= 1024."
  }
}

variable "min_workers" {
  description = "Nodes (and workers) kept with nothing staged; 0 costs nothing idle."
  type        = number
  default     = 0

  validation {
    condition     = var.min_workers >= 0 && floor(var.min_workers) == var.min_workers
    error_message = "min_workers must be a whole number >= 0."
  }
}

variable "max_workers" {
  description = "Most nodes of the pool and most workers (--max-workers)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 500 && floor(var.max_workers) == var.max_workers
    error_message = "max_workers must be a whole number from 1 to 500."
  }
}

variable "worker_image" {
  description = "Worker image (docker/Dockerfile --target worker) in a registry the pool can pull from; prefetched onto every node. Fixed tag or digest."
  type        = string
  default     = "codalab/worker:0.1.0"

  validation {
    condition     = can(regex("^[^\\s]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.worker_image)) && !endswith(var.worker_image, ":latest")
    error_message = "worker_image needs a fixed tag or digest (not latest)."
  }
}

variable "worker_run_as_user" {
  description = "Every bundle runs as this unprivileged user, numeric UID or UID:GID, never 0 (--worker-run-as-user, the workers' --run-as-user; needs workers of this project): owner of its bundle directory only, with every capability dropped (docs/security.md). Images that expect to run as root (installing packages at run time, say) fail under it. \"\" leaves the flag out: bundles then run as their directory's owner, as CodaLab does, unless the worker image sets CL_WORKER_RUN_AS_USER (docker/Dockerfile's sets 65534:65534). The workers give each bundle directory to this user, which the share (NoRootSquash) lets root do."
  type        = string
  default     = "65534:65534"
  nullable    = false

  validation {
    condition     = var.worker_run_as_user == "" || var.worker_run_as_user == "none" || (can(regex("^[1-9][0-9]{0,9}(:[1-9][0-9]{0,9})?$", var.worker_run_as_user)) && try(alltrue([for id in split(":", var.worker_run_as_user) : tonumber(id) <= 4294967294]), false))
    error_message = "worker_run_as_user: a numeric UID or UID:GID from 1 to 4294967294 (not 0: root is what it takes away), or \"none\" (bundles run as their directory's owner, even in an image that sets CL_WORKER_RUN_AS_USER), or \"\" to leave --worker-run-as-user out."
  }
}

variable "nfs_quota_gb" {
  description = "Size of the shared work dir's NFS share in GiB (Premium Azure Files: 100 at least, billed as provisioned)."
  type        = number
  default     = 100

  validation {
    condition     = var.nfs_quota_gb >= 100 && var.nfs_quota_gb <= 102400
    error_message = "nfs_quota_gb must be from 100 to 102400."
  }
}

# --- The manager --------------------------------------------------------------------------------

variable "manager_image" {
  description = "Manager image (docker/Dockerfile --target manager) in a registry the manager VM can pull from. Fixed tag or digest."
  type        = string
  default     = "codalab/cl-worker-manager:0.1.0"

  validation {
    condition     = can(regex("^[^\\s]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.manager_image)) && !endswith(var.manager_image, ":latest")
    error_message = "manager_image needs a fixed tag or digest (not latest)."
  }
}

variable "manager_vm_size" {
  description = "VM size of the manager (a B1s is enough: one process, a tick every few seconds)."
  type        = string
  default     = "Standard_B1s"
}

variable "admin_ssh_public_key" {
  description = "SSH public key of the manager VM's admin user (password login is off; the VM has no public address: reach it through Azure Bastion or the network)."
  type        = string

  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp[0-9]+) [A-Za-z0-9+/=]+", var.admin_ssh_public_key))
    error_message = "admin_ssh_public_key must be an OpenSSH public key."
  }
}

variable "admin_ip_ranges" {
  description = "Public IP ranges (CIDR, without /32 for one address) of where Terraform runs: the storage accounts and the Key Vault accept them besides the virtual network."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.admin_ip_ranges : can(regex("^[0-9.]+(/[0-9]+)?$", c)) && c != "0.0.0.0/0"])
    error_message = "admin_ip_ranges: IPv4 addresses or CIDR blocks, not 0.0.0.0/0."
  }
}
