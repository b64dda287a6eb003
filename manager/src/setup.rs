//! The start-up both ways of running share (one backend, or several tiers): the one `match`
//! over the backends ([`BackendCommand::args`]), the building of one backend's [`Manager`]
//! ([`build_manager`]), and the drive of the loop ([`drive`]: metrics server, login, one plan
//! or the loop until SIGTERM).

use std::path::Path;
use std::sync::Arc;

use backends::{
    BackendArgs, BuildContext, BuildError, DynBackend, Resources, ShapeArgs, WorkerProfile,
};
use futures::future::BoxFuture;
use protocol::{Credentials, RestClient};
use tokio_util::sync::CancellationToken;

use crate::cli::{BackendCommand, GlobalArgs};
use crate::control::{Exit, Manager};
use crate::metrics::Metrics;
use crate::policy::Config;

/// One backend's flags with their type erased: what the start-up reads of them, and their
/// builder. Every [`BackendArgs`] is one.
pub trait AnyBackendArgs: Send + Sync {
    /// The default worker shape (`--cpus`, `--gpus`, `--memory-mb`).
    fn shape(&self) -> &ShapeArgs;
    /// A CodaLab credentials file given among the backend's flags.
    fn password_file(&self) -> Option<&Path>;
    /// What the workers may hold together, when the backend is bounded.
    fn capacity(&self) -> Result<Option<Resources>, BuildError>;
    /// Exit once more than this many worker jobs failed.
    fn exit_after_num_failed(&self) -> Option<u32>;
    /// Where its Kubernetes API is, for a backend that has one.
    fn cluster_access(&self) -> Option<common::cluster::ClusterAccess>;
    /// The backend's pre-flight check and builder.
    fn build<'a>(
        &'a self,
        cx: &'a BuildContext<'a>,
    ) -> BoxFuture<'a, Result<(DynBackend, WorkerProfile), BuildError>>;
}

impl<A> AnyBackendArgs for A
where
    A: BackendArgs + Send + Sync,
    A::Backend: 'static,
{
    fn shape(&self) -> &ShapeArgs {
        BackendArgs::shape(self)
    }

    fn password_file(&self) -> Option<&Path> {
        BackendArgs::password_file(self)
    }

    fn capacity(&self) -> Result<Option<Resources>, BuildError> {
        BackendArgs::capacity(self)
    }

    fn exit_after_num_failed(&self) -> Option<u32> {
        BackendArgs::exit_after_num_failed(self)
    }

    fn cluster_access(&self) -> Option<common::cluster::ClusterAccess> {
        BackendArgs::cluster_access(self)
    }

    fn build<'a>(
        &'a self,
        cx: &'a BuildContext<'a>,
    ) -> BoxFuture<'a, Result<(DynBackend, WorkerProfile), BuildError>> {
        Box::pin(async move {
            let (backend, profile) = BackendArgs::build(self, cx).await?;
            Ok((DynBackend::new(backend), profile))
        })
    }
}

impl BackendCommand {
    /// The backend's flags; `None` for `status`, `completions` and `man`, which start no
    /// backend. The one place that
    /// knows every backend: a new one is one arm here.
    pub fn args(&self) -> Option<&dyn AnyBackendArgs> {
        match self {
            BackendCommand::Local(a) => Some(a),
            BackendCommand::SlurmBatch(a) => Some(a.as_ref()),
            BackendCommand::AwsBatch(a) => Some(a.as_ref()),
            BackendCommand::AzureBatch(a) => Some(a.as_ref()),
            BackendCommand::Kubernetes(a) => Some(a.as_ref()),
            BackendCommand::Status(_) | BackendCommand::Docs(_) => None,
        }
    }
}

/// What building one backend's manager needs besides its flags and its policy configuration.
pub struct ManagerContext<'a> {
    pub g: &'a GlobalArgs,
    pub credentials: &'a Credentials,
    pub client: &'a RestClient,
    pub metrics: Arc<Metrics>,
}

/// One backend's [`Manager`] on `config` (its shapes, caps and knobs already set): the
/// backend's capacity, the configuration checked, the backend's builder (its pre-flight
/// check), the shapes it adds.
pub async fn build_manager(
    args: &dyn AnyBackendArgs,
    mut config: Config,
    cx: ManagerContext<'_>,
) -> anyhow::Result<Manager<DynBackend>> {
    config.capacity = args.capacity()?;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let shapes = config.shapes.clone();
    let build = BuildContext {
        username: &cx.credentials.username,
        password: &cx.credentials.password,
        work_dir_prefix: cx.g.worker_work_dir_prefix.as_deref(),
        shapes: &shapes,
        capacity: config.capacity,
    };
    let (backend, profile) = args.build(&build).await?;
    config.shapes.extend(profile.extra_shapes.iter().cloned());
    let mut manager = Manager::new(
        cx.client.clone(),
        backend,
        profile,
        config,
        cx.g.settings(),
        cx.g.staged_keywords(&cx.credentials.username),
        cx.metrics,
    );
    manager.exit_after_num_failed = args.exit_after_num_failed();
    Ok(manager)
}

/// A loop [`drive`] runs: one backend's [`Manager`] or the tiers.
pub trait Driven {
    /// What `/metrics` and `/status` serve.
    fn metrics(&self) -> Arc<Metrics>;
    /// Logs what it drives, once logged in.
    fn describe(&self);
    /// One tick that launches and cancels nothing (`--once`): its plan as JSON, or `None`
    /// when the staged bundles could not be read.
    fn plan_once(&mut self) -> impl std::future::Future<Output = anyhow::Result<Option<String>>>;
    /// Ticks until `shutdown`.
    fn run(&mut self, shutdown: CancellationToken) -> impl std::future::Future<Output = Exit>;
    /// Acts only while `gate` says this manager holds the lease.
    fn follow_lease(&mut self, gate: crate::lease::Gate);
}

impl<B: backends::Backend> Driven for Manager<B> {
    fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    fn describe(&self) {
        for s in &self.config.shapes {
            tracing::info!(
                "shape {}: {} CPUs, {} GPUs, {} MiB",
                s.name,
                s.resources.cpus,
                s.resources.gpus,
                s.resources.memory_bytes >> 20
            );
        }
        tracing::info!(
            "{} backend; staged query {:?}",
            self.backend.name(),
            self.keywords
        );
    }

    async fn plan_once(&mut self) -> anyhow::Result<Option<String>> {
        match self.tick(true).await {
            Some(plan) => Ok(Some(serde_json::to_string_pretty(&plan)?)),
            None => Ok(None),
        }
    }

    async fn run(&mut self, shutdown: CancellationToken) -> Exit {
        Manager::run(self, shutdown).await
    }

    fn follow_lease(&mut self, gate: crate::lease::Gate) {
        self.lease = Some(gate);
    }
}

/// Starts the metrics server, logs in, then ticks until `shutdown` (or, with `--once`, plans
/// once and prints the plan).
pub async fn drive<D: Driven>(
    g: &GlobalArgs,
    client: &RestClient,
    shutdown: &CancellationToken,
    cluster: Option<common::cluster::ClusterAccess>,
    mut driven: D,
) -> anyhow::Result<Exit> {
    // The lease's store is reached before anything else: a wrong --lease is a start-up error.
    let store = match (&g.lease, g.once) {
        (Some(spec), false) => Some(lease_store(g, spec, cluster).await?),
        _ => None,
    };
    let server = match g.metrics_addr {
        Some(addr) => Some(crate::metrics::serve(addr, driven.metrics(), shutdown.clone()).await?),
        None => None,
    };
    // Its own token: the lease is handed back after the loop's last tick, not before.
    let lease_stop = CancellationToken::new();
    let lease_task = store.map(|(store, me)| {
        let metrics = driven.metrics();
        let (gate, task) = crate::lease::start(
            store,
            me,
            std::time::Duration::from_secs(g.lease_duration_seconds),
            on_transition(metrics.clone()),
            lease_stop.clone(),
        );
        metrics.lease.follow(gate.clone());
        driven.follow_lease(gate);
        task
    });
    if !common::login_until_success(client, shutdown.cancelled()).await? {
        lease_stop.cancel();
        return Ok(Exit::Stopped);
    }
    driven.describe();
    let exit = if g.once {
        match driven.plan_once().await? {
            Some(plan) => println!("{plan}"),
            None => anyhow::bail!("--once: the staged bundles could not be read"),
        }
        Exit::Stopped
    } else {
        driven.run(shutdown.clone()).await
    };
    lease_stop.cancel();
    if let Some(task) = lease_task {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
    }
    shutdown.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    Ok(exit)
}

/// The store `--lease` names, and this manager's identity in it. A Kubernetes lease is reached
/// with the `kubernetes` backend's cluster flags when there is one, else with the standard
/// configuration (in-cluster service account, `KUBECONFIG`).
async fn lease_store(
    g: &GlobalArgs,
    spec: &crate::lease::LeaseSpec,
    cluster: Option<common::cluster::ClusterAccess>,
) -> anyhow::Result<(Arc<dyn crate::lease::Store>, String)> {
    use crate::lease::{file::FileStore, kube::KubeStore, LeaseSpec};
    let me = g
        .lease_identity
        .clone()
        .unwrap_or_else(crate::lease::default_identity);
    let store: Arc<dyn crate::lease::Store> = match spec {
        LeaseSpec::File(path) => {
            Arc::new(FileStore::new(path, &me).map_err(|e| anyhow::anyhow!("--lease file:{e}"))?)
        }
        LeaseSpec::Kubernetes { namespace, name } => {
            let config = match cluster {
                Some(access) => access
                    .config(Path::new(common::cluster::SERVICE_ACCOUNT_TOKEN))
                    .await
                    .map_err(|e| anyhow::anyhow!("--lease kubernetes:…: {e}"))?,
                None => kube::Config::infer().await.map_err(|e| {
                    anyhow::anyhow!(
                        "--lease kubernetes:…: no Kubernetes configuration ({e}): set \
                         KUBECONFIG or run in a cluster"
                    )
                })?,
            };
            let client = kube::Client::try_from(config)
                .map_err(|e| anyhow::anyhow!("--lease kubernetes:…: {e}"))?;
            Arc::new(KubeStore::new(client, namespace, name))
        }
    };
    // Read once: an unreachable store or a file that is no lease fails the start-up.
    store
        .read()
        .await
        .map_err(|e| anyhow::anyhow!("--lease {}: {e}", store.describe()))?;
    Ok((store, me))
}

/// The metrics of a change of hands.
fn on_transition(metrics: Arc<Metrics>) -> crate::lease::OnTransition {
    Box::new(move |t, _| {
        metrics.lease.transitions.inc();
        metrics.lease.leader.set(i64::from(matches!(
            t,
            crate::lease::Transition::Acquired { .. }
        )));
    })
}
