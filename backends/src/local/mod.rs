//! The `local` backend: workers are child processes of this machine.
//!
//! Every job gets its own work directory `<prefix>/<worker_id>` (its output goes to
//! `worker.log` there) and its own process group. Job records are kept in
//! `<prefix>/local-jobs.json` (replaced atomically) so that a restarted manager adopts the
//! workers that are still running instead of launching duplicates. A record holds the process
//! start time (field 22 of `/proc/<pid>/stat`), which guards against pid reuse.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Resources;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::{Backend, BackendError, JobSpec, JobState, JobStatus, Ledger, SECRET_ENV};

mod args;
pub use args::LocalArgs;

/// Name of the job-record file under the prefix.
pub const JOBS_FILE: &str = "local-jobs.json";
/// Name of the worker's log file in its work directory.
pub const LOG_FILE: &str = "worker.log";
/// Time between SIGTERM and SIGKILL when a job is cancelled.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// What this machine offers to local workers: its CPUs (available parallelism), total memory
/// (the kernel's `sysinfo`, `MemTotal`) and GPUs ([`gpu_count`]).
pub fn capacity() -> Result<Resources, BackendError> {
    let cpus = std::thread::available_parallelism()
        .map_err(|e| BackendError::permanent("cannot count the CPUs").with_source(e))?;
    let memory_bytes = nix::sys::sysinfo::sysinfo()
        .map_err(|e| {
            BackendError::permanent("cannot read the memory size (sysinfo)").with_source(e)
        })?
        .ram_total();
    Ok(Resources::new(
        u32::try_from(cpus.get()).unwrap_or(u32::MAX),
        gpu_count(),
        memory_bytes,
    ))
}

/// GPUs that `nvidia-smi -L` lists (0 without the tool or a driver).
pub fn gpu_count() -> u32 {
    std::process::Command::new("nvidia-smi")
        .arg("-L")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or(0, |o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU "))
                .count() as u32
        })
}

/// State and start time (clock ticks since boot) of a process, from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state), so field 22 (starttime) is `fields[19]`.
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// The start time of a process (field 22 of `/proc/<pid>/stat`), if it exists.
pub fn process_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, start)| start)
}

/// Whether `pid` is a live (non-zombie) process that started at `start_time`.
fn process_matches(pid: u32, start_time: u64) -> bool {
    matches!(proc_stat(pid), Some((state, start))
        if start == start_time && state != 'Z' && state != 'X')
}

/// A persisted job record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub worker_id: String,
    pub shape_name: String,
    pub pid: u32,
    /// Seconds since the Unix epoch when the job was submitted.
    pub started_at_unix: u64,
    /// Field 22 of `/proc/<pid>/stat` when the job was submitted.
    pub proc_start_time: u64,
    /// CPU ids given to the worker as `--cpuset`.
    #[serde(default)]
    pub cpuset: Vec<u32>,
    /// GPU indices given to the worker as `--gpuset`.
    #[serde(default)]
    pub gpuset: Vec<u32>,
}

/// `n` ids out of `ids`, the least used by `taken` first (ties: lowest id); with more jobs than
/// ids (deliberate overcommit) the load is spread evenly.
fn pick_least_used(ids: &[u32], taken: &[&[u32]], n: u32) -> Vec<u32> {
    let mut load: Vec<(usize, u32)> = ids
        .iter()
        .map(|&id| (taken.iter().filter(|t| t.contains(&id)).count(), id))
        .collect();
    load.sort_unstable();
    let mut picked: Vec<u32> = load
        .into_iter()
        .take(n as usize)
        .map(|(_, id)| id)
        .collect();
    picked.sort_unstable();
    picked
}

fn id_list(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The CPU ids this process may run on.
fn machine_cpu_ids() -> Vec<u32> {
    match nix::sched::sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .filter_map(|i| u32::try_from(i).ok())
            .collect(),
        Err(_) => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..u32::try_from(n).unwrap_or(u32::MAX)).collect()
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct JobsFile {
    jobs: Vec<JobRecord>,
}

/// Children started by this instance, kept so that they can be reaped, and the exit statuses
/// of reaped children whose jobs have not been reported yet.
#[derive(Default)]
struct Children {
    by_id: HashMap<String, Child>,
    exited: HashMap<String, bool>,
}

impl Children {
    /// Whether job `record` still runs; reaps it if it is our child and has exited.
    /// Returns `Some(success)` once it has finished.
    fn finished(&mut self, record: &JobRecord) -> Option<bool> {
        if let Some(&success) = self.exited.get(&record.id) {
            return Some(success);
        }
        if let Some(child) = self.by_id.get_mut(&record.id) {
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.by_id.remove(&record.id);
                    self.exited.insert(record.id.clone(), status.success());
                    return Some(status.success());
                }
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!(id = %record.id, error = %e, "cannot poll child; checking /proc");
                    self.by_id.remove(&record.id);
                }
            }
        }
        // Not our child (adopted from an earlier manager): its exit status is unknown.
        if process_matches(record.pid, record.proc_start_time) {
            None
        } else {
            // After a self-restart (exec) the workers are still our children: reap a zombie.
            // For anyone else's process this fails with ECHILD, harmlessly.
            if let Ok(pid) = i32::try_from(record.pid) {
                let _ = nix::sys::wait::waitpid(
                    Pid::from_raw(pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
            }
            Some(false)
        }
    }

    /// Forgets the statuses of jobs no longer recorded and reaps exited children whose
    /// records are gone (e.g. reported by another instance).
    fn forget_unrecorded(&mut self, records: &[JobRecord]) {
        let recorded = |id: &String| records.iter().any(|r| &r.id == id);
        self.exited.retain(|id, _| recorded(id));
        self.by_id
            .retain(|id, child| recorded(id) || !matches!(child.try_wait(), Ok(Some(_)) | Err(_)));
    }
}

/// Runs workers as child processes of this machine.
pub struct LocalBackend {
    prefix: PathBuf,
    grace: Duration,
    children: Arc<Mutex<Children>>,
    ledger: Mutex<Ledger>,
    cpu_ids: Vec<u32>,
    gpus: u32,
}

impl LocalBackend {
    /// A backend keeping its work directories and job records under `prefix` (created if
    /// missing). Jobs recorded there by an earlier manager are adopted.
    pub fn new(prefix: impl Into<PathBuf>) -> Result<Self, BackendError> {
        let prefix = prefix.into();
        fs::create_dir_all(&prefix).map_err(|e| {
            BackendError::permanent(format!("cannot create {}", prefix.display())).with_source(e)
        })?;
        Ok(Self {
            prefix,
            grace: DEFAULT_GRACE,
            children: Arc::default(),
            ledger: Mutex::default(),
            cpu_ids: machine_cpu_ids(),
            gpus: 0,
        })
    }

    /// GPUs of this machine (indices `0..n` for the workers' `--gpuset`; default none).
    pub fn with_gpus(mut self, n: u32) -> Self {
        self.gpus = n;
        self
    }

    /// Sets the time between SIGTERM and SIGKILL on cancel.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The work directory of a worker.
    pub fn work_dir(&self, worker_id: &str) -> PathBuf {
        self.prefix.join(worker_id)
    }

    fn jobs_path(&self) -> PathBuf {
        self.prefix.join(JOBS_FILE)
    }

    fn load(&self) -> Result<Vec<JobRecord>, BackendError> {
        let path = self.jobs_path();
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<JobsFile>(&bytes)
                .map(|f| f.jobs)
                .map_err(|e| {
                    BackendError::permanent(format!("corrupt job records in {}", path.display()))
                        .with_source(e)
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io_error(&path, e)),
        }
    }

    /// Writes the records to a temporary file and renames it over the record file.
    fn save(&self, jobs: &[JobRecord]) -> Result<(), BackendError> {
        let path = self.jobs_path();
        let bytes = serde_json::to_vec_pretty(&JobsFile {
            jobs: jobs.to_vec(),
        })
        .map_err(|e| BackendError::permanent("cannot encode job records").with_source(e))?;
        common::write_atomic(&path, &bytes, None).map_err(|e| io_error(&path, e))
    }

    fn validate(spec: &JobSpec) -> Result<(), BackendError> {
        let id = spec.worker_id.as_str();
        if id.is_empty() || id == "." || id == ".." || id.contains('/') || id.starts_with('.') {
            return Err(BackendError::permanent(format!("invalid worker id {id:?}")));
        }
        if spec.command.is_empty() {
            return Err(BackendError::permanent("empty worker command"));
        }
        let password_file = spec
            .command
            .windows(2)
            .find(|w| w[0] == "--password-file")
            .map(|w| Path::new(&w[1]));
        if let Some(path) = password_file {
            let meta = fs::metadata(path).map_err(|e| {
                BackendError::permanent(format!("password file {}", path.display())).with_source(e)
            })?;
            if !meta.is_file() || meta.mode() & 0o077 != 0 {
                return Err(BackendError::permanent(format!(
                    "password file {} must be a regular file of mode 600",
                    path.display()
                )));
            }
        }
        Ok(())
    }
}

fn io_error(path: &Path, e: std::io::Error) -> BackendError {
    BackendError::retryable(format!("{}: {e}", path.display())).with_source(e)
}

/// Sends `signal` to the process group led by `pid`; a vanished group is not an error.
fn signal_group(pid: u32, signal: Signal) -> Result<(), BackendError> {
    let pgid =
        i32::try_from(pid).map_err(|_| BackendError::permanent(format!("invalid pid {pid}")))?;
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(BackendError::retryable(format!(
            "cannot send {signal} to process group {pgid}"
        ))
        .with_source(e)),
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    async fn submit(&self, spec: &JobSpec) -> Result<String, BackendError> {
        Self::validate(spec)?;
        let mut children = self.children.lock().await;
        let mut jobs = self.load()?;
        if let Some(existing) = jobs.iter().find(|r| r.worker_id == spec.worker_id) {
            if children.finished(existing).is_none() {
                return Err(BackendError::permanent(format!(
                    "worker {} already runs as job {}",
                    spec.worker_id, existing.id
                )));
            }
        }
        let work_dir = self.work_dir(&spec.worker_id);
        fs::create_dir_all(&work_dir).map_err(|e| io_error(&work_dir, e))?;
        let log_path = work_dir.join(LOG_FILE);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| io_error(&log_path, e))?;
        let log_err = log.try_clone().map_err(|e| io_error(&log_path, e))?;

        // Each worker gets its own cores, GPUs and memory, so that the server sees the shape.
        let live: Vec<&JobRecord> = jobs
            .iter()
            .filter(|r| children.finished(r).is_none())
            .collect();
        let cpus_taken: Vec<&[u32]> = live.iter().map(|r| r.cpuset.as_slice()).collect();
        let cpuset = pick_least_used(&self.cpu_ids, &cpus_taken, spec.resources.cpus.max(1));
        let gpus_taken: Vec<&[u32]> = live.iter().map(|r| r.gpuset.as_slice()).collect();
        // GPUs are never shared between workers.
        let free_gpus: Vec<u32> = (0..self.gpus)
            .filter(|id| !gpus_taken.iter().any(|t| t.contains(id)))
            .collect();
        let gpuset = pick_least_used(&free_gpus, &[], spec.resources.gpus);
        if gpuset.len() < spec.resources.gpus as usize {
            return Err(BackendError::permanent(format!(
                "a worker of {} GPUs does not fit: {} of this machine's {} GPUs are free",
                spec.resources.gpus,
                free_gpus.len(),
                self.gpus
            )));
        }
        let mut command = Command::new(&spec.command[0]);
        command.args(&spec.command[1..]);
        command.arg("--cpuset").arg(id_list(&cpuset));
        command.arg("--gpuset").arg(if gpuset.is_empty() {
            "NONE".to_string()
        } else {
            id_list(&gpuset)
        });
        if spec.resources.memory_bytes > 0 {
            command
                .arg("--max-memory")
                .arg(spec.resources.memory_bytes.to_string());
        }
        for name in SECRET_ENV {
            command.env_remove(name);
        }
        command
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&work_dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .kill_on_drop(false);
        let mut child = command.spawn().map_err(|e| {
            let message = format!("cannot start {}", spec.command[0]);
            match e.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    BackendError::permanent(message).with_source(e)
                }
                _ => BackendError::retryable(message).with_source(e),
            }
        })?;
        let pid = child
            .id()
            .ok_or_else(|| BackendError::retryable("started worker has no pid"))?;
        // The child cannot have been reaped yet, so /proc/<pid>/stat exists (maybe as a zombie).
        let Some(proc_start_time) = process_start_time(pid) else {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(BackendError::retryable(format!(
                "cannot read /proc/{pid}/stat"
            )));
        };
        let id = format!("{}-{pid}", spec.worker_id);
        let started_at_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        jobs.push(JobRecord {
            id: id.clone(),
            worker_id: spec.worker_id.clone(),
            shape_name: spec.shape_name.clone(),
            pid,
            started_at_unix,
            proc_start_time,
            cpuset,
            gpuset,
        });
        if let Err(e) = self.save(&jobs) {
            // An unrecorded worker could never be adopted or cancelled: do not leave it running.
            let _ = signal_group(pid, Signal::SIGKILL);
            let _ = child.wait().await;
            return Err(e);
        }
        tracing::info!(%id, pid, work_dir = %work_dir.display(), "started local worker");
        children.by_id.insert(id.clone(), child);
        self.ledger
            .lock()
            .await
            .submitted(&id, &spec.worker_id, &spec.shape_name);
        Ok(id)
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        let mut children = self.children.lock().await;
        let jobs = self.load()?;
        let mut statuses = Vec::with_capacity(jobs.len());
        let mut remaining = Vec::with_capacity(jobs.len());
        for record in jobs {
            let state = match children.finished(&record) {
                Some(success) => JobState::Finished { success },
                None => JobState::Running,
            };
            statuses.push(JobStatus {
                id: record.id.clone(),
                worker_id: record.worker_id.clone(),
                shape_name: record.shape_name.clone(),
                state,
                detail: None,
            });
            if state == JobState::Running {
                remaining.push(record);
            }
        }
        if remaining.len() != statuses.len() {
            // Finished jobs are reported once, then forgotten.
            self.save(&remaining)?;
        }
        children.forget_unrecorded(&remaining);
        // Records removed by another manager on the same directory were reported by it.
        Ok(self.ledger.lock().await.observe(statuses).forget_vanished())
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        let mut children = self.children.lock().await;
        let jobs = self.load()?;
        let Some(record) = jobs.into_iter().find(|r| r.id == id) else {
            tracing::debug!(%id, "cancel of an unknown local job");
            return Ok(());
        };
        if children.finished(&record).is_some() {
            // Already over; `list` reports it.
            return Ok(());
        }
        signal_group(record.pid, Signal::SIGTERM)?;
        tracing::info!(%id, pid = record.pid, "sent SIGTERM to local worker");
        let grace = self.grace;
        let children = Arc::clone(&self.children);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let mut children = children.lock().await;
            if children.finished(&record).is_none() {
                tracing::warn!(id = %record.id, "local worker ignored SIGTERM; sending SIGKILL");
                if let Err(e) = signal_group(record.pid, Signal::SIGKILL) {
                    tracing::warn!(id = %record.id, error = %e, "SIGKILL failed");
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_size_is_the_kernels_mem_total() {
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap();
        let kb: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        assert_eq!(capacity().unwrap().memory_bytes, kb * 1024);
    }

    #[test]
    fn reads_own_start_time() {
        let pid = std::process::id();
        let (state, start) = proc_stat(pid).expect("own stat");
        assert_ne!(state, 'Z');
        assert!(process_matches(pid, start));
        assert!(!process_matches(pid, start + 1));
    }

    #[test]
    fn least_used_ids_spread_the_load() {
        let ids = [0, 1, 2, 3];
        assert_eq!(pick_least_used(&ids, &[], 2), vec![0, 1]);
        assert_eq!(pick_least_used(&ids, &[&[0, 1]], 2), vec![2, 3]);
        assert_eq!(pick_least_used(&ids, &[&[0, 1], &[2]], 2), vec![0, 3]);
        // Overcommit: more than the machine has, evenly.
        assert_eq!(pick_least_used(&[0, 1], &[&[0], &[1], &[0]], 1), vec![1]);
        assert_eq!(pick_least_used(&[0, 1], &[], 3), vec![0, 1]);
        assert_eq!(pick_least_used(&[], &[], 1), Vec::<u32>::new());
        assert_eq!(id_list(&[0, 2]), "0,2");
        assert!(!machine_cpu_ids().is_empty());
    }

    #[test]
    fn capacity_is_positive() {
        let cap = capacity().unwrap();
        assert!(cap.cpus >= 1);
        assert!(cap.memory_bytes > 0);
    }
}
