output "manager_command" {
  description = "The cl-worker-manager command line the manager's Deployment runs, as one shell line."
  value       = module.codalab.manager_command
}

output "set_password_command" {
  description = "Puts ./codalab-password.txt into the credentials Secret (after get_credentials_command)."
  value       = module.codalab.set_password_command
}

output "get_credentials_command" {
  description = "Points kubectl at the cluster."
  value       = "gcloud container clusters get-credentials ${google_container_cluster.this.name} --zone ${var.zone} --project ${var.project}"
}

output "cluster_name" {
  description = "Name of the GKE cluster."
  value       = google_container_cluster.this.name
}

output "cluster_endpoint" {
  description = "Address of the cluster's API endpoint (for the kubernetes provider)."
  value       = google_container_cluster.this.endpoint
}

output "cluster_ca_certificate" {
  description = "Base64 CA certificate of the cluster's API endpoint (public)."
  value       = google_container_cluster.this.master_auth[0].cluster_ca_certificate
}

output "gpu_node_pool" {
  description = "The GPU node pool the workers are scheduled on."
  value       = google_container_node_pool.gpu.name
}

output "filestore_ip" {
  description = "NFS server of the shared work dir."
  value       = google_filestore_instance.work.networks[0].ip_addresses[0]
}

output "filestore_export_ip_ranges" {
  description = "Where the Filestore share is exported: the nodes' range (root squashed to nfs_owner_uid), then any nfs_admin_ip_ranges (root as root)."
  value       = flatten(google_filestore_instance.work.file_shares[0].nfs_export_options[*].ip_ranges)
}

output "namespace" {
  description = "Namespace of the manager and the workers."
  value       = module.codalab.namespace
}
