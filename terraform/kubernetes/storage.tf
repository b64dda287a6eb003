# The shared work dir: an NFS PersistentVolume (when create_nfs_volume) and the claim
# <nfs_volume_name>-claim that every worker pod mounts (--nfs-volume-name). storageClassName ""
# keeps a default StorageClass from provisioning an unshared disk instead.

resource "kubernetes_persistent_volume_v1" "nfs" {
  count = var.create_nfs_volume ? 1 : 0

  lifecycle {
    precondition {
      condition     = var.nfs_server != null
      error_message = "create_nfs_volume needs nfs_server."
    }
  }

  metadata {
    name   = var.nfs_volume_name
    labels = local.labels
  }
  spec {
    capacity                         = { storage = var.nfs_capacity }
    access_modes                     = ["ReadWriteMany"]
    persistent_volume_reclaim_policy = "Retain"
    storage_class_name               = ""
    mount_options                    = ["nfsvers=3", "hard"]
    persistent_volume_source {
      nfs {
        server = var.nfs_server
        path   = var.nfs_path
      }
    }
  }
}

resource "kubernetes_persistent_volume_claim_v1" "nfs" {
  metadata {
    name      = local.claim_name
    namespace = local.namespace
    labels    = local.labels
  }
  spec {
    access_modes       = ["ReadWriteMany"]
    storage_class_name = ""
    volume_name        = var.create_nfs_volume ? kubernetes_persistent_volume_v1.nfs[0].metadata[0].name : var.nfs_volume_name
    resources {
      requests = { storage = var.nfs_capacity }
    }
  }
  # With an existing volume the claim may bind later; the manager checks it before its first tick.
  wait_until_bound = var.create_nfs_volume
}
