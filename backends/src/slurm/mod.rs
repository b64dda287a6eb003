//! The `slurm-batch` backend: one `sbatch` job per worker, `cl-worker` run through `srun` on the
//! compute node.
//!
//! - **Identification.** Job names are the worker ids `<user>-<job-name>-<hex>` (Python's form);
//!   the comment `clwm:<shape>` carries the shape. A restarted manager finds its jobs by the name
//!   prefix, so it adopts them.
//! - **One status call per tick**: `squeue --states=all` for the user, filtered here. A job that
//!   this manager knew and that vanished from `squeue` (purged after `MinJobAge`) is resolved once
//!   with one `sacct` call for all of them, then forgotten. Every end state frees the slot.
//! - **Scripts** are written to `<slurm-work-dir>/<worker_id>/<worker_id>.slurm`. `#SBATCH`
//!   values are checked (no whitespace or quotes: sbatch does not parse shell quoting), and the
//!   worker's argv is shell-quoted. Credentials reach the job only as a mode-600 password file;
//!   `sbatch` runs without `CODALAB_USERNAME`/`CODALAB_PASSWORD` in its environment.
//! - **Walltime**: `--signal=B:TERM@<secs>` makes the batch shell forward SIGTERM to the worker
//!   (`--pass-down-termination`), which hands its runs back to the server before Slurm kills it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::Mutex;

use crate::{Backend, BackendError, JobSpec, JobState, JobStatus, Ledger, SECRET_ENV};

mod args;
mod script;
pub use args::SlurmArgs;
use script::check_sbatch_value;
pub use script::render_script;

/// Longest a Slurm command may take before it counts as failed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Prefix of the job comment that names the worker shape.
pub const COMMENT_PREFIX: &str = "clwm:";

/// Settings of the backend (the `slurm-batch` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmConfig {
    pub partition: String,
    /// Middle part of the job names (`--job-name`).
    pub job_name: String,
    pub user: String,
    pub nodelist: Option<String>,
    pub exclude: Option<String>,
    pub gpu_type: Option<String>,
    pub constraint: Option<String>,
    /// `--time` of every job.
    pub time: String,
    pub account: Option<String>,
    /// Where scripts and job output go (`--slurm-work-dir`).
    pub work_dir: PathBuf,
    /// Seconds before the time limit at which the worker gets SIGTERM (0: no `--signal`).
    pub signal_secs: u32,
    /// Print scripts instead of submitting them.
    pub dry_run: bool,
    /// What runs the bundles on the compute nodes (`--container-engine`).
    pub engine: ContainerEngine,
}

/// The container engine of the compute nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ContainerEngine {
    /// The node's Docker daemon (Python's assumption).
    #[default]
    Docker,
    /// A Podman service of the job's own, on a private socket in the job's directory.
    Podman(PodmanSettings),
}

/// How a job runs its Podman service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodmanSettings {
    /// Image storage on the node, shared by the jobs of a user (`--podman-storage-dir`); a
    /// shell word, expanded on the node (default `${TMPDIR:-/tmp}/cl-worker-podman-$(id -u)`).
    pub storage_dir: String,
    /// `overlay` (default) or `vfs` (`--podman-storage-driver`).
    pub storage_driver: String,
    /// A `containers.conf` for the service (`--podman-containers-conf`).
    pub containers_conf: Option<PathBuf>,
}

impl SlurmConfig {
    /// Prefix of this manager's job names and worker ids: `<user>-<job-name>-`.
    pub fn job_prefix(&self) -> String {
        format!("{}-{}-", self.user, self.job_name)
    }

    /// Refuses values that sbatch would misread in an `#SBATCH` line.
    pub fn validate(&self) -> Result<(), BackendError> {
        let mut fields: Vec<(&str, &str)> = vec![
            ("--partition", &self.partition),
            ("--job-name", &self.job_name),
            ("--user", &self.user),
            ("--time", &self.time),
        ];
        for (flag, v) in [
            ("--nodelist", &self.nodelist),
            ("--exclude", &self.exclude),
            ("--gpu-type", &self.gpu_type),
            ("--constraint", &self.constraint),
            ("--account", &self.account),
        ] {
            if let Some(v) = v {
                fields.push((flag, v));
            }
        }
        let work_dir = self.work_dir.to_string_lossy();
        fields.push(("--slurm-work-dir", &work_dir));
        for (flag, v) in fields {
            check_sbatch_value(flag, v)?;
        }
        if self.partition.is_empty() || self.user.is_empty() || self.job_name.is_empty() {
            return Err(BackendError::permanent(
                "--partition, --user and --job-name must not be empty",
            ));
        }
        Ok(())
    }
}

/// The job id printed by `sbatch --parsable` (`<id>` or `<id>;<cluster>`).
pub fn parse_sbatch(stdout: &str) -> Result<String, BackendError> {
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    let id = line
        .and_then(|l| l.split(';').next())
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit() || c == '_'));
    id.map(str::to_string).ok_or_else(|| {
        BackendError::retryable(format!(
            "cannot read a job id from sbatch's output {stdout:?}"
        ))
    })
}

/// `squeue` format: id, name, state, comment, reason.
pub const SQUEUE_FORMAT: &str = "%i|%j|%T|%k|%r";

/// One job line of `squeue --format=SQUEUE_FORMAT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    pub id: String,
    pub name: String,
    pub state: String,
    pub comment: String,
    pub reason: String,
}

/// Parses `squeue --noheader --format=SQUEUE_FORMAT`; malformed lines are skipped with a warning.
pub fn parse_squeue(stdout: &str) -> Vec<QueueEntry> {
    let mut out = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.splitn(5, '|').collect();
        if f.len() < 3 || f[0].trim().is_empty() {
            tracing::warn!("skipping a squeue line I cannot read: {line:?}");
            continue;
        }
        out.push(QueueEntry {
            id: f[0].trim().to_string(),
            name: f[1].trim().to_string(),
            state: f[2].trim().to_string(),
            comment: f.get(3).map_or("", |s| s.trim()).to_string(),
            reason: f.get(4).map_or("", |s| s.trim()).to_string(),
        });
    }
    out
}

/// A Slurm job state as the manager sees it. States are matched by their leading word
/// (`CANCELLED by 0` is CANCELLED).
pub fn classify_state(state: &str) -> JobState {
    let word = state.split_whitespace().next().unwrap_or("");
    match word {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"
        | "RESV_DEL_HOLD" | "SUSPENDED" | "STOPPED" | "RESIZING" | "SIGNALING" | "SPECIAL_EXIT"
        | "STAGE_OUT" => JobState::Pending,
        "RUNNING" => JobState::Running,
        // The worker is gone; what is left is Slurm's clean-up.
        "COMPLETING" | "COMPLETED" | "CANCELLED" | "TIMEOUT" | "PREEMPTED" | "DEADLINE" => {
            JobState::Finished { success: true }
        }
        // FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY and anything unknown: a failure.
        _ => JobState::Finished { success: false },
    }
}

/// `sacct -P -n -X --format=JobID,State` lines → state by job id.
pub fn parse_sacct(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| {
            let (id, state) = l.split_once('|')?;
            Some((id.trim().to_string(), state.trim().to_string()))
        })
        .collect()
}

/// What the backend remembers between ticks.
#[derive(Debug, Default)]
struct Tracking {
    /// Known jobs and ended jobs already reported.
    ledger: Ledger,
    /// `--dry-run` "submissions", listed as pending so that they are not made again.
    dry: Vec<JobStatus>,
}

/// Runs workers as Slurm batch jobs through the Slurm command-line tools.
pub struct SlurmBackend {
    cfg: SlurmConfig,
    tracking: Mutex<Tracking>,
}

impl SlurmBackend {
    pub fn new(cfg: SlurmConfig) -> Result<Self, BackendError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            tracking: Mutex::default(),
        })
    }

    /// Runs a Slurm command; non-zero exit is an error carrying its stderr.
    async fn slurm(&self, program: &str, args: &[&str]) -> Result<String, BackendError> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for name in SECRET_ENV {
            cmd.env_remove(name);
        }
        let out = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
            .await
            .map_err(|_| {
                BackendError::retryable(format!(
                    "{program} did not answer within {}s",
                    COMMAND_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| {
                let retry = e.kind() != std::io::ErrorKind::NotFound;
                let msg = format!("cannot run {program}");
                if retry {
                    BackendError::retryable(msg).with_source(e)
                } else {
                    BackendError::permanent(msg).with_source(e)
                }
            })?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(BackendError::retryable(format!(
                "{program} {}: {} ({})",
                args.join(" "),
                err.trim(),
                out.status
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The largest CPU count and memory (MiB) of one node of the partition (`sinfo`).
    pub async fn largest_node(&self) -> Result<(u32, u64, u32), BackendError> {
        let out = self
            .slurm(
                "sinfo",
                &[
                    "--noheader",
                    "--partition",
                    &self.cfg.partition,
                    "--format=%c|%m|%G",
                ],
            )
            .await?;
        let mut best = (0u32, 0u64, 0u32);
        for line in out.lines() {
            let f: Vec<&str> = line.split('|').collect();
            if f.len() < 3 {
                continue;
            }
            let cpus = f[0].trim().trim_end_matches('+').parse().unwrap_or(0);
            let mem = f[1].trim().trim_end_matches('+').parse().unwrap_or(0);
            let gpus = gres_gpus(f[2]);
            best = (best.0.max(cpus), best.1.max(mem), best.2.max(gpus));
        }
        if best.0 == 0 {
            return Err(BackendError::permanent(format!(
                "partition {:?} has no nodes (sinfo)",
                self.cfg.partition
            )));
        }
        Ok(best)
    }

    fn write_script(&self, spec: &JobSpec, script: &str) -> Result<PathBuf, BackendError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.cfg.work_dir.join(&spec.worker_id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io_err(&dir, e))?;
        let path = dir.join(format!("{}.slurm", spec.worker_id));
        std::fs::write(&path, script).map_err(|e| io_err(&path, e))?;
        Ok(path)
    }
}

/// GPUs in a `sinfo %G` gres string such as `gpu:2`, `gpu:a100:4(S:0-1)`, `(null)`.
fn gres_gpus(gres: &str) -> u32 {
    gres.split(',')
        .filter(|g| g.trim_start().starts_with("gpu"))
        .filter_map(|g| {
            let g = g.split('(').next().unwrap_or(g);
            g.rsplit(':').next()?.trim().parse::<u32>().ok()
        })
        .sum()
}

fn io_err(path: &Path, e: std::io::Error) -> BackendError {
    BackendError::retryable(format!("{}: {e}", path.display())).with_source(e)
}

impl Backend for SlurmBackend {
    fn name(&self) -> &str {
        "slurm-batch"
    }

    async fn submit(&self, spec: &JobSpec) -> Result<String, BackendError> {
        let script = render_script(&self.cfg, spec)?;
        if self.cfg.dry_run {
            println!(
                "# --dry-run: the script of worker {}\n{script}",
                spec.worker_id
            );
            let id = format!("dry-run:{}", spec.worker_id);
            self.tracking.lock().await.dry.push(JobStatus {
                id: id.clone(),
                worker_id: spec.worker_id.clone(),
                shape_name: spec.shape_name.clone(),
                state: JobState::Pending,
                detail: None,
            });
            return Ok(id);
        }
        let path = self.write_script(spec, &script)?;
        let path_s = path.to_string_lossy();
        let out = self.slurm("sbatch", &["--parsable", &path_s]).await?;
        let id = parse_sbatch(&out)?;
        self.tracking
            .lock()
            .await
            .ledger
            .submitted(&id, &spec.worker_id, &spec.shape_name);
        Ok(id)
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        let format = format!("--format={SQUEUE_FORMAT}");
        let listed = self
            .slurm(
                "squeue",
                &[
                    "--noheader",
                    "--states=all",
                    "--user",
                    &self.cfg.user,
                    &format,
                ],
            )
            .await;
        let out = match listed {
            Ok(out) => out,
            // A dry run may be made away from the cluster: it has no jobs anyway.
            Err(e) if self.cfg.dry_run => {
                tracing::warn!("--dry-run: {e}; assuming no jobs");
                String::new()
            }
            Err(e) => return Err(e),
        };
        let prefix = self.cfg.job_prefix();
        let mut ended_as = HashMap::new();
        let listing: Vec<JobStatus> = parse_squeue(&out)
            .into_iter()
            .filter(|e| e.name.starts_with(&prefix))
            .map(|e| {
                let state = classify_state(&e.state);
                if state == JobState::Pending
                    && matches!(
                        e.reason.as_str(),
                        "PartitionConfig" | "BadConstraints" | "ReqNodeNotAvail" | "PartitionNodeLimit"
                    )
                {
                    tracing::warn!(
                        "Slurm job {} cannot start as submitted ({}): check the worker shape against partition {}",
                        e.id,
                        e.reason,
                        self.cfg.partition
                    );
                }
                // An ended job's Slurm state is its detail (`PREEMPTED`, `CANCELLED by 0`).
                let detail = matches!(state, JobState::Finished { .. }).then(|| e.state.clone());
                if detail.is_some() {
                    ended_as.insert(e.id.clone(), e.state);
                }
                JobStatus {
                    id: e.id,
                    worker_id: e.name,
                    shape_name: e
                        .comment
                        .strip_prefix(COMMENT_PREFIX)
                        .map(str::to_string)
                        .unwrap_or_default(),
                    state,
                    detail,
                }
            })
            .collect();
        let mut tracking = self.tracking.lock().await;
        let Tracking { ledger, dry } = &mut *tracking;
        let mut statuses = dry.clone();
        // Ended jobs are reported once, although squeue shows them until MinJobAge.
        let observed = ledger.observe(listing);
        // Jobs that vanished from squeue: one sacct call for all.
        let vanished = observed.vanished_ids();
        let states = if vanished.is_empty() {
            HashMap::new()
        } else {
            let ids = vanished.join(",");
            match self
                .slurm(
                    "sacct",
                    &[
                        "--parsable2",
                        "--noheader",
                        "--allocations",
                        "--format=JobID,State",
                        "--jobs",
                        &ids,
                    ],
                )
                .await
            {
                Ok(out) => parse_sacct(&out),
                Err(e) => {
                    tracing::info!("sacct cannot resolve vanished jobs {ids}: {e}");
                    HashMap::new()
                }
            }
        };
        let reported = observed.resolve(|id| {
            let state = states.get(id);
            tracing::info!(
                "job {id} left squeue; final state {}",
                state.map_or("unknown", String::as_str)
            );
            state.map(|s| classify_state(s))
        });
        for job in &reported {
            if let Some(state) = ended_as.get(&job.id) {
                tracing::debug!("job {} ended {state}", job.id);
            }
        }
        statuses.extend(reported);
        Ok(statuses)
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        if id.starts_with("dry-run:") {
            println!("# --dry-run: scancel {id}");
            self.tracking.lock().await.dry.retain(|j| j.id != id);
            return Ok(());
        }
        match self.slurm("scancel", &[id]).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("Invalid job id") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbatch_output_parsing() {
        assert_eq!(parse_sbatch("42\n").unwrap(), "42");
        assert_eq!(parse_sbatch("42;cluster\n").unwrap(), "42");
        assert!(parse_sbatch("").is_err());
        assert!(parse_sbatch("Submitted batch job 42").is_err());
    }

    #[test]
    fn squeue_lines_and_states() {
        let out = "17|alice-w-1|RUNNING|clwm:gpu|None\n18|alice-w-2|PENDING|clwm:default|Priority\ngarbage\n\n19|x|NODE_FAIL||NodeDown\n";
        let e = parse_squeue(out);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].comment, "clwm:gpu");
        assert_eq!(e[1].reason, "Priority");
        assert_eq!(classify_state("RUNNING"), JobState::Running);
        assert_eq!(classify_state("PENDING"), JobState::Pending);
        assert_eq!(classify_state("REQUEUED"), JobState::Pending);
        for s in [
            "COMPLETED",
            "CANCELLED by 0",
            "TIMEOUT",
            "PREEMPTED",
            "COMPLETING",
        ] {
            assert_eq!(
                classify_state(s),
                JobState::Finished { success: true },
                "{s}"
            );
        }
        for s in ["FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "WEIRD"] {
            assert_eq!(
                classify_state(s),
                JobState::Finished { success: false },
                "{s}"
            );
        }
        let s = parse_sacct("5|COMPLETED\n6|CANCELLED by 0\n");
        assert_eq!(s["6"], "CANCELLED by 0");
        assert_eq!(gres_gpus("gpu:2"), 2);
        assert_eq!(gres_gpus("gpu:a100:4(S:0-1)"), 4);
        assert_eq!(gres_gpus("(null)"), 0);
    }
}
