//! `--bundle-runtime docker` (the default; Podman through its Docker-compatible socket too): the
//! runtime's settings from the command line, the machine's CPUs, GPUs and memory its runs
//! share, and the runtime's start-up (networks, GPUs found through the engine, the image
//! cleaner).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{DockerConfig, DockerRuntime};
use crate::cli::{self, Args};
use crate::config::{Config, MachineResources};
use crate::metrics::Metrics;
use crate::resources;
use crate::runtime::BundleRuntime;

/// The engine's address (a plaintext one on another machine only with the opt-in) and the
/// image limits.
pub fn config(args: &Args) -> anyhow::Result<DockerConfig> {
    let docker_host = args.docker_host.clone().filter(|h| !h.is_empty());
    if let Some(host) = docker_host.as_deref() {
        if protocol::net::is_plaintext_remote(host) {
            if !args.allow_insecure_docker_host {
                anyhow::bail!(
                    "--docker-host {host}: a Docker API on another machine without TLS lets \
                     anyone on the network run root containers on it; reach it through a unix \
                     socket (e.g. an SSH tunnel), or pass --allow-insecure-docker-host to \
                     accept that"
                );
            }
            tracing::warn!(
                "--allow-insecure-docker-host: the Docker API at {host} is reached without TLS"
            );
        }
    }
    Ok(DockerConfig {
        docker_host,
        network_prefix: args.network_prefix.clone(),
        max_image_cache_bytes: args.max_image_cache_size,
        max_image_bytes: args.max_image_size,
    })
}

/// This machine's share for runs: `--cpuset` of its CPUs, `--gpuset` of the GPUs `nvidia-smi`
/// lists (without one, the engine is asked once connected: `gpus_from_engine`; `NONE` asks
/// nobody), `--max-memory` capped by the machine's memory.
pub fn resources(args: &Args) -> anyhow::Result<MachineResources> {
    let spec = args.gpuset.trim();
    let (gpuset, gpus_from_engine) = if spec.is_empty() || spec == "NONE" {
        tracing::info!("GPUs: none (--gpuset {spec:?})");
        (Vec::new(), None)
    } else {
        let gpus = resources::discover_gpus();
        if gpus.is_empty() {
            (Vec::new(), Some(args.gpuset.clone()))
        } else {
            super::gpus::log_found("nvidia-smi on this machine", &gpus);
            let gpuset = resources::parse_gpuset(&args.gpuset, &gpus)
                .map_err(|e| anyhow::anyhow!("--gpuset: {e}"))?;
            (gpuset, None)
        }
    };
    let cpuset = cli::parse_cpuset(&args.cpuset, &cli::available_cpus())
        .map_err(|e| anyhow::anyhow!("--cpuset: {e}"))?;
    let total = total_memory();
    Ok(MachineResources {
        cpuset,
        gpuset,
        gpus_from_engine,
        memory_bytes: args.max_memory.map_or(total, |m| m.min(total)),
    })
}

fn total_memory() -> u64 {
    nix::sys::sysinfo::sysinfo()
        .map(|i| i.ram_total())
        .unwrap_or(0)
}

/// Connects to the engine and readies it for runs: the worker's networks, the GPUs found
/// through the engine where this machine had no `nvidia-smi` (into `config.agent.gpuset`), the
/// image cleaner of `--max-image-cache-size`. On failure nothing of the worker's stays behind.
pub async fn start(
    docker: &DockerConfig,
    config: &mut Config,
    metrics: Arc<Metrics>,
    shutdown: &CancellationToken,
) -> anyhow::Result<DockerRuntime> {
    let runtime = DockerRuntime::connect(docker, &config.agent.work_dir, metrics).await?;
    if let Err(e) = runtime.prepare().await {
        runtime.shutdown().await;
        return Err(e.into());
    }
    if let Some(spec) = config.gpus_from_engine.take() {
        match runtime.gpuset_from_engine(&spec).await {
            Ok(gpuset) => config.agent.gpuset = gpuset,
            Err(e) => {
                runtime.shutdown().await;
                return Err(e);
            }
        }
    }
    runtime.spawn_image_cleaner(shutdown.clone());
    Ok(runtime)
}
