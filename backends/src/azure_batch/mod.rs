//! The `azure-batch` backend: one Azure Batch task per worker, in an existing job bound to an
//! (autoscale) pool, through a small typed REST client on `azure_core`'s pipeline.
//!
//! - **Tasks** are `<prefix><worker id>` (`cl_worker_<id>` by default, Python's convention):
//!   a container task running the worker image with the shape's `--cpus`/`--memory`, the
//!   Docker socket and the work-dir prefix mounted as host paths, the worker command
//!   shell-quoted, no task retries, and the task's `stdout.txt` and `stderr.txt` uploaded to
//!   `--log-container-url` under `<task id>/` when it completes.
//! - **Credentials** never travel in a task: the worker reads a mode-600 credentials file,
//!   mounted read-only: `--password-file`, at the same path on every node (terraform/azure-batch
//!   has the pool's start task write it from Key Vault on each node's own disk), or else the one
//!   the manager writes on the shared work dir (only `--allow-plaintext-password` puts the
//!   password in the task's environment, with a warning).
//! - **Own tasks** are listed in one paginated call per tick (`$filter` on the id prefix,
//!   `$select` of the fields used): `active`/`preparing` are pending, `running` is running,
//!   `completed` is reported once with its exit code and failure info, then deleted so that
//!   the job does not fill up. A failed listing is an error (nothing is launched or cancelled
//!   that tick), never "no workers".
//! - **Scaling** is the pool's autoscale formula (`examples/azure/`); `--pool-id` reports the
//!   pool's allocation state and node counts in `/status` and `/metrics`.

use futures::StreamExt;
use tokio::sync::Mutex;

use crate::{
    Backend, BackendError, JobSpec, JobState, JobStatus, Ledger, PoolError, PoolSource, PoolStatus,
};

mod args;
pub mod client;
pub mod heal;
pub mod model;

pub use args::AzureBatchArgs;
use client::{BatchClient, BatchError, ListQuery};
use model::{
    AutoUser, ContainerDestination, ContainerSettings, EnvironmentSetting, IdentityReference,
    OutputFile, OutputFileDestination, Task, TaskAdd, TaskConstraints, TaskState, UploadOptions,
    UserIdentity,
};

/// Start of a task's display name; the rest is the worker's shape.
const DISPLAY_PREFIX: &str = "cl-worker ";
/// Deletions of completed tasks in flight at once.
const DELETE_CONCURRENCY: usize = 8;
/// Tasks per listing page (the service's maximum).
const PAGE_SIZE: u32 = 1000;

/// Settings of the backend (the `azure-batch` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct AzureBatchConfig {
    /// The Batch job tasks are added to (`--job-id`).
    pub job_id: String,
    /// Start of every task id (`--task-id-prefix`, default `cl_worker_`).
    pub task_prefix: String,
    /// Worker image (`containerSettings.imageName`).
    pub image: String,
    /// `docker run --user`.
    pub user: String,
    /// Blob container (with its SAS, or for `log_identity`) the task logs go to.
    pub log_container_url: String,
    /// Resource id of a pool identity allowed to write to the log container.
    pub log_identity: Option<String>,
    /// Host path mounted at the same path (the workers' work dirs), if any.
    pub work_dir_prefix: Option<String>,
    /// A further host path mounted at the same path (`CODALAB_BUNDLE_MOUNT` with a shared file
    /// system).
    pub bundle_mount: Option<String>,
    /// Credentials file mounted read-only and passed as `--password-file`.
    pub password_file: Option<String>,
    /// `CODALAB_USERNAME`/`CODALAB_PASSWORD` in the task environment (explicit opt-in only).
    pub plaintext_credentials: Option<(String, String)>,
    /// Pool to report on (`--pool-id`).
    pub pool_id: Option<String>,
    /// Remove the pool's `unusable`/`starttaskfailed` nodes after this long in that state
    /// (`--remove-unhealthy-nodes-after`; `None`: never).
    pub remove_unhealthy_after: Option<std::time::Duration>,
}

impl AzureBatchConfig {
    /// Checks what the service would refuse only at the first task.
    pub fn validate(&self) -> Result<(), BackendError> {
        let id_ok = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if self.job_id.is_empty() || !id_ok(&self.job_id) {
            return Err(BackendError::permanent(format!(
                "--job-id {:?}: letters, digits, '-' and '_' only",
                self.job_id
            )));
        }
        // Task ids: at most 64 characters; the rest is for the worker id (16 hex digits).
        if !id_ok(&self.task_prefix) || self.task_prefix.len() > 64 - 32 {
            return Err(BackendError::permanent(format!(
                "--task-id-prefix {:?}: at most 32 letters, digits, '-' and '_'",
                self.task_prefix
            )));
        }
        let url = reqwest::Url::parse(&self.log_container_url).ok();
        if !url.is_some_and(|u| matches!(u.scheme(), "https" | "http") && u.host_str().is_some()) {
            return Err(BackendError::permanent(format!(
                "--log-container-url {}: a blob container URL expected",
                redact_url(&self.log_container_url)
            )));
        }
        if self.password_file.is_none() && self.plaintext_credentials.is_none() {
            return Err(BackendError::permanent(
                "azure-batch needs a credentials file the pool's nodes can read",
            ));
        }
        Ok(())
    }

    /// The task of one worker.
    pub fn task(&self, spec: &JobSpec) -> TaskAdd {
        let id = format!("{}{}", self.task_prefix, spec.worker_id);
        let mut argv = spec.command.clone();
        if let Some(p) = &self.password_file {
            argv.push("--password-file".into());
            argv.push(p.clone());
        }
        let inner = format!("exec {}", quote_all(&argv));
        let command_line = format!("/bin/sh -c {}", quote(&inner));
        let mut options = vec![
            format!("--cpus {}", spec.resources.cpus.max(1)),
            format!("--memory {}m", (spec.resources.memory_bytes >> 20).max(6)),
            format!("--user {}", quote(&self.user)),
            "-v /var/run/docker.sock:/var/run/docker.sock".to_string(),
        ];
        let mut mount = |path: &str, ro: bool| {
            let suffix = if ro { ":ro" } else { "" };
            options.push(format!("-v {}", quote(&format!("{path}:{path}{suffix}"))));
        };
        // The work dir's parent at the same path whatever the flags: the worker hands paths
        // under it to the node's Docker for its runs' mounts.
        mount(self.work_dir_prefix.as_deref().unwrap_or("/tmp"), false);
        if let Some(p) = &self.bundle_mount {
            mount(p, false);
        }
        if let Some(p) = &self.password_file {
            mount(p, true);
        }
        let mut env: Vec<EnvironmentSetting> = spec
            .env
            .iter()
            .filter(|(k, _)| !crate::SECRET_ENV.contains(&k.as_str()))
            .map(|(k, v)| EnvironmentSetting {
                name: k.clone(),
                value: v.clone(),
            })
            .collect();
        if let Some((user, password)) = &self.plaintext_credentials {
            for (name, value) in [("CODALAB_USERNAME", user), ("CODALAB_PASSWORD", password)] {
                env.push(EnvironmentSetting {
                    name: name.into(),
                    value: value.clone(),
                });
            }
        }
        TaskAdd {
            display_name: Some(format!("{DISPLAY_PREFIX}{}", spec.shape_name)),
            command_line,
            container_settings: ContainerSettings {
                image_name: self.image.clone(),
                container_run_options: options.join(" "),
            },
            constraints: TaskConstraints {
                max_task_retry_count: 0,
            },
            environment_settings: env,
            user_identity: UserIdentity {
                auto_user: AutoUser {
                    scope: "pool".into(),
                    elevation_level: "admin".into(),
                },
            },
            output_files: vec![OutputFile {
                file_pattern: "$AZ_BATCH_TASK_DIR/std*.txt".into(),
                destination: OutputFileDestination {
                    container: ContainerDestination {
                        container_url: self.log_container_url.clone(),
                        path: id.clone(),
                        identity_reference: self.log_identity.as_ref().map(|r| IdentityReference {
                            resource_id: r.clone(),
                        }),
                    },
                },
                upload_options: UploadOptions {
                    upload_condition: "taskcompletion".into(),
                },
            }],
            id,
        }
    }

    /// The listing of this manager's tasks.
    pub fn list_query(&self) -> ListQuery {
        ListQuery {
            filter: Some(format!("startswith(id,'{}')", self.task_prefix)),
            select: ["id", "displayName", "state", "executionInfo"]
                .map(String::from)
                .to_vec(),
            max_results: Some(PAGE_SIZE),
        }
    }

    /// A listed task as a job of this manager (`None` if its id is not ours).
    pub fn status_of(&self, task: &Task) -> Option<JobStatus> {
        let worker_id = task.id.strip_prefix(&self.task_prefix)?;
        let (state, detail) = match task.state {
            TaskState::Active | TaskState::Preparing | TaskState::Other => {
                (JobState::Pending, None)
            }
            TaskState::Running => (JobState::Running, None),
            TaskState::Completed => {
                let info = task.execution_info.clone().unwrap_or_default();
                let success = info.failure_info.is_none()
                    && info.exit_code == Some(0)
                    && info.result.as_deref().is_none_or(|r| r == "success");
                let mut detail = info.failure_info.as_ref().map(|f| {
                    let code = f.code.as_deref().unwrap_or("failure");
                    match f.message.as_deref() {
                        Some(m) if !m.is_empty() => format!("{code}: {m}"),
                        _ => code.to_string(),
                    }
                });
                if let Some(code) = info.exit_code.filter(|c| *c != 0) {
                    let d = detail.get_or_insert_with(String::new);
                    if !d.is_empty() {
                        d.push(' ');
                    }
                    d.push_str(&format!("(exit code {code})"));
                }
                (JobState::Finished { success }, detail)
            }
        };
        Some(JobStatus {
            id: task.id.clone(),
            worker_id: worker_id.to_string(),
            shape_name: task
                .display_name
                .as_deref()
                .and_then(|d| d.strip_prefix(DISPLAY_PREFIX))
                .unwrap_or_default()
                .to_string(),
            state,
            detail,
        })
    }
}

/// One argument for a POSIX shell (unchanged when it needs no quotes).
fn quote(s: &str) -> String {
    shlex::try_quote(s)
        .map(|c| c.into_owned())
        .unwrap_or_else(|_| format!("'{}'", s.replace('\0', "").replace('\'', r"'\''")))
}

fn quote_all(argv: &[String]) -> String {
    argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

/// A URL without its query (a SAS is a credential): for messages and logs.
pub fn redact_url(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?<SAS redacted>"),
        None => url.to_string(),
    }
}

/// Runs workers as Azure Batch tasks.
pub struct AzureBatchBackend {
    client: BatchClient,
    cfg: AzureBatchConfig,
    ledger: Mutex<Ledger>,
}

impl AzureBatchBackend {
    pub fn new(client: BatchClient, cfg: AzureBatchConfig) -> Result<Self, BackendError> {
        cfg.validate()?;
        Ok(Self {
            client,
            cfg,
            ledger: Mutex::default(),
        })
    }

    pub fn config(&self) -> &AzureBatchConfig {
        &self.cfg
    }

    pub fn client(&self) -> &BatchClient {
        &self.client
    }

    /// The pre-flight check: the job exists, is active, and (with `--pool-id`) runs on that
    /// pool. Authentication and a missing job are permanent errors.
    pub async fn check_job(&self) -> Result<(), BackendError> {
        let job = self
            .client
            .get_job(&self.cfg.job_id)
            .await
            .map_err(|e| e.into_backend(&format!("job {}", self.cfg.job_id)))?;
        if let Some(state) = job.state.as_deref().filter(|s| *s != "active") {
            tracing::warn!(
                "job {} is {state}: tasks can only be added to an active job",
                self.cfg.job_id
            );
        }
        let job_pool = job.pool_info.and_then(|p| p.pool_id);
        if let (Some(want), Some(have)) = (&self.cfg.pool_id, &job_pool) {
            if want != have {
                tracing::warn!(
                    "--pool-id {want}, but job {} runs on pool {have}: the reported pool is not \
                     the one the workers run on",
                    self.cfg.job_id
                );
            }
        }
        tracing::info!(
            "Azure Batch job {} on pool {}",
            self.cfg.job_id,
            job_pool.as_deref().unwrap_or("(auto pool)")
        );
        Ok(())
    }

    async fn delete_completed(&self, ids: Vec<String>) {
        futures::stream::iter(ids)
            .map(|id| async move {
                match self.client.delete_task(&self.cfg.job_id, &id).await {
                    Ok(()) => tracing::debug!("deleted completed task {id}"),
                    Err(e) if e.status == 404 => {}
                    // Listed again next tick, not reported again, deleted then.
                    Err(e) => tracing::warn!("cannot delete completed task {id}: {e}"),
                }
            })
            .buffer_unordered(DELETE_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
    }
}

fn log_ended(job: &JobStatus) {
    if let JobState::Finished { success } = job.state {
        let how = if success { "succeeded" } else { "failed" };
        match &job.detail {
            Some(d) => tracing::info!("task {} {how}: {d}", job.id),
            None => tracing::info!("task {} {how}", job.id),
        }
    }
}

impl Backend for AzureBatchBackend {
    fn name(&self) -> &str {
        "azure-batch"
    }

    async fn submit(&self, spec: &JobSpec) -> Result<String, BackendError> {
        let task = self.cfg.task(spec);
        match self.client.add_task(&self.cfg.job_id, &task).await {
            Ok(()) => {}
            // A retried add whose first try went through: the task is ours.
            Err(BatchError { code, .. }) if code == "TaskExists" => {}
            Err(e) => return Err(e.into_backend("add task")),
        }
        self.ledger
            .lock()
            .await
            .submitted(&task.id, &spec.worker_id, &spec.shape_name);
        Ok(task.id)
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        let (tasks, _pages) = self
            .client
            .list_tasks(&self.cfg.job_id, &self.cfg.list_query())
            .await
            .map_err(|e| e.into_backend("list tasks"))?;
        let listing: Vec<JobStatus> = tasks.iter().filter_map(|t| self.cfg.status_of(t)).collect();
        let completed: Vec<String> = listing
            .iter()
            .filter(|j| matches!(j.state, JobState::Finished { .. }))
            .map(|j| j.id.clone())
            .collect();
        let out = {
            let mut ledger = self.ledger.lock().await;
            // A task that vanished was deleted by someone else: its end is unknown.
            ledger.observe(listing).resolve(|_| None)
        };
        out.iter().for_each(log_ended);
        // Reported (now or at an earlier listing): delete, so the job does not fill up.
        self.delete_completed(completed).await;
        Ok(out)
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        match self.client.terminate_task(&self.cfg.job_id, id).await {
            Ok(()) => Ok(()),
            Err(e) if e.status == 404 || e.code == "TaskCompleted" => Ok(()),
            Err(e) => Err(e.into_backend("terminate task")),
        }
    }
}

/// The pool of `--pool-id`, read with the backend's client, and healed: its nodes unhealthy
/// past the grace period are removed ([`heal`]).
pub struct AzurePool {
    client: BatchClient,
    id: String,
    /// `--remove-unhealthy-nodes-after` (`None`: the nodes are listed, never removed).
    grace: Option<std::time::Duration>,
    memory: Mutex<PoolMemory>,
}

#[derive(Default)]
struct PoolMemory {
    heal: heal::Memory,
    /// When the nodes were last listed, and what that listing found.
    listed_at: Option<std::time::Instant>,
    sick: Vec<(heal::Sick, Option<String>)>,
}

/// The nodes are listed at most this often (seconds), and at least twice per grace period.
const LIST_NODES_EVERY: f64 = 30.0;

impl AzureBatchBackend {
    /// The reader of the pool its jobs run on, when `--pool-id` names one.
    pub fn pool_source(&self) -> Option<AzurePool> {
        Some(AzurePool {
            client: self.client.clone(),
            id: self.cfg.pool_id.clone()?,
            grace: self.cfg.remove_unhealthy_after,
            memory: Mutex::default(),
        })
    }
}

/// The listing of a pool's unhealthy nodes.
pub fn unhealthy_nodes_query() -> ListQuery {
    ListQuery {
        filter: Some(
            heal::UNHEALTHY
                .map(|s| format!("state eq '{s}'"))
                .join(" or "),
        ),
        select: [
            "id",
            "state",
            "stateTransitionTime",
            "errors",
            "startTaskInfo",
        ]
        .map(String::from)
        .to_vec(),
        max_results: Some(PAGE_SIZE),
    }
}

/// The service's reason for a node's state: its first error, or its start task's failure.
fn node_reason(n: &model::Node) -> Option<String> {
    let both = |code: Option<&str>, message: Option<&str>| match (code, message) {
        (Some(c), Some(m)) if !m.is_empty() => Some(format!("{c}: {m}")),
        (Some(c), _) => Some(c.to_string()),
        (None, Some(m)) => Some(m.to_string()),
        (None, None) => None,
    };
    n.errors
        .iter()
        .find_map(|e| both(e.code.as_deref(), e.message.as_deref()))
        .or_else(|| {
            let info = n.start_task_info.as_ref()?;
            let f = info.failure_info.as_ref();
            both(
                f.and_then(|f| f.code.as_deref()),
                f.and_then(|f| f.message.as_deref()),
            )
            .or_else(|| info.exit_code.map(|c| format!("start task exit code {c}")))
        })
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl AzurePool {
    /// Lists the unhealthy nodes (when due) and removes those past the grace; fills in the
    /// status's node fields.
    async fn heal(&self, status: &mut PoolStatus) {
        let now = unix_now();
        let mut memory = self.memory.lock().await;
        let every = self.grace.map_or(LIST_NODES_EVERY, |g| {
            (g.as_secs_f64() / 2.0).min(LIST_NODES_EVERY)
        });
        let due = memory
            .listed_at
            .is_none_or(|t| t.elapsed().as_secs_f64() >= every);
        let mut removed = Vec::new();
        if due {
            match self
                .client
                .list_nodes(&self.id, &unhealthy_nodes_query())
                .await
            {
                Ok((nodes, _)) => {
                    memory.listed_at = Some(std::time::Instant::now());
                    let listed: Vec<(String, String, Option<f64>)> = nodes
                        .iter()
                        .map(|n| {
                            let at = n
                                .state_transition_time
                                .as_deref()
                                .and_then(|t| azure_core::time::parse_rfc3339(t).ok())
                                .map(|t| t.unix_timestamp_nanos() as f64 / 1e9);
                            (n.id.clone(), n.state.clone().unwrap_or_default(), at)
                        })
                        .collect();
                    let sick = memory.heal.observe(&listed, now);
                    memory.sick = sick
                        .into_iter()
                        .map(|s| {
                            let why = nodes.iter().find(|n| n.id == s.id).and_then(node_reason);
                            (s, why)
                        })
                        .collect();
                }
                Err(e) => {
                    status.repair_error = Some(
                        e.into_backend(&format!("pool {} nodes", self.id))
                            .to_string(),
                    );
                }
            }
            let steady = status.allocation_state == "steady";
            let sick: Vec<heal::Sick> = memory.sick.iter().map(|(s, _)| s.clone()).collect();
            let grace = self.grace.map(|g| g.as_secs_f64());
            let chosen = memory.heal.to_remove(&sick, now, grace, steady);
            if !chosen.is_empty() {
                let ids: Vec<String> = chosen.iter().map(|s| s.id.clone()).collect();
                let body = model::NodeRemove {
                    node_list: ids.clone(),
                    // Whatever runs on a broken node ends; the manager starts new workers.
                    node_deallocation_option: "terminate".into(),
                };
                match self.client.remove_nodes(&self.id, &body).await {
                    Ok(()) => {
                        for s in &chosen {
                            tracing::warn!(
                                "pool {}: removing node {} ({} for {:.0} s)",
                                self.id,
                                s.id,
                                s.state,
                                now - s.since
                            );
                        }
                        removed = chosen;
                    }
                    Err(e) => {
                        memory.heal.refused(&ids);
                        let e = e.into_backend(&format!("remove nodes of pool {}", self.id));
                        tracing::warn!("{e}");
                        status.repair_error = Some(e.to_string());
                    }
                }
            }
        }
        // The listed nodes, less those whose removal was just asked: reported apart.
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut memory.sick)
            .into_iter()
            .partition(|(s, _)| removed.iter().any(|r| r.id == s.id));
        let node = |(s, why): &(heal::Sick, Option<String>)| backends_node(s, why.clone(), now);
        status.unhealthy_nodes = kept.iter().map(node).collect();
        status.removed_nodes = gone.iter().map(node).collect();
        memory.sick = kept;
    }
}

fn backends_node(s: &heal::Sick, error: Option<String>, now: f64) -> crate::PoolNode {
    crate::PoolNode {
        id: s.id.clone(),
        state: s.state.clone(),
        for_seconds: (now - s.since).max(0.0) as u64,
        error,
    }
}

impl PoolSource for AzurePool {
    fn pool(&self) -> futures::future::BoxFuture<'_, Result<PoolStatus, BackendError>> {
        Box::pin(async move {
            let p = self
                .client
                .get_pool(&self.id)
                .await
                .map_err(|e| e.into_backend(&format!("pool {}", self.id)))?;
            let mut status = PoolStatus {
                id: p.id,
                state: p.state.unwrap_or_default(),
                allocation_state: p.allocation_state.unwrap_or_default(),
                current_dedicated_nodes: p.current_dedicated_nodes.unwrap_or(0),
                current_low_priority_nodes: p.current_low_priority_nodes.unwrap_or(0),
                target_dedicated_nodes: p.target_dedicated_nodes.unwrap_or(0),
                target_low_priority_nodes: p.target_low_priority_nodes.unwrap_or(0),
                task_slots_per_node: p.task_slots_per_node,
                auto_scale: p.enable_auto_scale,
                resize_errors: p
                    .resize_errors
                    .into_iter()
                    .map(|e| PoolError {
                        code: e.code.unwrap_or_default(),
                        message: e.message.unwrap_or_default(),
                    })
                    .collect(),
                unhealthy_nodes: Vec::new(),
                removed_nodes: Vec::new(),
                repair_error: None,
            };
            self.heal(&mut status).await;
            Ok(status)
        })
    }
}

#[cfg(test)]
mod tests;
