# A GKE cluster for CodaLab GPU workers, feeding the kubernetes module:
#
#   system pool (1 small node: the manager, GKE's own pods)
#   gpu pool    (Spot, autoscaled from 0 to max_workers nodes, taint nvidia.com/gpu=present)
#   Filestore   (NFS, the shared work dir: the PersistentVolume `nfs` of the kubernetes module)
#
# GKE nodes run containerd, not Docker: the workers use --bundle-runtime kubernetes (one pod per
# bundle on the worker's node). The cluster autoscaler adds a GPU node when the manager's worker
# pod cannot be scheduled and removes it when the idle worker has exited.

locals {
  labels   = merge(var.labels, { "codalab-worker-manager" = var.name })
  gpu_pool = "${var.name}-gpu"

  # Who runs the bundles (--worker-run-as-user): by default the share's owner, the uid root on
  # the nodes is squashed to. The workers give each bundle directory to that user, and root
  # squashed to nfs_owner_uid can give a directory to no one else.
  worker_run_as_user = var.worker_run_as_user != null ? var.worker_run_as_user : "${var.nfs_owner_uid}:${var.nfs_owner_gid}"

  region             = regex("^(.+)-[a-z]$", var.zone)[0]
  subnetwork_is_link = can(regex("^(https://www\\.googleapis\\.com/compute/v1/)?projects/", var.subnetwork))
  # The nodes' addresses: the subnetwork's primary range. Pods and services have secondary
  # ranges of their own (GKE adds them to the subnetwork with the cluster).
  node_ip_range     = data.google_compute_subnetwork.nodes.ip_cidr_range
  subnetwork_ranges = concat([local.node_ip_range], [for r in data.google_compute_subnetwork.nodes.secondary_ip_range : r.ip_cidr_range])
  # Admin ranges that overlap a range of the subnetwork (two CIDR blocks overlap when their
  # network addresses agree at the shorter of the two prefixes).
  nfs_admin_overlaps = [
    for pair in setproduct(var.nfs_admin_ip_ranges, local.subnetwork_ranges) : pair
    if cidrhost("${cidrhost(pair[0], 0)}/${min(tonumber(split("/", pair[0])[1]), tonumber(split("/", pair[1])[1]))}", 0) ==
    cidrhost("${cidrhost(pair[1], 0)}/${min(tonumber(split("/", pair[0])[1]), tonumber(split("/", pair[1])[1]))}", 0)
  ]
}

# The subnetwork of the nodes, for its primary range: the one range the Filestore share is
# exported to.
data "google_compute_subnetwork" "nodes" {
  self_link = local.subnetwork_is_link ? var.subnetwork : null
  name      = local.subnetwork_is_link ? null : var.subnetwork
  project   = local.subnetwork_is_link ? null : var.project
  region    = local.subnetwork_is_link ? null : local.region
}

resource "google_service_account" "nodes" {
  project      = var.project
  account_id   = "${var.name}-gke-nodes"
  display_name = "Nodes of the ${var.name} GKE cluster (logs, metrics, image pulls)"
}

# Least privilege for the nodes: write logs and metrics, pull images.
resource "google_project_iam_member" "nodes" {
  for_each = toset([
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/artifactregistry.reader",
  ])
  project = var.project
  role    = each.value
  member  = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_container_cluster" "this" {
  #checkov:skip=CKV_GCP_66:Binary Authorization needs an attestor pipeline; the workers run the images of arbitrary CodaLab bundles, which no attestor can vouch for.
  #checkov:skip=CKV_GCP_65:RBAC through Google Groups needs a Workspace domain; access is through IAM on the project.
  #checkov:skip=CKV_GCP_12:NetworkPolicy is enforced by Dataplane V2 (datapath_provider ADVANCED_DATAPATH), which replaces the Calico network_policy block this check looks for.
  #checkov:skip=CKV_GCP_21:resource_labels is set (local.labels, a merge the scanner does not evaluate).
  project  = var.project
  name     = var.name
  location = var.zone

  network    = var.network
  subnetwork = var.subnetwork

  # Node pools are managed below.
  remove_default_node_pool = true
  initial_node_count       = 1
  deletion_protection      = var.deletion_protection
  resource_labels          = local.labels

  release_channel {
    channel = "REGULAR"
  }

  # VPC-native (alias IPs), private nodes, a public endpoint open to authorized_networks only.
  networking_mode = "VPC_NATIVE"
  ip_allocation_policy {}
  private_cluster_config {
    enable_private_nodes    = true
    enable_private_endpoint = false
    master_ipv4_cidr_block  = var.master_ipv4_cidr_block
  }
  master_authorized_networks_config {
    dynamic "cidr_blocks" {
      for_each = var.authorized_networks
      content {
        cidr_block   = cidr_blocks.value
        display_name = "authorized ${cidr_blocks.key}"
      }
    }
  }

  # Dataplane V2 enforces NetworkPolicy (runs with --request-network false carry a label for one).
  datapath_provider           = "ADVANCED_DATAPATH"
  enable_intranode_visibility = true
  enable_shielded_nodes       = true

  workload_identity_config {
    workload_pool = "${var.project}.svc.id.goog"
  }

  master_auth {
    client_certificate_config {
      issue_client_certificate = false
    }
  }

  node_config {
    # Only the default pool's (removed); the pools below set their own.
    service_account = google_service_account.nodes.email
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }
  }
}

resource "google_container_node_pool" "system" {
  project    = var.project
  name       = "${var.name}-system"
  cluster    = google_container_cluster.this.id
  location   = var.zone
  node_count = 1

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = "e2-standard-2"
    disk_size_gb    = 50
    image_type      = "COS_CONTAINERD"
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    resource_labels = local.labels
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }
    metadata = { "disable-legacy-endpoints" = "true" }
  }
}

resource "google_container_node_pool" "gpu" {
  project  = var.project
  name     = local.gpu_pool
  cluster  = google_container_cluster.this.id
  location = var.zone

  # Scale from zero: nothing runs (and nothing is paid for) while no bundle is staged.
  initial_node_count = 0
  autoscaling {
    min_node_count = 0
    max_node_count = var.max_workers
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = var.machine_type
    spot            = var.spot
    disk_size_gb    = 200
    image_type      = "COS_CONTAINERD"
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    resource_labels = local.labels
    labels          = { "codalab.org/pool" = "gpu" }

    guest_accelerator {
      type  = var.gpu_type
      count = var.gpus
      gpu_driver_installation_config {
        gpu_driver_version = "LATEST"
      }
    }

    # Only pods that tolerate it (the GPU workers and their run pods) land here.
    taint {
      key    = "nvidia.com/gpu"
      value  = "present"
      effect = "NO_SCHEDULE"
    }

    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }
    metadata = { "disable-legacy-endpoints" = "true" }
  }
}

# The shared work dir: one NFS share on the cluster's network, exported to the nodes only, with
# root squashed to the share's dedicated owner.
resource "google_filestore_instance" "work" {
  #checkov:skip=CKV_GCP_125:Scratch space (dependency cache, run directories) that the workers rebuild from the CodaLab server; a customer-managed key would only add a KMS key to manage.
  project                     = var.project
  name                        = "${var.name}-work"
  location                    = var.zone
  tier                        = var.filestore_tier
  labels                      = local.labels
  deletion_protection_enabled = var.deletion_protection

  file_shares {
    name        = "codalab"
    capacity_gb = var.filestore_capacity_gb
    # The nodes only: the kubelet mounts a pod's NFS volume from its node's address, so no pod
    # address (the cluster's secondary range) needs the share, and a pod that speaks NFS itself
    # is refused. Root (the worker pods, the kubelet) acts as the share's owner, never as root.
    nfs_export_options {
      ip_ranges   = [local.node_ip_range]
      access_mode = "READ_WRITE"
      squash_mode = "ROOT_SQUASH"
      anon_uid    = var.nfs_owner_uid
      anon_gid    = var.nfs_owner_gid
    }
    # Administration (nfs_admin_ip_ranges, empty by default): root as root, e.g. to hand the
    # share's root to its owner once (README).
    dynamic "nfs_export_options" {
      for_each = length(var.nfs_admin_ip_ranges) > 0 ? [var.nfs_admin_ip_ranges] : []
      content {
        ip_ranges   = nfs_export_options.value
        access_mode = "READ_WRITE"
        squash_mode = "NO_ROOT_SQUASH"
      }
    }
  }

  networks {
    network = var.network
    modes   = ["MODE_IPV4"]
  }

  lifecycle {
    precondition {
      condition     = length(local.nfs_admin_overlaps) == 0
      error_message = "nfs_admin_ip_ranges overlap the nodes' subnetwork (${jsonencode(local.nfs_admin_overlaps)}): an admin address among the nodes or the pods would give that node or pod root on the share (and Filestore refuses overlapping export ranges). Use an address outside the subnetwork's ranges."
    }
  }
}

# The workers, their RBAC and the manager, in the cluster above. The root module configures the
# kubernetes provider from this module's cluster_endpoint and cluster_ca_certificate.
module "codalab" {
  source = "../kubernetes"

  codalab_server   = var.codalab_server
  codalab_username = var.codalab_username
  search           = var.search

  bundle_runtime = "kubernetes"
  cpus           = var.cpus
  gpus           = var.gpus
  memory_mb      = var.memory_mb
  min_workers    = 0
  max_workers    = var.max_workers
  node_selector  = { "cloud.google.com/gke-nodepool" = google_container_node_pool.gpu.name }
  tolerations    = ["nvidia.com/gpu=present:NoSchedule"]

  # NetworkPolicy egress to the private control plane's endpoint only (port 443).
  api_server_cidrs = [var.master_ipv4_cidr_block]
  api_server_ports = [443]

  create_nfs_volume = true
  nfs_server        = google_filestore_instance.work.networks[0].ip_addresses[0]
  nfs_path          = "/${google_filestore_instance.work.file_shares[0].name}"
  nfs_capacity      = "${var.filestore_capacity_gb}Gi"

  worker_image       = var.worker_image
  worker_run_as_user = local.worker_run_as_user
  manager_image      = var.manager_image
  labels             = { "app.kubernetes.io/managed-by" = "terraform" }

  depends_on = [google_container_node_pool.system]
}
