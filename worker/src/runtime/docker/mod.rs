//! The Docker runtime, through bollard: images (with their cache), networks, and run containers
//! with CodaLab's contract.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, HostConfig, Mount, MountType,
    NetworkConnectRequest, NetworkCreateRequest, NetworkingConfig,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StatsOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{
    dropped_capabilities, exact, wrapped_command, BundleRuntime, OwnRun, RunSpec, RunStatus,
    RuntimeError, Sample, LABEL_BUNDLE_UUID, LABEL_WORKER_ID,
};
use crate::metrics::Metrics;

pub mod args;
mod exits;
pub mod gpus;
mod images;
mod network;
mod pull;
mod registry;

pub use images::ImageCache;

/// Label of the networks a worker of this project created.
const NETWORK_LABEL: &str = "org.codalab.worker-network";
/// Bridge option that, set to `false`, stops containers on a network from reaching each other.
const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";
/// Podman's network option that stops traffic between networks that have it.
const PODMAN_ISOLATE: &str = "isolate";

/// Name of a run's container.
pub fn container_name(uuid: &str) -> String {
    format!("codalab_run_{uuid}")
}

/// Settings of the Docker runtime.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// `--docker-host` / `DOCKER_HOST`: the API to talk to; `None` for the local engine.
    pub docker_host: Option<String>,
    /// Names of the worker's networks: `<prefix>_general`, `<prefix>_ext`, `<prefix>_int`.
    pub network_prefix: String,
    /// `--max-image-cache-size`.
    pub max_image_cache_bytes: Option<u64>,
    /// `--max-image-size`.
    pub max_image_bytes: Option<u64>,
}

/// The engine behind the Docker-compatible API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Docker,
    /// Podman's service: GPUs are CDI devices (`nvidia.com/gpu=<uuid>`), not device requests.
    Podman,
}

/// The network a run's container is started on: under Docker the worker's shared `_ext` or
/// `_int` network (inter-container traffic off), under Podman the run's own network (Podman's
/// bridges have no inter-container switch; networks made with `isolate` cannot reach each
/// other).
pub fn run_network(spec: &RunSpec, network_prefix: &str, engine: Engine) -> String {
    match engine {
        Engine::Docker => format!(
            "{network_prefix}{}",
            if spec.network { "_ext" } else { "_int" }
        ),
        Engine::Podman => own_network(network_prefix, &spec.uuid),
    }
}

/// The network of its own a run gets under Podman.
pub fn own_network(network_prefix: &str, uuid: &str) -> String {
    format!("{network_prefix}_run_{uuid}")
}

/// The container-create body of a run on `network` (a name or an id; separate from the I/O so
/// that it can be tested). A mount whose source or target is not [`exact`] is refused: the
/// engine resolves a source on the host, so an approximated one could name another entry.
pub fn create_body(
    spec: &RunSpec,
    network: &str,
    engine: Engine,
) -> Result<ContainerCreateBody, RuntimeError> {
    {
        let workdir = format!("/{}", spec.uuid);
        let mut env = vec![format!("HOME={workdir}"), "CODALAB=true".to_string()];
        // Structured bind mounts, not `Binds` strings: a path holding `:` cannot turn into
        // options, and a missing source is an error rather than a directory the engine creates
        // on the host. (Podman re-parses them with `,` between options: `exact` refuses commas.)
        let bind = |source: &Path, target: &str, read_only: bool| {
            Ok::<_, RuntimeError>(Mount {
                target: Some(exact(Path::new(target))?.to_owned()),
                source: Some(exact(source)?.to_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(read_only),
                ..Default::default()
            })
        };
        let mut mounts = vec![bind(&spec.bundle_path, &workdir, false)?];
        for b in &spec.mounts {
            mounts.push(bind(&b.host, &b.container, b.read_only)?);
        }
        let (device_requests, devices) = if spec.gpu_uuids.is_empty() {
            // No GPU even where the engine's default runtime is NVIDIA's and the image asks
            // for all (`ENV NVIDIA_VISIBLE_DEVICES=all` in CUDA images).
            env.push("NVIDIA_VISIBLE_DEVICES=void".into());
            (None, None)
        } else {
            env.push(format!(
                "NVIDIA_VISIBLE_DEVICES={}",
                spec.gpu_uuids.join(",")
            ));
            match engine {
                Engine::Docker => (
                    Some(vec![DeviceRequest {
                        driver: Some("nvidia".into()),
                        device_ids: Some(spec.gpu_uuids.clone()),
                        capabilities: Some(vec![vec!["gpu".into()]]),
                        ..Default::default()
                    }]),
                    None,
                ),
                // The NVIDIA Container Toolkit's CDI spec names each GPU by its UUID
                // (`nvidia-ctk cdi generate`); Podman resolves a qualified CDI name given as a
                // device.
                Engine::Podman => (
                    None,
                    Some(
                        spec.gpu_uuids
                            .iter()
                            .map(|u| DeviceMapping {
                                path_on_host: Some(format!("nvidia.com/gpu={u}")),
                                path_in_container: Some(String::new()),
                                cgroup_permissions: Some("rwm".into()),
                            })
                            .collect(),
                    ),
                ),
            }
        };
        let mut labels = HashMap::new();
        labels.insert(LABEL_WORKER_ID.to_owned(), spec.worker_id.clone());
        labels.insert(LABEL_BUNDLE_UUID.to_owned(), spec.uuid.clone());
        Ok(ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(wrapped_command(&spec.command)),
            // An empty entrypoint resets the image's own.
            entrypoint: Some(vec![String::new()]),
            working_dir: Some(workdir),
            env: Some(env),
            user: Some(spec.user.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                memory: (spec.memory_bytes > 0).then_some(spec.memory_bytes as i64),
                // No swap beyond the memory limit: the limit means what it says.
                memory_swap: (spec.memory_bytes > 0).then_some(spec.memory_bytes as i64),
                pids_limit: (spec.pids_limit > 0).then_some(spec.pids_limit),
                security_opt: Some(vec!["no-new-privileges".into()]),
                cap_drop: Some(dropped_capabilities(spec)),
                cpuset_cpus: (!spec.cpuset.is_empty()).then(|| {
                    spec.cpuset
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                }),
                shm_size: Some(spec.shm_size_bytes as i64),
                network_mode: Some(network.to_owned()),
                device_requests,
                devices,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
    engine: Engine,
    network_prefix: String,
    /// The shared networks by id, as the last check before a run found them (network.rs).
    network_ids: Arc<std::sync::Mutex<Option<network::NetworkIds>>>,
    images: Arc<ImageCache>,
    /// Runs' exits as their `die` events told them (exits.rs).
    exits: Arc<exits::Exits>,
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
fn docker_message(e: &DockerError) -> String {
    match e {
        DockerError::DockerResponseServerError { message, .. } => message.clone(),
        DockerError::DockerStreamError { error } => error.clone(),
        other => other.to_string(),
    }
}

/// A bollard error as a [`RuntimeError`] with the text `text`.
fn with_text(e: &DockerError, text: String) -> RuntimeError {
    match e {
        e if is_not_found(e) => RuntimeError::NotFound(text),
        e if is_conflict(e) => RuntimeError::Conflict(text),
        DockerError::IOError { .. }
        | DockerError::HyperResponseError { .. }
        | DockerError::HyperLegacyError { .. }
        | DockerError::RequestTimeoutError
        | DockerError::SocketNotFoundError(_) => RuntimeError::Unavailable(text),
        _ => RuntimeError::Other(text),
    }
}

/// A bollard error as a [`RuntimeError`] with Docker's own text.
fn runtime_error(e: &DockerError) -> RuntimeError {
    with_text(e, docker_message(e))
}

/// A container state's time (RFC 3339, nanoseconds) in seconds since the epoch; Docker's zero
/// time (`0001-01-01T00:00:00Z`, not started or not finished) is `None`.
fn parse_time(s: Option<&str>) -> Option<f64> {
    let s = s?;
    if s.starts_with("0001-01-01") {
        return None;
    }
    let t: jiff::Timestamp = s.parse().ok()?;
    Some(t.as_second() as f64 + f64::from(t.subsec_nanosecond()) / 1e9)
}

/// Why no client of the engine's API could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("--docker-host {host:?}: unix://PATH, tcp://HOST:PORT or http://HOST:PORT expected")]
    BadHost { host: String },
    #[error(transparent)]
    Client(#[from] DockerError),
}

/// A client of the Docker-compatible API at `host` (`unix://`, `tcp://`, `http://`), or of the
/// local engine. Set explicitly rather than through bollard's reading of `DOCKER_HOST`, so that the
/// flag wins over the environment and a bad URL is refused with its name.
fn connect(host: Option<&str>) -> Result<Docker, ConnectError> {
    const TIMEOUT: u64 = 120;
    let Some(host) = host else {
        return Ok(Docker::connect_with_unix_defaults()?);
    };
    if let Some(path) = host.strip_prefix("unix://") {
        Docker::connect_with_unix(path, TIMEOUT, bollard::API_DEFAULT_VERSION)
    } else if host.starts_with("tcp://") || host.starts_with("http://") {
        Docker::connect_with_http(host, TIMEOUT, bollard::API_DEFAULT_VERSION)
    } else {
        return Err(ConnectError::BadHost {
            host: host.to_owned(),
        });
    }
    .map_err(ConnectError::Client)
}

impl DockerRuntime {
    /// Which engine answered on the socket.
    pub fn kind(&self) -> Engine {
        self.engine
    }

    /// Connects to the local engine and agrees on an API version it speaks. The image cache's
    /// last-use times live in `work_dir`; its size goes to `metrics`.
    pub async fn connect(
        cfg: &DockerConfig,
        work_dir: &Path,
        metrics: Arc<Metrics>,
    ) -> Result<Self, RuntimeError> {
        let host = cfg
            .docker_host
            .as_deref()
            .unwrap_or("the local Docker engine");
        let docker = connect(cfg.docker_host.as_deref())
            .map_err(|e| RuntimeError::Unavailable(format!("cannot connect to {host}: {e}")))?
            .negotiate_version()
            .await
            .map_err(|e| RuntimeError::Unavailable(format!("cannot reach {host}: {e}")))?;
        docker.ping().await.map_err(|e| {
            RuntimeError::Unavailable(format!("the Docker engine does not answer: {e}"))
        })?;
        let engine = match docker.version().await {
            Ok(v)
                if v.components
                    .iter()
                    .flatten()
                    .any(|c| c.name.to_ascii_lowercase().contains("podman")) =>
            {
                tracing::info!("bundles run through Podman at {host}");
                Engine::Podman
            }
            _ => Engine::Docker,
        };
        let images = ImageCache::new(
            work_dir,
            cfg.max_image_cache_bytes,
            cfg.max_image_bytes,
            metrics,
        );
        Ok(DockerRuntime {
            docker,
            engine,
            network_prefix: cfg.network_prefix.clone(),
            network_ids: Arc::default(),
            images,
            exits: Arc::default(),
        })
    }

    /// Cleans and measures the image cache every minute until `stop`.
    pub fn spawn_image_cleaner(&self, stop: CancellationToken) {
        self.images.spawn_cleaner(self.clone(), stop);
    }

    /// The image's digest (`repo@sha256:…`) or id, if it is present locally.
    async fn local_image(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        match self.docker.inspect_image(image).await {
            Ok(info) => Ok(Some(
                info.repo_digests
                    .and_then(|d| d.into_iter().next())
                    .or(info.id)
                    .unwrap_or_else(|| image.to_owned()),
            )),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(runtime_error(&e)),
        }
    }

    /// Size in bytes of a local image; `None` when absent.
    async fn image_size(&self, image: &str) -> Result<Option<u64>, RuntimeError> {
        match self.docker.inspect_image(image).await {
            Ok(info) => Ok(Some(info.size.unwrap_or(0).max(0) as u64)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(runtime_error(&e)),
        }
    }

    /// The image's size as its registry tells it, before any pull (`registry.rs`).
    async fn registry_size(&self, image: &str) -> Result<Option<u64>, registry::RegistryError> {
        registry::image_size(image).await
    }

    /// Removes an image unless a container uses it.
    async fn remove_image(&self, image: &str) -> Result<(), RuntimeError> {
        self.docker
            .remove_image(
                image,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
            .map(drop)
            .map_err(|e| runtime_error(&e))
    }

    /// Creates and starts a run container; returns its id. A leftover container of the same
    /// name is removed first; a failed start removes the new one.
    async fn start_container(&self, spec: &RunSpec) -> Result<String, RuntimeError> {
        match self.try_start_container(spec).await {
            // Another worker sharing the network prefix may have removed the networks on exit,
            // or be creating them at the same time. Docker says which only in its text.
            Err(e)
                if e.to_string().contains("network")
                    && (e.to_string().contains("not found")
                        || e.to_string().contains("ambiguous")) =>
            {
                tracing::info!("re-creating networks {}_*: {e}", self.network_prefix);
                self.ensure_networks().await?;
                self.try_start_container(spec).await
            }
            r => r,
        }
    }

    async fn try_start_container(&self, spec: &RunSpec) -> Result<String, RuntimeError> {
        let name = container_name(&spec.uuid);
        if self.engine == Engine::Podman {
            // Podman does not say a taken name with a 409: its leftover goes first.
            self.remove_container(&name).await?;
            self.create_own_network(spec).await?;
        }
        let networks = self.run_networks(spec);
        let body = match create_body(spec, &networks.run, self.engine) {
            Ok(b) => b,
            Err(e) => {
                self.remove_own_network(&spec.uuid).await;
                return Err(e);
            }
        };
        let create = || {
            let opts = CreateContainerOptionsBuilder::default().name(&name).build();
            let mut body = body.clone();
            if let Some(endpoint) = networks.endpoint(&networks.run) {
                body.networking_config = Some(NetworkingConfig {
                    endpoints_config: Some(HashMap::from([(networks.run.clone(), endpoint)])),
                });
            }
            self.docker.create_container(Some(opts), body)
        };
        // A leftover container of the name (a crash, a run handed back) goes first; Docker
        // says a taken name with a 409, so a new run makes no call for it.
        let created = match create().await {
            Err(e) if is_conflict(&e) => {
                self.remove_container(&name).await?;
                create().await
            }
            r => r,
        };
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                self.remove_own_network(&spec.uuid).await;
                return Err(runtime_error(&e));
            }
        };
        let id = created.id;
        let result = async {
            if let Some(general) = &networks.general {
                self.docker
                    .connect_network(
                        general,
                        NetworkConnectRequest {
                            container: id.clone(),
                            endpoint_config: networks.endpoint(general),
                        },
                    )
                    .await?;
            }
            self.docker
                .start_container(
                    &id,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
        }
        .await;
        if let Err(e) = result {
            let _ = self.remove_container(&id).await;
            self.remove_own_network(&spec.uuid).await;
            return Err(runtime_error(&e));
        }
        self.exits.started(&id, &name, common::now_unix());
        Ok(id)
    }

    /// The container's writable layer's size (`SizeRw`; the engine walks the layer for it).
    async fn writable_layer(&self, id: &str) -> Option<u64> {
        let opts = bollard::query_parameters::InspectContainerOptionsBuilder::default()
            .size(true)
            .build();
        match self.docker.inspect_container(id, Some(opts)).await {
            Ok(info) => info.size_rw.map(|n| n.max(0) as u64),
            Err(e) => {
                tracing::debug!("no writable layer size of {id}: {}", docker_message(&e));
                None
            }
        }
    }

    async fn inspect_container(&self, id: &str) -> Result<Option<RunStatus>, RuntimeError> {
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
                Ok(Some(RunStatus {
                    running: st.running.unwrap_or(false),
                    exit_code: st.exit_code,
                    oom_killed: st.oom_killed.unwrap_or(false),
                    started_at: parse_time(st.started_at.as_deref()),
                    finished_at: parse_time(st.finished_at.as_deref()),
                    failure: None,
                }))
            }
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(runtime_error(&e)),
        }
    }

    /// One stats sample (the engine answers at once with `one-shot`).
    async fn stats_sample(&self, id: &str) -> Result<Sample, RuntimeError> {
        let opts = StatsOptionsBuilder::default()
            .stream(false)
            .one_shot(true)
            .build();
        let mut stream = self.docker.stats(id, Some(opts));
        let s = match stream.next().await {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(runtime_error(&e)),
            None => return Err(RuntimeError::Other("no stats".into())),
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
    async fn kill_container(&self, id: &str) -> Result<(), RuntimeError> {
        let opts = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        match self.docker.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
            // Podman answers a kill of a stopped container with a server error, not Docker's
            // conflict: what the container is now decides.
            Err(e) => match self.inspect_container(id).await {
                Ok(None) => Ok(()),
                Ok(Some(s)) if !s.running => Ok(()),
                _ => Err(runtime_error(&e)),
            },
        }
    }

    /// Force-removes a container with its anonymous volumes (an image's `VOLUME`s: they would
    /// outlive it on the host's disk, counted against no run); one that is gone is fine.
    async fn remove_container(&self, id: &str) -> Result<(), RuntimeError> {
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(runtime_error(&e)),
        }
    }

    /// Ids and bundle uuids of the containers labelled with this worker id.
    async fn containers_of(&self, worker_id: &str) -> Result<Vec<OwnRun>, RuntimeError> {
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
            .map_err(|e| runtime_error(&e))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let uuid = c.labels.as_ref()?.get(LABEL_BUNDLE_UUID)?.clone();
                Some(OwnRun { id: c.id?, uuid })
            })
            .collect())
    }

    /// The container's address on `<prefix>_general`.
    async fn general_address(&self, uuid: &str, id: &str) -> Result<String, RuntimeError> {
        let general = match self.engine {
            Engine::Docker => format!("{}_general", self.network_prefix),
            Engine::Podman => own_network(&self.network_prefix, uuid),
        };
        let info = self
            .docker
            .inspect_container(
                id,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .map_err(|e| runtime_error(&e))?;
        info.network_settings
            .and_then(|n| n.networks)
            .and_then(|mut m| m.remove(&general))
            .and_then(|e| e.ip_address)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                RuntimeError::NotFound(format!(
                    "The container of bundle {uuid} has no address on network {general}"
                ))
            })
    }
}

impl BundleRuntime for DockerRuntime {
    fn engine(&self) -> &'static str {
        "Docker engine"
    }

    async fn prepare(&self) -> Result<(), RuntimeError> {
        self.ensure_networks().await
    }

    async fn ensure_image(
        &self,
        image: &str,
        progress: impl FnMut(String) + Send,
    ) -> Result<String, RuntimeError> {
        // Before any registry request or pull: a name outside the grammar could make a
        // request of another kind (a path of the engine's own API, say).
        if !registry::valid_reference(image) {
            return Err(RuntimeError::Image(format!(
                "invalid reference format: {image:?} is not an image name"
            )));
        }
        self.images.ensure(self, image, progress).await
    }

    fn pin_image(&self, image: &str) {
        self.images.pin(image);
    }

    fn unpin_image(&self, image: &str) {
        self.images.unpin(image);
    }

    async fn clean_images(&self) {
        self.images.clean(self).await;
    }

    async fn start(
        &self,
        spec: &RunSpec,
        _progress: impl FnMut(String) + Send,
    ) -> Result<String, RuntimeError> {
        self.start_container(spec).await
    }

    async fn writable_bytes(&self, id: &str) -> Option<u64> {
        self.writable_layer(id).await
    }

    async fn inspect(&self, id: &str) -> Result<Option<RunStatus>, RuntimeError> {
        if let Some(st) = self.exits.status(id) {
            return Ok(Some(st));
        }
        self.inspect_container(id).await
    }

    /// The container's wait, or its `die` event, whichever comes first (exits.rs). The events
    /// are read from the run's start on, so a `die` before this call is seen too; a stream that
    /// breaks leaves it to the wait.
    async fn wait(&self, id: &str) {
        let mut waited = self
            .docker
            .wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>);
        let Some(started) = self
            .exits
            .started_at(id)
            .filter(|_| self.engine == Engine::Docker)
        else {
            waited.next().await;
            return;
        };
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("container".to_owned(), vec![id.to_owned()]),
            ("event".to_owned(), vec!["oom".to_owned(), "die".to_owned()]),
        ]);
        let mut events = self
            .docker
            .events(Some(bollard::query_parameters::EventsOptions {
                since: Some(format!("{}", started.floor() as i64 - 1)),
                until: None,
                filters: Some(filters),
            }));
        let died = async {
            while let Some(Ok(ev)) = events.next().await {
                if ev.action.as_deref() == Some("oom") {
                    self.exits.oom(id);
                }
                if let Some((code, at)) = exits::die_of(&ev) {
                    self.exits.died(id, code, at);
                    return;
                }
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = waited.next() => {}
            () = died => {}
        }
    }

    async fn sample(&self, id: &str) -> Result<Sample, RuntimeError> {
        self.stats_sample(id).await
    }

    async fn kill(&self, uuid: &str) -> Result<(), RuntimeError> {
        self.kill_container(&container_name(uuid)).await
    }

    async fn remove(&self, uuid: &str) -> Result<(), RuntimeError> {
        let name = container_name(uuid);
        self.remove_container(&name).await?;
        self.exits.forget(&name);
        self.remove_own_network(uuid).await;
        Ok(())
    }

    async fn address(&self, uuid: &str, id: &str) -> Result<String, RuntimeError> {
        self.general_address(uuid, id).await
    }

    async fn list_own(&self, worker_id: &str) -> Result<Vec<OwnRun>, RuntimeError> {
        self.containers_of(worker_id).await
    }

    async fn shutdown(&self) {
        self.remove_networks().await;
    }
}

#[cfg(test)]
mod tests;
