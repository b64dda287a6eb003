//! `cl-worker-manager`: watches a CodaLab server for staged bundles and launches `cl-worker`s
//! on a backend, as the pure policy of [`manager::policy`] decides.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use backends::{BackendArgs, BuildContext, ShapeSize};
use clap::Parser;
use manager::cli::{BackendCommand, Cli, GlobalArgs, StatusArgs};
use manager::config::FileConfig;
use manager::control::{Exit, Manager};
use manager::metrics::Metrics;
use manager::policy::{Config, Resources, Shape};
use protocol::{ClientConfig, Credentials, RestClient};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let BackendCommand::Status(args) = &cli.backend {
        return status(args, cli.global.metrics_addr);
    }
    common::process::init_logging(
        &[
            "cl_worker_manager",
            "manager",
            "backends",
            "protocol",
            "common",
        ],
        cli.global.verbose,
        cli.global.log_format,
    );
    let Some(rt) = common::process::runtime("cl-worker-manager") else {
        return ExitCode::FAILURE;
    };
    let result = rt.block_on(run(cli));
    // Workers are in their own process groups and outlive the manager; nothing to wait for.
    rt.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(Exit::Stopped) => ExitCode::SUCCESS,
        Ok(Exit::Restart) => restart(),
        Ok(Exit::TooManyFailures(msg)) => {
            tracing::error!("{msg}; exiting");
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cl-worker-manager status [URL]`: a running manager's status as a table (or JSON); the exit
/// code says whether it is healthy (see [`manager::status::exit`]).
fn status(args: &StatusArgs, metrics_addr: Option<std::net::SocketAddr>) -> ExitCode {
    let url = args.url(metrics_addr);
    match manager::status::fetch(&url, Duration::from_secs(args.timeout.max(1))) {
        Ok(s) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            } else {
                print!("{}", manager::status::render_table(&s, common::now_unix()));
            }
            ExitCode::from(s.exit_code())
        }
        Err(e) => {
            eprintln!("cl-worker-manager status: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `--restart-after-seconds`: replace this process with a fresh copy of itself (same pid, so
/// local workers stay its children; every descriptor is close-on-exec).
fn restart() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("cannot restart: {e}");
            return ExitCode::FAILURE;
        }
    };
    let e = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .exec();
    tracing::error!("cannot restart: {e}");
    ExitCode::FAILURE
}

/// SIGTERM or SIGINT cancel the token; the loop finishes its tick and stops.
fn shutdown_on_signals() -> anyhow::Result<CancellationToken> {
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
fn policy_config(g: &GlobalArgs, default_shape: Shape) -> anyhow::Result<Config> {
    let mut config = Config::with_default_shape(default_shape);
    if let Some(path) = &g.config {
        FileConfig::load(path)?.apply(&mut config);
    }
    config.min_workers = g.min_workers as usize;
    config.max_workers = g.max_workers as usize;
    config.min_seconds_between_workers = g.min_seconds_between_workers as f64;
    config.worker_tag = g.worker_tag.clone();
    config.worker_tag_exclusive = g.worker_tag_exclusive;
    config.prefilter = !g.no_prefilter;
    Ok(config)
}

async fn run(cli: Cli) -> anyhow::Result<Exit> {
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
        BackendCommand::Local(args) => start(g, &shutdown, args).await,
        BackendCommand::SlurmBatch(args) => start(g, &shutdown, args.as_ref()).await,
        BackendCommand::AwsBatch(args) => start(g, &shutdown, args.as_ref()).await,
        BackendCommand::AzureBatch(args) => start(g, &shutdown, args.as_ref()).await,
        BackendCommand::Kubernetes(args) => start(g, &shutdown, args.as_ref()).await,
        // Answered by `main` without a control loop.
        BackendCommand::Status(_) => Ok(Exit::Stopped),
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
    config.capacity = capacity.map(|c| Resources::new(c.cpus, c.gpus, c.memory_bytes));
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let shapes: Vec<ShapeSize> = config
        .shapes
        .iter()
        .map(|s| ShapeSize {
            name: s.name.clone(),
            cpus: s.cpus,
            gpus: s.gpus,
            memory_bytes: s.memory_bytes,
        })
        .collect();
    let cx = BuildContext {
        username: &credentials.username,
        password: &credentials.password,
        work_dir_prefix: g.worker_work_dir_prefix.as_deref(),
        shapes: &shapes,
        capacity,
    };
    let (backend, profile) = args.build(&cx).await?;
    for s in &profile.extra_shapes {
        config
            .shapes
            .push(Shape::new(s.name.clone(), s.cpus, s.gpus, s.memory_bytes));
    }
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
        Some(addr) => Some(manager::metrics::serve(addr, metrics, shutdown.clone()).await?),
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
