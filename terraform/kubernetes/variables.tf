# --- Namespace and names ------------------------------------------------------------------------

variable "namespace" {
  description = "Namespace of the manager, its worker pods, the credentials Secret and the work-dir claim (the manager's --namespace)."
  type        = string
  default     = "codalab"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a DNS label: lowercase letters, digits and '-', at most 63."
  }
}

variable "create_namespace" {
  description = "Create the namespace (false: it exists already)."
  type        = bool
  default     = true
}

variable "manager_name" {
  description = "The manager's --manager-name, in a label of every worker pod: two managers in one namespace need two names."
  type        = string
  default     = "cl-worker-manager"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.manager_name))
    error_message = "manager_name must be a DNS label (it is also a label value)."
  }
}

variable "labels" {
  description = "Labels added to every object."
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
  description = "CodaLab user the manager and its workers log in as; stored in the credentials Secret. The password is put there out of band (set_password_command), never through Terraform."
  type        = string
  default     = "codalab"

  validation {
    condition     = length(var.codalab_username) > 0 && !can(regex("\\s", var.codalab_username))
    error_message = "codalab_username must be non-empty, without whitespace."
  }
}

variable "credentials_secret_name" {
  description = "Name of the Secret (keys username and password) the manager and the workers read (--password-secret)."
  type        = string
  default     = "codalab-worker-credentials"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", var.credentials_secret_name))
    error_message = "credentials_secret_name must be a DNS subdomain name."
  }
}

variable "search" {
  description = "Extra `cl search` terms for the staged bundles this manager serves (--search), e.g. [\"request_gpus>=1\"]."
  type        = list(string)
  default     = []
}

variable "worker_tag" {
  description = "Tag of the workers (--worker-tag): only bundles with this request_queue go to them when worker_tag_exclusive."
  type        = string
  default     = null
}

variable "worker_tag_exclusive" {
  description = "Workers run only bundles whose request_queue is worker_tag (--worker-tag-exclusive)."
  type        = bool
  default     = false
}

# --- Workers ------------------------------------------------------------------------------------

variable "bundle_runtime" {
  description = "How workers run bundles: docker (the node's Docker engine, through its socket) or kubernetes (one pod per bundle; for nodes on containerd, such as GKE's)."
  type        = string
  default     = "docker"

  validation {
    condition     = contains(["docker", "kubernetes"], var.bundle_runtime)
    error_message = "bundle_runtime must be docker or kubernetes."
  }
}

variable "cpus" {
  description = "CPUs of each worker pod (--cpus)."
  type        = number
  default     = 1

  validation {
    condition     = var.cpus >= 1 && var.cpus <= 256 && floor(var.cpus) == var.cpus
    error_message = "cpus must be a whole number from 1 to 256."
  }
}

variable "gpus" {
  description = "NVIDIA GPUs of each worker pod (--gpus); GPU pods tolerate the nvidia.com/gpu taint."
  type        = number
  default     = 0

  validation {
    condition     = var.gpus >= 0 && var.gpus <= 16 && floor(var.gpus) == var.gpus
    error_message = "gpus must be a whole number from 0 to 16."
  }
}

variable "memory_mb" {
  description = "Memory of each worker pod in MiB (--memory-mb)."
  type        = number
  default     = 2048

  validation {
    condition     = var.memory_mb >= 512 && floor(var.memory_mb) == var.memory_mb
    error_message = "memory_mb must be a whole number >= 512."
  }
}

variable "min_workers" {
  description = "Workers kept running with nothing staged (--min-workers); 0 costs nothing idle."
  type        = number
  default     = 0

  validation {
    condition     = var.min_workers >= 0 && floor(var.min_workers) == var.min_workers
    error_message = "min_workers must be a whole number >= 0."
  }
}

variable "max_workers" {
  description = "Most worker pods at once (--max-workers)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 1000 && floor(var.max_workers) == var.max_workers
    error_message = "max_workers must be a whole number from 1 to 1000."
  }
}

variable "node_selector" {
  description = "Worker pods only on nodes with these labels (--node-selector KEY=VALUE each), e.g. { \"cloud.google.com/gke-nodepool\" = \"gpu\" }."
  type        = map(string)
  default     = {}
}

variable "tolerations" {
  description = "Taints the worker pods tolerate (--toleration KEY[=VALUE][:EFFECT] each)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for t in var.tolerations : can(regex("^[A-Za-z0-9./_-]+(=[A-Za-z0-9._-]*)?(:(NoSchedule|PreferNoSchedule|NoExecute))?$", t))])
    error_message = "each toleration is KEY[=VALUE][:EFFECT], EFFECT one of NoSchedule, PreferNoSchedule, NoExecute."
  }
}

variable "worker_image" {
  description = "Image of the worker pods (docker/Dockerfile --target worker), pushed to a registry the cluster pulls from; a fixed tag or digest."
  type        = string
  default     = "codalab/worker:0.1.0"

  validation {
    condition     = can(regex("^[^\\s]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.worker_image)) && !endswith(var.worker_image, ":latest")
    error_message = "worker_image needs a fixed tag or digest (not latest): pods restarted later must run the same image."
  }
}

variable "worker_idle_seconds" {
  description = "A worker with nothing to run exits after this many seconds (--worker-idle-seconds)."
  type        = number
  default     = 600

  validation {
    condition     = var.worker_idle_seconds >= 0
    error_message = "worker_idle_seconds must be >= 0."
  }
}

variable "worker_max_work_dir_size" {
  description = "Largest work dir of one worker, e.g. 10g (--worker-max-work-dir-size)."
  type        = string
  default     = "10g"

  validation {
    condition     = can(regex("^[0-9]+[kmgt]?$", var.worker_max_work_dir_size))
    error_message = "worker_max_work_dir_size is a number with an optional k, m, g or t suffix."
  }
}

variable "worker_run_as_user" {
  description = "Every bundle runs as this unprivileged user, numeric UID or UID:GID, never 0 (--worker-run-as-user, the workers' --run-as-user; needs workers of this project): owner of its bundle directory only, with every capability dropped (docs/security.md). Images that expect to run as root (installing packages at run time, say) fail under it. \"\" leaves the flag out: bundles then run as their directory's owner, as CodaLab does, unless the worker image sets CL_WORKER_RUN_AS_USER (docker/Dockerfile's sets 65534:65534). The workers give each bundle directory to this user: on an NFS share that squashes root, it must be the uid root is squashed to (65534, nobody, by default)."
  type        = string
  default     = "65534:65534"
  nullable    = false

  validation {
    condition     = var.worker_run_as_user == "" || var.worker_run_as_user == "none" || (can(regex("^[1-9][0-9]{0,9}(:[1-9][0-9]{0,9})?$", var.worker_run_as_user)) && try(alltrue([for id in split(":", var.worker_run_as_user) : tonumber(id) <= 4294967294]), false))
    error_message = "worker_run_as_user: a numeric UID or UID:GID from 1 to 4294967294 (not 0: root is what it takes away), or \"none\" (bundles run as their directory's owner, even in an image that sets CL_WORKER_RUN_AS_USER), or \"\" to leave --worker-run-as-user out."
  }
}

# --- Shared work dir ----------------------------------------------------------------------------

variable "shared_work_dir" {
  description = "Path of the shared work dir inside the worker pods (--worker-work-dir-prefix)."
  type        = string
  default     = "/var/lib/codalab"

  validation {
    condition     = startswith(var.shared_work_dir, "/") && !endswith(var.shared_work_dir, "/")
    error_message = "shared_work_dir must be an absolute path without a trailing '/'."
  }
}

variable "nfs_volume_name" {
  description = "Name of the PersistentVolume of the shared work dir; the workers mount the claim <name>-claim (--nfs-volume-name)."
  type        = string
  default     = "nfs"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$", var.nfs_volume_name))
    error_message = "nfs_volume_name must be a DNS label of at most 42 characters."
  }
}

variable "create_nfs_volume" {
  description = "Create the PersistentVolume nfs_volume_name for nfs_server:nfs_path (false: it exists already)."
  type        = bool
  default     = false
}

variable "nfs_server" {
  description = "NFS server of the shared work dir (a Filestore instance, an NFS export), when create_nfs_volume."
  type        = string
  default     = null
}

variable "nfs_path" {
  description = "Exported path on nfs_server."
  type        = string
  default     = "/codalab"

  validation {
    condition     = startswith(var.nfs_path, "/")
    error_message = "nfs_path must be absolute."
  }
}

variable "nfs_capacity" {
  description = "Capacity of the shared work-dir volume and claim, e.g. 1Ti."
  type        = string
  default     = "1Ti"

  validation {
    condition     = can(regex("^[0-9]+(Mi|Gi|Ti)$", var.nfs_capacity))
    error_message = "nfs_capacity is a number with Mi, Gi or Ti."
  }
}

# --- The manager --------------------------------------------------------------------------------

variable "manager_image" {
  description = "Image of the manager (docker/Dockerfile --target manager), pushed to a registry the cluster pulls from; a fixed tag or digest."
  type        = string
  default     = "codalab/cl-worker-manager:0.1.0"

  validation {
    condition     = can(regex("^[^\\s]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]{64})$", var.manager_image)) && !endswith(var.manager_image, ":latest")
    error_message = "manager_image needs a fixed tag or digest (not latest): pods restarted later must run the same image."
  }
}

variable "manager_replicas" {
  description = "Managers in the Deployment. They share one --manager-name under the Kubernetes Lease lease_name (--lease): the holder alone launches and cancels workers, the others stand by and take over once it has gone unrenewed for 15 s (a crash, a drained node, a rollout). 1 runs a single manager, still under the lease, so that a rollout never runs two at once."
  type        = number
  default     = 2

  validation {
    condition     = var.manager_replicas >= 1 && var.manager_replicas <= 5 && floor(var.manager_replicas) == var.manager_replicas
    error_message = "manager_replicas must be a whole number from 1 to 5."
  }
}

variable "lease_name" {
  description = "Name of the Lease (coordination.k8s.io/v1) in the namespace that the managers elect their leader by (--lease kubernetes:NAMESPACE/NAME); the manager's Role may get and update only this Lease. Two installations in one namespace need two names."
  type        = string
  default     = "cl-worker-manager"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", var.lease_name))
    error_message = "lease_name must be a DNS subdomain name: lowercase letters, digits, '-' and '.'."
  }
}

variable "metrics_port" {
  description = "Port of the manager's /metrics, /status and /healthz (--metrics-addr 0.0.0.0:PORT)."
  type        = number
  default     = 9464

  validation {
    condition     = var.metrics_port >= 1024 && var.metrics_port <= 65535
    error_message = "metrics_port must be from 1024 to 65535 (the manager is not root)."
  }
}

# --- Network and API access ---------------------------------------------------------------------

variable "codalab_server_cidrs" {
  description = "IPv4 CIDRs where the manager and the workers reach the CodaLab server (NetworkPolicy egress, all ports). null: the public internet, i.e. 0.0.0.0/0 except private (RFC 1918), shared (100.64.0.0/10), loopback, link-local (169.254.0.0/16: the metadata servers) and 168.63.129.16. A CodaLab server on a private address needs its CIDR here, e.g. [\"10.0.5.20/32\"]."
  type        = list(string)
  default     = null

  validation {
    condition = var.codalab_server_cidrs == null || alltrue([
      for c in coalesce(var.codalab_server_cidrs, ["10.0.0.0/8"]) :
      can(regex("^[0-9.]+/[0-9]+$", c)) && can(cidrhost(c, 0)) &&
      try(cidrhost("169.254.169.254/${split("/", c)[1]}", 0) != cidrhost(c, 0), false) &&
      try(cidrhost("168.63.129.16/${split("/", c)[1]}", 0) != cidrhost(c, 0), false)
    ])
    error_message = "codalab_server_cidrs must be IPv4 CIDRs that do not hold the metadata address 169.254.169.254 or 168.63.129.16 (leave it null for the public internet)."
  }
}

variable "api_server_cidrs" {
  description = "IPv4 CIDRs of the Kubernetes API server's endpoints (`kubectl get endpoints kubernetes -n default`), which the manager, and with bundle_runtime = \"kubernetes\" the workers, reach on api_server_ports (NetworkPolicy egress). The default, the private ranges, holds the endpoints of most clusters (GKE private clusters: master_ipv4_cidr_block; EKS: the VPC's addresses); narrow it to the endpoint. A public endpoint is reached through codalab_server_cidrs' public internet."
  type        = list(string)
  default     = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"]

  validation {
    condition = alltrue([
      for c in var.api_server_cidrs :
      can(regex("^[0-9.]+/[0-9]+$", c)) && can(cidrhost(c, 0)) &&
      try(cidrhost("169.254.169.254/${split("/", c)[1]}", 0) != cidrhost(c, 0), false)
    ])
    error_message = "api_server_cidrs must be IPv4 CIDRs that do not hold the metadata address 169.254.169.254."
  }
}

variable "api_server_ports" {
  description = "TCP ports of the API server's endpoints: 443 on GKE, EKS and AKS, 6443 on kubeadm clusters."
  type        = list(number)
  default     = [443, 6443]

  validation {
    condition     = length(var.api_server_ports) > 0 && alltrue([for p in var.api_server_ports : p >= 1 && p <= 65535 && floor(p) == p])
    error_message = "api_server_ports must be TCP ports (1 to 65535)."
  }
}

variable "docker_network_cidrs" {
  description = "With bundle_runtime = \"docker\": the node's Docker networks, which the workers reach to connect to their runs' ports (netcat); Docker's default address pools (172.17.0.0 to 172.31.255.255, 192.168.0.0/16). Runs in the node's Docker engine are not pods: NetworkPolicy does not apply to them."
  type        = list(string)
  default     = ["172.17.0.0/16", "172.18.0.0/15", "172.20.0.0/14", "172.24.0.0/13", "192.168.0.0/16"]

  validation {
    condition     = alltrue([for c in var.docker_network_cidrs : can(regex("^[0-9.]+/[0-9]+$", c)) && can(cidrhost(c, 0))])
    error_message = "docker_network_cidrs must be IPv4 CIDRs."
  }
}

variable "monitoring_namespace" {
  description = "Namespace whose pods (Prometheus) may reach the manager's metrics port (NetworkPolicy ingress, selected by its kubernetes.io/metadata.name label); null: none."
  type        = string
  default     = "monitoring"

  validation {
    condition     = var.monitoring_namespace == null || can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", coalesce(var.monitoring_namespace, "x")))
    error_message = "monitoring_namespace must be a namespace name (a DNS label) or null."
  }
}

variable "kubelet_stats" {
  description = "With bundle_runtime = \"kubernetes\": where the cluster serves no metrics API (metrics-server), let the workers read their runs' stats from the kubelet's Summary API (the manager's --worker-kubelet-stats, a ClusterRole with get on nodes/proxy). nodes/proxy reaches the rest of the kubelet's API too (exec into any pod of a node): leave it false where metrics-server runs (GKE, AKS, most EKS setups)."
  type        = bool
  default     = false
}
