//! The node agent: scheduler and kubelet for the fake nodes, in the stand-in's process.
//!
//! It polls the in-memory API (kube-rs `Api`s on the kube-fake-client client) every tick or
//! when the front signals a write, and:
//! * binds PersistentVolumeClaims (each to a directory `<state>/pvcs/<namespace>/<claim>`);
//! * schedules pending pods on the nodes (see `sched`), or reports them Unschedulable;
//! * starts each bound pod's containers in the Docker engine (host network: the pod IP is the
//!   node's IP, as for `hostNetwork` pods), watches them and reports the pod status;
//! * stops and removes the containers of deleted pods (SIGTERM, SIGKILL after the grace);
//! * applies the fault injections (`state::Faults`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bollard::models::{ContainerCreateBody, ContainerSummaryStateEnum, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Event, Node, PersistentVolumeClaim, Pod, Secret, Taint,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::sched::{self, Placed, Resources};
use crate::state::{
    fault_selects, Shared, LABEL_CONTAINER_NAME, LABEL_INSTANCE, LABEL_POD_NAME,
    LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// Container label: the state directory of the stand-in that started it (to clean up after a
/// crash without touching another instance's containers).
pub const LABEL_STATE: &str = "org.cl-worker-test.kube-standin.state";

/// A fake node, as given on the command line.
#[derive(Debug, Clone)]
pub struct NodeArg {
    pub name: String,
    pub cpu: String,
    pub memory: String,
    pub gpu: u32,
    pub pods: u32,
    pub ip: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

impl std::str::FromStr for NodeArg {
    type Err = String;

    /// `name=node-a,cpu=4,memory=8Gi,gpu=2,pods=110,ip=127.0.0.1,label.pool=gpu,taint.nvidia.com/gpu=present:NoSchedule`
    fn from_str(s: &str) -> Result<Self, String> {
        let mut n = NodeArg {
            name: String::new(),
            cpu: "4".into(),
            memory: "8Gi".into(),
            gpu: 0,
            pods: 110,
            ip: "127.0.0.1".into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
        };
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected key=value"))?;
            match k {
                "name" => n.name = v.into(),
                "cpu" => n.cpu = v.into(),
                "memory" => n.memory = v.into(),
                "gpu" => n.gpu = v.parse().map_err(|_| format!("gpu={v}: not a count"))?,
                "pods" => n.pods = v.parse().map_err(|_| format!("pods={v}: not a count"))?,
                "ip" => {
                    if !v.starts_with("127.") {
                        return Err(format!(
                            "ip={v}: node addresses must be loopback (127.x.y.z)"
                        ));
                    }
                    n.ip = v.into()
                }
                _ if k.starts_with("label.") => {
                    n.labels.insert(k["label.".len()..].into(), v.into());
                }
                _ if k.starts_with("taint.") => {
                    let (value, effect) = v
                        .rsplit_once(':')
                        .ok_or_else(|| format!("{part:?}: expected taint.KEY=VALUE:EFFECT"))?;
                    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                        return Err(format!(
                            "{part:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute"
                        ));
                    }
                    n.taints.push(Taint {
                        key: k["taint.".len()..].into(),
                        value: (!value.is_empty()).then(|| value.into()),
                        effect: effect.into(),
                        ..Default::default()
                    });
                }
                _ => return Err(format!("unknown node setting {k:?}")),
            }
        }
        if n.name.is_empty() {
            return Err("a node needs name=...".into());
        }
        for q in [&n.cpu, &n.memory] {
            if sched::parse_quantity(q).is_none() {
                return Err(format!("{q:?} is not a quantity"));
            }
        }
        Ok(n)
    }
}

pub struct AgentConfig {
    pub nodes: Vec<NodeArg>,
    pub tick: Duration,
    pub max_grace: i64,
    pub image_backoff: Duration,
}

/// One started container.
#[derive(Debug, Clone)]
struct Ctr {
    name: String,
    id: String,
    image: String,
    image_id: String,
    restarts: i32,
    /// The last finished run, for lastState (restarts only).
    last: Option<Value>,
    /// Current state for containerStatuses: {"running": ...} / {"terminated": ...} / {"waiting": ...}.
    state: Value,
    /// When a restart is due (restartPolicy Always/OnFailure).
    restart_at: Option<Instant>,
}

/// A pod whose containers exist.
#[derive(Debug)]
struct Run {
    ns: String,
    name: String,
    node: String,
    grace: i64,
    ctrs: Vec<Ctr>,
    pod_dir: PathBuf,
    gpus: Vec<u32>,
    started: String,
}

/// A bound pod that could not start yet (image, config, volume trouble).
#[derive(Debug, Default)]
struct Waiting {
    attempts: u32,
    next_try: Option<Instant>,
    pull_failed_at: Option<Instant>,
}

pub struct Agent {
    shared: Arc<Shared>,
    docker: Docker,
    cfg: AgentConfig,
    pods: Api<Pod>,
    nodes: Api<Node>,
    runs: HashMap<String, Run>,
    waiting: HashMap<String, Waiting>,
    /// Last status written per pod uid (a digest), to write only on change.
    written: HashMap<String, String>,
    /// Last event reason per pod uid, so repeated conditions make one event.
    evented: HashMap<String, String>,
    lost_applied: HashSet<String>,
    event_seq: u64,
}

/// Where a kubelet projects a pod's service account token.
const SA_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Docker's RFC 3339 nano timestamps as Kubernetes' second-precision form.
fn k8s_time(docker_time: Option<&str>) -> String {
    docker_time
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .filter(|t| t.as_second() > 0)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(now)
}

fn labels_of(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

fn phase_of(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(phase_of(pod), "Succeeded" | "Failed")
}

fn cond(type_: &str, status: &str, reason: Option<&str>, message: Option<&str>) -> Value {
    let mut c = json!({"type": type_, "status": status, "lastProbeTime": null, "lastTransitionTime": now()});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    if let Some(m) = message {
        c["message"] = json!(m);
    }
    c
}

impl Agent {
    pub async fn new(shared: Arc<Shared>, cfg: AgentConfig) -> Result<Self> {
        let docker = Docker::connect_with_local_defaults()
            .context("cannot connect to Docker")?
            .negotiate_version()
            .await
            .context("cannot reach the Docker engine")?;
        docker
            .ping()
            .await
            .context("the Docker engine does not answer")?;
        let client = shared.client.clone();
        Ok(Agent {
            shared,
            docker,
            cfg,
            pods: Api::all(client.clone()),
            nodes: Api::all(client),
            runs: HashMap::new(),
            waiting: HashMap::new(),
            written: HashMap::new(),
            evented: HashMap::new(),
            lost_applied: HashSet::new(),
            event_seq: 0,
        })
    }

    fn state_label(&self) -> String {
        self.shared.state_dir.display().to_string()
    }

    /// Removes containers left by an earlier instance with the same state directory.
    pub async fn remove_stale_containers(&self, all: bool) -> Result<usize> {
        let filters: HashMap<String, Vec<String>> = [(
            "label".to_string(),
            vec![format!("{LABEL_STATE}={}", self.state_label())],
        )]
        .into();
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let mut n = 0;
        for c in self.docker.list_containers(Some(opts)).await? {
            let mine = c.labels.as_ref().and_then(|l| l.get(LABEL_INSTANCE))
                == Some(&self.shared.instance);
            if mine && !all {
                continue;
            }
            if let Some(id) = c.id {
                let rm = RemoveContainerOptionsBuilder::default()
                    .force(true)
                    .v(true)
                    .build();
                if self.docker.remove_container(&id, Some(rm)).await.is_ok() {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    pub async fn register_nodes(&self) -> Result<()> {
        for n in &self.cfg.nodes {
            let mut labels = n.labels.clone();
            for (k, v) in [
                ("kubernetes.io/hostname", n.name.as_str()),
                ("kubernetes.io/os", "linux"),
                ("kubernetes.io/arch", "amd64"),
                ("beta.kubernetes.io/os", "linux"),
                ("beta.kubernetes.io/arch", "amd64"),
            ] {
                labels.entry(k.into()).or_insert_with(|| v.into());
            }
            let mut capacity = json!({"cpu": n.cpu, "memory": n.memory, "pods": n.pods.to_string(),
                                      "ephemeral-storage": "100Gi", "hugepages-2Mi": "0"});
            if n.gpu > 0 {
                capacity[sched::GPU] = json!(n.gpu.to_string());
            }
            let (major, minor) = self.shared.version;
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": n.name, "labels": labels},
                "spec": {"taints": if n.taints.is_empty() { Value::Null } else { serde_json::to_value(&n.taints)? }},
                "status": {
                    "capacity": capacity, "allocatable": capacity,
                    "conditions": node_conditions(true),
                    "addresses": [{"type": "InternalIP", "address": n.ip}, {"type": "Hostname", "address": n.name}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                    "nodeInfo": {
                        "machineID": format!("{:032x}", crate::api_hash(&n.name)), "systemUUID": format!("{:032x}", crate::api_hash(&n.name) ^ 1),
                        "bootID": self.shared.instance, "kernelVersion": "6.0.0", "osImage": "kube-standin fake node",
                        "containerRuntimeVersion": "docker://20.10", "kubeletVersion": format!("v{major}.{minor}.0-kube-standin"),
                        "kubeProxyVersion": format!("v{major}.{minor}.0-kube-standin"), "operatingSystem": "linux", "architecture": "amd64",
                    },
                },
            }))?;
            self.nodes
                .create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("creating node {}", n.name))?;
        }
        Ok(())
    }

    pub async fn run(mut self, stop: tokio::sync::watch::Receiver<bool>) {
        let mut stop = stop;
        loop {
            if *stop.borrow() {
                break;
            }
            if let Err(e) = self.tick().await {
                tracing::warn!("agent: {e:#}");
            }
            tokio::select! {
                _ = self.shared.wake.notified() => {}
                _ = tokio::time::sleep(self.cfg.tick) => {}
                _ = stop.changed() => {}
            }
        }
        // Shut down: every container of this instance goes.
        let uids: Vec<String> = self.runs.keys().cloned().collect();
        for uid in uids {
            if let Some(run) = self.runs.remove(&uid) {
                stop_run(self.docker.clone(), run, 0).await;
            }
        }
        match self.remove_stale_containers(true).await {
            Ok(n) if n > 0 => tracing::info!("removed {n} leftover containers"),
            _ => {}
        }
    }

    async fn tick(&mut self) -> Result<()> {
        let faults = self.shared.faults();
        self.bind_claims().await?;
        let pods = self.pods.list(&ListParams::default()).await?.items;
        let nodes = self.nodes.list(&ListParams::default()).await?.items;

        // Pods that are gone (deleted): stop their containers.
        let live: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let gone: Vec<String> = self
            .runs
            .keys()
            .filter(|u| !live.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(run) = self.runs.remove(&uid) {
                let asked = self.shared.grace.lock().expect("grace lock").remove(&uid);
                let grace = asked.unwrap_or(run.grace).clamp(0, self.cfg.max_grace);
                tracing::info!(
                    "pod {}/{} deleted: stopping its containers (grace {grace} s)",
                    run.ns,
                    run.name
                );
                tokio::spawn(stop_run(self.docker.clone(), run, grace));
            }
        }
        self.waiting.retain(|u, _| live.contains(u));
        self.written.retain(|u, _| live.contains(u));
        self.evented.retain(|u, _| live.contains(u));

        // Lost nodes.
        for n in &nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let lost = faults.lost_nodes.contains(&name);
            if lost != self.lost_applied.contains(&name) {
                self.set_node_lost(n, lost).await?;
                if lost {
                    self.lost_applied.insert(name);
                } else {
                    self.lost_applied.remove(&name);
                }
            }
        }

        // Usage per node from the pods bound there (for scheduling).
        let mut used: HashMap<String, Resources> = HashMap::new();
        let mut sorted: Vec<&Pod> = pods.iter().collect();
        sorted.sort_by_key(|p| {
            (
                p.metadata.creation_timestamp.clone().map(|t| t.0),
                p.metadata.name.clone(),
            )
        });
        for p in &sorted {
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                if !is_terminal(p) {
                    let u = used.entry(node).or_default();
                    for (k, v) in sched::pod_requests(p) {
                        *u.entry(k).or_default() += v;
                    }
                    *u.entry("pods".into()).or_default() += 1.0;
                }
            }
        }
        let mut placed: Vec<(Pod, String)> = sorted
            .iter()
            .filter(|p| !is_terminal(p))
            .filter_map(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .map(|n| ((*p).clone(), n))
            })
            .collect();

        // One listing of this instance's containers per tick: a running container needs no
        // inspection of its own (100 pods made 100 inspections a tick).
        let listed = if self.runs.is_empty() {
            None
        } else {
            Some(self.container_states().await?)
        };
        for pod in sorted {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            match node_name {
                None => {
                    if is_terminal(pod) {
                        continue;
                    }
                    if let Some(node) = self.schedule(pod, &nodes, &faults, &used, &placed).await? {
                        let u = used.entry(node.clone()).or_default();
                        for (k, v) in sched::pod_requests(pod) {
                            *u.entry(k).or_default() += v;
                        }
                        *u.entry("pods".into()).or_default() += 1.0;
                        placed.push((pod.clone(), node));
                    }
                }
                Some(node) => {
                    if faults.lost_nodes.contains(&node) {
                        if !is_terminal(pod) {
                            self.fail_node_lost(pod, &node).await?;
                        }
                        continue;
                    }
                    if self.runs.contains_key(&uid) {
                        self.monitor(pod, listed.as_ref(), &nodes).await?;
                    } else if !is_terminal(pod) {
                        let Some(n) = nodes
                            .iter()
                            .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
                        else {
                            continue; // bound to a node that does not exist: stays Pending
                        };
                        self.try_start(pod, n, &faults).await?;
                    }
                }
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Events and status writes
    // -----------------------------------------------------------------------

    async fn event(
        &mut self,
        pod: &Pod,
        type_: &str,
        reason: &str,
        message: &str,
        component: &str,
        host: Option<&str>,
    ) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = format!("{reason}\u{0}{message}");
        if self.evented.get(&uid) == Some(&key) {
            return;
        }
        self.evented.insert(uid.clone(), key);
        self.event_seq += 1;
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ts = now();
        let mut source = json!({"component": component});
        if let Some(h) = host {
            source["host"] = json!(h);
        }
        let ev: Result<Event, _> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("{name}.{:016x}", (self.event_seq << 20) ^ crate::api_hash(&uid)), "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": uid, "apiVersion": "v1"},
            "reason": reason, "message": message, "type": type_, "source": source,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
            "reportingComponent": component, "reportingInstance": host.unwrap_or(component),
        }));
        if let Ok(ev) = ev {
            let api: Api<Event> = Api::namespaced(self.shared.client.clone(), &ns);
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                tracing::debug!("event for {ns}/{name}: {e}");
            }
        }
    }

    /// Writes a status (merge patch on pods/status) unless the same digest was written last.
    async fn write_status(&mut self, pod: &Pod, digest: String, status: Value) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if self.written.get(&uid) == Some(&digest) {
            return Ok(());
        }
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &ns);
        match api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
        {
            Ok(_) => {
                self.written.insert(uid, digest);
            }
            // Deleted meanwhile: nothing to report.
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Claims
    // -----------------------------------------------------------------------

    async fn bind_claims(&mut self) -> Result<()> {
        let api: Api<PersistentVolumeClaim> = Api::all(self.shared.client.clone());
        for pvc in api.list(&ListParams::default()).await?.items {
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                continue;
            }
            let ns = pvc.metadata.namespace.clone().unwrap_or_default();
            let name = pvc.metadata.name.clone().unwrap_or_default();
            let dir = self.claim_dir(&ns, &name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let spec = pvc.spec.clone().unwrap_or_default();
            let storage = spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage").cloned())
                .map(|q| q.0)
                .unwrap_or_else(|| "1Gi".into());
            let volume = format!("pvc-{}", pvc.metadata.uid.clone().unwrap_or_default());
            let nsapi: Api<PersistentVolumeClaim> =
                Api::namespaced(self.shared.client.clone(), &ns);
            nsapi
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"volumeName": volume}})),
                )
                .await?;
            nsapi
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"status": {"phase": "Bound", "accessModes": spec.access_modes,
                                                     "capacity": {"storage": storage}}}),
                    ),
                )
                .await?;
            tracing::info!("claim {ns}/{name} bound to {}", dir.display());
        }
        Ok(())
    }

    fn claim_dir(&self, ns: &str, name: &str) -> PathBuf {
        self.shared.state_dir.join("pvcs").join(ns).join(name)
    }

    // -----------------------------------------------------------------------
    // Scheduling
    // -----------------------------------------------------------------------

    async fn schedule(
        &mut self,
        pod: &Pod,
        nodes: &[Node],
        faults: &crate::state::Faults,
        used: &HashMap<String, Resources>,
        placed: &[(Pod, String)],
    ) -> Result<Option<String>> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let unschedulable = |msg: String| -> (String, Value) {
            let status = json!({"phase": "Pending",
                "conditions": [cond("PodScheduled", "False", Some("Unschedulable"), Some(&msg))]});
            (format!("unschedulable:{msg}"), status)
        };
        // Claims must exist (and are bound by now).
        let mut missing_claim = None;
        for v in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default()
        {
            if let Some(c) = v.persistent_volume_claim {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.shared.client.clone(), &ns);
                if api.get_opt(&c.claim_name).await?.is_none() {
                    missing_claim = Some(c.claim_name);
                    break;
                }
            }
        }
        let (digest, status, reason) = if fault_selects(&faults.unschedulable, &labels_of(pod)) {
            let msg = format!(
                "0/{} nodes are available: {} node(s) were unschedulable. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.",
                nodes.len(), nodes.len(), nodes.len(), nodes.len()
            );
            let (d, s) = unschedulable(msg.clone());
            (d, s, Some(msg))
        } else if let Some(claim) = missing_claim {
            let msg = format!("persistentvolumeclaim \"{claim}\" not found. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.", nodes.len(), nodes.len());
            let (d, s) = unschedulable(msg.clone());
            (d, s, Some(msg))
        } else {
            let pairs: Vec<(&Pod, &Node)> = placed
                .iter()
                .filter_map(|(p, n)| {
                    nodes
                        .iter()
                        .find(|x| x.metadata.name.as_deref() == Some(n.as_str()))
                        .map(|x| (p, x))
                })
                .collect();
            let placed_refs: Vec<Placed<'_>> = pairs
                .iter()
                .map(|(p, n)| Placed { pod: p, node: n })
                .collect();
            let mut sorted_nodes: Vec<&Node> = nodes.iter().collect();
            sorted_nodes.sort_by_key(|n| n.metadata.name.clone());
            let mut all_reasons = Vec::new();
            let mut chosen = None;
            for n in sorted_nodes {
                let nname = n.metadata.name.clone().unwrap_or_default();
                let ready = !self.lost_applied.contains(&nname);
                let empty = Resources::new();
                let u = used.get(&nname).unwrap_or(&empty);
                let mut reasons = sched::node_rejects(pod, n, u, &placed_refs, ready);
                let max_pods = sched::node_allocatable(n)
                    .get("pods")
                    .copied()
                    .unwrap_or(110.0);
                if u.get("pods").copied().unwrap_or(0.0) + 1.0 > max_pods {
                    reasons.push("Too many pods".into());
                }
                if reasons.is_empty() {
                    chosen = Some(nname);
                    break;
                }
                all_reasons.push(reasons);
            }
            match chosen {
                Some(node) => {
                    let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &ns);
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"nodeName": node}})),
                    )
                    .await?;
                    let status = json!({"phase": "Pending", "conditions": [cond("PodScheduled", "True", None, None)]});
                    self.write_status(pod, format!("scheduled:{node}"), status)
                        .await?;
                    let msg = format!("Successfully assigned {ns}/{name} to {node}");
                    self.event(pod, "Normal", "Scheduled", &msg, "default-scheduler", None)
                        .await;
                    tracing::info!("{msg}");
                    return Ok(Some(node));
                }
                None => {
                    let msg = sched::unschedulable_message(nodes.len(), &all_reasons);
                    let (d, s) = unschedulable(msg.clone());
                    (d, s, Some(msg))
                }
            }
        };
        self.write_status(pod, digest, status).await?;
        if let Some(msg) = reason {
            self.event(
                pod,
                "Warning",
                "FailedScheduling",
                &msg,
                "default-scheduler",
                None,
            )
            .await;
        }
        Ok(None)
    }

    // -----------------------------------------------------------------------
    // Starting pods
    // -----------------------------------------------------------------------

    fn node_ip(&self, node: &Node) -> String {
        node.status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .map(|a| a.address.clone())
            .unwrap_or_else(|| "127.0.0.1".into())
    }

    /// The pending status of a bound pod whose containers wait for `reason`.
    /// A container that cannot be configured or created (`reason`:
    /// `CreateContainerConfigError`, `CreateContainerError`), as the kubelet reports it: the
    /// pod's waiting status, a `Failed` event, another try later.
    #[allow(clippy::too_many_arguments)]
    async fn container_error(
        &mut self,
        pod: &Pod,
        uid: &str,
        node_ip: &str,
        node_name: &str,
        reason: &str,
        msg: &str,
    ) -> Result<()> {
        let status = self.waiting_status(pod, node_ip, reason, Some(msg));
        let tag = match reason {
            "CreateContainerConfigError" => "configerror",
            _ => "createerror",
        };
        self.write_status(pod, format!("{tag}:{msg}"), status)
            .await?;
        self.event(
            pod,
            "Warning",
            "Failed",
            &format!("Error: {msg}"),
            "kubelet",
            Some(node_name),
        )
        .await;
        self.retry_later(uid);
        Ok(())
    }

    fn waiting_status(
        &self,
        pod: &Pod,
        node_ip: &str,
        reason: &str,
        message: Option<&str>,
    ) -> Value {
        let spec = pod.spec.clone().unwrap_or_default();
        let statuses: Vec<Value> = spec
            .containers
            .iter()
            .map(|c| {
                let mut w = json!({"reason": reason});
                if let Some(m) = message {
                    w["message"] = json!(m);
                }
                json!({"name": c.name, "image": c.image, "imageID": "", "ready": false, "started": false,
                       "restartCount": 0, "state": {"waiting": w}})
            })
            .collect();
        let not_ready = format!(
            "containers with unready status: [{}]",
            spec.containers
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
        json!({
            "phase": "Pending", "hostIP": node_ip, "hostIPs": [{"ip": node_ip}],
            "podIP": node_ip, "podIPs": [{"ip": node_ip}], "startTime": pod_start_time(pod),
            "conditions": [
                cond("PodReadyToStartContainers", "True", None, None),
                cond("Initialized", "True", None, None),
                cond("Ready", "False", Some("ContainersNotReady"), Some(&not_ready)),
                cond("ContainersReady", "False", Some("ContainersNotReady"), Some(&not_ready)),
                cond("PodScheduled", "True", None, None),
            ],
            "containerStatuses": statuses,
        })
    }

    async fn try_start(
        &mut self,
        pod: &Pod,
        node: &Node,
        faults: &crate::state::Faults,
    ) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let node_ip = self.node_ip(node);
        let (in_backoff, pull_failed_at, attempts) = {
            let w = self.waiting.entry(uid.clone()).or_default();
            (
                w.next_try.is_some_and(|t| Instant::now() < t),
                w.pull_failed_at,
                w.attempts,
            )
        };
        if in_backoff {
            // In back-off. After a failed pull, ErrImagePull turns into ImagePullBackOff.
            if let Some(at) = pull_failed_at {
                if at.elapsed() >= Duration::from_millis(1500) {
                    let image = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.containers.first())
                        .and_then(|c| c.image.clone())
                        .unwrap_or_default();
                    let msg = format!("Back-off pulling image \"{image}\"");
                    let status = self.waiting_status(pod, &node_ip, "ImagePullBackOff", Some(&msg));
                    self.write_status(pod, format!("backoff:{attempts}"), status)
                        .await?;
                    self.event(pod, "Normal", "BackOff", &msg, "kubelet", Some(&node_name))
                        .await;
                }
            }
            return Ok(());
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let labels = labels_of(pod);
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());

        // Image "pulls": there is no registry, so an image must already be in the engine.
        for c in &spec.containers {
            let image = c.image.clone().unwrap_or_default();
            let present = self.docker.inspect_image(&image).await.is_ok();
            let injected = fault_selects(&faults.image_pull, &labels);
            if !present || injected {
                let why = if injected {
                    "injected fault (kube-standin image-pull-fail)".to_string()
                } else {
                    "the image is not present on the node and no registry is reachable".to_string()
                };
                let msg = format!("Failed to pull image \"{image}\": {why}");
                let w = self.waiting.get_mut(&uid).expect("waiting entry");
                w.attempts += 1;
                let backoff = self.cfg.image_backoff * 2u32.saturating_pow(w.attempts.min(4) - 1);
                w.next_try = Some(Instant::now() + backoff.max(Duration::from_millis(1600)));
                w.pull_failed_at = Some(Instant::now());
                let attempts = w.attempts;
                let status = self.waiting_status(pod, &node_ip, "ErrImagePull", Some(&msg));
                self.write_status(pod, format!("errimagepull:{attempts}"), status)
                    .await?;
                self.event(
                    pod,
                    "Warning",
                    "Failed",
                    &format!("Error: ErrImagePull: {msg}"),
                    "kubelet",
                    Some(&node_name),
                )
                .await;
                return Ok(());
            }
        }

        // Volumes: secrets, config maps, claims, host paths, empty dirs.
        let pod_dir = self.shared.state_dir.join("pods").join(&uid);
        let mut volume_dirs: HashMap<String, (PathBuf, bool)> = HashMap::new();
        for v in spec.volumes.clone().unwrap_or_default() {
            let dir = pod_dir.join("volumes").join(&v.name);
            let source = if let Some(h) = &v.host_path {
                let p = PathBuf::from(&h.path);
                if h.type_.as_deref() == Some("DirectoryOrCreate") {
                    let _ = std::fs::create_dir_all(&p);
                }
                Some((p, false))
            } else if let Some(c) = &v.persistent_volume_claim {
                let p = self.claim_dir(&ns, &c.claim_name);
                std::fs::create_dir_all(&p)?;
                Some((p, c.read_only.unwrap_or(false)))
            } else if v.empty_dir.is_some() {
                std::fs::create_dir_all(&dir)?;
                Some((dir.clone(), false))
            } else if let Some(s) = &v.secret {
                let name = s.secret_name.clone().unwrap_or_default();
                let api: Api<Secret> = Api::namespaced(self.shared.client.clone(), &ns);
                match api.get_opt(&name).await? {
                    Some(secret) => {
                        let data: BTreeMap<String, Vec<u8>> = secret
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0))
                            .collect();
                        write_volume_files(
                            &dir,
                            &data,
                            s.items.as_deref(),
                            s.default_mode.unwrap_or(0o644),
                        )?;
                        Some((dir.clone(), true))
                    }
                    None if s.optional == Some(true) => {
                        std::fs::create_dir_all(&dir)?;
                        Some((dir.clone(), true))
                    }
                    None => {
                        let msg = format!("MountVolume.SetUp failed for volume \"{}\" : secret \"{name}\" not found", v.name);
                        let status = self.waiting_status(pod, &node_ip, "ContainerCreating", None);
                        self.write_status(pod, format!("mount:{msg}"), status)
                            .await?;
                        self.event(
                            pod,
                            "Warning",
                            "FailedMount",
                            &msg,
                            "kubelet",
                            Some(&node_name),
                        )
                        .await;
                        self.retry_later(&uid);
                        return Ok(());
                    }
                }
            } else if let Some(cm) = &v.config_map {
                let name = cm.name.clone();
                let api: Api<ConfigMap> = Api::namespaced(self.shared.client.clone(), &ns);
                match api.get_opt(&name).await? {
                    Some(m) => {
                        let mut data: BTreeMap<String, Vec<u8>> = m
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.into_bytes()))
                            .collect();
                        data.extend(
                            m.binary_data
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(k, v)| (k, v.0)),
                        );
                        write_volume_files(
                            &dir,
                            &data,
                            cm.items.as_deref(),
                            cm.default_mode.unwrap_or(0o644),
                        )?;
                        Some((dir.clone(), true))
                    }
                    None if cm.optional == Some(true) => {
                        std::fs::create_dir_all(&dir)?;
                        Some((dir.clone(), true))
                    }
                    None => {
                        let msg = format!("MountVolume.SetUp failed for volume \"{}\" : configmap \"{name}\" not found", v.name);
                        let status = self.waiting_status(pod, &node_ip, "ContainerCreating", None);
                        self.write_status(pod, format!("mount:{msg}"), status)
                            .await?;
                        self.event(
                            pod,
                            "Warning",
                            "FailedMount",
                            &msg,
                            "kubelet",
                            Some(&node_name),
                        )
                        .await;
                        self.retry_later(&uid);
                        return Ok(());
                    }
                }
            } else {
                None
            };
            if let Some(s) = source {
                volume_dirs.insert(v.name.clone(), s);
            }
        }

        // The service account's token, as a kubelet projects it (unless the pod opts out):
        // token, namespace and ca.crt at the well-known path, and the API's address in env.
        let sa_dir = (spec.automount_service_account_token != Some(false))
            .then(|| pod_dir.join("volumes").join("kube-api-access-standin"));
        if let Some(dir) = &sa_dir {
            let token = self
                .shared
                .token
                .clone()
                .unwrap_or_else(|| "kube-standin-anonymous".into());
            let files = BTreeMap::from([
                ("token".to_string(), token.into_bytes()),
                ("namespace".to_string(), ns.clone().into_bytes()),
                ("ca.crt".to_string(), Vec::new()),
            ]);
            write_volume_files(dir, &files, None, 0o644)?;
        }

        // Container configs (environment needs secrets and config maps).
        let gpus = self.allocate_gpus(&node_name, pod);
        let mut bodies = Vec::new();
        for c in &spec.containers {
            let env = if fault_selects(&faults.config_error, &labels) {
                Err("injected fault (kube-standin config-error)".to_string())
            } else {
                self.container_env(pod, c, &node_ip, &node_name, &gpus)
                    .await?
            };
            let env = match env {
                Ok(mut e) if sa_dir.is_some() => {
                    e.push("KUBERNETES_SERVICE_HOST=127.0.0.1".into());
                    e.push(format!("KUBERNETES_SERVICE_PORT={}", self.shared.port));
                    e
                }
                Ok(e) => e,
                Err(msg) => {
                    return self
                        .container_error(
                            pod,
                            &uid,
                            &node_ip,
                            &node_name,
                            "CreateContainerConfigError",
                            &msg,
                        )
                        .await;
                }
            };
            let mut binds = Vec::new();
            for m in c.volume_mounts.clone().unwrap_or_default() {
                let Some((src, vol_ro)) = volume_dirs.get(&m.name) else {
                    tracing::warn!(
                        "pod {ns}/{}: volume {} is not mounted (unsupported volume type)",
                        pod.metadata.name.clone().unwrap_or_default(),
                        m.name
                    );
                    continue;
                };
                let mut src = src.clone();
                if let Some(sp) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                    // As the kubelet does: a subPath must stay inside its volume, links on the
                    // way included (it is refused, never mounted from outside).
                    let joined = src.join(sp);
                    if !joined.exists() && std::fs::symlink_metadata(&joined).is_err() {
                        let _ = std::fs::create_dir_all(&joined);
                    }
                    let inside = match (joined.canonicalize(), src.canonicalize()) {
                        (Ok(real), Ok(root)) => real.starts_with(&root).then_some(real),
                        _ => None,
                    };
                    let Some(real) = inside else {
                        let msg = format!(
                            "failed to prepare subPath for volumeMount \"{}\" of container \"{}\": \
                             subpath {sp:?} is outside the volume",
                            m.name, c.name
                        );
                        return self
                            .container_error(
                                pod,
                                &uid,
                                &node_ip,
                                &node_name,
                                "CreateContainerConfigError",
                                &msg,
                            )
                            .await;
                    };
                    src = real;
                }
                let ro = m.read_only.unwrap_or(false) || *vol_ro;
                binds.push(format!(
                    "{}:{}{}",
                    src.display(),
                    m.mount_path,
                    if ro { ":ro" } else { "" }
                ));
            }
            if let Some(dir) = &sa_dir {
                let mounted = c
                    .volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.mount_path.trim_end_matches('/') == SA_PATH);
                if !mounted {
                    binds.push(format!("{}:{SA_PATH}:ro", dir.display()));
                }
            }
            bodies.push((c.clone(), self.create_body(pod, c, env, binds)));
        }

        // Create and start.
        std::fs::create_dir_all(&pod_dir)?;
        let mut ctrs = Vec::new();
        for (c, body) in bodies {
            let cname = format!(
                "k8s_{}_{}_{}_{}_0",
                c.name,
                pod.metadata.name.clone().unwrap_or_default(),
                ns,
                uid
            );
            let opts = CreateContainerOptionsBuilder::default()
                .name(&cname)
                .build();
            let created = match self.docker.create_container(Some(opts), body).await {
                Ok(r) => r,
                Err(e) => {
                    for ctr in &ctrs {
                        let c: &Ctr = ctr;
                        let _ = self
                            .docker
                            .remove_container(
                                &c.id,
                                Some(RemoveContainerOptionsBuilder::default().force(true).build()),
                            )
                            .await;
                    }
                    let msg = format!(
                        "failed to create container {}: {}",
                        c.name,
                        docker_message(&e)
                    );
                    return self
                        .container_error(
                            pod,
                            &uid,
                            &node_ip,
                            &node_name,
                            "CreateContainerError",
                            &msg,
                        )
                        .await;
                }
            };
            let image = c.image.clone().unwrap_or_default();
            let image_id = self
                .docker
                .inspect_image(&image)
                .await
                .ok()
                .and_then(|i| i.id)
                .unwrap_or_default();
            ctrs.push(Ctr {
                name: c.name.clone(),
                id: created.id,
                image,
                image_id,
                restarts: 0,
                last: None,
                state: json!({"waiting": {"reason": "ContainerCreating"}}),
                restart_at: None,
            });
        }
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        for c in &mut ctrs {
            self.docker
                .start_container(
                    &c.id,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
                .with_context(|| format!("starting container {} of {ns}/{pod_name}", c.name))?;
            c.state = json!({"running": {"startedAt": now()}});
        }
        let started = now();
        for c in &ctrs {
            self.event(
                pod,
                "Normal",
                "Started",
                &format!("Started container {}", c.name),
                "kubelet",
                Some(&node_name),
            )
            .await;
        }
        tracing::info!(
            "pod {ns}/{pod_name} running on {node_name} ({} container(s))",
            ctrs.len()
        );
        self.waiting.remove(&uid);
        self.runs.insert(
            uid,
            Run {
                ns,
                name: pod_name,
                node: node_name,
                grace: spec.termination_grace_period_seconds.unwrap_or(30),
                ctrs,
                pod_dir,
                gpus,
                started,
            },
        );
        let nodes = self.nodes.list(&ListParams::default()).await?.items;
        self.monitor(pod, None, &nodes).await
    }

    /// This instance's containers, each with whether it runs (one Docker call).
    async fn container_states(&self) -> Result<HashMap<String, bool>> {
        let filters: HashMap<String, Vec<String>> = [(
            "label".to_string(),
            vec![format!("{LABEL_INSTANCE}={}", self.shared.instance)],
        )]
        .into();
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        Ok(self
            .docker
            .list_containers(Some(opts))
            .await?
            .into_iter()
            .filter_map(|c| {
                let running = c.state == Some(ContainerSummaryStateEnum::RUNNING);
                c.id.map(|id| (id, running))
            })
            .collect())
    }

    fn retry_later(&mut self, uid: &str) {
        let w = self.waiting.entry(uid.to_string()).or_default();
        w.attempts += 1;
        w.pull_failed_at = None;
        w.next_try = Some(Instant::now() + Duration::from_secs(2));
    }

    /// GPU indexes for the pod on its node (its nvidia.com/gpu limit), not in use by others.
    fn allocate_gpus(&self, node: &str, pod: &Pod) -> Vec<u32> {
        let want = sched::pod_requests(pod)
            .get(sched::GPU)
            .copied()
            .unwrap_or(0.0) as u32;
        if want == 0 {
            return Vec::new();
        }
        let taken: HashSet<u32> = self
            .runs
            .values()
            .filter(|r| r.node == node)
            .flat_map(|r| r.gpus.clone())
            .collect();
        (0..64)
            .filter(|i| !taken.contains(i))
            .take(want as usize)
            .collect()
    }

    /// The container's environment (KEY=VALUE), or the CreateContainerConfigError message.
    async fn container_env(
        &self,
        pod: &Pod,
        c: &Container,
        node_ip: &str,
        node_name: &str,
        gpus: &[u32],
    ) -> Result<Result<Vec<String>, String>> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let secrets: Api<Secret> = Api::namespaced(self.shared.client.clone(), &ns);
        let maps: Api<ConfigMap> = Api::namespaced(self.shared.client.clone(), &ns);
        let mut env: Vec<(String, String)> = Vec::new();
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(x, _)| *x != k);
            env.push((k, v));
        };
        if !gpus.is_empty() {
            let ids = gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            set(&mut env, "NVIDIA_VISIBLE_DEVICES".into(), ids);
        }
        for from in c.env_from.clone().unwrap_or_default() {
            let prefix = from.prefix.clone().unwrap_or_default();
            if let Some(r) = from.secret_ref {
                match secrets.get_opt(&r.name).await? {
                    Some(s) => {
                        for (k, v) in s.data.unwrap_or_default() {
                            set(
                                &mut env,
                                format!("{prefix}{k}"),
                                String::from_utf8_lossy(&v.0).into_owned(),
                            );
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Ok(Err(format!("secret \"{}\" not found", r.name))),
                }
            }
            if let Some(r) = from.config_map_ref {
                match maps.get_opt(&r.name).await? {
                    Some(m) => {
                        for (k, v) in m.data.unwrap_or_default() {
                            set(&mut env, format!("{prefix}{k}"), v);
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Ok(Err(format!("configmap \"{}\" not found", r.name))),
                }
            }
        }
        let labels = labels_of(pod);
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        for e in c.env.clone().unwrap_or_default() {
            let value = if let Some(v) = e.value {
                expand(&v, &env)
            } else if let Some(src) = e.value_from {
                if let Some(f) = src.field_ref {
                    let path = f.field_path.as_str();
                    let v = match path {
                        "metadata.name" => pod.metadata.name.clone(),
                        "metadata.namespace" => Some(ns.clone()),
                        "metadata.uid" => pod.metadata.uid.clone(),
                        "spec.nodeName" => Some(node_name.to_string()),
                        "spec.serviceAccountName" => pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.service_account_name.clone()),
                        "status.hostIP" | "status.podIP" => Some(node_ip.to_string()),
                        "status.hostIPs" | "status.podIPs" => Some(node_ip.to_string()),
                        _ => path
                            .strip_prefix("metadata.labels['")
                            .and_then(|r| r.strip_suffix("']"))
                            .map(|k| labels.get(k).cloned().unwrap_or_default())
                            .or_else(|| {
                                path.strip_prefix("metadata.annotations['")
                                    .and_then(|r| r.strip_suffix("']"))
                                    .map(|k| annotations.get(k).cloned().unwrap_or_default())
                            }),
                    };
                    match v {
                        Some(v) => v,
                        None => return Ok(Err(format!("unsupported fieldRef {path}"))),
                    }
                } else if let Some(r) = src.secret_key_ref {
                    match secrets.get_opt(&r.name).await? {
                        Some(s) => match s.data.unwrap_or_default().get(&r.key) {
                            Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Ok(Err(format!(
                                    "couldn't find key {} in Secret {ns}/{}",
                                    r.key, r.name
                                )))
                            }
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Ok(Err(format!("secret \"{}\" not found", r.name))),
                    }
                } else if let Some(r) = src.config_map_key_ref {
                    match maps.get_opt(&r.name).await? {
                        Some(m) => match m.data.unwrap_or_default().get(&r.key) {
                            Some(v) => v.clone(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Ok(Err(format!(
                                    "couldn't find key {} in ConfigMap {ns}/{}",
                                    r.key, r.name
                                )))
                            }
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Ok(Err(format!("configmap \"{}\" not found", r.name))),
                    }
                } else if let Some(r) = src.resource_field_ref {
                    let res = c.resources.clone().unwrap_or_default();
                    let (map, key) = match r.resource.split_once('.') {
                        Some(("limits", k)) => (res.limits.unwrap_or_default(), k.to_string()),
                        Some(("requests", k)) => (res.requests.unwrap_or_default(), k.to_string()),
                        _ => {
                            return Ok(Err(format!("unsupported resourceFieldRef {}", r.resource)))
                        }
                    };
                    let v = map
                        .get(&key)
                        .and_then(|q| sched::parse_quantity(&q.0))
                        .unwrap_or(0.0);
                    let divisor = r
                        .divisor
                        .as_ref()
                        .and_then(|q| sched::parse_quantity(&q.0))
                        .unwrap_or(1.0);
                    format!("{}", (v / divisor).ceil() as i64)
                } else {
                    String::new()
                }
            } else {
                String::new()
            };
            set(&mut env, e.name, value);
        }
        Ok(Ok(env
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()))
    }

    fn create_body(
        &self,
        pod: &Pod,
        c: &Container,
        env: Vec<String>,
        binds: Vec<String>,
    ) -> ContainerCreateBody {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let kv: Vec<(String, String)> = env
            .iter()
            .filter_map(|e| {
                e.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        let command = c
            .command
            .clone()
            .map(|v| v.iter().map(|a| expand(a, &kv)).collect::<Vec<_>>());
        let args = c
            .args
            .clone()
            .map(|v| v.iter().map(|a| expand(a, &kv)).collect::<Vec<_>>());
        let limits = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        let memory = limits
            .get(sched::MEMORY)
            .and_then(|q| sched::parse_quantity(&q.0))
            .map(|b| b as i64);
        let nano_cpus = limits
            .get(sched::CPU)
            .and_then(|q| sched::parse_quantity(&q.0))
            .map(|c| (c * 1e9) as i64);
        let labels: HashMap<String, String> = [
            (LABEL_INSTANCE.to_string(), self.shared.instance.clone()),
            (LABEL_STATE.to_string(), self.state_label()),
            (
                LABEL_POD_NAME.to_string(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                LABEL_POD_NAMESPACE.to_string(),
                pod.metadata.namespace.clone().unwrap_or_default(),
            ),
            (LABEL_POD_UID.to_string(), uid),
            (LABEL_CONTAINER_NAME.to_string(), c.name.clone()),
        ]
        .into();
        let sc = c.security_context.clone().unwrap_or_default();
        let psc = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.clone())
            .unwrap_or_default();
        let user = sc.run_as_user.or(psc.run_as_user).map(|u| {
            match sc.run_as_group.or(psc.run_as_group) {
                Some(g) => format!("{u}:{g}"),
                None => u.to_string(),
            }
        });
        ContainerCreateBody {
            image: c.image.clone(),
            // command replaces the image's ENTRYPOINT (and then its CMD too); args replace CMD.
            cmd: match (&command, args) {
                (_, Some(a)) => Some(a),
                (Some(_), None) => Some(Vec::new()),
                (None, None) => None,
            },
            entrypoint: command,
            env: Some(env),
            working_dir: c.working_dir.clone(),
            labels: Some(labels),
            tty: c.tty,
            open_stdin: c.stdin,
            user,
            hostname: None,
            host_config: Some(HostConfig {
                binds: Some(binds),
                network_mode: Some("host".into()),
                memory,
                memory_swap: memory,
                nano_cpus,
                privileged: sc.privileged,
                // The container's securityContext, as a container runtime applies it.
                cap_add: sc.capabilities.as_ref().and_then(|c| c.add.clone()),
                cap_drop: sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
                security_opt: (sc.allow_privilege_escalation == Some(false))
                    .then(|| vec!["no-new-privileges".to_string()]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    // -----------------------------------------------------------------------
    // Running pods
    // -----------------------------------------------------------------------

    /// A started pod's containers: restarts that are due, exits, and the pod's status.
    /// `listed` (this tick's listing, see `container_states`) spares the inspection of a
    /// container that still runs; `None` inspects each.
    async fn monitor(
        &mut self,
        pod: &Pod,
        listed: Option<&HashMap<String, bool>>,
        nodes: &[Node],
    ) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let restart_policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        let Some(mut run) = self.runs.remove(&uid) else {
            return Ok(());
        };
        let mut events = Vec::new();
        for c in &mut run.ctrs {
            if let Some(at) = c.restart_at {
                if Instant::now() >= at {
                    c.restart_at = None;
                    c.restarts += 1;
                    if self
                        .docker
                        .start_container(
                            &c.id,
                            None::<bollard::query_parameters::StartContainerOptions>,
                        )
                        .await
                        .is_ok()
                    {
                        c.state = json!({"running": {"startedAt": now()}});
                        events.push(("Normal", "Started", format!("Started container {}", c.name)));
                    }
                }
                continue;
            }
            if c.state.get("running").is_none() {
                continue;
            }
            if listed.and_then(|l| l.get(&c.id)) == Some(&true) {
                continue;
            }
            let info = match self
                .docker
                .inspect_container(
                    &c.id,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
            {
                Ok(i) => i,
                Err(_) => {
                    // Removed behind our back.
                    c.state = json!({"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the pod was terminated",
                        "startedAt": run.started, "finishedAt": now()}});
                    continue;
                }
            };
            let st = info.state.unwrap_or_default();
            if st.running == Some(true) {
                continue;
            }
            let code = st.exit_code.unwrap_or(0);
            let reason = if st.oom_killed == Some(true) {
                "OOMKilled"
            } else if code == 0 {
                "Completed"
            } else {
                "Error"
            };
            let term = json!({"exitCode": code, "reason": reason,
                "startedAt": k8s_time(st.started_at.as_deref()), "finishedAt": k8s_time(st.finished_at.as_deref()),
                "containerID": format!("docker://{}", c.id)});
            let restart = match restart_policy.as_str() {
                "Always" => true,
                "OnFailure" => code != 0,
                _ => false,
            };
            if restart {
                let delay = Duration::from_secs(10u64.min(1 << c.restarts.clamp(0, 4)));
                c.last = Some(json!({"terminated": term}));
                c.restart_at = Some(Instant::now() + delay);
                c.state = json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off {}s restarting failed container={} pod={}", delay.as_secs(), c.name, run.name)}});
                events.push((
                    "Warning",
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name, run.name
                    ),
                ));
            } else {
                c.state = json!({"terminated": term});
            }
        }
        let node_ip = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(run.node.as_str()))
            .map(|n| self.node_ip(n))
            .unwrap_or_else(|| "127.0.0.1".into());
        let (digest, status) = run_status(pod, &run, &restart_policy, &node_ip);
        let node = run.node.clone();
        self.runs.insert(uid, run);
        self.write_status(pod, digest, status).await?;
        for (t, r, m) in events {
            self.event(pod, t, r, &m, "kubelet", Some(&node)).await;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Lost nodes
    // -----------------------------------------------------------------------

    async fn set_node_lost(&mut self, node: &Node, lost: bool) -> Result<()> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        taints.retain(|t| t.key != "node.kubernetes.io/unreachable");
        if lost {
            for effect in ["NoSchedule", "NoExecute"] {
                taints.push(Taint {
                    key: "node.kubernetes.io/unreachable".into(),
                    effect: effect.into(),
                    time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    )),
                    ..Default::default()
                });
            }
        }
        let taints = if taints.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&taints)?
        };
        self.nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await?;
        self.nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": node_conditions(!lost)}})),
            )
            .await?;
        tracing::info!(
            "node {name} is now {}",
            if lost {
                "lost (NotReady)"
            } else {
                "Ready again"
            }
        );
        Ok(())
    }

    async fn fail_node_lost(&mut self, pod: &Pod, node: &str) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let mut statuses = Vec::new();
        if let Some(run) = self.runs.remove(&uid) {
            for c in &run.ctrs {
                let _ = self
                    .docker
                    .kill_container(
                        &c.id,
                        Some(
                            KillContainerOptionsBuilder::default()
                                .signal("SIGKILL")
                                .build(),
                        ),
                    )
                    .await;
            }
            for c in &run.ctrs {
                statuses.push(json!({"name": c.name, "image": c.image, "imageID": c.image_id,
                    "containerID": format!("docker://{}", c.id), "ready": false, "started": false, "restartCount": c.restarts,
                    "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the pod was terminated",
                        "startedAt": run.started, "finishedAt": now()}}}));
            }
            // The containers stay (killed) until the pod is deleted, like the rest of the pod.
            self.runs.insert(
                uid.clone(),
                Run {
                    ctrs: run.ctrs.clone(),
                    ..run
                },
            );
            if let Some(r) = self.runs.get_mut(&uid) {
                for c in &mut r.ctrs {
                    c.state = json!({"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}});
                    c.restart_at = None;
                }
            }
        } else {
            for c in pod
                .spec
                .as_ref()
                .map(|s| s.containers.clone())
                .unwrap_or_default()
            {
                statuses.push(json!({"name": c.name, "image": c.image, "imageID": "", "ready": false, "started": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the pod was terminated",
                        "startedAt": null, "finishedAt": now()}}}));
            }
        }
        let msg = format!("Node {node} which was running pod {name} is unresponsive");
        let status = json!({
            "phase": "Failed", "reason": "NodeLost", "message": msg,
            "conditions": [
                cond("DisruptionTarget", "True", Some("DeletionByTaintManager"), Some("Taint manager: deleting due to NoExecute taint")),
                cond("Ready", "False", Some("NodeLost"), Some(&msg)),
                cond("ContainersReady", "False", Some("NodeLost"), None),
                cond("PodScheduled", "True", None, None),
            ],
            "containerStatuses": statuses,
        });
        self.write_status(pod, "nodelost".into(), status).await?;
        self.event(
            pod,
            "Warning",
            "NodeNotReady",
            "Node is not ready",
            "node-controller",
            None,
        )
        .await;
        tracing::info!("{msg}: pod failed (NodeLost)");
        Ok(())
    }
}

fn node_conditions(ready: bool) -> Value {
    let t = now();
    let (st, reason, msg) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "Unknown",
            "NodeStatusUnknown",
            "Kubelet stopped posting node status.",
        )
    };
    let mut conds: Vec<Value> = [
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ]
    .iter()
    .map(|(ty, r, m)| {
        if ready {
            json!({"type": ty, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": t, "lastTransitionTime": t})
        } else {
            json!({"type": ty, "status": "Unknown", "reason": "NodeStatusUnknown", "message": msg, "lastHeartbeatTime": t, "lastTransitionTime": t})
        }
    })
    .collect();
    conds.push(json!({"type": "Ready", "status": st, "reason": reason, "message": msg, "lastHeartbeatTime": t, "lastTransitionTime": t}));
    json!(conds)
}

fn pod_start_time(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(now)
}

/// The status of a pod with containers, and a digest of what matters in it.
fn run_status(pod: &Pod, run: &Run, restart_policy: &str, node_ip: &str) -> (String, Value) {
    let mut statuses = Vec::new();
    let mut digest = String::new();
    let (mut running, mut done, mut failed) = (0, 0, 0);
    for c in &run.ctrs {
        let is_running = c.state.get("running").is_some();
        if is_running {
            running += 1;
        }
        if let Some(t) = c.state.get("terminated") {
            done += 1;
            if t.get("exitCode").and_then(Value::as_i64) != Some(0) {
                failed += 1;
            }
        }
        let mut s = json!({"name": c.name, "image": c.image, "imageID": c.image_id,
            "containerID": format!("docker://{}", c.id), "ready": is_running, "started": is_running,
            "restartCount": c.restarts, "state": c.state});
        if let Some(l) = &c.last {
            s["lastState"] = l.clone();
        }
        digest.push_str(&format!(
            "{}:{}:{};",
            c.name,
            c.restarts,
            state_key(&c.state)
        ));
        statuses.push(s);
    }
    let n = run.ctrs.len();
    let phase = if done == n && n > 0 && restart_policy != "Always" {
        if failed == 0 {
            "Succeeded"
        } else if restart_policy == "OnFailure" {
            "Running"
        } else {
            "Failed"
        }
    } else {
        "Running"
    };
    let all_ready = running == n;
    let ready_cond = |t: &str| {
        if all_ready {
            cond(t, "True", None, None)
        } else if phase == "Succeeded" || phase == "Failed" {
            cond(t, "False", Some("PodCompleted"), None)
        } else {
            let names: Vec<&str> = run
                .ctrs
                .iter()
                .filter(|c| c.state.get("running").is_none())
                .map(|c| c.name.as_str())
                .collect();
            cond(
                t,
                "False",
                Some("ContainersNotReady"),
                Some(&format!(
                    "containers with unready status: [{}]",
                    names.join(" ")
                )),
            )
        }
    };
    let status = json!({
        "phase": phase, "hostIP": node_ip, "hostIPs": [{"ip": node_ip}], "podIP": node_ip, "podIPs": [{"ip": node_ip}],
        "startTime": pod_start_time(pod),
        "conditions": [
            cond("PodReadyToStartContainers", if phase == "Running" { "True" } else { "False" }, None, None),
            cond("Initialized", "True", None, None),
            ready_cond("Ready"),
            ready_cond("ContainersReady"),
            cond("PodScheduled", "True", None, None),
        ],
        "containerStatuses": statuses,
    });
    (format!("{phase}|{digest}"), status)
}

fn state_key(state: &Value) -> String {
    if let Some(t) = state.get("terminated") {
        format!("terminated/{}/{}", t["exitCode"], t["reason"])
    } else if let Some(w) = state.get("waiting") {
        format!("waiting/{}", w["reason"])
    } else {
        "running".into()
    }
}

/// Stops a pod's containers (SIGTERM, SIGKILL after `grace` seconds), removes them and the
/// pod's directory.
async fn stop_run(docker: Docker, run: Run, grace: i64) {
    let stops = run.ctrs.iter().map(|c| {
        let docker = docker.clone();
        let id = c.id.clone();
        async move {
            let opts = StopContainerOptionsBuilder::default()
                .t(grace as i32)
                .build();
            let _ = docker.stop_container(&id, Some(opts)).await;
            let rm = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            let _ = docker.remove_container(&id, Some(rm)).await;
        }
    });
    futures::future::join_all(stops).await;
    let _ = std::fs::remove_dir_all(&run.pod_dir);
}

/// `$(VAR)` references expanded from earlier variables; `$$(VAR)` escapes; unknown ones stay.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(j) => {
                    let name = &inner[..j];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &inner[j + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Writes a secret's or config map's keys as files (all keys, or the listed `items`).
fn write_volume_files(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: i32,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let files: Vec<(String, &Vec<u8>, i32)> = match items {
        Some(items) => items
            .iter()
            .filter_map(|it| {
                data.get(&it.key)
                    .map(|v| (it.path.clone(), v, it.mode.unwrap_or(default_mode)))
            })
            .collect(),
        None => data
            .iter()
            .map(|(k, v)| (k.clone(), v, default_mode))
            .collect(),
    };
    for (path, content, mode) in files {
        if path.split('/').any(|p| p == "..") || path.starts_with('/') {
            continue;
        }
        let p = dir.join(&path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, content)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode((mode & 0o7777) as u32))?;
    }
    Ok(())
}

fn docker_message(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_args() {
        let n: NodeArg = "name=node-a,cpu=4,memory=8Gi,gpu=2,label.pool=gpu,taint.nvidia.com/gpu=present:NoSchedule"
            .parse()
            .unwrap();
        assert_eq!(
            (n.name.as_str(), n.cpu.as_str(), n.memory.as_str(), n.gpu),
            ("node-a", "4", "8Gi", 2)
        );
        assert_eq!(n.labels["pool"], "gpu");
        assert_eq!(n.taints[0].key, "nvidia.com/gpu");
        assert_eq!(n.taints[0].value.as_deref(), Some("present"));
        assert_eq!(n.taints[0].effect, "NoSchedule");
        assert!("cpu=4".parse::<NodeArg>().is_err());
        assert!("name=a,ip=10.0.0.1".parse::<NodeArg>().is_err());
        assert!("name=a,memory=lots".parse::<NodeArg>().is_err());
    }

    #[test]
    fn dependent_variables() {
        let env = vec![
            ("A".to_string(), "x".to_string()),
            ("B".to_string(), "y".to_string()),
        ];
        assert_eq!(expand("$(A)-$(B)-$(C)-$$(A)-$", &env), "x-y-$(C)-$(A)-$");
    }
}
