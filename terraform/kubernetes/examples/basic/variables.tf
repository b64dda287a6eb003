variable "codalab_server" {
  description = "URL of the CodaLab server."
  type        = string
}

variable "nfs_server" {
  description = "NFS server of the shared work dir."
  type        = string
}

variable "nfs_path" {
  description = "Exported path on nfs_server."
  type        = string
  default     = "/codalab"
}

variable "kubeconfig" {
  description = "kubeconfig file of the cluster."
  type        = string
  default     = "~/.kube/config"
}

variable "kube_context" {
  description = "Context of the kubeconfig (null: its current context)."
  type        = string
  default     = null
}
