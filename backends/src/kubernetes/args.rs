//! The `kubernetes` flags (Python's, plus what a cluster operator needs) and the builder of a
//! [`KubernetesBackend`]: the API client, the credentials of the workers, the pre-flight check.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use k8s_openapi::api::core::v1::Toleration;

use super::pod::{self, Deadlines};
use super::{BundleRuntime, Credentials, KubernetesBackend, KubernetesConfig};
use crate::{BackendArgs, BackendError, BuildContext, BuildError, ShapeArgs, WorkerProfile};

/// Flags of the `kubernetes` backend.
#[derive(Debug, Clone, Args)]
pub struct KubernetesArgs {
    /// Bundle runtime of the workers: `docker` (the node's Docker, through its socket mounted
    /// into the worker pod) or `kubernetes` (one pod per bundle).
    #[arg(long, value_enum, default_value = "docker")]
    pub bundle_runtime: BundleRuntime,
    /// API server URL. Without it: the standard configuration (in-cluster service account,
    /// `KUBECONFIG`, `~/.kube/config`).
    #[arg(long)]
    pub cluster_host: Option<String>,
    /// Bearer token for the API (visible in `ps`: prefer --auth-token-file).
    #[arg(long)]
    pub auth_token: Option<String>,
    /// File holding the bearer token for the API (re-read when it changes).
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// CA certificate file of the API server (`/dev/null`: none; see --cert).
    #[arg(long)]
    pub cert_path: Option<String>,
    /// Send the bearer token to a plain-HTTP API server on another machine (refused without
    /// it: the token would cross the network in clear). Workers get the same opt-in for
    /// `--worker-cluster-host`.
    #[arg(long)]
    pub allow_insecure_cluster_host: bool,
    /// CA certificate of the API server, as PEM text (used when --cert-path is not given or
    /// is `/dev/null`; literal `\n` are newlines).
    #[arg(long)]
    pub cert: Option<String>,
    /// Name of the PersistentVolume holding the shared work directory: the worker pods mount
    /// the claim `<name>-claim` (else a hostPath on the node).
    #[arg(long)]
    pub nfs_volume_name: Option<String>,
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// Namespace of the worker pods, the credentials Secret and the claim.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// This manager's name, in a label of every pod it creates: two managers in one namespace
    /// need two names.
    #[arg(long, default_value = "cl-worker-manager")]
    pub manager_name: String,
    /// Worker image (default `codalab/worker:$CODALAB_VERSION`, `latest` without it).
    #[arg(long)]
    pub worker_image: Option<String>,
    /// `imagePullPolicy` of the worker container (default: the cluster's).
    #[arg(long, value_parser = ["Always", "IfNotPresent", "Never"])]
    pub image_pull_policy: Option<String>,
    /// Only nodes with this label: `KEY=VALUE` (repeatable).
    #[arg(long = "node-selector", value_parser = parse_node_selector)]
    pub node_selectors: Vec<(String, String)>,
    /// Tolerate a taint: `KEY[=VALUE][:EFFECT]` (repeatable). GPU pods always tolerate
    /// `nvidia.com/gpu`.
    #[arg(long = "toleration", value_parser = parse_toleration)]
    pub tolerations: Vec<Toleration>,
    /// Service account of the worker pods.
    #[arg(long)]
    pub service_account: Option<String>,
    /// Secret to pull the worker image with (repeatable).
    #[arg(long = "image-pull-secret")]
    pub image_pull_secrets: Vec<String>,
    /// PriorityClass of the worker pods.
    #[arg(long)]
    pub priority_class: Option<String>,
    /// At most one of this manager's workers per node (a required pod anti-affinity).
    #[arg(long)]
    pub one_worker_per_node: bool,
    /// Secret (keys `username` and `password`) mounted read-only into each worker pod as its
    /// `--password-file`.
    #[arg(long, env = "CL_WORKER_MANAGER_PASSWORD_SECRET")]
    pub password_secret: Option<String>,
    /// Put the CodaLab credentials in the worker pods' plain environment instead (Python's
    /// way; readable by anyone who may read the pods).
    #[arg(long)]
    pub allow_plaintext_password: bool,
    /// The manager's own CodaLab credentials: a file with the username and password lines, or
    /// a directory with `username` and `password` files (a mounted Secret).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// `--network-prefix` of the workers with `--bundle-runtime docker`: shared by the workers
    /// of a node, as they share its Docker engine.
    #[arg(long, default_value = "codalab_worker_network")]
    pub network_prefix: String,
    /// The node's Docker socket, mounted into worker pods with `--bundle-runtime docker`.
    #[arg(long, default_value = "/var/run/docker.sock")]
    pub docker_socket: String,
    /// With `--bundle-runtime kubernetes`: the API server URL the workers use (passed as their
    /// `--kubernetes-cluster-host`, with their pod's service account token). Without it they
    /// use their in-cluster configuration.
    #[arg(long)]
    pub worker_cluster_host: Option<String>,
    /// With `--bundle-runtime kubernetes`: the workers read their runs' stats from the
    /// kubelet's Summary API where the cluster serves no metrics API (passed as their
    /// `--kubernetes-kubelet-stats`). Their account then needs `get` on `nodes/proxy`, which
    /// reaches the rest of the kubelet's API too (examples/kubernetes/
    /// runtime-rbac-kubelet-stats.yaml); without it they read metrics-server only.
    #[arg(long)]
    pub worker_kubelet_stats: bool,
    /// Seconds a pod may wait for a node (the cluster autoscaler may be adding one) before it
    /// is deleted as a failed launch.
    #[arg(long, default_value_t = 900)]
    pub unschedulable_timeout: u64,
    /// Seconds a pod may fail to pull its image or create its container before it is deleted
    /// as a failed launch.
    #[arg(long, default_value_t = 300)]
    pub start_failure_timeout: u64,
    /// Seconds a worker pod may stay on a node that stopped reporting (the pod's Ready
    /// condition not True while it runs, or its deletion not confirmed by the node) before it
    /// is deleted by force and counted as ended, so that its place under --max-workers is free
    /// again; 0: never.
    #[arg(long, default_value_t = 300)]
    pub node_lost_timeout: u64,
}

fn parse_toleration(s: &str) -> Result<Toleration, String> {
    pod::parse_toleration(s)
}

fn parse_node_selector(s: &str) -> Result<(String, String), String> {
    pod::parse_node_selector(s)
}

impl KubernetesArgs {
    /// Where the API is and how to authenticate, from the flags.
    pub fn access(&self) -> common::cluster::ClusterAccess {
        common::cluster::ClusterAccess {
            flag_prefix: "",
            cluster_host: self.cluster_host.clone(),
            auth_token: self.auth_token.clone(),
            auth_token_file: self.auth_token_file.clone(),
            cert_path: self.cert_path.clone(),
            cert: self.cert.clone(),
            namespace: self.namespace.clone(),
            allow_insecure: self.allow_insecure_cluster_host,
        }
    }

    /// The kube-rs configuration: from the flags when `--cluster-host` is given, else inferred.
    async fn kube_config(&self) -> Result<kube::Config, BuildError> {
        self.access()
            .config(Path::new(common::cluster::SERVICE_ACCOUNT_TOKEN))
            .await
            .map_err(|e| BuildError::Preflight(e.to_string()))
    }

    /// The workers' flags for their bundle runtime. Workers running bundles as pods put them
    /// in this namespace, with their own service account: no API credentials on their command
    /// line.
    pub(crate) fn worker_args(&self) -> Vec<String> {
        // A pod deleted with a grace period (a spot node's shutdown, a drain, a scale-down of
        // the node pool) gets SIGTERM first: the worker hands its runs back in that time.
        let mut args = vec![
            "--pass-down-termination".to_string(),
            "--bundle-runtime".to_string(),
            self.bundle_runtime.as_str().into(),
        ];
        if self.bundle_runtime == BundleRuntime::Kubernetes {
            args.extend(["--kubernetes-namespace".into(), self.namespace.clone()]);
            if let Some(host) = &self.worker_cluster_host {
                args.extend(["--kubernetes-cluster-host".into(), host.clone()]);
                if self.allow_insecure_cluster_host {
                    args.push("--allow-insecure-kubernetes-cluster-host".into());
                }
            }
            if self.worker_kubelet_stats {
                args.push("--kubernetes-kubelet-stats".into());
            }
        } else {
            if self.worker_cluster_host.is_some() {
                tracing::warn!(
                    "--worker-cluster-host is only used with --bundle-runtime kubernetes"
                );
            }
            if self.worker_kubelet_stats {
                tracing::warn!(
                    "--worker-kubelet-stats is only used with --bundle-runtime kubernetes"
                );
            }
        }
        args
    }

    fn credentials(&self, cx: &BuildContext<'_>) -> Result<Credentials, BuildError> {
        match (&self.password_secret, self.allow_plaintext_password) {
            (Some(secret), _) => Ok(Credentials::Secret(secret.clone())),
            (None, true) => {
                tracing::warn!(
                    "--allow-plaintext-password: the CodaLab password goes into every worker \
                     pod's plain environment, readable by anyone allowed to read pods; prefer \
                     --password-secret"
                );
                Ok(Credentials::Plaintext {
                    username: cx.username.to_string(),
                    password: cx.password.to_string(),
                })
            }
            (None, false) => Err(BuildError::Preflight(
                "kubernetes: the workers need credentials: pass --password-secret NAME (a Secret \
                 with keys username and password), or --allow-plaintext-password"
                    .into(),
            )),
        }
    }
}

impl BackendArgs for KubernetesArgs {
    type Backend = KubernetesBackend;

    fn shape(&self) -> &ShapeArgs {
        &self.shape
    }

    fn cluster_access(&self) -> Option<common::cluster::ClusterAccess> {
        Some(self.access())
    }

    fn password_file(&self) -> Option<&Path> {
        self.password_file.as_deref()
    }

    /// Workers share `<prefix>/codalab-worker-scratch` (Python's), on the claim or the node.
    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(KubernetesBackend, WorkerProfile), BuildError> {
        if !pod::is_dns_label(&self.namespace) {
            return Err(BuildError::Preflight(format!(
                "--namespace {:?} is not a valid namespace name",
                self.namespace
            )));
        }
        if !pod::is_label_value(&self.manager_name) || self.manager_name.is_empty() {
            return Err(BuildError::Preflight(format!(
                "--manager-name {:?} is not a valid label value (at most 63 letters, digits, \
                 '-', '_' or '.', starting and ending with a letter or digit)",
                self.manager_name
            )));
        }
        if let Some(bad) = cx.shapes.iter().find(|s| !pod::is_label_value(&s.name)) {
            return Err(BuildError::Preflight(format!(
                "shape name {:?} is not a valid Kubernetes label value",
                bad.name
            )));
        }
        let image = crate::profile::worker_image(self.worker_image.as_deref());
        let prefix = cx.work_dir_prefix.unwrap_or("/tmp/");
        let work_dir = Path::new(prefix)
            .join("codalab-worker-scratch")
            .display()
            .to_string();
        if !work_dir.starts_with('/') {
            return Err(BuildError::Preflight(format!(
                "--worker-work-dir-prefix {prefix:?} must be an absolute path (it is mounted \
                 into the worker pods)"
            )));
        }
        let cfg = KubernetesConfig {
            namespace: self.namespace.clone(),
            manager_name: self.manager_name.clone(),
            image,
            image_pull_policy: self.image_pull_policy.clone(),
            bundle_runtime: self.bundle_runtime,
            docker_socket: self.docker_socket.clone(),
            work_dir: work_dir.clone(),
            nfs_volume_name: self.nfs_volume_name.clone(),
            credentials: self.credentials(cx)?,
            service_account: self.service_account.clone(),
            image_pull_secrets: self.image_pull_secrets.clone(),
            priority_class: self.priority_class.clone(),
            node_selector: self.node_selectors.iter().cloned().collect(),
            tolerations: self.tolerations.clone(),
            one_worker_per_node: self.one_worker_per_node,
            deadlines: Deadlines {
                unschedulable: Duration::from_secs(self.unschedulable_timeout),
                start_failure: Duration::from_secs(self.start_failure_timeout),
                node_lost: Duration::from_secs(self.node_lost_timeout),
            },
        };
        // kube-rs needs a process-wide TLS provider; ring is the project's.
        common::install_crypto_provider();
        let config = self.kube_config().await?;
        let client = kube::Client::try_from(config).map_err(|e| {
            BuildError::Backend(BackendError::permanent(format!("Kubernetes client: {e}")))
        })?;
        let backend = KubernetesBackend::new(cfg, client);
        backend.preflight().await?;
        let mut profile = WorkerProfile::new(Box::new(move |_| work_dir.clone()));
        // Workers on one node share its Docker engine: one set of networks per worker would
        // exhaust Docker's default address pools at about fifteen workers per node.
        if self.bundle_runtime == BundleRuntime::Docker {
            profile.network_prefix = Some(self.network_prefix.clone());
        }
        profile.extra_args = self.worker_args();
        Ok((backend, profile))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_args;

    #[test]
    fn pythons_flags_and_defaults_and_ours_beyond_them() {
        let k: KubernetesArgs = parse_args(&[
            "--cluster-host",
            "https://k:6443",
            "--auth-token",
            "t",
            "--cert-path",
            "/dev/null",
            "--cert",
            "/dev/null",
            "--nfs-volume-name",
            "nfs",
            "--toleration",
            "pool=gpu:NoSchedule",
            "--node-selector",
            "pool=gpu",
            "--node-selector",
            "zone=a",
        ])
        .unwrap();
        assert_eq!(k.bundle_runtime.as_str(), "docker");
        assert_eq!(
            (k.shape.cpus, k.shape.gpus, k.shape.memory_mb),
            (1, 0, 2048)
        );
        assert_eq!(
            (k.namespace.as_str(), k.manager_name.as_str()),
            ("default", "cl-worker-manager")
        );
        assert_eq!(k.docker_socket, "/var/run/docker.sock");
        assert_eq!(k.node_selectors.len(), 2);
        assert_eq!(k.tolerations[0].effect.as_deref(), Some("NoSchedule"));
        assert_eq!(
            (
                k.unschedulable_timeout,
                k.start_failure_timeout,
                k.node_lost_timeout
            ),
            (900, 300, 300)
        );
        for bad in [
            &["--toleration", "k=v:Never"][..],
            &["--node-selector", "novalue"],
            &["--bundle-runtime", "singularity"],
        ] {
            assert!(parse_args::<KubernetesArgs>(bad).is_err(), "{bad:?}");
        }
    }
}
