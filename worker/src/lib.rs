//! The CodaLab worker as a library: `cl-worker` parses its flags and calls [`run`]; tests drive
//! the same code.

pub mod archive;
pub mod cli;
pub mod deps;
pub mod docker;
pub mod format;
pub mod images;
pub mod persist;
pub mod read;
pub mod resources;
pub mod run_state;
pub mod worker;
pub mod ws;

use std::path::Path;
use std::time::Duration;

use protocol::{ClientConfig, Credentials, RestClient};
use tokio_util::sync::CancellationToken;

use crate::cli::{Args, RuntimeKind};

/// Total RAM of the machine.
fn total_memory() -> u64 {
    nix::sys::sysinfo::sysinfo()
        .map(|i| i.ram_total())
        .unwrap_or(0)
}

fn prepare_work_dir(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o770)
            .create(dir)
            .map_err(|e| anyhow::anyhow!("cannot create work dir {}: {e}", dir.display()))?;
    }
    let dir = dir
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("cannot use work dir {}: {e}", dir.display()))?;
    std::fs::create_dir_all(dir.join("runs"))?;
    Ok(dir)
}

/// Runs the worker until a signal, idleness or the run limit ends it.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.bundle_runtime == RuntimeKind::Kubernetes {
        anyhow::bail!(
            "--bundle-runtime kubernetes is not supported by this worker; run bundles with \
             --bundle-runtime docker"
        );
    }
    let gpus = resources::discover_gpus();
    for g in &gpus {
        tracing::info!(
            "found GPU {} {} ({} MiB)",
            g.index,
            g.uuid,
            g.memory_mib.map_or("?".into(), |m| m.to_string())
        );
    }
    let gpuset = resources::parse_gpuset(&args.gpuset, &gpus)
        .map_err(|e| anyhow::anyhow!("--gpuset: {e}"))?;
    let cpuset = cli::parse_cpuset(&args.cpuset, &cli::available_cpus())
        .map_err(|e| anyhow::anyhow!("--cpuset: {e}"))?;
    let credentials = Credentials::resolve(args.password_file.as_deref())?;
    let work_dir = prepare_work_dir(&args.work_dir)?;
    let client = RestClient::new(ClientConfig::new(args.server.clone()), credentials)?;

    // Log in: bad credentials end the worker; an unreachable server is retried.
    let interrupted = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if !common::login_until_success(&client, interrupted).await? {
        anyhow::bail!("interrupted before logging in");
    }
    tracing::info!(
        "logged in to {} as {}; worker id {:?}",
        client.server(),
        client.username(),
        args.id
    );

    let docker = docker::DockerRuntime::connect()
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    docker
        .ensure_networks(&args.network_prefix)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let deps = deps::Dependencies::new(
        client.clone(),
        work_dir.join("dependencies"),
        args.download_dependencies_max_retries,
        args.id.clone(),
        args.max_work_dir_size,
    )?;
    // Eviction and tidying of the (possibly shared) dependency cache; ends with the runtime.
    let _deps_maintenance = deps.spawn_maintenance();
    let memory = match args.max_memory {
        Some(m) => m.min(total_memory()),
        None => total_memory(),
    };
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into());
    let cfg = worker::Config {
        worker_id: args.id.clone(),
        work_dir: work_dir.clone(),
        network_prefix: args.network_prefix.clone(),
        cpuset,
        gpuset,
        memory_bytes: memory,
        tag: args.tag.clone(),
        group: args.group.clone(),
        tag_exclusive: args.tag_exclusive_effective(),
        shared_file_system: args.shared_file_system,
        exit_when_idle: args.exit_when_idle,
        idle_seconds: args.idle_seconds,
        checkin_frequency: Duration::from_secs(args.checkin_frequency_seconds.max(1)),
        exit_after_num_runs: args.exit_after_num_runs,
        pass_down_termination: args.pass_down_termination,
        preemptible: args.preemptible,
        shm_size_bytes: args.shared_memory_size_gb << 30,
        pids_limit: args.pids_limit,
        hostname,
        ws_url: Some(args.ws_server()),
    };
    // Runs of an earlier process with this id are resumed; an unreadable state file stops the
    // worker rather than orphaning them.
    let state_path = persist::state_path(&work_dir, &args.id);
    let saved = persist::load(&state_path).map_err(|e| {
        anyhow::anyhow!("{e}; move the file aside to start this worker without its earlier runs")
    })?;
    let shutdown = CancellationToken::new();
    let images = images::ImageCache::new(
        docker.clone(),
        &work_dir,
        args.max_image_cache_size,
        args.max_image_size,
    );
    images.spawn_cleaner(shutdown.clone());
    let mut worker = worker::Worker::new(cfg, client, docker.clone(), deps, images, shutdown);
    worker.resume(saved).await;
    let reason = worker.run().await;
    tracing::info!("stopped ({reason:?})");
    if reason != worker::ExitReason::Signal || args.pass_down_termination {
        docker.remove_networks(&args.network_prefix).await;
    }
    if args.delete_work_dir_on_exit {
        if let Err(e) = std::fs::remove_dir_all(&work_dir) {
            tracing::warn!("cannot delete {}: {e}", work_dir.display());
        }
    }
    Ok(())
}
