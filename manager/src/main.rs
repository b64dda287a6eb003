//! `cl-worker-manager`: watches a CodaLab server for staged bundles and launches `cl-worker`s
//! on a backend, as the pure policy of [`manager::policy`] decides.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use backends::{AwsBatchBackend, AwsBatchConfig, LocalBackend, SlurmBackend, SlurmConfig};
use clap::Parser;
use manager::cli::{AwsBatchArgs, Backend as BackendArgs, Cli, GlobalArgs, LocalArgs, SlurmArgs};
use manager::config::FileConfig;
use manager::control::{Exit, Manager};
use manager::metrics::Metrics;
use manager::policy::{Config, Resources, Shape};
use protocol::{ClientConfig, Credentials, RestClient};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    common::process::init_logging(
        &["cl_worker_manager", "manager", "backends", "protocol"],
        cli.global.verbose,
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

fn write_password_file(dir: &Path, c: &Credentials) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(".worker-password");
    let body = format!("{}\n{}\n", c.username, c.password);
    common::write_atomic(&path, body.as_bytes(), Some(0o600))?;
    Ok(path)
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

/// Everything a backend needs from the common start-up.
struct Common {
    g: GlobalArgs,
    client: RestClient,
    credentials: Credentials,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
}

impl Common {
    /// A manager of `backend` with this process's client, flags, keywords and metrics.
    fn manager<B: backends::Backend>(
        &self,
        backend: B,
        config: Config,
        password_file: Option<PathBuf>,
        work_dir: manager::control::WorkDirFn,
    ) -> Manager<B> {
        Manager::new(
            self.client.clone(),
            backend,
            config,
            self.g.clone(),
            self.g.staged_keywords(&self.credentials.username),
            password_file,
            self.metrics.clone(),
            work_dir,
        )
    }
}

async fn run(cli: Cli) -> anyhow::Result<Exit> {
    let g = cli.global.clone();
    if g.max_workers < g.min_workers {
        anyhow::bail!(
            "--max-workers ({}) is below --min-workers ({})",
            g.max_workers,
            g.min_workers
        );
    }
    let shutdown = shutdown_on_signals()?;
    let password_flag = match &cli.backend {
        BackendArgs::SlurmBatch(s) => s.password_file.clone(),
        BackendArgs::Local(_) | BackendArgs::AwsBatch(_) => None,
    };
    let credentials = Credentials::resolve(password_flag.as_deref())?;
    let client = RestClient::new(ClientConfig::new(g.server.clone()), credentials.clone())?;
    let metrics = Arc::new(Metrics::new());
    let common = Common {
        g,
        client,
        credentials,
        shutdown: shutdown.clone(),
        metrics,
    };
    let exit = match &cli.backend {
        BackendArgs::Local(local) => run_local(common, local).await,
        BackendArgs::SlurmBatch(slurm) => run_slurm(common, slurm).await,
        BackendArgs::AwsBatch(aws) => run_aws(common, aws).await,
    };
    // Also when a backend failed before its loop: the signal task and metrics server end.
    shutdown.cancel();
    exit
}

/// Starts the metrics server, logs in, then ticks (or plans once).
async fn drive<B: backends::Backend>(c: &Common, mut manager: Manager<B>) -> anyhow::Result<Exit> {
    let server = match c.g.metrics_addr {
        Some(addr) => {
            Some(manager::metrics::serve(addr, c.metrics.clone(), c.shutdown.clone()).await?)
        }
        None => None,
    };
    if !common::login_until_success(&c.client, c.shutdown.cancelled()).await? {
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
    let exit = if c.g.once {
        match manager.tick(true).await {
            Some(plan) => println!("{}", serde_json::to_string_pretty(&plan)?),
            None => anyhow::bail!("--once: the staged bundles could not be read"),
        }
        Exit::Stopped
    } else {
        manager.run(c.shutdown.clone()).await
    };
    c.shutdown.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    Ok(exit)
}

async fn run_local(c: Common, local: &LocalArgs) -> anyhow::Result<Exit> {
    let g = &c.g;
    let prefix = PathBuf::from(
        g.worker_work_dir_prefix
            .clone()
            .unwrap_or_else(|| "cl-worker-manager-local".into()),
    );
    let mut config = policy_config(g, local.shape.to_shape())?;
    let machine = backends::capacity()?;
    let gpus = local.machine_gpus.unwrap_or_else(backends::gpu_count);
    config.capacity = Some(Resources::new(
        local.machine_cpus.unwrap_or(machine.cpus),
        gpus,
        local
            .machine_memory_mb
            .map_or(machine.memory_bytes, |mb| mb.saturating_mul(1 << 20)),
    ));
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    tracing::info!(
        "local workers under {}, machine capacity {:?}",
        prefix.display(),
        config.capacity
    );
    let backend = LocalBackend::new(&prefix)?.with_gpus(gpus);
    let password_file = write_password_file(&prefix, &c.credentials)?;
    let work_root = prefix.clone();
    let mut manager = c.manager(
        backend,
        config,
        Some(password_file),
        Box::new(move |id| work_root.join(id).join("work").display().to_string()),
    );
    manager.network_prefix = Some(local.network_prefix.clone());
    drive(&c, manager).await
}

fn current_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default()
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

async fn run_slurm(c: Common, s: &SlurmArgs) -> anyhow::Result<Exit> {
    let g = &c.g;
    let user = s.user.clone().unwrap_or_else(current_user);
    let work_dir = absolute(&s.slurm_work_dir)?;
    let non_empty = |v: &str| Some(v.to_string()).filter(|v| !v.is_empty());
    let cfg = SlurmConfig {
        partition: s.partition.clone(),
        job_name: s.job_name.clone(),
        user: user.clone(),
        nodelist: non_empty(&s.nodelist),
        exclude: non_empty(&s.exclude),
        gpu_type: s.gpu_type.clone(),
        constraint: s.constraint.clone(),
        time: s.time.clone(),
        account: s.account.clone(),
        work_dir: work_dir.clone(),
        signal_secs: s.signal_seconds,
        dry_run: s.dry_run,
    };
    let backend = SlurmBackend::new(cfg)?;
    let config = policy_config(g, s.shape.to_shape())?;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    // A shape larger than every node of the partition would stay PENDING forever.
    match backend.largest_node().await {
        Ok((cpus, mem_mb, gpus)) => {
            for sh in &config.shapes {
                if sh.cpus > cpus || sh.gpus > gpus || sh.memory_bytes >> 20 > mem_mb {
                    let msg = format!(
                        "worker shape {} ({} CPUs, {} GPUs, {} MiB) fits no node of partition {} \
                         (largest: {cpus} CPUs, {gpus} GPUs, {mem_mb} MiB)",
                        sh.name,
                        sh.cpus,
                        sh.gpus,
                        sh.memory_bytes >> 20,
                        s.partition
                    );
                    if s.dry_run {
                        tracing::warn!("{msg}");
                    } else {
                        anyhow::bail!("{msg}");
                    }
                }
            }
        }
        Err(e) if s.dry_run => tracing::warn!("cannot read partition {}: {e}", s.partition),
        Err(e) => anyhow::bail!("cannot read partition {}: {e}", s.partition),
    }
    let password_file = match &s.password_file {
        Some(p) => absolute(p)?,
        None if s.dry_run => work_dir.join(".worker-password"),
        None => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&work_dir)?;
            write_password_file(&work_dir, &c.credentials)?
        }
    };
    // Python's shared work dir of all of a user's Slurm workers.
    let base = match g.worker_work_dir_prefix.as_deref() {
        Some(p) => absolute(Path::new(p))?,
        None => std::env::current_dir()?,
    };
    let shared = base
        .join(format!("{user}-codalab-SlurmBatchWorkerManager-scratch"))
        .join("workdir");
    let mut manager = c.manager(
        backend,
        config,
        Some(password_file),
        Box::new(move |_| shared.display().to_string()),
    );
    manager.worker_id_prefix = format!("{user}-{}-", s.job_name);
    manager.extra_worker_args = vec!["--pass-down-termination".into()];
    manager.exit_after_num_failed = s.exit_after_num_failed;
    drive(&c, manager).await
}

async fn run_aws(c: Common, a: &AwsBatchArgs) -> anyhow::Result<Exit> {
    let g = &c.g;
    let image = a.worker_image.clone().unwrap_or_else(|| {
        format!(
            "codalab/worker:{}",
            std::env::var("CODALAB_VERSION").unwrap_or_else(|_| "latest".into())
        )
    });
    if a.password_secret_arn.is_none() && a.allow_plaintext_password {
        tracing::warn!(
            "--allow-plaintext-password: the CodaLab password goes into the job definition's \
             plain environment, readable by anyone allowed to describe it; prefer \
             --password-secret-arn"
        );
    }
    let cfg = AwsBatchConfig {
        job_queue: a.job_queue.clone(),
        job_definition_name: a.job_definition_name.clone(),
        image,
        user: a.user.clone(),
        cpus: a.shape.cpus,
        gpus: a.shape.gpus,
        memory_mb: a.shape.memory_mb,
        job_filter: a.job_filter.clone(),
        work_dir_prefix: g.worker_work_dir_prefix.clone(),
        username: c.credentials.username.clone(),
        password_secret_arn: a.password_secret_arn.clone(),
        plaintext_password: (a.password_secret_arn.is_none() && a.allow_plaintext_password)
            .then(|| c.credentials.password.clone()),
    };
    let backend = AwsBatchBackend::new(cfg, &a.region).await?;
    // Early, so that a permission or configuration problem shows at start-up; a failure here
    // is retried at the first submission.
    if let Err(e) = backend.ensure_job_definition().await {
        tracing::warn!("job definition {}: {e}", a.job_definition_name);
    }
    let config = policy_config(g, a.shape.to_shape())?;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let prefix = g
        .worker_work_dir_prefix
        .clone()
        .unwrap_or_else(|| "/tmp".into());
    let mut manager = c.manager(
        backend,
        config,
        None,
        // Python's per-worker work dir on AWS.
        Box::new(move |id| format!("{prefix}/cl_worker_{id}_work_dir")),
    );
    // Spot reclaims and TerminateJob send SIGTERM: the worker hands its runs back first.
    manager.extra_worker_args = vec!["--pass-down-termination".into()];
    if std::env::var("CODALAB_SHARED_FILE_SYSTEM").is_ok_and(|v| v == "true") {
        manager
            .extra_worker_args
            .push("--shared-file-system".into());
    }
    drive(&c, manager).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn password_file_is_private() {
        let d = tempfile::tempdir().unwrap();
        let c = Credentials {
            username: "u".into(),
            password: "p".into(),
        };
        let p = write_password_file(d.path(), &c).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read_to_string(p).unwrap(), "u\np\n");
    }
}
