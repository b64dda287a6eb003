output "manager_command" {
  description = "The cl-worker-manager command line the Deployment runs, as one shell line."
  value       = local.manager_command
}

output "manager_argv" {
  description = "The same command line as a list (the container's command and args)."
  value       = local.manager_argv
}

output "namespace" {
  description = "Namespace of the manager, its worker pods, the Secret and the claim."
  value       = local.namespace
}

output "credentials_secret_name" {
  description = "The Secret holding the CodaLab username and password."
  value       = kubernetes_secret_v1.credentials.metadata[0].name
}

output "set_password_command" {
  description = "How to put the CodaLab password into the Secret without Terraform seeing it (reads ./codalab-password.txt)."
  value       = "kubectl -n ${local.namespace} create secret generic ${kubernetes_secret_v1.credentials.metadata[0].name} --from-literal=username=${var.codalab_username} --from-file=password=codalab-password.txt --dry-run=client -o yaml | kubectl apply -f -"
}

output "manager_service_account" {
  description = "The manager's ServiceAccount (bound to the Role of exactly its API calls)."
  value       = kubernetes_service_account_v1.manager.metadata[0].name
}

output "worker_service_account" {
  description = "The worker pods' ServiceAccount (--service-account)."
  value       = kubernetes_service_account_v1.worker.metadata[0].name
}

output "work_dir_claim" {
  description = "The claim of the shared work dir that every worker pod mounts."
  value       = kubernetes_persistent_volume_claim_v1.nfs.metadata[0].name
}

output "status_command" {
  description = "How to see the manager's status from a workstation."
  value       = "kubectl -n ${local.namespace} port-forward deploy/cl-worker-manager ${var.metrics_port} & curl -s localhost:${var.metrics_port}/status"
}
