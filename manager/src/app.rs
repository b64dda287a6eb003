//! The manager's start-up, as the binary runs it: the backend picked by one `match`, the common
//! start-up (credentials, client, policy configuration), the backend's own (its builder and
//! pre-flight check), then the control loop ([`Manager::run`]) until SIGTERM. `main.rs` only
//! parses the command line, sets up logging and the async runtime, and maps the exit.

use std::sync::Arc;

use backends::{BackendArgs, BuildContext};
use protocol::{ClientConfig, Credentials, RestClient};
use tokio_util::sync::CancellationToken;

use crate::cli::{BackendCommand, Cli, GlobalArgs};
use crate::config::FileConfig;
use crate::control::{Exit, Manager};
use crate::metrics::Metrics;
use crate::policy::{Config, Shape};

/// SIGTERM or SIGINT cancel the token; the loop finishes its tick and stops.
pub fn shutdown_on_signals() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{signal, SignalKind};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("received SIGTERM; finishing this tick"),
            _ = int.recv() => tracing::info!("received SIGINT; finishing this tick"),
        }
        t.cancel();
    });
    Ok(token)
}

/// The policy configuration: the backend flags' default shape, the `--config` file, the global
/// flags.
pub fn policy_config(g: &GlobalArgs, default_shape: Shape) -> anyhow::Result<Config> {
    let mut config = Config::with_default_shape(default_shape);
    if let Some(path) = &g.config {
        let file = FileConfig::load(path)?;
        if !file.tiers.is_empty() {
            anyhow::bail!(
                "--config {}: its [[tier]] sections name the backends: run cl-worker-manager \
                 without a backend subcommand",
                path.display()
            );
        }
        file.apply(&mut config);
    }
    g.apply_policy_flags(&mut config);
    Ok(config)
}

pub async fn run(cli: Cli) -> anyhow::Result<Exit> {
    let g = &cli.global;
    if g.max_workers < g.min_workers {
        anyhow::bail!(
            "--max-workers ({}) is below --min-workers ({})",
            g.max_workers,
            g.min_workers
        );
    }
    let shutdown = shutdown_on_signals()?;
    // The one place that knows every backend.
    let exit = match &cli.backend {
        Some(BackendCommand::Local(args)) => start(g, &shutdown, args).await,
        Some(BackendCommand::SlurmBatch(args)) => start(g, &shutdown, args.as_ref()).await,
        Some(BackendCommand::AwsBatch(args)) => start(g, &shutdown, args.as_ref()).await,
        Some(BackendCommand::AzureBatch(args)) => start(g, &shutdown, args.as_ref()).await,
        Some(BackendCommand::Kubernetes(args)) => start(g, &shutdown, args.as_ref()).await,
        // Answered by `main` without a control loop.
        Some(BackendCommand::Status(_)) => Ok(Exit::Stopped),
        // Several backends, from the [[tier]] sections of --config.
        None => crate::tiers::start::start(g, &shutdown).await,
    };
    // Also when a backend failed before its loop: the signal task and metrics server end.
    shutdown.cancel();
    exit
}

/// The common start-up (credentials, client, policy configuration), then the backend's own
/// (its builder and pre-flight check), then the loop.
async fn start<A: BackendArgs>(
    g: &GlobalArgs,
    shutdown: &CancellationToken,
    args: &A,
) -> anyhow::Result<Exit> {
    let credentials = Credentials::resolve(args.password_file())?;
    let client = RestClient::new(ClientConfig::new(g.server.clone()), credentials.clone())?;
    let metrics = Arc::new(Metrics::new());
    let flags = args.shape();
    let mut config = policy_config(
        g,
        Shape::from_flags(flags.cpus, flags.gpus, flags.memory_mb),
    )?;
    let capacity = args.capacity()?;
    config.capacity = capacity;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let shapes = config.shapes.clone();
    let cx = BuildContext {
        username: &credentials.username,
        password: &credentials.password,
        work_dir_prefix: g.worker_work_dir_prefix.as_deref(),
        shapes: &shapes,
        capacity,
    };
    let (backend, profile) = args.build(&cx).await?;
    config.shapes.extend(profile.extra_shapes.iter().cloned());
    let mut manager = Manager::new(
        client.clone(),
        backend,
        profile,
        config,
        g.settings(),
        g.staged_keywords(&credentials.username),
        metrics.clone(),
    );
    manager.exit_after_num_failed = args.exit_after_num_failed();
    drive(g, &client, metrics, shutdown, manager).await
}

/// Starts the metrics server, logs in, then ticks (or plans once).
async fn drive<B: backends::Backend>(
    g: &GlobalArgs,
    client: &RestClient,
    metrics: Arc<Metrics>,
    shutdown: &CancellationToken,
    mut manager: Manager<B>,
) -> anyhow::Result<Exit> {
    let server = match g.metrics_addr {
        Some(addr) => Some(crate::metrics::serve(addr, metrics, shutdown.clone()).await?),
        None => None,
    };
    if !common::login_until_success(client, shutdown.cancelled()).await? {
        return Ok(Exit::Stopped);
    }
    for s in &manager.config.shapes {
        tracing::info!(
            "shape {}: {} CPUs, {} GPUs, {} MiB",
            s.name,
            s.cpus,
            s.gpus,
            s.memory_bytes >> 20
        );
    }
    tracing::info!(
        "{} backend; staged query {:?}",
        manager.backend.name(),
        manager.keywords
    );
    let exit = if g.once {
        match manager.tick(true).await {
            Some(plan) => println!("{}", serde_json::to_string_pretty(&plan)?),
            None => anyhow::bail!("--once: the staged bundles could not be read"),
        }
        Exit::Stopped
    } else {
        manager.run(shutdown.clone()).await
    };
    shutdown.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    Ok(exit)
}
