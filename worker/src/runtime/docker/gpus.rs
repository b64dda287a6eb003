//! GPU discovery through the Docker engine, for a worker with no `nvidia-smi` of its own: a
//! worker in a container (AWS Batch jobs, Azure Batch container tasks, Kubernetes pods with the
//! host's Docker socket) sees the machine's GPUs only through the engine that runs its bundles.
//!
//! As Python does, a container of the CUDA base image runs `nvidia-smi` with every GPU of the
//! machine. It asks for them with a device request (`--gpus all`: Docker 19.03 or later with the
//! NVIDIA Container Toolkit), the mechanism the worker's GPU runs use, so that what discovery
//! finds is what runs can get. The image is `CL_WORKER_GPU_DISCOVERY_IMAGE` where set (a site's
//! mirror), else Python's; it is pulled only when absent.

use std::time::Duration;

use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures::StreamExt;

use super::{docker_message, DockerRuntime, Engine};
use crate::resources::{self, Gpu};
use crate::runtime::RuntimeError;

/// Python's discovery image.
pub const DEFAULT_IMAGE: &str = "nvidia/cuda:11.5.2-base-ubuntu20.04";
/// The environment variable that names another discovery image (e.g. a registry mirror's).
pub const IMAGE_ENV: &str = "CL_WORKER_GPU_DISCOVERY_IMAGE";
/// How long the discovery container may take (a pull of the image not included).
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// How long the pull of the discovery image may take.
const PULL_LIMIT: Duration = Duration::from_secs(300);

/// The discovery image: [`IMAGE_ENV`], else [`DEFAULT_IMAGE`].
pub fn discovery_image() -> String {
    std::env::var(IMAGE_ENV)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_IMAGE.to_owned())
}

/// The command the discovery container runs.
pub fn discovery_command() -> Vec<String> {
    [
        "nvidia-smi",
        "--query-gpu=index,uuid,memory.total",
        "--format=csv,noheader,nounits",
    ]
    .map(String::from)
    .to_vec()
}

/// The discovery container: every GPU by a device request, no network, nothing else of the
/// machine's.
pub fn discovery_body(image: &str) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(discovery_command()),
        entrypoint: Some(vec![String::new()]),
        host_config: Some(HostConfig {
            device_requests: Some(vec![DeviceRequest {
                driver: Some("nvidia".into()),
                count: Some(-1),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]),
            network_mode: Some("none".into()),
            security_opt: Some(vec!["no-new-privileges".into()]),
            cap_drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Restricts the GPUs found to the worker's own `NVIDIA_VISIBLE_DEVICES` (indices or UUIDs)
/// when it names some: a worker container given some of the machine's GPUs (a Kubernetes
/// device plugin, `docker run --gpus '"device=1"'`) uses only those. `all`, empty or unset
/// keeps all; `none`/`void` keeps none.
pub fn restrict_to_visible(gpus: Vec<Gpu>, visible: Option<&str>) -> Vec<Gpu> {
    let Some(v) = visible.map(str::trim).filter(|v| !v.is_empty()) else {
        return gpus;
    };
    match v {
        "all" => gpus,
        "none" | "void" => Vec::new(),
        list => {
            let wanted: Vec<&str> = list.split(',').map(str::trim).collect();
            gpus.into_iter()
                .filter(|g| wanted.contains(&g.index.as_str()) || wanted.contains(&g.uuid.as_str()))
                .collect()
        }
    }
}

/// Why the engine found no GPUs.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(
        "Podman gives GPUs as CDI devices and has no device request for all of them; run the \
         worker where nvidia-smi is on its PATH"
    )]
    Podman,
    #[error("cannot get the image {image}: {source}")]
    Pull { image: String, source: RuntimeError },
    #[error("the pull of {image} took over {} s", PULL_LIMIT.as_secs())]
    PullTimeout { image: String },
    #[error("cannot create a container of {image}: {}", docker_message(.source))]
    Create { image: String, source: DockerError },
    #[error(
        "the engine has no NVIDIA device driver (is the NVIDIA Container Toolkit installed?): {}",
        docker_message(.0)
    )]
    NoDeviceDriver(#[source] DockerError),
    #[error("cannot start the discovery container: {}", docker_message(.0))]
    Start(#[source] DockerError),
    #[error("nvidia-smi in {image} did not finish within {} s", RUN_LIMIT.as_secs())]
    RunTimeout { image: String },
    /// nvidia-smi's exit code and the start of its output.
    #[error("nvidia-smi exited with {code}: {output}")]
    Exit { code: i64, output: String },
}

/// Logs the GPUs found and how.
pub fn log_found(how: &str, gpus: &[Gpu]) {
    tracing::info!("GPUs: {} found by {how}", gpus.len());
    for g in gpus {
        tracing::info!(
            "found GPU {} {} ({} MiB)",
            g.index,
            g.uuid,
            g.memory_mib.map_or("?".into(), |m| m.to_string())
        );
    }
}

impl DockerRuntime {
    /// `--gpuset` resolved against the GPUs the engine finds, for a worker whose own
    /// `nvidia-smi` found none; the log says which way they were found, or why none were.
    pub async fn gpuset_from_engine(&self, spec: &str) -> anyhow::Result<Vec<String>> {
        let gpus = match self.discover_gpus().await {
            Ok(found) => {
                let visible = std::env::var("NVIDIA_VISIBLE_DEVICES").ok();
                let n = found.len();
                let gpus = restrict_to_visible(found, visible.as_deref());
                if gpus.is_empty() {
                    tracing::info!(
                        "GPUs: none (no nvidia-smi on this machine; the Docker engine found {n}{})",
                        visible
                            .map(|v| format!(", none of them in NVIDIA_VISIBLE_DEVICES={v}"))
                            .unwrap_or_default()
                    );
                } else {
                    log_found(
                        &format!(
                            "the Docker engine (nvidia-smi in {}, with a device request for all \
                             GPUs{})",
                            discovery_image(),
                            if gpus.len() < n {
                                format!(
                                    "; {} of {n} in this worker's NVIDIA_VISIBLE_DEVICES",
                                    gpus.len()
                                )
                            } else {
                                String::new()
                            }
                        ),
                        &gpus,
                    );
                }
                gpus
            }
            Err(why) => {
                tracing::info!(
                    "GPUs: none (no nvidia-smi on this machine; the Docker engine: {why})"
                );
                Vec::new()
            }
        };
        resources::parse_gpuset(spec, &gpus).map_err(|e| anyhow::anyhow!("--gpuset: {e}"))
    }

    /// The machine's GPUs as the engine shows them to a container asking for all of them; an
    /// error says why none could be found.
    pub async fn discover_gpus(&self) -> Result<Vec<Gpu>, DiscoverError> {
        if self.engine == Engine::Podman {
            return Err(DiscoverError::Podman);
        }
        let image = discovery_image();
        match tokio::time::timeout(PULL_LIMIT, self.pull_image(&image, |_| {})).await {
            Ok(Ok(_)) => {}
            Ok(Err(source)) => return Err(DiscoverError::Pull { image, source }),
            Err(_) => return Err(DiscoverError::PullTimeout { image }),
        }
        let name = format!(
            "cl_worker_gpu_discovery_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let opts = CreateContainerOptionsBuilder::default().name(&name).build();
        self.docker
            .create_container(Some(opts), discovery_body(&image))
            .await
            .map_err(|source| DiscoverError::Create {
                image: image.clone(),
                source,
            })?;
        let result = tokio::time::timeout(RUN_LIMIT, self.run_discovery(&name)).await;
        let _ = self
            .docker
            .remove_container(
                &name,
                Some(
                    RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .v(true)
                        .build(),
                ),
            )
            .await;
        match result {
            Ok(r) => r,
            Err(_) => Err(DiscoverError::RunTimeout { image }),
        }
    }

    async fn run_discovery(&self, name: &str) -> Result<Vec<Gpu>, DiscoverError> {
        if let Err(e) = self
            .docker
            .start_container(
                name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
        {
            return Err(
                if docker_message(&e).contains("could not select device driver") {
                    DiscoverError::NoDeviceDriver(e)
                } else {
                    DiscoverError::Start(e)
                },
            );
        }
        // A non-zero exit is an error of the wait stream; the exit code is read below.
        let mut wait = self.docker.wait_container(
            name,
            None::<bollard::query_parameters::WaitContainerOptions>,
        );
        while wait.next().await.is_some() {}
        let code = self
            .docker
            .inspect_container(
                name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .ok()
            .and_then(|i| i.state)
            .and_then(|s| s.exit_code)
            .unwrap_or(-1);
        let mut out = Vec::new();
        let mut logs = self.docker.logs(
            name,
            Some(
                LogsOptionsBuilder::default()
                    .stdout(true)
                    .stderr(true)
                    .build(),
            ),
        );
        while let Some(Ok(chunk)) = logs.next().await {
            out.extend_from_slice(&chunk.into_bytes());
            if out.len() > 1 << 20 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&out);
        if code != 0 {
            return Err(DiscoverError::Exit {
                code,
                output: text.trim().chars().take(500).collect(),
            });
        }
        Ok(resources::parse_nvidia_smi(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: &str, u: &str) -> Gpu {
        Gpu {
            index: i.into(),
            uuid: u.into(),
            memory_mib: None,
        }
    }

    #[test]
    fn the_discovery_container_asks_for_every_gpu_and_nothing_else() {
        let b = discovery_body(DEFAULT_IMAGE);
        assert_eq!(
            b.image.as_deref(),
            Some("nvidia/cuda:11.5.2-base-ubuntu20.04")
        );
        assert_eq!(b.cmd.as_ref().unwrap()[0], "nvidia-smi");
        let hc = b.host_config.unwrap();
        let dr = &hc.device_requests.unwrap()[0];
        assert_eq!(dr.driver.as_deref(), Some("nvidia"));
        assert_eq!(dr.count, Some(-1));
        assert_eq!(dr.capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert!(hc.mounts.is_none() && hc.binds.is_none());
    }

    #[test]
    fn the_workers_own_visible_devices_restrict_what_the_engine_found() {
        let all = vec![gpu("0", "GPU-a"), gpu("1", "GPU-b"), gpu("2", "GPU-c")];
        assert_eq!(restrict_to_visible(all.clone(), None), all);
        assert_eq!(restrict_to_visible(all.clone(), Some("all")), all);
        assert_eq!(restrict_to_visible(all.clone(), Some(" ")), all);
        assert!(restrict_to_visible(all.clone(), Some("none")).is_empty());
        assert!(restrict_to_visible(all.clone(), Some("void")).is_empty());
        assert_eq!(
            restrict_to_visible(all.clone(), Some("1")),
            vec![gpu("1", "GPU-b")]
        );
        assert_eq!(
            restrict_to_visible(all, Some("GPU-c, 0")),
            vec![gpu("0", "GPU-a"), gpu("2", "GPU-c")]
        );
    }
}
