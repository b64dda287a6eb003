//! `cl-worker-manager`: watches a CodaLab server for staged bundles and launches `cl-worker`s
//! on a backend, as the pure policy of [`manager::policy`] decides.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use backends::{Backend, JobSpec, JobState, LocalBackend};
use clap::Parser;
use manager::cli::{Backend as BackendArgs, Cli};
use manager::policy::{
    self, Action, Config, Job, Observation, PolicyState, Resources, Shape, StagedBundle,
};
use protocol::{Bundle, ClientConfig, Credentials, RestClient};
use serde_json::Value;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = if cli.global.verbose { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "warn,cl_worker_manager={level},protocol={level}"
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cl-worker-manager: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn meta_u32(b: &Bundle, key: &str, default: u32) -> u32 {
    match b.metadata(key) {
        Some(Value::Number(n)) => n.as_u64().map_or(default, |n| n as u32),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(default),
        _ => default,
    }
}

/// A staged bundle's request, with the server's defaults (1 CPU, 0 GPUs, 2 GiB).
fn staged_bundle(b: &Bundle) -> StagedBundle {
    let memory = b
        .metadata("request_memory")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .and_then(|s| protocol::parse_size(s).ok())
        .unwrap_or(2 << 30);
    let mut sb = StagedBundle::new(
        b.uuid.clone(),
        meta_u32(b, "request_cpus", 1).max(1),
        meta_u32(b, "request_gpus", 0),
        memory,
    );
    if let Some(q) = b
        .metadata("request_queue")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
    {
        sb = sb.with_queue(q);
    }
    sb
}

/// Free resources of this manager's workers that have checked in (`/rest/workers/info`), by
/// worker id. A worker with runs is credited with what its runs did not request (memory in
/// proportion to free CPUs: the server does not report memory in use).
fn free_by_worker(info: &Value) -> std::collections::HashMap<String, Resources> {
    let mut out = std::collections::HashMap::new();
    for w in info
        .get("data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let id = w
            .get("worker_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let n = |k: &str| w.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (cpus, gpus, mem) = (n("cpus"), n("gpus"), n("memory_bytes"));
        let free_cpus = cpus.saturating_sub(n("cpus_in_use"));
        let free_gpus = gpus.saturating_sub(n("gpus_in_use"));
        let free_mem = mem.checked_div(cpus).unwrap_or(0) * free_cpus;
        out.insert(
            id,
            Resources::new(free_cpus as u32, free_gpus as u32, free_mem),
        );
    }
    out
}

fn write_password_file(dir: &Path, c: &Credentials) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(".worker-password");
    let tmp = dir.join(".worker-password.tmp");
    std::fs::write(&tmp, format!("{}\n{}\n", c.username, c.password))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn new_worker_id() -> String {
    let mut bytes = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let g = &cli.global;
    if g.max_workers < g.min_workers {
        anyhow::bail!(
            "--max-workers ({}) is below --min-workers ({})",
            g.max_workers,
            g.min_workers
        );
    }
    let credentials = Credentials::resolve(None)?;
    let client = RestClient::new(ClientConfig::new(g.server.clone()), credentials.clone())?;
    client.login().await?;
    let BackendArgs::Local(local) = &cli.backend;
    let prefix = PathBuf::from(
        g.worker_work_dir_prefix
            .clone()
            .unwrap_or_else(|| "cl-worker-manager-local".into()),
    );
    let backend = LocalBackend::new(&prefix)?;
    let shape = Shape::from_flags(local.cpus, local.gpus, local.memory_mb);
    let mut config = Config::with_default_shape(shape.clone());
    config.min_workers = g.min_workers as usize;
    config.max_workers = g.max_workers as usize;
    config.min_seconds_between_workers = g.min_seconds_between_workers as f64;
    config.worker_tag = g.worker_tag.clone();
    config.worker_tag_exclusive = g.worker_tag_exclusive;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let mut state = PolicyState::new(&config);
    let password_file = write_password_file(&prefix, &credentials)?;
    let keywords = g.staged_keywords(&credentials.username);
    tracing::info!(
        "managing workers of shape {} ({} CPUs, {} GPUs, {} MiB) under {}; staged query {:?}",
        shape.name,
        shape.cpus,
        shape.gpus,
        local.memory_mb,
        prefix.display(),
        keywords
    );
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let tick = now();
        let staged = match client.search_bundles(&keywords, 100).await {
            Ok(list) => list.iter().map(staged_bundle).collect(),
            Err(e) => {
                tracing::warn!("cannot read staged bundles, skipping this tick: {e}");
                Vec::new()
            }
        };
        let free = match client.workers_info().await {
            Ok(v) => free_by_worker(&v),
            Err(e) => {
                // Unknown free capacity: launched workers count as pending, none is doubled.
                tracing::warn!("cannot read /rest/workers/info: {e}");
                Default::default()
            }
        };
        let jobs = backend.list().await.map_err(|e| e.to_string()).map(|list| {
            list.into_iter()
                .filter_map(|j| {
                    let server_id = format!("host-{}", j.worker_id);
                    match j.state {
                        JobState::Finished { .. } => None,
                        JobState::Pending => Some(Job::pending(j.id, j.shape_name)),
                        // A worker that has not checked in yet is as good as pending: it will
                        // take bundles but has not said so.
                        JobState::Running => Some(match free.get(&server_id) {
                            Some(f) => Job::active(j.id, j.shape_name).with_free(*f),
                            None => Job::pending(j.id, j.shape_name),
                        }),
                    }
                })
                .collect::<Vec<_>>()
        });
        let obs = Observation {
            staged,
            jobs,
            now: tick,
        };
        let plan = policy::plan(&config, &mut state, &obs);
        for r in &plan.reasons {
            tracing::info!("{r}");
        }
        if g.once {
            println!("{}", serde_json::to_string_pretty(&plan)?);
            return Ok(());
        }
        for action in &plan.actions {
            match action {
                Action::Launch { shape, count } => {
                    let sh = config
                        .shapes
                        .iter()
                        .find(|s| &s.name == shape)
                        .cloned()
                        .unwrap_or_else(|| shape_default(&config));
                    for _ in 0..*count {
                        let id = new_worker_id();
                        let work_dir = backend.work_dir(&id).join("work");
                        let spec = JobSpec {
                            worker_id: id.clone(),
                            shape_name: sh.name.clone(),
                            cpus: sh.cpus,
                            gpus: sh.gpus,
                            memory_bytes: sh.memory_bytes,
                            command: g.worker_command(&id, &work_dir.display().to_string()),
                            env: Vec::new(),
                            password_file: Some(password_file.clone()),
                        };
                        let ok = match backend.submit(&spec).await {
                            Ok(job) => {
                                tracing::info!(
                                    "launched worker host-{id} as job {job} (shape {shape})"
                                );
                                true
                            }
                            Err(e) => {
                                tracing::warn!("cannot launch a worker of shape {shape}: {e}");
                                false
                            }
                        };
                        policy::record_submit(&mut state, shape, ok, now());
                    }
                }
                Action::Cancel { job_id } => match backend.cancel(job_id).await {
                    Ok(()) => tracing::info!("cancelled job {job_id}: no staged bundle needs it"),
                    Err(e) => tracing::warn!("cannot cancel job {job_id}: {e}"),
                },
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(g.sleep_time.max(1))) => {}
            _ = sigterm.recv() => {
                tracing::info!("received SIGTERM; exiting (workers finish their runs and exit when idle)");
                return Ok(());
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

fn shape_default(config: &Config) -> Shape {
    config.shapes[0].clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn staged_bundle_requests_with_server_defaults() {
        let b = Bundle {
            uuid: "0x1".into(),
            attributes: json!({"metadata": {"request_cpus": 2, "request_gpus": 1,
                "request_memory": "4g", "request_queue": "gpu"}})
            .as_object()
            .unwrap()
            .clone(),
        };
        let s = staged_bundle(&b);
        assert_eq!(
            (s.request_cpus, s.request_gpus, s.request_memory_bytes),
            (2, 1, 4 << 30)
        );
        assert_eq!(s.request_queue.as_deref(), Some("gpu"));
        let b = Bundle {
            uuid: "0x2".into(),
            attributes: json!({"metadata": {"request_memory": "", "request_queue": ""}})
                .as_object()
                .unwrap()
                .clone(),
        };
        let s = staged_bundle(&b);
        assert_eq!(
            (s.request_cpus, s.request_gpus, s.request_memory_bytes),
            (1, 0, 2 << 30)
        );
        assert_eq!(s.request_queue, None);
    }

    #[test]
    fn free_resources_of_checked_in_workers() {
        let info = json!({"data": [
            {"worker_id": "host-a", "cpus": 4, "gpus": 1, "memory_bytes": 4096,
             "cpus_in_use": 1, "gpus_in_use": 1, "run_uuids": ["0x1"]},
            {"worker_id": "host-b", "cpus": 2, "gpus": 0, "memory_bytes": 2048,
             "cpus_in_use": 0, "gpus_in_use": 0, "run_uuids": []}
        ]});
        let f = free_by_worker(&info);
        assert_eq!(f["host-a"], Resources::new(3, 0, 3072));
        assert_eq!(f["host-b"], Resources::new(2, 0, 2048));
    }

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
