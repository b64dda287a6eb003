//! `--bundle-runtime docker` (the default; Podman through its Docker-compatible socket too): the
//! runtime's flags, the machine's CPUs, GPUs and memory its runs share, and the runtime's
//! start-up (networks, GPUs found through the engine, the image cleaner).

use clap::Args;

use super::{DockerConfig, DockerRuntime};
use crate::format::parse_size;
use crate::resources;
use crate::runtime::{BuildContext, BuildError, BundleRuntime, MachineShare, RuntimeArgs};

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// The Docker runtime's flags (also Podman's).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Docker and Podman runtimes")]
pub struct DockerArgs {
    /// Docker network name prefix.
    #[arg(long, default_value = "codalab_worker_network")]
    pub network_prefix: String,

    /// Docker-compatible API to run bundles through (`unix:///path/to.sock`, `tcp://host:port`,
    /// `http://host:port`), e.g. a Podman service's socket. Default: the local Docker engine.
    #[arg(long, env = "DOCKER_HOST")]
    pub docker_host: Option<String>,

    /// Accept a `--docker-host` on another machine without TLS (`tcp://`, `http://`): refused
    /// without it, since that API runs root containers for anyone who reaches it.
    #[arg(long)]
    pub allow_insecure_docker_host: bool,

    /// Limit the disk space used to cache Docker images for runs.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub max_image_cache_size: Option<u64>,

    /// Limit the size of Docker images that runs may use.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub max_image_size: Option<u64>,
}

impl DockerArgs {
    /// The engine's address (a plaintext one on another machine only with the opt-in) and the
    /// image limits.
    pub fn config(&self) -> Result<DockerConfig, BuildError> {
        let docker_host = self.docker_host.clone().filter(|h| !h.is_empty());
        if let Some(host) = docker_host.as_deref() {
            if protocol::net::is_plaintext_remote(host) {
                if !self.allow_insecure_docker_host {
                    return Err(BuildError::Flag(format!(
                        "--docker-host {host}: a Docker API on another machine without TLS lets \
                         anyone on the network run root containers on it; reach it through a \
                         unix socket (e.g. an SSH tunnel), or pass --allow-insecure-docker-host \
                         to accept that"
                    )));
                }
                tracing::warn!(
                    "--allow-insecure-docker-host: the Docker API at {host} is reached without TLS"
                );
            }
        }
        Ok(DockerConfig {
            docker_host,
            network_prefix: self.network_prefix.clone(),
            max_image_cache_bytes: self.max_image_cache_size,
            max_image_bytes: self.max_image_size,
        })
    }
}

impl RuntimeArgs for DockerArgs {
    type Runtime = DockerRuntime;

    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(DockerRuntime, MachineShare), BuildError> {
        let config = self.config()?;
        start(&config, cx).await
    }
}

/// What `--gpuset` asks of this machine: no GPU, the GPUs `nvidia-smi` here lists, or (no
/// `nvidia-smi` here: a worker in a container) the GPUs the engine finds once connected.
enum GpuSource {
    Listed(Vec<String>),
    Engine(String),
}

/// This machine's share for runs but the GPUs found through the engine: `--cpuset` of its
/// CPUs, `--gpuset` of the GPUs `nvidia-smi` lists (`NONE` asks nobody), `--max-memory` capped
/// by the machine's memory.
fn machine(cx: &BuildContext<'_>) -> Result<(MachineShare, GpuSource), BuildError> {
    let spec = cx.gpuset.trim();
    let gpus = if spec.is_empty() || spec == "NONE" {
        tracing::info!("GPUs: none (--gpuset {spec:?})");
        GpuSource::Listed(Vec::new())
    } else {
        let found = resources::discover_gpus();
        if found.is_empty() {
            GpuSource::Engine(cx.gpuset.to_string())
        } else {
            super::gpus::log_found("nvidia-smi on this machine", &found);
            GpuSource::Listed(
                resources::parse_gpuset(cx.gpuset, &found)
                    .map_err(|e| BuildError::Flag(format!("--gpuset: {e}")))?,
            )
        }
    };
    let cpuset = resources::parse_cpuset(cx.cpuset, &resources::available_cpus())
        .map_err(|e| BuildError::Flag(format!("--cpuset: {e}")))?;
    let total = total_memory();
    let share = MachineShare {
        cpuset,
        gpuset: Vec::new(),
        memory_bytes: cx.max_memory.map_or(total, |m| m.min(total)),
    };
    Ok((share, gpus))
}

fn total_memory() -> u64 {
    nix::sys::sysinfo::sysinfo()
        .map(|i| i.ram_total())
        .unwrap_or(0)
}

/// Connects to the engine and readies it for runs: the worker's networks, the GPUs found
/// through the engine where this machine had no `nvidia-smi`, the image cleaner of
/// `--max-image-cache-size`. On failure nothing of the worker's stays behind.
pub(crate) async fn start(
    docker: &DockerConfig,
    cx: &BuildContext<'_>,
) -> Result<(DockerRuntime, MachineShare), BuildError> {
    let (mut share, gpus) = machine(cx)?;
    let runtime = DockerRuntime::connect(docker, cx.work_dir, cx.metrics.clone())
        .await
        .map_err(BuildError::start)?;
    if let Err(e) = runtime.prepare().await {
        runtime.shutdown().await;
        return Err(BuildError::start(e));
    }
    share.gpuset = match gpus {
        GpuSource::Listed(gpus) => gpus,
        GpuSource::Engine(spec) => match runtime.gpuset_from_engine(&spec).await {
            Ok(gpus) => gpus,
            Err(e) => {
                runtime.shutdown().await;
                return Err(BuildError::flag(e));
            }
        },
    };
    runtime.spawn_image_cleaner(cx.shutdown.clone());
    Ok((runtime, share))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The Docker runtime's settings from a `cl-worker` command line (the worker's own parser).
    fn docker_args(extra: &[&str]) -> DockerArgs {
        let mut argv = vec!["cl-worker"];
        argv.extend_from_slice(extra);
        crate::cli::Args::try_parse_from(argv).unwrap().docker
    }

    fn config(extra: &[&str]) -> Result<DockerConfig, BuildError> {
        docker_args(extra).config()
    }

    #[test]
    fn a_remote_docker_host_without_tls_needs_the_opt_in() {
        let e = config(&["--docker-host", "tcp://10.0.0.7:2375"])
            .err()
            .unwrap();
        assert!(matches!(e, BuildError::Flag(_)), "{e:?}");
        assert!(
            e.to_string().contains("--allow-insecure-docker-host"),
            "{e}"
        );
        let c = config(&[
            "--docker-host",
            "tcp://10.0.0.7:2375",
            "--allow-insecure-docker-host",
        ])
        .unwrap();
        assert_eq!(c.docker_host.as_deref(), Some("tcp://10.0.0.7:2375"));
        // A local socket or this machine's own port needs nothing.
        for host in ["unix:///run/podman/podman.sock", "tcp://127.0.0.1:2375"] {
            assert!(config(&["--docker-host", host]).is_ok(), "{host}");
        }
    }
}
