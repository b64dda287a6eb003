//! `--bundle-runtime kubernetes`: the runtime's settings from the command line and the
//! environment the manager's pod sets, and its start-up (the node's free resources become the
//! worker's CPUs, GPUs and memory).

use tokio_util::sync::CancellationToken;

use super::{KubernetesConfig, KubernetesRuntime, NODE_ENV, POD_ENV};
use crate::cli::Args;
use crate::config::{Config, MachineResources};
use crate::runtime::BundleRuntime;

/// The API server's access (Python's four flags, `common::cluster`), the worker's node
/// (`CODALAB_KUBERNETES_NODE_NAME`, required) and pod, and where run stats come from.
pub fn config(args: &Args) -> anyhow::Result<KubernetesConfig> {
    let node = std::env::var(NODE_ENV)
        .ok()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--bundle-runtime kubernetes needs {NODE_ENV} (the node this worker runs on, \
                 from the downward API's spec.nodeName; cl-worker-manager sets it)"
            )
        })?;
    Ok(KubernetesConfig {
        access: common::cluster::ClusterAccess {
            flag_prefix: "kubernetes-",
            cluster_host: args.kubernetes_cluster_host.clone(),
            auth_token: args.kubernetes_auth_token.clone(),
            auth_token_file: args.kubernetes_auth_token_file.clone(),
            cert_path: args.kubernetes_cert_path.clone(),
            cert: args.kubernetes_cert.clone(),
            namespace: args.kubernetes_namespace.clone(),
            allow_insecure: args.allow_insecure_kubernetes_cluster_host,
        },
        node,
        pod: std::env::var(POD_ENV).ok().filter(|n| !n.is_empty()),
        kubelet_stats: args.kubernetes_kubelet_stats,
        no_gpus: no_gpus(&args.gpuset),
    })
}

/// `--gpuset NONE` (or empty): a worker given no GPU offers none of the node's.
pub(super) fn no_gpus(gpuset: &str) -> bool {
    matches!(gpuset.trim(), "" | "NONE")
}

/// None yet: the node's free resources decide, once the runtime has read them (`start`);
/// `--cpuset` and `--gpuset` are ignored, said once (but `--gpuset NONE`, which offers no GPU).
pub fn resources(args: &Args) -> MachineResources {
    for (flag, v) in [("--cpuset", &args.cpuset), ("--gpuset", &args.gpuset)] {
        if v != "ALL" && !(flag == "--gpuset" && no_gpus(v)) {
            tracing::warn!(
                "{flag} is ignored with --bundle-runtime kubernetes: runs get what the node has \
                 free"
            );
        }
    }
    MachineResources {
        cpuset: Vec::new(),
        gpuset: Vec::new(),
        gpus_from_engine: None,
        memory_bytes: args.max_memory.unwrap_or(u64::MAX),
    }
}

/// Connects to the API server, reads the node, and gives the worker the node's free CPUs and
/// GPUs (refreshed for every check-in by the runtime itself).
pub async fn start(
    k8s: &KubernetesConfig,
    config: &mut Config,
    shutdown: &CancellationToken,
) -> anyhow::Result<KubernetesRuntime> {
    let runtime = KubernetesRuntime::connect(
        k8s,
        &config.agent.work_dir,
        &config.agent.worker_id,
        shutdown.clone(),
    )
    .await?;
    // (No GPU when the worker was given none: `capacity` offers 0.)
    let cap = runtime.capacity().unwrap_or_default();
    config.agent.cpuset = (0..cap.cpus.max(1) as usize).collect();
    config.agent.gpuset = (0..cap.gpus)
        .map(|i| format!("kubernetes-gpu-{i}"))
        .collect();
    tracing::info!(
        "node {}: {} CPUs, {} GPUs, {} bytes of memory free for runs",
        k8s.node,
        cap.cpus,
        cap.gpus,
        cap.memory_bytes
    );
    Ok(runtime)
}
