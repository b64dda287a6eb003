//! Docker through bollard: images, networks, and run containers with CodaLab's contract.

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, NetworkConnectRequest, NetworkCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, StatsOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;

use crate::format::size_str;

/// Label on every run container: the worker id that started it.
pub const LABEL_WORKER_ID: &str = "org.codalab.worker-id";
/// Label on every run container: the bundle uuid.
pub const LABEL_BUNDLE_UUID: &str = "org.codalab.bundle-uuid";

/// Bridge option that, set to `false`, stops containers on a network from reaching each other.
const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";

/// Name of a run's container.
pub fn container_name(uuid: &str) -> String {
    format!("codalab_run_{uuid}")
}

/// An image spec with `:latest` added when it names no tag, as the server and Python worker do.
pub fn normalize_image(spec: &str) -> String {
    if spec.contains(':') || spec.contains('@') {
        spec.to_owned()
    } else {
        format!("{spec}:latest")
    }
}

/// The bash wrapper: the command's stdout and stderr go to files in the bundle dir.
pub fn wrapped_command(command: &str) -> Vec<String> {
    let mut cmd = command.trim_end().to_owned();
    if !cmd.ends_with(';') {
        cmd.push(';');
    }
    vec![
        "/bin/bash".into(),
        "-c".into(),
        format!("( {cmd} ) >stdout 2>stderr"),
    ]
}

/// One bind mount.
#[derive(Debug, Clone, PartialEq)]
pub struct Bind {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// Everything needed to create a run container.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub uuid: String,
    pub command: String,
    pub image: String,
    pub bundle_path: PathBuf,
    pub dependency_binds: Vec<Bind>,
    /// `uid:gid` to run as.
    pub user: String,
    pub memory_bytes: u64,
    pub cpuset: Vec<usize>,
    pub gpu_uuids: Vec<String>,
    pub shm_size_bytes: u64,
    pub network: bool,
    pub network_prefix: String,
    pub worker_id: String,
    /// Most processes (threads included) the container may have; 0 for no limit.
    pub pids_limit: i64,
}

/// Capabilities dropped from Docker's default set: none of them is needed to install packages
/// or run programs, and each widens what a run can do to its neighbours.
pub const DROPPED_CAPABILITIES: [&str; 6] = [
    "NET_RAW",
    "MKNOD",
    "SYS_CHROOT",
    "SETFCAP",
    "SETPCAP",
    "AUDIT_WRITE",
];

impl ContainerSpec {
    /// The container-create body (separate from the I/O so that it can be tested).
    pub fn create_body(&self) -> ContainerCreateBody {
        let workdir = format!("/{}", self.uuid);
        let mut env = vec![format!("HOME={workdir}"), "CODALAB=true".to_string()];
        let mut binds = vec![format!("{}:{workdir}:rw", self.bundle_path.display())];
        for b in &self.dependency_binds {
            binds.push(format!(
                "{}:{}:{}",
                b.host.display(),
                b.container,
                if b.read_only { "ro" } else { "rw" }
            ));
        }
        let device_requests = if self.gpu_uuids.is_empty() {
            None
        } else {
            env.push(format!(
                "NVIDIA_VISIBLE_DEVICES={}",
                self.gpu_uuids.join(",")
            ));
            Some(vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(self.gpu_uuids.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }])
        };
        let network_mode = format!(
            "{}{}",
            self.network_prefix,
            if self.network { "_ext" } else { "_int" }
        );
        let mut labels = HashMap::new();
        labels.insert(LABEL_WORKER_ID.to_owned(), self.worker_id.clone());
        labels.insert(LABEL_BUNDLE_UUID.to_owned(), self.uuid.clone());
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(wrapped_command(&self.command)),
            // An empty entrypoint resets the image's own.
            entrypoint: Some(vec![String::new()]),
            working_dir: Some(workdir),
            env: Some(env),
            user: Some(self.user.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                binds: Some(binds),
                memory: (self.memory_bytes > 0).then_some(self.memory_bytes as i64),
                // No swap beyond the memory limit: the limit means what it says.
                memory_swap: (self.memory_bytes > 0).then_some(self.memory_bytes as i64),
                pids_limit: (self.pids_limit > 0).then_some(self.pids_limit),
                security_opt: Some(vec!["no-new-privileges".into()]),
                cap_drop: Some(DROPPED_CAPABILITIES.iter().map(|c| c.to_string()).collect()),
                cpuset_cpus: (!self.cpuset.is_empty()).then(|| {
                    self.cpuset
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                }),
                shm_size: Some(self.shm_size_bytes as i64),
                network_mode: Some(network_mode),
                device_requests,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// State of a container, from `inspect`.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerStatus {
    pub running: bool,
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
}

/// A one-shot stats sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub cpu_total_ns: u64,
    pub cpu_user_ns: u64,
    pub cpu_system_ns: u64,
    pub system_ns: u64,
    pub online_cpus: u32,
    pub memory_bytes: u64,
    pub memory_limit: u64,
}

#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
}

fn is_not_found(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

fn is_conflict(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}

/// Docker's error text without bollard's wrapping.
pub fn docker_message(e: &DockerError) -> String {
    match e {
        DockerError::DockerResponseServerError { message, .. } => message.clone(),
        DockerError::DockerStreamError { error } => error.clone(),
        other => other.to_string(),
    }
}

fn parse_time(s: Option<&str>) -> Option<f64> {
    let s = s?;
    if s.starts_with("0001-01-01") {
        return None;
    }
    // RFC 3339 with nanoseconds, e.g. 2026-11-21T10:00:00.123456789Z.
    let (date, rest) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let time_end = rest.find(['Z', '+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(time_end);
    let mut t = time.split(':');
    let (hh, mm) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let ss: f64 = t.next()?.parse().ok()?;
    let offset = if zone.is_empty() || zone == "Z" {
        0
    } else {
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let mut z = zone[1..].split(':');
        let zh: i64 = z.next()?.parse().ok()?;
        let zm: i64 = z.next().unwrap_or("0").parse().ok()?;
        sign * (zh * 3600 + zm * 60)
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86400 + hh * 3600 + mm * 60 - offset) as f64 + ss)
}

impl DockerRuntime {
    /// Connects to the local engine and agrees on an API version it speaks.
    pub async fn connect() -> Result<Self, String> {
        let docker = Docker::connect_with_local_defaults()
            .map_err(|e| format!("cannot connect to Docker: {e}"))?
            .negotiate_version()
            .await
            .map_err(|e| format!("cannot reach the Docker engine: {e}"))?;
        docker
            .ping()
            .await
            .map_err(|e| format!("the Docker engine does not answer: {e}"))?;
        Ok(DockerRuntime { docker })
    }

    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// Creates `<prefix>_general` (internal), `<prefix>_ext` and `<prefix>_int` (internal) if
    /// they are missing.
    pub async fn ensure_networks(&self, prefix: &str) -> Result<(), String> {
        for (suffix, internal) in [("_general", true), ("_ext", false), ("_int", true)] {
            let name = format!("{prefix}{suffix}");
            // Workers sharing a prefix that start together race here: Docker allows several
            // networks of one name, and a name is ambiguous until the duplicates are removed.
            let mut attempt = 0;
            loop {
                match self.ensure_network(&name, internal).await {
                    Ok(()) => break,
                    Err(e) if attempt < 5 => {
                        attempt += 1;
                        tracing::debug!("network {name}: {e}; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(100 * attempt)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    async fn ensure_network(&self, name: &str, internal: bool) -> Result<(), String> {
        // A name must mean one network.
        self.dedupe_network(name).await?;
        match self
            .docker
            .inspect_network(
                name,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
        {
            Ok(n) => {
                let isolated = n
                    .options
                    .as_ref()
                    .and_then(|o| o.get(ICC_OPTION))
                    .is_some_and(|v| v == "false");
                let empty = n.containers.as_ref().is_none_or(|c| c.is_empty());
                if isolated {
                    return Ok(());
                }
                if !empty {
                    tracing::warn!(
                        "network {name} lets containers reach one another (made by an older \
                         worker); it is in use, so it is kept"
                    );
                    return Ok(());
                }
                tracing::info!("re-creating network {name} with containers isolated");
                if let Err(e) = self.docker.remove_network(name).await {
                    return Err(format!("cannot re-create network {name}: {e}"));
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(format!("cannot inspect network {name}: {e}")),
        }
        let req = NetworkCreateRequest {
            name: name.to_string(),
            internal: Some(internal),
            labels: Some(HashMap::from([(
                "org.codalab.worker-network".to_owned(),
                "true".to_owned(),
            )])),
            // Runs share these bridges but must not reach one another.
            options: Some(HashMap::from([(ICC_OPTION.to_owned(), "false".to_owned())])),
            ..Default::default()
        };
        match self.docker.create_network(req).await {
            Ok(_) => tracing::info!("created Docker network {name}"),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(format!("cannot create network {name}: {e}")),
        }
        self.dedupe_network(name).await?;
        Ok(())
    }

    /// Keeps one network of this exact name, the one with the lowest id (every worker picks the
    /// same), and removes the others; one in use by containers stays (Docker refuses).
    async fn dedupe_network(&self, name: &str) -> Result<(), String> {
        let filters = HashMap::from([("name".to_owned(), vec![name.to_owned()])]);
        let opts = bollard::query_parameters::ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        let list = self
            .docker
            .list_networks(Some(opts))
            .await
            .map_err(|e| format!("cannot list networks named {name}: {e}"))?;
        let mut ids: Vec<String> = list
            .into_iter()
            .filter(|n| n.name.as_deref() == Some(name))
            .filter_map(|n| n.id)
            .collect();
        if ids.len() <= 1 {
            return Ok(());
        }
        ids.sort();
        for id in &ids[1..] {
            match self.docker.remove_network(id).await {
                Ok(()) => tracing::info!("removed duplicate Docker network {name} ({id})"),
                Err(e) => tracing::debug!(
                    "duplicate network {name} ({id}) not removed: {}",
                    docker_message(&e)
                ),
            }
        }
        Ok(())
    }

    /// Removes the worker's networks (clean exit). Networks that other workers' containers
    /// still use are left alone (Docker refuses to remove them).
    pub async fn remove_networks(&self, prefix: &str) {
        for suffix in ["_general", "_ext", "_int"] {
            let name = format!("{prefix}{suffix}");
            if let Err(e) = self.docker.remove_network(&name).await {
                if !is_not_found(&e) {
                    tracing::debug!("network {name} not removed: {}", docker_message(&e));
                }
            }
        }
    }

    /// The image's digest (`repo@sha256:…`) or id, if it is present locally.
    pub async fn local_image(&self, image: &str) -> Result<Option<String>, String> {
        match self.docker.inspect_image(image).await {
            Ok(info) => Ok(Some(
                info.repo_digests
                    .and_then(|d| d.into_iter().next())
                    .or(info.id)
                    .unwrap_or_else(|| image.to_owned()),
            )),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(docker_message(&e)),
        }
    }

    /// Size in bytes of a local image; `None` when absent.
    pub async fn image_size(&self, image: &str) -> Result<Option<u64>, String> {
        match self.docker.inspect_image(image).await {
            Ok(info) => Ok(Some(info.size.unwrap_or(0).max(0) as u64)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(docker_message(&e)),
        }
    }

    /// Removes an image unless a container uses it.
    pub async fn remove_image(&self, image: &str) -> Result<(), String> {
        self.docker
            .remove_image(
                image,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
            .map(drop)
            .map_err(|e| docker_message(&e))
    }

    /// Makes sure the image is present: no pull when it already is. Returns its digest.
    pub async fn ensure_image(
        &self,
        image: &str,
        mut progress: impl FnMut(String),
    ) -> Result<String, String> {
        if let Some(digest) = self.local_image(image).await? {
            return Ok(digest);
        }
        progress(format!("Pulling docker image {image}"));
        let opts = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let mut stream = self.docker.create_image(Some(opts), None, None);
        let mut pull_error = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    if let Some(status) = info.status {
                        let detail = info
                            .progress_detail
                            .and_then(|d| Some((d.current?, d.total?)))
                            .map(|(c, t)| format!(" {}/{}", size_str(c as f64), size_str(t as f64)))
                            .unwrap_or_default();
                        progress(format!("Pulling docker image {image}. {status}{detail}"));
                    }
                }
                Err(e) => {
                    pull_error = Some(docker_message(&e));
                    break;
                }
            }
        }
        match self.local_image(image).await? {
            Some(digest) => Ok(digest),
            None => Err(pull_error.unwrap_or_else(|| format!("image {image} not found"))),
        }
    }

    /// Creates and starts a run container; returns its id. A leftover container of the same
    /// name is removed first; a failed start removes the new one.
    pub async fn start_container(&self, spec: &ContainerSpec) -> Result<String, String> {
        match self.try_start_container(spec).await {
            // Another worker sharing the network prefix may have removed the networks on exit,
            // or be creating them at the same time.
            Err(e)
                if e.contains("network")
                    && (e.contains("not found") || e.contains("ambiguous")) =>
            {
                tracing::info!("re-creating networks {}_*: {e}", spec.network_prefix);
                self.ensure_networks(&spec.network_prefix).await?;
                self.try_start_container(spec).await
            }
            r => r,
        }
    }

    async fn try_start_container(&self, spec: &ContainerSpec) -> Result<String, String> {
        let name = container_name(&spec.uuid);
        self.remove(&name).await?;
        let opts = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = self
            .docker
            .create_container(Some(opts), spec.create_body())
            .await
            .map_err(|e| docker_message(&e))?;
        let id = created.id;
        let result = async {
            self.docker
                .connect_network(
                    &format!("{}_general", spec.network_prefix),
                    NetworkConnectRequest {
                        container: id.clone(),
                        ..Default::default()
                    },
                )
                .await?;
            self.docker
                .start_container(
                    &id,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
        }
        .await;
        if let Err(e) = result {
            let _ = self.remove(&id).await;
            return Err(docker_message(&e));
        }
        Ok(id)
    }

    /// `None` when the container does not exist.
    pub async fn inspect(&self, id: &str) -> Result<Option<ContainerStatus>, String> {
        match self
            .docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
        {
            Ok(info) => {
                let st = info.state.unwrap_or_default();
                Ok(Some(ContainerStatus {
                    running: st.running.unwrap_or(false),
                    exit_code: st.exit_code,
                    oom_killed: st.oom_killed.unwrap_or(false),
                    started_at: parse_time(st.started_at.as_deref()),
                    finished_at: parse_time(st.finished_at.as_deref()),
                }))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(docker_message(&e)),
        }
    }

    /// One stats sample (the engine answers at once with `one-shot`).
    pub async fn sample(&self, id: &str) -> Result<Sample, String> {
        let opts = StatsOptionsBuilder::default()
            .stream(false)
            .one_shot(true)
            .build();
        let mut stream = self.docker.stats(id, Some(opts));
        let s = match stream.next().await {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(docker_message(&e)),
            None => return Err("no stats".into()),
        };
        let cpu = s.cpu_stats.unwrap_or_default();
        let usage = cpu.cpu_usage.unwrap_or_default();
        let mem = s.memory_stats.unwrap_or_default();
        Ok(Sample {
            cpu_total_ns: usage.total_usage.unwrap_or(0),
            cpu_user_ns: usage.usage_in_usermode.unwrap_or(0),
            cpu_system_ns: usage.usage_in_kernelmode.unwrap_or(0),
            system_ns: cpu.system_cpu_usage.unwrap_or(0),
            online_cpus: cpu.online_cpus.unwrap_or(0),
            memory_bytes: mem.usage.unwrap_or(0),
            memory_limit: mem.limit.unwrap_or(0),
        })
    }

    /// SIGKILL; a container that is gone or already stopped is fine.
    pub async fn kill(&self, id: &str) -> Result<(), String> {
        let opts = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        match self.docker.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
            Err(e) => Err(docker_message(&e)),
        }
    }

    /// Force-removes a container; one that is gone is fine.
    pub async fn remove(&self, id: &str) -> Result<(), String> {
        let opts = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(docker_message(&e)),
        }
    }

    /// Ids and bundle uuids of the containers labelled with this worker id.
    pub async fn containers_of(&self, worker_id: &str) -> Result<Vec<(String, String)>, String> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_WORKER_ID}={worker_id}")],
        )]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let list = self
            .docker
            .list_containers(Some(opts))
            .await
            .map_err(|e| docker_message(&e))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let uuid = c.labels.as_ref()?.get(LABEL_BUNDLE_UUID)?.clone();
                Some((c.id?, uuid))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names() {
        assert_eq!(normalize_image("ubuntu"), "ubuntu:latest");
        assert_eq!(
            normalize_image("codalab/default-cpu"),
            "codalab/default-cpu:latest"
        );
        assert_eq!(normalize_image("a/b:1.0"), "a/b:1.0");
        assert_eq!(normalize_image("a@sha256:00"), "a@sha256:00");
    }

    #[test]
    fn command_wrapper() {
        assert_eq!(
            wrapped_command("echo hi"),
            vec!["/bin/bash", "-c", "( echo hi; ) >stdout 2>stderr"]
        );
        assert_eq!(wrapped_command("true;")[2], "( true; ) >stdout 2>stderr");
    }

    #[test]
    fn container_contract() {
        let spec = ContainerSpec {
            uuid: "0xabc".into(),
            command: "cat d".into(),
            image: "img:latest".into(),
            bundle_path: "/w/runs/0xabc".into(),
            dependency_binds: vec![Bind {
                host: "/w/dependencies/0xdef".into(),
                container: "/0xabc_dependencies/d".into(),
                read_only: true,
            }],
            user: "1000:1000".into(),
            memory_bytes: 2 << 30,
            cpuset: vec![0, 2],
            gpu_uuids: vec!["GPU-1".into()],
            shm_size_bytes: 1 << 30,
            network: false,
            network_prefix: "pfx".into(),
            worker_id: "w1".into(),
            pids_limit: 4096,
        };
        let body = spec.create_body();
        assert_eq!(body.working_dir.as_deref(), Some("/0xabc"));
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        let env = body.env.unwrap();
        assert!(env.contains(&"HOME=/0xabc".to_string()));
        assert!(env.contains(&"CODALAB=true".to_string()));
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-1".to_string()));
        let hc = body.host_config.unwrap();
        assert_eq!(
            hc.binds.unwrap(),
            vec![
                "/w/runs/0xabc:/0xabc:rw",
                "/w/dependencies/0xdef:/0xabc_dependencies/d:ro"
            ]
        );
        assert_eq!(hc.memory, Some(2 << 30));
        assert_eq!(hc.memory_swap, Some(2 << 30));
        assert_eq!(hc.pids_limit, Some(4096));
        assert_eq!(
            hc.security_opt.as_deref(),
            Some(&["no-new-privileges".to_string()][..])
        );
        assert!(hc
            .cap_drop
            .as_ref()
            .unwrap()
            .contains(&"NET_RAW".to_string()));
        assert_eq!(hc.cpuset_cpus.as_deref(), Some("0,2"));
        assert_eq!(hc.shm_size, Some(1 << 30));
        assert_eq!(hc.network_mode.as_deref(), Some("pfx_int"));
        let dr = &hc.device_requests.unwrap()[0];
        assert_eq!(dr.device_ids.as_deref(), Some(&["GPU-1".to_string()][..]));
        assert_eq!(body.labels.unwrap()[LABEL_WORKER_ID], "w1");
    }

    #[test]
    fn docker_times() {
        assert_eq!(parse_time(Some("1970-01-01T00:00:10Z")), Some(10.0));
        assert_eq!(
            parse_time(Some("2026-11-21T10:00:00.5Z")),
            Some(1_795_255_200.5)
        );
        assert_eq!(parse_time(Some("1970-01-01T01:00:00+01:00")), Some(0.0));
        assert_eq!(parse_time(Some("0001-01-01T00:00:00Z")), None);
        assert_eq!(parse_time(None), None);
    }
}
