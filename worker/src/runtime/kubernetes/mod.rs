//! `--bundle-runtime kubernetes`: each run is a pod `codalab-run-<uuid>` on the worker's own
//! node, for clusters whose nodes have no Docker daemon. The pod is built in [`pod`] (pure);
//! this file holds the API calls: create and wait for the start, read the status, kill and
//! remove, find the worker's pods after a restart, the node's free resources for check-ins and
//! the runs' stats (the metrics API; the kubelet's Summary API through the node proxy only with
//! `--kubernetes-kubelet-stats`).
//!
//! The runs' pods are read from one listing of the worker's run pods (its label), made at most
//! once a second for all of them ([`Listing`]): a worker with 50 runs asks the API server once
//! a second, not 50 times.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use tokio_util::sync::CancellationToken;

use super::{BundleRuntime, OwnRun, RunSpec, RunStatus, RuntimeError, Sample};
use common::Resources;

pub mod args;
pub mod pod;
pub mod rbac;

use pod::{Placement, Startup, WorkVolume};

/// Environment variable with the worker's node (the manager sets it from the downward API).
pub const NODE_ENV: &str = "CODALAB_KUBERNETES_NODE_NAME";
/// Environment variable with the worker's own pod, to find the volume of its work dir.
pub const POD_ENV: &str = "CODALAB_KUBERNETES_POD_NAME";

/// The runtime's flags.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    pub access: common::cluster::ClusterAccess,
    /// The node the worker runs on; its runs go there.
    pub node: String,
    /// The worker's own pod, when it runs in one.
    pub pod: Option<String>,
    /// `--kubernetes-kubelet-stats`: without the metrics API, read the runs' stats from the
    /// kubelet's Summary API through `nodes/proxy` (see [`rbac::KUBELET_STATS`]). Off: the
    /// worker never calls `nodes/proxy`.
    pub kubelet_stats: bool,
    /// `--gpuset NONE` (a worker given no GPU): the node's GPUs are not offered.
    pub no_gpus: bool,
}

/// Where a run's resource use is read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StatsSource {
    /// `metrics.k8s.io` (metrics-server): memory and a CPU rate, integrated here.
    Metrics,
    /// The kubelet's Summary API through the API server's node proxy: cumulative CPU time.
    Summary,
    None,
}

#[derive(Default)]
struct CpuIntegral {
    at: Option<Instant>,
    rate_cores: f64,
    total_ns: f64,
}

struct Inner {
    client: Client,
    namespace: String,
    node: String,
    worker_label: String,
    work: WorkVolume,
    tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    stats: StatsSource,
    /// The last Summary of the node, shared by the runs for a second.
    summary: tokio::sync::Mutex<Option<(Instant, serde_json::Value)>>,
    cpu: Mutex<HashMap<String, CpuIntegral>>,
    limits: Mutex<HashMap<String, u64>>,
    capacity: Mutex<Option<Resources>>,
    /// Offer no GPU, whatever the node has free (`--gpuset NONE`).
    no_gpus: bool,
    /// The listings of the worker's run pods, shared by every run that reads its pod.
    listings: Listings,
}

/// The last listing of the worker's run pods and the request in flight. The request runs as a
/// task of its own: a run's monitor that stops polling its wait (to read its stats) holds up
/// no other reader.
struct Listings {
    last: tokio::sync::watch::Sender<Option<Listing>>,
    /// When the request in flight went out.
    in_flight: Mutex<Option<Instant>>,
}

impl Listings {
    fn new() -> Self {
        Listings {
            last: tokio::sync::watch::Sender::new(None),
            in_flight: Mutex::new(None),
        }
    }
}

/// One listing of the worker's run pods (those with its worker label), by name.
#[derive(Clone)]
struct Listing {
    /// When its request went out: every change the API server took before is in it.
    at: Instant,
    pods: Result<Arc<HashMap<String, Pod>>, RuntimeError>,
}

/// Runs as pods on the worker's node.
#[derive(Clone)]
pub struct KubernetesRuntime {
    inner: Arc<Inner>,
}

/// How often the node's free resources are read for check-ins.
const CAPACITY_PERIOD: Duration = Duration::from_secs(5);
/// How often the worker's run pods are listed while a run waits on its pod.
const POLL: Duration = Duration::from_secs(1);

/// A kube error as a runtime error, naming the RBAC verb and resource to grant on 403.
fn api_error(e: kube::Error, verb: &str, what: &str) -> RuntimeError {
    match &e {
        kube::Error::Api(s) if s.code == 404 => RuntimeError::NotFound(s.message.clone()),
        kube::Error::Api(s) if s.code == 409 => RuntimeError::Conflict(s.message.clone()),
        kube::Error::Api(s) if s.code == 403 => RuntimeError::Other(format!(
            "Kubernetes API forbids {verb} {what}: {} (grant the worker's service account \
             {verb} on {what}; see examples/kubernetes/runtime-rbac.yaml)",
            s.message
        )),
        kube::Error::Api(s) if s.code == 401 => RuntimeError::Other(format!(
            "Kubernetes API refused the worker's credentials: {}",
            s.message
        )),
        kube::Error::Api(s) if s.code >= 500 || s.code == 429 => {
            RuntimeError::Unavailable(format!("Kubernetes API: {}", s.message))
        }
        kube::Error::Api(s) => RuntimeError::Other(format!("Kubernetes API: {}", s.message)),
        _ => RuntimeError::Unavailable(format!("Kubernetes API unreachable: {e}")),
    }
}

impl KubernetesRuntime {
    /// Connects, reads the worker's node (and pod), finds how run pods reach the work dir and
    /// where stats come from, and starts reading the node's free resources.
    pub async fn connect(
        cfg: &KubernetesConfig,
        work_dir: &Path,
        worker_id: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        common::install_crypto_provider();
        let config = cfg
            .access
            .config(Path::new(common::cluster::SERVICE_ACCOUNT_TOKEN))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let https = config.cluster_url.scheme_str() == Some("https");
        let client = Client::try_from(config).map_err(|e| {
            anyhow::anyhow!(
                "cannot make a Kubernetes API client: {e}{}",
                if https {
                    " (without --kubernetes-cert-path or an in-cluster ca.crt the machine's CA \
                     certificates verify the API server: install them, e.g. the \
                     ca-certificates package)"
                } else {
                    ""
                }
            )
        })?;
        let ns = cfg.access.namespace.clone();
        let nodes: Api<Node> = Api::all(client.clone());
        nodes.get(&cfg.node).await.map_err(|e| {
            anyhow::anyhow!(
                "node {:?} ({NODE_ENV}): {}",
                cfg.node,
                api_error(e, "get", "nodes")
            )
        })?;
        let mut work = WorkVolume::host(work_dir).map_err(|e| anyhow::anyhow!("work dir: {e}"))?;
        let mut tolerations = Vec::new();
        if let Some(name) = &cfg.pod {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let me = pods.get(name).await.map_err(|e| {
                anyhow::anyhow!(
                    "the worker's pod {ns}/{name}: {}",
                    api_error(e, "get", "pods")
                )
            })?;
            match WorkVolume::of_pod(&me, work_dir) {
                Some(w) => work = w,
                None => tracing::warn!(
                    "no claim or host path of pod {name} holds {}: run pods mount it as a host path",
                    work_dir.display()
                ),
            }
            tolerations = me.spec.and_then(|s| s.tolerations).unwrap_or_default();
        }
        tracing::info!(
            "kubernetes runtime: runs as pods in namespace {ns} on node {}, work dir {:?}",
            cfg.node,
            work.source
        );
        let stats = stats_source(&client, &cfg.node, cfg.kubelet_stats).await;
        let rt = KubernetesRuntime {
            inner: Arc::new(Inner {
                client,
                namespace: ns,
                node: cfg.node.clone(),
                worker_label: pod::worker_label(worker_id),
                work,
                tolerations,
                stats,
                summary: tokio::sync::Mutex::new(None),
                cpu: Mutex::new(HashMap::new()),
                limits: Mutex::new(HashMap::new()),
                capacity: Mutex::new(None),
                no_gpus: cfg.no_gpus,
                listings: Listings::new(),
            }),
        };
        rt.refresh_capacity()
            .await
            .map_err(|e| anyhow::anyhow!("the free resources of node {}: {e}", cfg.node))?;
        let bg = rt.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(CAPACITY_PERIOD) => {}
                }
                if let Err(e) = bg.refresh_capacity().await {
                    tracing::warn!(
                        "cannot read the free resources of node {}: {e}",
                        bg.inner.node
                    );
                }
            }
        });
        Ok(rt)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.inner.client.clone(), &self.inner.namespace)
    }

    async fn refresh_capacity(&self) -> Result<Resources, RuntimeError> {
        let node: Api<Node> = Api::all(self.inner.client.clone());
        let node = node
            .get(&self.inner.node)
            .await
            .map_err(|e| api_error(e, "get", "nodes"))?;
        let all: Api<Pod> = Api::all(self.inner.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.inner.node));
        let pods = all
            .list(&lp)
            .await
            .map_err(|e| api_error(e, "list", "pods (all namespaces)"))?;
        let c = pod::capacity(&node, &pods.items, &self.inner.worker_label);
        *self.inner.capacity.lock().unwrap() = Some(c);
        Ok(c)
    }

    async fn get(&self, name: &str) -> Result<Option<Pod>, RuntimeError> {
        self.pods()
            .get_opt(name)
            .await
            .map_err(|e| api_error(e, "get", "pods"))
    }

    /// A listing of the worker's run pods whose request went out at `fresh_after` or later:
    /// the last one when it did, else a new one. The runs that wait at the same time share it:
    /// each asks for the listing after the one it last saw, one [`POLL`] later, so all of them
    /// are served by one request a second.
    async fn listed(&self, fresh_after: Instant) -> Listing {
        let listings = &self.inner.listings;
        let mut rx = listings.last.subscribe();
        loop {
            if let Some(l) = rx
                .borrow_and_update()
                .as_ref()
                .filter(|l| l.at >= fresh_after)
            {
                return l.clone();
            }
            {
                let mut in_flight = listings.in_flight.lock().unwrap();
                if !in_flight.is_some_and(|at| at >= fresh_after) {
                    let at = Instant::now();
                    *in_flight = Some(at);
                    tokio::spawn(self.clone().list_pods(at));
                }
            }
            // The sender lives as long as `self`.
            let _ = rx.changed().await;
        }
    }

    /// One listing of the worker's run pods, sent at `at`, kept unless a later one is.
    async fn list_pods(self, at: Instant) {
        let lp = ListParams::default().labels(&pod::runs_selector(&self.inner.worker_label));
        let pods = self
            .pods()
            .list(&lp)
            .await
            .map(|list| {
                Arc::new(
                    list.items
                        .into_iter()
                        .filter_map(|p| Some((p.metadata.name.clone()?, p)))
                        .collect(),
                )
            })
            .map_err(|e| api_error(e, "list", "pods"));
        let listings = &self.inner.listings;
        listings.last.send_if_modified(|last| {
            let newer = last.as_ref().is_none_or(|l| l.at < at);
            if newer {
                *last = Some(Listing { at, pods });
            }
            newer
        });
        let mut in_flight = listings.in_flight.lock().unwrap();
        if *in_flight == Some(at) {
            *in_flight = None;
        }
    }

    /// Run pod `name` as a listing at most [`POLL`] old shows it.
    async fn observed(&self, name: &str) -> Result<Option<Pod>, RuntimeError> {
        let l = self.listed(recent()).await;
        Ok(l.pods?.get(name).cloned())
    }

    /// Deletes a pod at once; gone is fine. With `wait`, returns when it no longer exists.
    async fn delete(&self, name: &str, wait: bool) -> Result<(), RuntimeError> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let deleting = match self.pods().delete(name, &dp).await {
            // The pod, now terminating; a status when it is already gone.
            Ok(answer) => answer.left(),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(api_error(e, "delete", "pods")),
        };
        if !wait {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let still_there =
            || RuntimeError::Other(format!("pod {name} is still there 60 s after its deletion"));
        match deleting {
            // The worker's own run pod: the shared listing tells when it is gone.
            Some(p) if pod::is_run_of(&p, &self.inner.worker_label) => {
                let mut after = Instant::now();
                loop {
                    let l = self.listed(after).await;
                    if !l.pods?.contains_key(name) {
                        return Ok(());
                    }
                    if Instant::now() >= deadline {
                        return Err(still_there());
                    }
                    after = l.at + POLL;
                    tokio::time::sleep_until(after.into()).await;
                }
            }
            // Another worker's pod of the same name (a bundle run before elsewhere), which the
            // listing does not hold.
            _ => {
                while self.get(name).await?.is_some() {
                    if Instant::now() >= deadline {
                        return Err(still_there());
                    }
                    tokio::time::sleep(POLL).await;
                }
                Ok(())
            }
        }
    }

    async fn summary(&self) -> Result<serde_json::Value, RuntimeError> {
        let mut cached = self.inner.summary.lock().await;
        if let Some((at, v)) = cached.as_ref() {
            if at.elapsed() < Duration::from_secs(1) {
                return Ok(v.clone());
            }
        }
        let v = get_json(
            &self.inner.client,
            &format!("/api/v1/nodes/{}/proxy/stats/summary", self.inner.node),
        )
        .await
        .map_err(|e| api_error(e, "get", "nodes/proxy"))?;
        *cached = Some((Instant::now(), v.clone()));
        Ok(v)
    }

    /// (cumulative CPU ns, working set bytes) of a run pod.
    async fn usage(&self, name: &str) -> Result<(u64, u64), RuntimeError> {
        match self.inner.stats {
            StatsSource::None => Err(RuntimeError::Other("no stats source".into())),
            StatsSource::Summary => {
                let v = self.summary().await?;
                let p = v["pods"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| {
                        p["podRef"]["name"] == name
                            && p["podRef"]["namespace"] == self.inner.namespace.as_str()
                    })
                    .ok_or_else(|| RuntimeError::NotFound(format!("no stats of pod {name}")))?;
                let c = p["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["name"] == "run")
                    .unwrap_or(p);
                Ok((
                    c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0),
                    c["memory"]["workingSetBytes"].as_u64().unwrap_or(0),
                ))
            }
            StatsSource::Metrics => {
                let v = get_json(
                    &self.inner.client,
                    &format!(
                        "/apis/metrics.k8s.io/v1beta1/namespaces/{}/pods/{name}",
                        self.inner.namespace
                    ),
                )
                .await
                .map_err(|e| api_error(e, "get", "pods.metrics.k8s.io"))?;
                let c = v["containers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["name"] == "run")
                    .ok_or_else(|| RuntimeError::NotFound(format!("no metrics of pod {name}")))?;
                let q = |k: &str| {
                    c["usage"][k]
                        .as_str()
                        .and_then(pod::quantity)
                        .unwrap_or(0.0)
                };
                let (rate, mem) = (q("cpu"), q("memory"));
                let mut cpu = self.inner.cpu.lock().unwrap();
                let e = cpu.entry(name.to_owned()).or_default();
                let now = Instant::now();
                if let Some(at) = e.at {
                    // Trapezoid between two rate readings.
                    e.total_ns += (now - at).as_secs_f64() * (e.rate_cores + rate) / 2.0 * 1e9;
                }
                e.at = Some(now);
                e.rate_cores = rate;
                Ok((e.total_ns as u64, mem as u64))
            }
        }
    }
}

/// The start of the last [`POLL`]: a listing sent since is recent enough to read a pod's state.
fn recent() -> Instant {
    let now = Instant::now();
    now.checked_sub(POLL).unwrap_or(now)
}

/// A GET of a path the typed API does not cover, as JSON.
async fn get_json(client: &Client, path: &str) -> Result<serde_json::Value, kube::Error> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request::<serde_json::Value>(req).await
}

/// The metrics API when it is served; else, only with `kubelet_stats`
/// (`--kubernetes-kubelet-stats`), the node's Summary API when the worker may read it. Without
/// `kubelet_stats` no request goes to `nodes/proxy`.
async fn stats_source(client: &Client, node: &str, kubelet_stats: bool) -> StatsSource {
    match get_json(client, "/apis/metrics.k8s.io/v1beta1").await {
        Ok(_) => {
            tracing::info!("run stats from the metrics API (metrics.k8s.io)");
            return StatsSource::Metrics;
        }
        Err(e) => tracing::debug!("no metrics API: {e}"),
    }
    if !kubelet_stats {
        tracing::warn!(
            "no run stats: the cluster serves no metrics API (metrics.k8s.io; install \
             metrics-server); runs report no CPU or memory use. --kubernetes-kubelet-stats reads \
             the kubelet's Summary API instead, which needs get on nodes/proxy"
        );
        return StatsSource::None;
    }
    match get_json(client, &format!("/api/v1/nodes/{node}/proxy/stats/summary")).await {
        Ok(_) => {
            tracing::info!("run stats from the kubelet's Summary API of node {node}");
            StatsSource::Summary
        }
        Err(e) => {
            tracing::warn!(
                "no run stats: the cluster serves no metrics API (metrics.k8s.io) and the \
                 kubelet's Summary API of node {node} is not readable ({e}; \
                 --kubernetes-kubelet-stats needs get on nodes/proxy); runs report no CPU or \
                 memory use"
            );
            StatsSource::None
        }
    }
}

impl BundleRuntime for KubernetesRuntime {
    fn engine(&self) -> &'static str {
        "Kubernetes API server"
    }

    async fn prepare(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// The node's container runtime pulls the image when the run pod starts (`IfNotPresent`).
    async fn ensure_image(
        &self,
        image: &str,
        _progress: impl FnMut(String) + Send,
    ) -> Result<String, RuntimeError> {
        Ok(super::normalize_image(image))
    }

    fn pin_image(&self, _image: &str) {}

    fn unpin_image(&self, _image: &str) {}

    /// The kubelet's image garbage collection owns the node's images.
    async fn clean_images(&self) {}

    async fn start(
        &self,
        spec: &RunSpec,
        mut progress: impl FnMut(String) + Send,
    ) -> Result<String, RuntimeError> {
        let name = pod::pod_name(&spec.uuid);
        self.delete(&name, true).await?;
        let at = Placement {
            namespace: self.inner.namespace.clone(),
            node: self.inner.node.clone(),
            tolerations: self.inner.tolerations.clone(),
            worker_id: spec.worker_id.clone(),
        };
        let body = pod::run_pod(spec, &self.inner.work, &at)
            .map_err(|e| RuntimeError::Other(e.to_string()))?;
        self.pods()
            .create(&PostParams::default(), &body)
            .await
            .map_err(|e| api_error(e, "create", "pods"))?;
        self.inner
            .limits
            .lock()
            .unwrap()
            .insert(name.clone(), spec.memory_bytes);
        let mut shown: Option<String> = None;
        // The first listing sent after the pod's creation holds it.
        let mut after = Instant::now();
        loop {
            let l = self.listed(after).await;
            let Some(p) = l.pods?.get(&name).cloned() else {
                return Err(RuntimeError::NotFound(format!(
                    "pod {name} was deleted before it started"
                )));
            };
            match pod::startup(&p) {
                Startup::Started => return Ok(name),
                Startup::Waiting(why) => {
                    if let Some(w) = why.as_ref().filter(|_| why != shown) {
                        tracing::info!("{name}: {w}");
                        progress(w.clone());
                        shown = why;
                    }
                }
                Startup::Failed { image, message } => {
                    let _ = self.delete(&name, false).await;
                    return Err(if image {
                        RuntimeError::Image(message)
                    } else {
                        RuntimeError::Other(message)
                    });
                }
            }
            after = l.at + POLL;
            tokio::time::sleep_until(after.into()).await;
        }
    }

    async fn inspect(&self, id: &str) -> Result<Option<RunStatus>, RuntimeError> {
        Ok(self.observed(id).await?.map(|p| pod::run_status(&p)))
    }

    async fn wait(&self, id: &str) {
        let mut after = recent();
        loop {
            let l = self.listed(after).await;
            match &l.pods {
                Ok(pods) if pods.get(id).is_some_and(|p| pod::run_status(p).running) => {}
                Ok(_) => return,
                Err(e) => tracing::debug!("waiting for {id}: {e}"),
            }
            after = l.at + POLL;
            tokio::time::sleep_until(after.into()).await;
        }
    }

    async fn sample(&self, id: &str) -> Result<Sample, RuntimeError> {
        let (cpu_ns, mem) = self.usage(id).await?;
        let known = self.inner.limits.lock().unwrap().get(id).copied();
        let limit = match known {
            Some(l) => l,
            // A run resumed after a restart: its limit is in its pod.
            None => {
                let l = self
                    .observed(id)
                    .await?
                    .map(|p| pod::memory_limit(&p))
                    .unwrap_or(0);
                self.inner.limits.lock().unwrap().insert(id.to_owned(), l);
                l
            }
        };
        Ok(Sample {
            cpu_total_ns: cpu_ns,
            cpu_user_ns: cpu_ns,
            cpu_system_ns: 0,
            // CPU time against wall time: the share is in cores.
            system_ns: (common::now_unix() * 1e9) as u64,
            online_cpus: 1,
            memory_bytes: mem,
            memory_limit: limit,
        })
    }

    async fn kill(&self, uuid: &str) -> Result<(), RuntimeError> {
        self.delete(&pod::pod_name(uuid), false).await
    }

    async fn remove(&self, uuid: &str) -> Result<(), RuntimeError> {
        let name = pod::pod_name(uuid);
        self.inner.cpu.lock().unwrap().remove(&name);
        self.inner.limits.lock().unwrap().remove(&name);
        self.delete(&name, true).await
    }

    async fn address(&self, uuid: &str, id: &str) -> Result<String, RuntimeError> {
        self.observed(id)
            .await?
            .and_then(|p| p.status.and_then(|s| s.pod_ip))
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| RuntimeError::NotFound(format!("The pod of bundle {uuid} has no IP")))
    }

    async fn list_own(&self, worker_id: &str) -> Result<Vec<OwnRun>, RuntimeError> {
        let lp = ListParams::default().labels(&pod::runs_selector(&pod::worker_label(worker_id)));
        let list = self
            .pods()
            .list(&lp)
            .await
            .map_err(|e| api_error(e, "list", "pods"))?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| {
                p.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(pod::ANNOTATION_WORKER_ID))
                    .map(String::as_str)
                    == Some(worker_id)
            })
            .filter_map(|p| {
                let uuid = p
                    .metadata
                    .labels
                    .as_ref()?
                    .get(pod::LABEL_BUNDLE_UUID)?
                    .clone();
                Some(OwnRun {
                    id: p.metadata.name?,
                    uuid,
                })
            })
            .collect())
    }

    async fn shutdown(&self) {}

    fn capacity(&self) -> Option<Resources> {
        offered(*self.inner.capacity.lock().unwrap(), self.inner.no_gpus)
    }
}

/// What the worker offers of the node's free resources: all of them, but no GPU when it was
/// given none (`--gpuset NONE`).
fn offered(free: Option<Resources>, no_gpus: bool) -> Option<Resources> {
    free.map(|c| Resources {
        gpus: if no_gpus { 0 } else { c.gpus },
        ..c
    })
}

#[cfg(test)]
mod tests;
