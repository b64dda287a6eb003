# --- Project and network ------------------------------------------------------------------------

variable "project" {
  description = "Google Cloud project id."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project id (6 to 30 lowercase letters, digits or '-')."
  }
}

variable "zone" {
  description = "Zone of the cluster (zonal: one free control plane), its node pools and the Filestore instance; pick one that has the GPU type."
  type        = string
  default     = "us-central1-a"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]-[a-z]$", var.zone))
    error_message = "zone must look like us-central1-a."
  }
}

variable "name" {
  description = "Name of the cluster and prefix of the other resources."
  type        = string
  default     = "codalab"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,24}$", var.name))
    error_message = "name: 1 to 25 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "network" {
  description = "Self link or name of the VPC network of the cluster and of Filestore."
  type        = string
  default     = "default"
}

variable "subnetwork" {
  description = "Name (in the zone's region of var.project) or self link of the nodes' subnetwork (with secondary ranges for pods and services chosen by GKE). Its primary range, the nodes' addresses, is the one range the Filestore share is exported to."
  type        = string
  default     = "default"
}

variable "master_ipv4_cidr_block" {
  description = "/28 range of the private control plane's endpoint peering."
  type        = string
  default     = "172.16.0.0/28"

  validation {
    condition     = can(cidrhost(var.master_ipv4_cidr_block, 0)) && endswith(var.master_ipv4_cidr_block, "/28")
    error_message = "master_ipv4_cidr_block must be a /28 CIDR block."
  }
}

variable "authorized_networks" {
  description = "CIDR blocks that may reach the cluster's API endpoint (where `terraform apply` and kubectl run)."
  type        = list(string)

  validation {
    condition     = length(var.authorized_networks) > 0 && alltrue([for c in var.authorized_networks : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "authorized_networks: at least one CIDR block, and not 0.0.0.0/0."
  }
}

variable "labels" {
  description = "Labels added to every resource."
  type        = map(string)
  default     = {}
}

variable "deletion_protection" {
  description = "Refuse to destroy the cluster and the Filestore instance."
  type        = bool
  default     = true
}

# --- GPU workers --------------------------------------------------------------------------------

variable "gpu_type" {
  description = "Accelerator of the GPU node pool, e.g. nvidia-l4, nvidia-tesla-t4."
  type        = string
  default     = "nvidia-l4"

  validation {
    condition     = can(regex("^nvidia-[a-z0-9-]+$", var.gpu_type))
    error_message = "gpu_type must be an NVIDIA accelerator type such as nvidia-l4."
  }
}

variable "gpus" {
  description = "GPUs per node, and per worker (one worker per node)."
  type        = number
  default     = 1

  validation {
    condition     = contains([1, 2, 4, 8], var.gpus)
    error_message = "gpus must be 1, 2, 4 or 8."
  }
}

variable "machine_type" {
  description = "Machine type of the GPU nodes (must fit gpu_type: g2-* for L4, n1-* for T4)."
  type        = string
  default     = "g2-standard-8"
}

variable "cpus" {
  description = "CPUs of each worker (leave room for the node's own pods: one less than the machine's)."
  type        = number
  default     = 7

  validation {
    condition     = var.cpus >= 1 && floor(var.cpus) == var.cpus
    error_message = "cpus must be a whole number >= 1."
  }
}

variable "memory_mb" {
  description = "Memory of each worker in MiB (below the machine's allocatable memory)."
  type        = number
  default     = 26000

  validation {
    condition     = var.memory_mb >= 1024 && floor(var.memory_mb) == var.memory_mb
    error_message = "memory_mb must be a whole number >= 1024."
  }
}

variable "max_workers" {
  description = "Most GPU nodes, and most workers (--max-workers)."
  type        = number
  default     = 4

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 100 && floor(var.max_workers) == var.max_workers
    error_message = "max_workers must be a whole number from 1 to 100."
  }
}

variable "spot" {
  description = "Spot VMs for the GPU pool (about a third of the price; may be preempted: the run is then lost and reported)."
  type        = bool
  default     = true
}

# --- Shared work dir ----------------------------------------------------------------------------

variable "filestore_tier" {
  description = "Filestore tier of the shared work dir (BASIC_HDD: 1 TiB minimum, the cheapest)."
  type        = string
  default     = "BASIC_HDD"

  validation {
    condition     = contains(["BASIC_HDD", "BASIC_SSD", "ZONAL", "REGIONAL"], var.filestore_tier)
    error_message = "filestore_tier must be BASIC_HDD, BASIC_SSD, ZONAL or REGIONAL."
  }
}

variable "filestore_capacity_gb" {
  description = "Capacity of the Filestore share in GB (BASIC_HDD: at least 1024; BASIC_SSD: at least 2560)."
  type        = number
  default     = 1024

  validation {
    condition     = var.filestore_capacity_gb >= 1024
    error_message = "filestore_capacity_gb must be at least 1024."
  }
}

variable "nfs_owner_uid" {
  description = "Owner uid of the Filestore share: root on the nodes (the worker pods, the kubelet) is squashed to it (ROOT_SQUASH, anon_uid), and runs execute as it (a run runs as its bundle directory's owner). The share's root directory must belong to it (README). The default is above the uids useradd gives (1000-60000) and below systemd's dynamic ones: no account of the nodes or of usual images has it."
  type        = number
  default     = 61000

  validation {
    condition     = var.nfs_owner_uid >= 1 && var.nfs_owner_uid <= 4294967294 && floor(var.nfs_owner_uid) == var.nfs_owner_uid
    error_message = "nfs_owner_uid: a whole number from 1 to 4294967294 (not 0: root is what the squash takes away)."
  }
}

variable "nfs_owner_gid" {
  description = "Owner gid of the Filestore share (anon_gid; see nfs_owner_uid)."
  type        = number
  default     = 61000

  validation {
    condition     = var.nfs_owner_gid >= 1 && var.nfs_owner_gid <= 4294967294 && floor(var.nfs_owner_gid) == var.nfs_owner_gid
    error_message = "nfs_owner_gid: a whole number from 1 to 4294967294 (not 0)."
  }
}

variable "nfs_admin_ip_ranges" {
  description = "Addresses of administration machines outside the nodes' subnetwork (its primary and secondary ranges: nodes, pods, services; checked at plan) that get the share read-write WITHOUT root squash (root as root), e.g. [\"10.10.0.5/32\"] for the one-off chown of the share's root (README). CIDR blocks of /24 or narrower, never 0.0.0.0/0. Leave empty ([]) otherwise."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([
      for r in var.nfs_admin_ip_ranges :
      can(cidrhost(r, 0)) && can(regex("^[0-9.]+/[0-9]+$", r)) && try(tonumber(split("/", r)[1]) >= 24 && tonumber(split("/", r)[1]) <= 32, false) && r != "0.0.0.0/0"
    ])
    error_message = "nfs_admin_ip_ranges: IPv4 CIDR blocks of /24 to /32 (root without squash for a few machines, never 0.0.0.0/0 or a whole network)."
  }
}

# --- CodaLab and the manager (passed to the kubernetes module) -----------------------------------

variable "codalab_server" {
  description = "URL of the CodaLab server."
  type        = string

  validation {
    condition     = can(regex("^https?://[^\\s/]+(/[^\\s]*)?$", var.codalab_server))
    error_message = "codalab_server must be an http(s) URL such as https://worksheets.example.org."
  }
}

variable "codalab_username" {
  description = "CodaLab user of the manager and the workers (the password is set with kubectl: output set_password_command)."
  type        = string
  default     = "codalab"
}

variable "search" {
  description = "Extra `cl search` terms for the bundles these workers take (default: the ones that ask for a GPU)."
  type        = list(string)
  default     = ["request_gpus>=1"]
}

variable "worker_image" {
  description = "Worker image in a registry the nodes can pull from (Artifact Registry), fixed tag or digest."
  type        = string
}

variable "manager_image" {
  description = "Manager image in a registry the nodes can pull from, fixed tag or digest."
  type        = string
}

variable "worker_run_as_user" {
  description = "Every bundle runs as this unprivileged user, numeric UID or UID:GID, never 0 (the kubernetes module's worker_run_as_user: --worker-run-as-user, the workers' --run-as-user; needs workers of this project): owner of its bundle directory only, with every capability dropped (docs/security.md). Images that expect to run as root (installing packages at run time, say) fail under it. null (the default): nfs_owner_uid:nfs_owner_gid, the share's owner, as whom the runs ran anyway. The workers give each bundle directory to this user, which root squashed to nfs_owner_uid can do for that uid only: another one fails every run. \"\" leaves the flag out: bundles then run as their directory's owner, as CodaLab does, unless the worker image sets CL_WORKER_RUN_AS_USER (docker/Dockerfile's sets 65534:65534). With that image, \"\" fails every run too."
  type        = string
  default     = null

  validation {
    condition     = var.worker_run_as_user == null || var.worker_run_as_user == "" || var.worker_run_as_user == "none" || (can(regex("^[1-9][0-9]{0,9}(:[1-9][0-9]{0,9})?$", var.worker_run_as_user)) && try(alltrue([for id in split(":", var.worker_run_as_user) : tonumber(id) <= 4294967294]), false))
    error_message = "worker_run_as_user: a numeric UID or UID:GID from 1 to 4294967294 (not 0: root is what it takes away), \"none\" (bundles run as their directory's owner, even in an image that sets CL_WORKER_RUN_AS_USER), \"\" to leave --worker-run-as-user out, or null for nfs_owner_uid:nfs_owner_gid."
  }
}
