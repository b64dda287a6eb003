# --- Naming and network -------------------------------------------------------------------------

variable "name" {
  description = "Prefix of every resource name (letters, digits and '-'; starts with a letter). Also the worker job definition name."
  type        = string
  default     = "codalab"

  validation {
    condition     = can(regex("^[A-Za-z][A-Za-z0-9-]{0,31}$", var.name))
    error_message = "name: 1 to 32 letters, digits or '-', starting with a letter."
  }
}

variable "vpc_id" {
  description = "VPC of the workers, the manager and the shared file system."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))
    error_message = "vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "subnet_ids" {
  description = "Subnets (one per Availability Zone, each AZ at most once) for the worker instances, the manager task and the EFS mount targets. Private subnets with a NAT gateway: workers pull Docker images and reach the CodaLab server."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 1 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "subnet_ids: at least one id like subnet-0123456789abcdef0."
  }
  validation {
    condition     = length(distinct(var.subnet_ids)) == length(var.subnet_ids)
    error_message = "subnet_ids must not repeat a subnet."
  }
}

variable "assign_public_ip" {
  description = "Give the manager task a public IP (only for public subnets without a NAT gateway)."
  type        = bool
  default     = false
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
  description = "CodaLab user the manager and its workers log in as (CODALAB_USERNAME). Its password goes into the Secrets Manager secret this module creates, never into Terraform."
  type        = string
  default     = "codalab"

  validation {
    condition     = length(var.codalab_username) > 0 && !can(regex("\\s", var.codalab_username))
    error_message = "codalab_username must be non-empty, without whitespace."
  }
}

variable "password_secret_recovery_days" {
  description = "Days a deleted password secret can still be restored (0 deletes at once)."
  type        = number
  default     = 7

  validation {
    condition     = var.password_secret_recovery_days == 0 || (var.password_secret_recovery_days >= 7 && var.password_secret_recovery_days <= 30)
    error_message = "password_secret_recovery_days: 0, or 7 to 30."
  }
}

# --- Worker shape and scaling ---------------------------------------------------------------------

variable "cpus" {
  description = "vCPUs of one worker (--cpus)."
  type        = number
  default     = 1

  validation {
    condition     = var.cpus >= 1 && var.cpus <= 192 && floor(var.cpus) == var.cpus
    error_message = "cpus: a whole number from 1 to 192."
  }
}

variable "gpus" {
  description = "GPUs of one worker (--gpus). Above 0, the compute environment uses the ECS GPU-optimised AMI and instance_types must list GPU instance types."
  type        = number
  default     = 0

  validation {
    condition     = var.gpus >= 0 && var.gpus <= 16 && floor(var.gpus) == var.gpus
    error_message = "gpus: a whole number from 0 to 16."
  }
}

variable "memory_mb" {
  description = "Memory of one worker in MiB (--memory-mb). Leave room for the ECS agent: an instance with 16 GiB offers about 15 GiB to jobs."
  type        = number
  default     = 2048

  validation {
    condition     = var.memory_mb >= 512 && var.memory_mb <= 2097152 && floor(var.memory_mb) == var.memory_mb
    error_message = "memory_mb: a whole number of MiB from 512 to 2097152."
  }
}

variable "min_workers" {
  description = "Workers the manager keeps at least (--min-workers). 0 lets the compute environment scale to no instance when idle."
  type        = number
  default     = 0

  validation {
    condition     = var.min_workers >= 0 && floor(var.min_workers) == var.min_workers
    error_message = "min_workers: a whole number >= 0."
  }
}

variable "max_workers" {
  description = "Workers (pending ones included) the manager has at most (--max-workers). Must be >= min_workers."
  type        = number
  default     = 10

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 1000 && floor(var.max_workers) == var.max_workers
    error_message = "max_workers: a whole number from 1 to 1000."
  }
}

variable "max_vcpus" {
  description = "Upper bound of the compute environment in vCPUs (default: cpus * max_workers). Caps the EC2 spend."
  type        = number
  default     = null

  validation {
    condition     = var.max_vcpus == null || try(var.max_vcpus >= 1 && floor(var.max_vcpus) == var.max_vcpus, false)
    error_message = "max_vcpus: a whole number >= 1, or null."
  }
}

variable "compute_type" {
  description = "EC2 (On-Demand) or SPOT instances for the workers. Spot reclaims stop the worker with SIGTERM; it hands its runs back to the server."
  type        = string
  default     = "EC2"

  validation {
    condition     = contains(["EC2", "SPOT"], var.compute_type)
    error_message = "compute_type: EC2 or SPOT."
  }
}

variable "spot_bid_percentage" {
  description = "For SPOT: the highest Spot price, in percent of the On-Demand price."
  type        = number
  default     = 100

  validation {
    condition     = var.spot_bid_percentage >= 1 && var.spot_bid_percentage <= 100
    error_message = "spot_bid_percentage: 1 to 100."
  }
}

variable "instance_types" {
  description = "Instance types or families of the compute environment, e.g. [\"c6i\", \"m6i\"], or GPU types such as [\"g5.xlarge\", \"g4dn.xlarge\"]. \"optimal\" lets Batch choose (CPU only)."
  type        = list(string)
  default     = ["optimal"]

  validation {
    condition     = length(var.instance_types) >= 1 && alltrue([for t in var.instance_types : can(regex("^[a-z0-9][a-z0-9.-]*$", t))])
    error_message = "instance_types: at least one instance type or family, such as c6i, g5.xlarge or optimal."
  }
}

variable "root_volume_gb" {
  description = "Root EBS volume of a worker instance in GiB (Docker images and containers live there)."
  type        = number
  default     = 100

  validation {
    condition     = var.root_volume_gb >= 30 && var.root_volume_gb <= 16384
    error_message = "root_volume_gb: 30 to 16384."
  }
}

variable "search" {
  description = "Extra keywords for the staged-bundle query (--search), e.g. [\"request_gpus=0\"]."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for s in var.search : length(s) > 0 && !startswith(s, "-")])
    error_message = "search: non-empty keywords, none starting with '-'."
  }
}

variable "worker_tag" {
  description = "Tag of the workers (--worker-tag), or null."
  type        = string
  default     = null
}

variable "worker_tag_exclusive" {
  description = "Workers run only bundles with their tag (--worker-tag-exclusive; needs worker_tag)."
  type        = bool
  default     = false
}

variable "worker_idle_seconds" {
  description = "Seconds a worker without runs waits before it exits (--worker-idle-seconds)."
  type        = number
  default     = 600

  validation {
    condition     = var.worker_idle_seconds >= 1 && floor(var.worker_idle_seconds) == var.worker_idle_seconds
    error_message = "worker_idle_seconds: a whole number >= 1."
  }
}

variable "worker_max_work_dir_size" {
  description = "Size limit of a worker's work dir on the shared file system (--worker-max-work-dir-size), e.g. 10g."
  type        = string
  default     = "10g"

  validation {
    condition     = can(regex("^[0-9]+[kmgt]?$", var.worker_max_work_dir_size))
    error_message = "worker_max_work_dir_size: a number with an optional k, m, g or t suffix, e.g. 10g."
  }
}

variable "worker_delete_work_dir_on_exit" {
  description = "Workers delete their work dir when they exit (--worker-delete-work-dir-on-exit). Each AWS Batch worker has its own directory on EFS; without this they pile up and cost storage."
  type        = bool
  default     = true
}

variable "job_queue_name" {
  description = "Name of the Batch job queue (default: <name>-workers)."
  type        = string
  default     = null

  validation {
    condition     = var.job_queue_name == null || can(regex("^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$", coalesce(var.job_queue_name, "x")))
    error_message = "job_queue_name: up to 128 letters, digits, '-' or '_'."
  }
}

# --- Images, shared work dir, logs ------------------------------------------------------------------

variable "manager_image" {
  description = "Image of the manager; it must have cl-worker-manager on its PATH."
  type        = string
  default     = "codalab/worker-manager:0.1.0"
}

variable "worker_image" {
  description = "Image of the workers (--worker-image); it must have cl-worker on its PATH. Pin a tag."
  type        = string
  default     = "codalab/worker:latest"
}

variable "shared_work_dir" {
  description = "Where the instances mount the EFS file system; the workers' work dirs go below it (--worker-work-dir-prefix). The same path inside and outside the worker container."
  type        = string
  default     = "/mnt/codalab"

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$", var.shared_work_dir)) && !can(regex("(^|/)\\.\\.(/|$)", var.shared_work_dir))
    error_message = "shared_work_dir: an absolute path without '..' or a trailing '/', e.g. /mnt/codalab."
  }
}

variable "shared_work_dir_uid" {
  description = "Owner uid of the shared work dir. The EFS access point makes every NFS call of the instances act as this uid (root in a container included: no client is root on the file system), and runs execute as it (a run runs as its bundle directory's owner). The default is above the uids useradd gives (1000-60000) and below systemd's dynamic ones (61184-65519): no account of the instances or of usual images has it."
  type        = number
  default     = 61000

  validation {
    condition     = var.shared_work_dir_uid >= 1 && var.shared_work_dir_uid <= 4294967294 && floor(var.shared_work_dir_uid) == var.shared_work_dir_uid
    error_message = "shared_work_dir_uid: a whole number from 1 to 4294967294 (not 0: root is what the access point takes away)."
  }
}

variable "shared_work_dir_gid" {
  description = "Owner gid of the shared work dir (the access point's gid; see shared_work_dir_uid)."
  type        = number
  default     = 61000

  validation {
    condition     = var.shared_work_dir_gid >= 1 && var.shared_work_dir_gid <= 4294967294 && floor(var.shared_work_dir_gid) == var.shared_work_dir_gid
    error_message = "shared_work_dir_gid: a whole number from 1 to 4294967294 (not 0)."
  }
}

variable "worker_run_as_user" {
  description = "Every bundle runs as this unprivileged user, numeric UID or UID:GID, never 0 (--worker-run-as-user, the workers' --run-as-user; needs workers of this project): owner of its bundle directory only, with every capability dropped (docs/security.md). Images that expect to run as root (installing packages at run time, say) fail under it. null (the default): shared_work_dir_uid:shared_work_dir_gid, the EFS access point's owner, as whom every NFS call acts and the runs ran anyway. The workers give each bundle directory to this user, which through the access point they can do for that uid only: another one fails every run. \"\" leaves the flag out: bundles then run as their directory's owner, as CodaLab does, unless the worker image sets CL_WORKER_RUN_AS_USER (docker/Dockerfile's sets 65534:65534). With that image, \"\" fails every run too."
  type        = string
  default     = null

  validation {
    condition     = var.worker_run_as_user == null || var.worker_run_as_user == "" || var.worker_run_as_user == "none" || (can(regex("^[1-9][0-9]{0,9}(:[1-9][0-9]{0,9})?$", var.worker_run_as_user)) && try(alltrue([for id in split(":", var.worker_run_as_user) : tonumber(id) <= 4294967294]), false))
    error_message = "worker_run_as_user: a numeric UID or UID:GID from 1 to 4294967294 (not 0: root is what it takes away), \"none\" (bundles run as their directory's owner, even in an image that sets CL_WORKER_RUN_AS_USER), \"\" to leave --worker-run-as-user out, or null for shared_work_dir_uid:shared_work_dir_gid."
  }
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the manager's logs."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a value CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, ..., 365, ..., 3653)."
  }
}

variable "manager_cpu" {
  description = "Fargate CPU units of the manager task (256 = 0.25 vCPU)."
  type        = number
  default     = 256

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096], var.manager_cpu)
    error_message = "manager_cpu: 256, 512, 1024, 2048 or 4096."
  }
}

variable "manager_memory_mb" {
  description = "Memory of the manager task in MiB (a size Fargate allows for manager_cpu)."
  type        = number
  default     = 512

  validation {
    condition     = var.manager_memory_mb >= 512 && var.manager_memory_mb <= 30720
    error_message = "manager_memory_mb: 512 to 30720."
  }
}
