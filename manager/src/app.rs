//! The manager's start-up, as the binary runs it: one backend (its flags from the one `match`
//! of [`BackendCommand::args`]) or several tiers (`crate::tiers::start`); the common start-up
//! (credentials, client, policy configuration), the backend's own (its builder and pre-flight
//! check, [`build_manager`]), then the control loop until SIGTERM ([`drive`]). `main.rs` only
//! parses the command line, sets up logging and the async runtime, and maps the exit.

use std::sync::Arc;

use protocol::{ClientConfig, Credentials, RestClient};
use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, GlobalArgs};
use crate::config::FileConfig;
use crate::control::Exit;
use crate::metrics::Metrics;
use crate::policy::{Config, Shape};
use crate::setup::{build_manager, drive, AnyBackendArgs, ManagerContext};

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
    let exit = match cli.backend.as_ref().map(|b| b.args()) {
        Some(Some(args)) => start(g, &shutdown, args).await,
        // `status`, `completions`, `man`: answered by `main` without a control loop.
        Some(None) => Ok(Exit::Stopped),
        // Several backends, from the [[tier]] sections of --config.
        None => crate::tiers::start::start(g, &shutdown).await,
    };
    // Also when a backend failed before its loop: the signal task and metrics server end.
    shutdown.cancel();
    exit
}

/// The common start-up (credentials, client, policy configuration), then the backend's own
/// (its builder and pre-flight check), then the loop.
async fn start(
    g: &GlobalArgs,
    shutdown: &CancellationToken,
    args: &dyn AnyBackendArgs,
) -> anyhow::Result<Exit> {
    let credentials = Credentials::resolve(args.password_file())?;
    let client = RestClient::new(ClientConfig::new(g.server.clone()), credentials.clone())?;
    let flags = args.shape();
    let config = policy_config(
        g,
        Shape::from_flags(flags.cpus, flags.gpus, flags.memory_mb),
    )?;
    let cx = ManagerContext {
        g,
        credentials: &credentials,
        client: &client,
        metrics: Arc::new(Metrics::new()),
    };
    let manager = build_manager(args, config, cx).await?;
    drive(g, &client, shutdown, args.cluster_access(), manager).await
}
