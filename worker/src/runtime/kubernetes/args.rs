//! `--bundle-runtime kubernetes`: the runtime's flags and the environment the manager's pod
//! sets, and its start-up (the node's free resources become the worker's CPUs, GPUs and
//! memory).

use std::path::PathBuf;

use clap::Args;

use super::{KubernetesConfig, KubernetesRuntime, NODE_ENV, POD_ENV};
use crate::runtime::{BuildContext, BuildError, BundleRuntime, MachineShare, RuntimeArgs};

/// The Kubernetes runtime's flags (Python's four API flags, the namespace, and ours).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubernetes runtime")]
pub struct KubernetesArgs {
    /// Kubernetes runtime: API server URL (default: the in-cluster service account, then
    /// KUBECONFIG or ~/.kube/config). With it and no token flag, the pod's own service account
    /// token is used.
    #[arg(long)]
    pub kubernetes_cluster_host: Option<String>,
    /// Kubernetes runtime: bearer token for the API (visible in `ps`: prefer
    /// --kubernetes-auth-token-file or the pod's service account).
    #[arg(long, conflicts_with = "kubernetes_auth_token_file")]
    pub kubernetes_auth_token: Option<String>,
    /// Kubernetes runtime: file holding the bearer token for the API (re-read when it changes).
    #[arg(long)]
    pub kubernetes_auth_token_file: Option<PathBuf>,
    /// Kubernetes runtime: CA certificate file of the API server (`/dev/null`: none, see
    /// --kubernetes-cert).
    #[arg(long)]
    pub kubernetes_cert_path: Option<String>,
    /// Kubernetes runtime: CA certificate as PEM text (literal `\n` are newlines), used when
    /// --kubernetes-cert-path is not given or is `/dev/null`.
    #[arg(long)]
    pub kubernetes_cert: Option<String>,
    /// Kubernetes runtime: send the bearer token to a plain-HTTP API server on another machine
    /// (refused without it).
    #[arg(long)]
    pub allow_insecure_kubernetes_cluster_host: bool,
    /// Kubernetes runtime: namespace of the run pods.
    #[arg(long, default_value = "default")]
    pub kubernetes_namespace: String,
    /// Kubernetes runtime: where the cluster serves no metrics API (metrics-server), read the
    /// runs' CPU and memory from the kubelet's Summary API through the API server's node proxy.
    /// Needs `get` on `nodes/proxy`, which also reaches the rest of the kubelet's API: without
    /// this flag the worker never calls it (and runs report no stats without metrics-server).
    /// Not a flag of the Python worker.
    #[arg(long, env = "CL_WORKER_KUBERNETES_KUBELET_STATS")]
    pub kubernetes_kubelet_stats: bool,
}

impl KubernetesArgs {
    /// The API server's access (Python's four flags, `common::cluster`), the worker's node
    /// (`CODALAB_KUBERNETES_NODE_NAME`, required) and pod, where run stats come from, and
    /// whether the worker offers GPUs (not with `--gpuset NONE`).
    pub fn config(&self, gpuset: &str) -> Result<KubernetesConfig, BuildError> {
        let node = std::env::var(NODE_ENV)
            .ok()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                BuildError::Flag(format!(
                    "--bundle-runtime kubernetes needs {NODE_ENV} (the node this worker runs \
                     on, from the downward API's spec.nodeName; cl-worker-manager sets it)"
                ))
            })?;
        Ok(KubernetesConfig {
            access: common::cluster::ClusterAccess {
                flag_prefix: "kubernetes-",
                cluster_host: self.kubernetes_cluster_host.clone(),
                auth_token: self.kubernetes_auth_token.clone(),
                auth_token_file: self.kubernetes_auth_token_file.clone(),
                cert_path: self.kubernetes_cert_path.clone(),
                cert: self.kubernetes_cert.clone(),
                namespace: self.kubernetes_namespace.clone(),
                allow_insecure: self.allow_insecure_kubernetes_cluster_host,
            },
            node,
            pod: std::env::var(POD_ENV).ok().filter(|n| !n.is_empty()),
            kubelet_stats: self.kubernetes_kubelet_stats,
            no_gpus: no_gpus(gpuset),
        })
    }
}

/// `--gpuset NONE` (or empty): a worker given no GPU offers none of the node's.
pub(super) fn no_gpus(gpuset: &str) -> bool {
    matches!(gpuset.trim(), "" | "NONE")
}

impl RuntimeArgs for KubernetesArgs {
    type Runtime = KubernetesRuntime;

    /// Connects to the API server, reads the node, and gives the worker the node's free CPUs
    /// and GPUs (refreshed for every check-in by the runtime itself). `--cpuset` and
    /// `--gpuset` are ignored, said once (but `--gpuset NONE`, which offers no GPU).
    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(KubernetesRuntime, MachineShare), BuildError> {
        let k8s = self.config(cx.gpuset)?;
        for (flag, v) in [("--cpuset", cx.cpuset), ("--gpuset", cx.gpuset)] {
            if v != "ALL" && !(flag == "--gpuset" && no_gpus(v)) {
                tracing::warn!(
                    "{flag} is ignored with --bundle-runtime kubernetes: runs get what the node \
                     has free"
                );
            }
        }
        let runtime =
            KubernetesRuntime::connect(&k8s, cx.work_dir, cx.worker_id, cx.shutdown.clone())
                .await
                .map_err(BuildError::start)?;
        // (No GPU when the worker was given none: `capacity` offers 0.)
        let cap = runtime.capacity().unwrap_or_default();
        tracing::info!(
            "node {}: {} CPUs, {} GPUs, {} bytes of memory free for runs",
            k8s.node,
            cap.cpus,
            cap.gpus,
            cap.memory_bytes
        );
        let share = MachineShare {
            cpuset: (0..cap.cpus.max(1) as usize).collect(),
            gpuset: (0..cap.gpus)
                .map(|i| format!("kubernetes-gpu-{i}"))
                .collect(),
            memory_bytes: cx.max_memory.unwrap_or(u64::MAX),
        };
        Ok((runtime, share))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args as Cli;
    use clap::Parser;

    #[test]
    fn the_node_comes_from_the_managers_pod_spec_and_one_token_flag_at_most() {
        if std::env::var(NODE_ENV).is_err() {
            let a = Cli::try_parse_from(["cl-worker"]).unwrap();
            let e = a.kubernetes.config("ALL").err().unwrap();
            assert!(matches!(e, BuildError::Flag(_)), "{e:?}");
            assert!(e.to_string().contains(NODE_ENV), "{e}");
        }
        let both = Cli::try_parse_from([
            "cl-worker",
            "--kubernetes-auth-token",
            "t",
            "--kubernetes-auth-token-file",
            "/f",
        ]);
        assert_eq!(
            both.err().unwrap().kind(),
            clap::error::ErrorKind::ArgumentConflict
        );
    }
}
