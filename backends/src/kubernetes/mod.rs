//! The `kubernetes` backend: one pod per worker, on kube-rs.
//!
//! - **Own pods** carry this manager's labels ([`pod::selector`]) and are found with **one
//!   label-selected list call per tick**; a restarted manager adopts them; pods of other
//!   managers are never counted or touched.
//! - **Pending pods count** toward `--max-workers` (Python counted only running ones and
//!   launched every tick while a cluster autoscaler added nodes). A pod that cannot start
//!   (`Unschedulable` past `--unschedulable-timeout`; `ErrImagePull`, `ImagePullBackOff`,
//!   `CreateContainerConfigError`, … past `--start-failure-timeout`) is deleted and reported as
//!   a failed launch, with its reason, so the manager backs off instead of storming.
//! - **Ended pods** are reported once, then deleted: finished pods do not pile up.
//! - **Credentials** come from a Secret mounted read-only as the worker's `--password-file`;
//!   never plain pod env or argv unless the operator opts in.
//! - **Errors**: 401/403 name the missing RBAC verb and resource; 409 on create adopts the pod
//!   (a retried create that went through); 429/5xx and connection errors are retried with
//!   back-off, then reported, so an unreachable API makes the tick's listing unknown.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Toleration};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;

use crate::{Backend, BackendError, BuildError, JobSpec, JobStatus, Ledger};

mod args;
pub mod pod;
pub mod rbac;
pub use args::KubernetesArgs;
pub use pod::Deadlines;

/// The bundle runtime the workers are started with (`--bundle-runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BundleRuntime {
    /// Bundles run in the node's Docker engine, through its socket mounted into the pod.
    Docker,
    /// Bundles run as pods of their own (the worker talks to the API).
    Kubernetes,
}

impl BundleRuntime {
    pub fn as_str(self) -> &'static str {
        match self {
            BundleRuntime::Docker => "docker",
            BundleRuntime::Kubernetes => "kubernetes",
        }
    }
}

/// How workers get their CodaLab credentials.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A Secret with keys `username` and `password`, mounted read-only as a directory and given
    /// to the worker as `--password-file`.
    Secret(String),
    /// Plain pod environment (`--allow-plaintext-password`, Python's way).
    Plaintext { username: String, password: String },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Secret(s) => f.debug_tuple("Secret").field(s).finish(),
            Credentials::Plaintext { username, .. } => f
                .debug_struct("Plaintext")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
        }
    }
}

/// Settings of the backend (the `kubernetes` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesConfig {
    /// Namespace of the worker pods (and of the Secret and the claim).
    pub namespace: String,
    /// Value of the manager label: what makes a pod this manager's.
    pub manager_name: String,
    /// Worker image.
    pub image: String,
    pub image_pull_policy: Option<String>,
    pub bundle_runtime: BundleRuntime,
    /// The node's Docker socket (mounted with `--bundle-runtime docker`).
    pub docker_socket: String,
    /// The workers' `--work-dir`, mounted at the same path as on the node.
    pub work_dir: String,
    /// PersistentVolume name; the pods mount the claim `<name>-claim` as the work dir.
    pub nfs_volume_name: Option<String>,
    pub credentials: Credentials,
    pub service_account: Option<String>,
    pub image_pull_secrets: Vec<String>,
    pub priority_class: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// A required pod anti-affinity: at most one of this manager's workers per node.
    pub one_worker_per_node: bool,
    pub deadlines: Deadlines,
}

/// The backend.
pub struct KubernetesBackend {
    cfg: KubernetesConfig,
    pods: Api<Pod>,
    client: kube::Client,
    ledger: Mutex<Ledger>,
}

/// Retries of one API call on throttling, server errors and connection errors (then the
/// error goes to the manager: an unknown listing, or a failed launch).
fn retry_policy() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(2))
        .with_max_times(3)
        .with_jitter()
}

/// Runs one API call, retried on throttling, server and connection errors ([`retry_policy`]).
async fn call<T, F, Fut>(f: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    f.retry(retry_policy()).when(transient).await
}

/// Whether the same call may succeed if repeated.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 429 | 500 | 502 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// The HTTP status of an API error (0 for other errors).
fn status_code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        _ => 0,
    }
}

/// A backend error for a failed `verb` on `resource` in `namespace`: 401/403 say what the
/// manager's credentials or service account lack.
pub(crate) fn api_error(
    e: kube::Error,
    verb: &str,
    resource: &str,
    namespace: &str,
) -> BackendError {
    let (message, retryable) = match &e {
        kube::Error::Api(s) if s.code == 401 => (
            format!(
                "the Kubernetes API refused the manager's credentials (401 Unauthorized: {}): \
                 check --auth-token-file (or the kubeconfig / service-account token)",
                s.message
            ),
            false,
        ),
        kube::Error::Api(s) if s.code == 403 => (
            format!(
                "the manager may not {verb} {resource} in namespace {namespace} (403 Forbidden: \
                 {}): grant its service account the verb \"{verb}\" on \"{resource}\" in a Role \
                 there (see examples/kubernetes/rbac.yaml)",
                s.message
            ),
            false,
        ),
        kube::Error::Api(s) => (
            format!(
                "Kubernetes API: {verb} {resource} in namespace {namespace}: {} {}: {}",
                s.code, s.reason, s.message
            ),
            transient(&e),
        ),
        other if transient(other) => (
            format!("Kubernetes API unreachable ({verb} {resource}): {other}"),
            true,
        ),
        other => (
            format!("Kubernetes API: {verb} {resource} in namespace {namespace}: {other}"),
            true,
        ),
    };
    let err = if retryable {
        BackendError::retryable(message)
    } else {
        BackendError::permanent(message)
    };
    err.with_source(e)
}

impl KubernetesBackend {
    /// A backend on `client` (which the builder made from the flags or the kube config).
    pub fn new(cfg: KubernetesConfig, client: kube::Client) -> Self {
        let pods = Api::namespaced(client.clone(), &cfg.namespace);
        Self {
            cfg,
            pods,
            client,
            ledger: Mutex::new(Ledger::new()),
        }
    }

    pub fn config(&self) -> &KubernetesConfig {
        &self.cfg
    }

    /// The pre-flight check: the pods can be listed, the credentials Secret has `username`
    /// and `password`, the work-dir claim exists. Permission problems and missing objects
    /// stop the start-up; an unreachable API only warns (the loop waits for it).
    pub async fn preflight(&self) -> Result<(), BuildError> {
        let ns = &self.cfg.namespace;
        let fatal = |e: BackendError| -> Result<(), BuildError> {
            if e.is_retryable() {
                tracing::warn!("pre-flight check: {e}; going on, the loop retries every tick");
                Ok(())
            } else {
                Err(BuildError::Backend(e))
            }
        };
        let lp = ListParams::default().labels(&pod::selector(&self.cfg.manager_name));
        if let Err(e) = call(|| self.pods.list(&lp)).await {
            return fatal(api_error(e, "list", "pods", ns));
        }
        if let Credentials::Secret(name) = &self.cfg.credentials {
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), ns);
            match call(|| secrets.get(name)).await {
                Ok(secret) => {
                    let data = secret.data.unwrap_or_default();
                    let missing: Vec<&str> = ["username", "password"]
                        .into_iter()
                        .filter(|k| data.get(*k).is_none_or(|v| v.0.is_empty()))
                        .collect();
                    if !missing.is_empty() {
                        return Err(BuildError::Preflight(format!(
                            "Secret {name} in namespace {ns} has no {} key: it must hold \
                             `username` and `password`",
                            missing.join(" or ")
                        )));
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(BuildError::Preflight(format!(
                        "Secret {name} (--password-secret) does not exist in namespace {ns}: \
                         create it with `kubectl -n {ns} create secret generic {name} \
                         --from-literal=username=<user> --from-file=password=<file>`"
                    )))
                }
                Err(e) => fatal(api_error(e, "get", "secrets", ns))?,
            }
        }
        if let Some(nfs) = &self.cfg.nfs_volume_name {
            let claim = format!("{nfs}-claim");
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
            match call(|| claims.get(&claim)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(BuildError::Preflight(format!(
                        "PersistentVolumeClaim {claim} (from --nfs-volume-name {nfs}) does not \
                         exist in namespace {ns}"
                    )))
                }
                Err(e) => fatal(api_error(e, "get", "persistentvolumeclaims", ns))?,
            }
        }
        Ok(())
    }

    /// Deletes pod `name`; a pod already gone is no error.
    async fn delete(&self, name: &str) -> Result<(), BackendError> {
        self.delete_with(name, DeleteParams::default()).await
    }

    /// Deletes pod `name` with `dp` (e.g. by force: grace 0).
    async fn delete_with(&self, name: &str, dp: DeleteParams) -> Result<(), BackendError> {
        match call(|| self.pods.delete(name, &dp)).await {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == 404 => Ok(()),
            Err(e) => Err(api_error(e, "delete", "pods", &self.cfg.namespace)),
        }
    }

    fn check(&self, spec: &JobSpec) -> Result<(), BackendError> {
        if !pod::is_dns_label(&pod::pod_name(&spec.worker_id)) {
            return Err(BackendError::permanent(format!(
                "worker id {:?} does not make a valid pod name",
                spec.worker_id
            )));
        }
        if !pod::is_label_value(&spec.shape_name) {
            return Err(BackendError::permanent(format!(
                "shape name {:?} is not a valid Kubernetes label value",
                spec.shape_name
            )));
        }
        if spec.command.is_empty() {
            return Err(BackendError::permanent("empty worker command"));
        }
        Ok(())
    }
}

impl Backend for KubernetesBackend {
    fn name(&self) -> &str {
        "kubernetes"
    }

    async fn submit(&self, spec: &JobSpec) -> Result<String, BackendError> {
        self.check(spec)?;
        let pod = pod::worker_pod(&self.cfg, spec);
        let name = pod::pod_name(&spec.worker_id);
        let pp = PostParams::default();
        match call(|| self.pods.create(&pp, &pod)).await {
            Ok(_) => {}
            // The name is this worker's own: a create that went through before its response
            // was lost. The pod is ours.
            Err(e) if status_code(&e) == 409 => {
                tracing::info!(
                    "pod {name} already exists (a retried create went through): adopting it"
                );
            }
            Err(e) => return Err(api_error(e, "create", "pods", &self.cfg.namespace)),
        }
        self.ledger
            .lock()
            .unwrap()
            .submitted(&name, &spec.worker_id, &spec.shape_name);
        Ok(name)
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        let lp = ListParams::default().labels(&pod::selector(&self.cfg.manager_name));
        let listed = call(|| self.pods.list(&lp))
            .await
            .map_err(|e| api_error(e, "list", "pods", &self.cfg.namespace))?;
        let now = common::now_unix() as i64;
        let mut jobs = Vec::with_capacity(listed.items.len());
        let mut doomed = Vec::new();
        for p in &listed.items {
            let seen = pod::classify(p, now, self.cfg.deadlines);
            if seen.should_delete() {
                let force = matches!(seen, pod::Seen::Lost { .. });
                doomed.push((p.metadata.name.clone().unwrap_or_default(), force));
            }
            match seen {
                pod::Seen::Foreign => {}
                pod::Seen::Job(job) => jobs.push(job),
                pod::Seen::Stuck { job, message } => {
                    tracing::warn!(
                        "pod {} cannot start ({}: {message}); deleting it: a failed launch",
                        job.id,
                        job.detail.as_deref().unwrap_or("?"),
                    );
                    jobs.push(job);
                }
                pod::Seen::Lost { job, message } => {
                    tracing::warn!(
                        "pod {} is {message}; deleting it by force: its worker is lost",
                        job.id
                    );
                    jobs.push(job);
                }
            }
        }
        // Ended and stuck pods are deleted now; one that fails to go is tried again next tick
        // (and not reported again).
        let deletions = doomed.iter().map(|(name, force)| async move {
            // The node cannot confirm a graceful deletion: `kubectl delete --force
            // --grace-period=0`, which removes the object at once.
            let dp = if *force {
                DeleteParams::default().grace_period(0)
            } else {
                DeleteParams::default()
            };
            if let Err(e) = self.delete_with(name, dp).await {
                tracing::warn!("deleting pod {name}: {e}");
            }
        });
        futures::future::join_all(deletions).await;
        let observed = self.ledger.lock().unwrap().observe(jobs);
        // A pod of ours that vanished was deleted by someone (or by our cancel): its end is
        // not known.
        Ok(observed.resolve(|_| None))
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        self.delete(id).await
    }
}

#[cfg(test)]
mod tests;
