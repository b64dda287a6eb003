//! The CodaLab worker as a library: `cl-worker` parses its flags and calls [`run`]; tests drive
//! [`run_with`] with a runtime of their own.

pub mod agent;
pub mod archive;
pub mod cli;
pub mod config;
mod deps;
mod format;
pub mod metrics;
pub mod nofollow;
pub mod notice;
pub mod persist;
pub mod prefetch;
mod read;
mod resources;
mod run;
pub mod runtime;
mod ws;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use protocol::{ClientConfig, Credentials, RestClient};
use tokio_util::sync::CancellationToken;

use crate::agent::ExitReason;
use crate::cli::Args;
use crate::cli::RuntimeKind;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::runtime::podman::args::PodmanArgs;
use crate::runtime::{BuildContext, BundleRuntime, RuntimeArgs};

/// Creates the work dir (mode 0770) and its `runs` folder (mode 0700: only the worker's user
/// reaches the runs' files on the host, set-user-id files a run made included); returns its
/// absolute path. Run dirs an earlier process left in the trash are deleted in the background.
pub fn prepare_work_dir(dir: &Path) -> anyhow::Result<PathBuf> {
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
    let runs = dir.join("runs");
    std::fs::create_dir_all(&runs)?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&runs, std::fs::Permissions::from_mode(0o700));
    }
    let trash: Vec<_> = std::fs::read_dir(&runs)?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| n.to_string_lossy().starts_with(run::TRASH_PREFIX))
        .collect();
    if !trash.is_empty() {
        let runs = nofollow::Dir::open(&runs)?;
        std::thread::spawn(move || {
            for name in trash {
                if let Err(e) = runs.remove(&name) {
                    tracing::warn!("cannot delete {}: {e}", name.to_string_lossy());
                }
            }
        });
    }
    Ok(dir)
}

/// `--dependency-cache-dir`: made (mode 0770) where missing, used by its canonical path (as
/// the work dir is: the operator's path, its links resolved once at start).
fn prepare_cache_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let cannot = |e: std::io::Error| {
        anyhow::anyhow!("cannot use --dependency-cache-dir {}: {e}", dir.display())
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o770)
            .create(dir)
            .map_err(cannot)?;
    }
    dir.canonicalize().map_err(cannot)
}

/// Runs the worker until a signal, idleness or the run limit ends it.
pub async fn run(args: Args) -> anyhow::Result<()> {
    args.check_prefetch().map_err(anyhow::Error::msg)?;
    let mut config = Config::from_args(&args);
    let credentials = Credentials::resolve(config.password_file.as_deref())?;
    config.agent.work_dir = prepare_work_dir(&config.agent.work_dir)?;
    let client = RestClient::new(ClientConfig::new(config.server.clone()), credentials)?;
    let metrics = Arc::new(Metrics::new());
    // `--metrics-addr`: served from the start (login retries included) until the worker ends.
    let serving = CancellationToken::new();
    let _stop_serving = serving.clone().drop_guard();
    if let Some(addr) = config.metrics_addr {
        metrics::serve(addr, metrics.clone(), serving).await?;
    }
    let shutdown = CancellationToken::new();
    let (work_dir, worker_id) = (
        config.agent.work_dir.clone(),
        config.agent.worker_id.clone(),
    );
    let cx = BuildContext {
        cpuset: &args.cpuset,
        gpuset: &args.gpuset,
        max_memory: args.max_memory,
        work_dir: &work_dir,
        worker_id: &worker_id,
        metrics: &metrics,
        shutdown: &shutdown,
    };
    // The one place that picks the runtime: each one's folder builds it from its own flags.
    match args.bundle_runtime {
        RuntimeKind::Docker => serve(&args.docker, &cx, config, client).await,
        RuntimeKind::Podman => serve(&PodmanArgs(&args.docker), &cx, config, client).await,
        RuntimeKind::Kubernetes => serve(&args.kubernetes, &cx, config, client).await,
    }
}

/// Builds the runtime (its flags are refused before the server is asked anything), logs in,
/// and runs the worker on it.
async fn serve<A: RuntimeArgs>(
    runtime_args: &A,
    cx: &BuildContext<'_>,
    config: Config,
    client: RestClient,
) -> anyhow::Result<()> {
    let (runtime, share) = runtime_args.build(cx).await?;
    let config = config.with_share(share);
    // Log in: bad credentials end the worker; an unreachable server is retried.
    let interrupted = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let logged_in = common::login_until_success(&client, interrupted).await;
    if !matches!(logged_in, Ok(true)) {
        runtime.shutdown().await;
        logged_in?;
        anyhow::bail!("interrupted before logging in");
    }
    tracing::info!(
        "logged in to {} as {}; worker id {:?}",
        client.server(),
        client.username(),
        config.agent.worker_id
    );
    run_with_metrics(
        config,
        client,
        runtime,
        cx.shutdown.clone(),
        cx.metrics.clone(),
    )
    .await?;
    Ok(())
}

/// The worker on a logged-in client and a prepared runtime, with `config.agent.work_dir` made by
/// [`prepare_work_dir`]: resumes the runs of the state file, then checks in and runs bundles
/// until a signal, idleness or the run limit; `shutdown` is cancelled when it stops.
pub async fn run_with<R: BundleRuntime>(
    config: Config,
    client: RestClient,
    runtime: R,
    shutdown: CancellationToken,
) -> anyhow::Result<ExitReason> {
    run_with_metrics(config, client, runtime, shutdown, Arc::default()).await
}

/// [`run_with`], recording into `metrics`.
pub async fn run_with_metrics<R: BundleRuntime>(
    config: Config,
    client: RestClient,
    runtime: R,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
) -> anyhow::Result<ExitReason> {
    let work_dir = config.agent.work_dir.clone();
    // A start-up failure leaves nothing of the runtime's behind (its networks): what the
    // runtime prepared is undone before the error is returned.
    let set_up = || -> anyhow::Result<_> {
        // The cache's root: `--dependency-cache-dir` (shared by the workers given it), else
        // the work dir.
        let cache_root = match &config.dependencies.cache_dir {
            Some(dir) => prepare_cache_dir(dir)?,
            None => work_dir.clone(),
        };
        let deps = deps::Dependencies::new(
            client.clone(),
            cache_root.join("dependencies"),
            config.dependencies.max_retries,
            config.agent.worker_id.clone(),
            config.dependencies.max_work_dir_bytes,
            metrics.clone(),
        )?;
        // Runs of an earlier process with this id are resumed; an unreadable state file stops
        // the worker rather than orphaning them.
        let state_path = persist::state_path(&work_dir, &config.agent.worker_id);
        let saved = persist::load(&state_path).map_err(|e| {
            anyhow::anyhow!(
                "{e}; move the file aside to start this worker without its earlier runs"
            )
        })?;
        Ok((deps, saved))
    };
    let (deps, saved) = match set_up() {
        Ok(v) => v,
        Err(e) => {
            runtime.shutdown().await;
            return Err(e);
        }
    };
    // Eviction and tidying of the (possibly shared) dependency cache; ends with the runtime.
    let _deps_maintenance = deps.spawn_maintenance();
    let pass_down_termination = config.agent.pass_down_termination;
    let mut worker = agent::Worker::new(
        config.agent,
        client,
        runtime.clone(),
        deps,
        shutdown,
        metrics,
    );
    worker.resume(saved).await;
    let reason = worker.run().await;
    tracing::info!("stopped ({reason:?})");
    if reason != ExitReason::Signal || pass_down_termination {
        runtime.shutdown().await;
    }
    if config.delete_work_dir_on_exit {
        if let Err(e) = std::fs::remove_dir_all(&work_dir) {
            tracing::warn!("cannot delete {}: {e}", work_dir.display());
        }
    }
    Ok(reason)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_runs_dir_is_the_workers_alone() {
        let t = tempfile::tempdir().unwrap();
        let wd = super::prepare_work_dir(&t.path().join("wd")).unwrap();
        let mode = std::fs::metadata(wd.join("runs"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // An existing runs dir is tightened too.
        std::fs::set_permissions(wd.join("runs"), std::fs::Permissions::from_mode(0o755)).unwrap();
        super::prepare_work_dir(&wd).unwrap();
        let mode = std::fs::metadata(wd.join("runs"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
