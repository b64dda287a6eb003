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

mod container;
mod schedule;
mod start;
mod status;

use self::container::*;
use self::status::*;

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
                // A node cut off from the control plane never saw the deletion (a forced one
                // removed the object only): when it is reached again its kubelet stops the
                // orphaned containers with the pod's own grace period.
                let asked = asked.filter(|_| !faults.unreachable_nodes.contains(&run.node));
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
            let lost =
                faults.lost_nodes.contains(&name) || faults.unreachable_nodes.contains(&name);
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
                    if faults.unreachable_nodes.contains(&node) {
                        if !is_terminal(pod) {
                            self.mark_not_ready(pod, &node).await?;
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

    // -----------------------------------------------------------------------
    // Scheduling
    // -----------------------------------------------------------------------

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

    // -----------------------------------------------------------------------
    // Running pods
    // -----------------------------------------------------------------------

    // -----------------------------------------------------------------------
    // Lost nodes
    // -----------------------------------------------------------------------
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
