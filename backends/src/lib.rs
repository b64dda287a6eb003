//! Backends on which the worker manager starts `cl-worker` processes.
//!
//! A backend only knows how to submit a job, list this manager's jobs in one batched call and
//! cancel a job; the scaling policy lives in the manager.
//!
//! Each backend is a folder: the backend itself (`mod.rs`), its command-line flags and the
//! builder that turns them into a running backend and a [`WorkerProfile`] after its pre-flight
//! check (`args.rs`), and its own formats (Slurm's batch script, AWS's job definition). The
//! bookkeeping that every backend needs to report each ended job exactly once is the shared
//! [`Ledger`]. [`fake::FakeBackend`] keeps its jobs in memory; the [`conformance`] suite runs
//! against it in unit tests and against the real backends in the end-to-end tests.

use std::future::Future;

pub mod aws_batch;
pub mod azure_batch;
#[cfg(any(test, feature = "fake"))]
pub mod conformance;
mod dynamic;
mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod kubernetes;
mod ledger;
pub mod local;
mod profile;
pub mod slurm;

pub use aws_batch::{AwsBatchArgs, AwsBatchBackend, AwsBatchConfig};
pub use azure_batch::{AzureBatchArgs, AzureBatchBackend, AzureBatchConfig};
pub use dynamic::DynBackend;
pub use error::{BackendError, BuildError};
pub use kubernetes::{KubernetesArgs, KubernetesBackend, KubernetesConfig};
pub use ledger::{Ledger, Observed};
pub use local::{capacity, gpu_count, LocalArgs, LocalBackend};
pub use profile::{
    write_password_file, BackendArgs, BuildContext, Resources, Shape, ShapeArgs, WorkDirFn,
    WorkerProfile,
};
pub use slurm::{SlurmArgs, SlurmBackend, SlurmConfig};

/// Environment variables that could carry credentials: never handed to a worker process or to
/// a submitting command.
pub(crate) const SECRET_ENV: [&str; 2] = ["CODALAB_USERNAME", "CODALAB_PASSWORD"];

/// What a backend needs to start one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Unique id of the worker (also names its work directory).
    pub worker_id: String,
    /// Name of the worker shape the job was sized from.
    pub shape_name: String,
    /// CPUs, GPUs and memory the worker gets (its shape's).
    pub resources: Resources,
    /// The `cl-worker` argv (program first).
    pub command: Vec<String>,
    /// Non-secret environment variables every worker gets (the manager's Sentry variables,
    /// passed on as Python's manager does). Credentials never travel here: each backend delivers
    /// them its own way (a credentials file named in `command`, a Secret, a job's secrets).
    pub env: Vec<(String, String)>,
}

/// The life-cycle state of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Pending,
    Running,
    Finished { success: bool },
}

/// One job of this manager as seen by its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    pub id: String,
    pub worker_id: String,
    pub shape_name: String,
    pub state: JobState,
    /// Why the job ended, when the backend knows (e.g. `ImagePullBackOff`, `OOMKilled`).
    pub detail: Option<String>,
}

/// A place where workers run.
pub trait Backend: Send + Sync {
    /// Short name of the backend (e.g. `local`).
    fn name(&self) -> &str;

    /// Starts a job; returns its backend id.
    fn submit(&self, spec: &JobSpec) -> impl Future<Output = Result<String, BackendError>> + Send;

    /// This manager's own jobs, fetched in one batched call. A job that ended (or vanished from
    /// the backend) is reported as [`JobState::Finished`] exactly once, then no more.
    fn list(&self) -> impl Future<Output = Result<Vec<JobStatus>, BackendError>> + Send;

    /// Asks a job to stop (gracefully first). Unknown ids are not an error.
    fn cancel(&self, id: &str) -> impl Future<Output = Result<(), BackendError>> + Send;
}

/// Where a backend's compute pool can be read (Azure Batch's `--pool-id`), handed to the
/// manager by the backend's builder in [`WorkerProfile::pool`]; most backends have none. A
/// reading also repairs what the source may (Azure Batch: removes nodes unhealthy past the
/// grace period) and reports it in [`PoolStatus::removed_nodes`].
pub trait PoolSource: Send + Sync {
    fn pool(&self) -> futures::future::BoxFuture<'_, Result<PoolStatus, BackendError>>;
}

/// The compute pool of a backend, as `/status` and `/metrics` report it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStatus {
    pub id: String,
    /// `active`, `deleting`, …
    pub state: String,
    /// `steady`, `resizing` or `stopping`.
    pub allocation_state: String,
    pub current_dedicated_nodes: u32,
    pub current_low_priority_nodes: u32,
    pub target_dedicated_nodes: u32,
    pub target_low_priority_nodes: u32,
    pub task_slots_per_node: Option<u32>,
    pub auto_scale: Option<bool>,
    /// The service's errors of the pool's last resize (quota, allocation failures). The
    /// service keeps them until the next resize, so they may be stale at a reached target.
    pub resize_errors: Vec<PoolError>,
    /// Nodes that take no work (`unusable`, `starttaskfailed`), as last listed.
    pub unhealthy_nodes: Vec<PoolNode>,
    /// Nodes whose removal this reading asked for (the self-healing).
    pub removed_nodes: Vec<PoolNode>,
    /// Why the nodes could not be listed or removed (the pool itself was read).
    pub repair_error: Option<String>,
}

/// An error the service reports for a pool or a node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolError {
    pub code: String,
    pub message: String,
}

/// A node of a pool that takes no work.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolNode {
    pub id: String,
    pub state: String,
    /// Seconds in that state.
    pub for_seconds: u64,
    /// The service's reason, if it gives one.
    pub error: Option<String>,
}

/// Parses one backend's flags as its subcommand of `cl-worker-manager` parses them: the flag
/// tests beside each backend's `args.rs`.
#[cfg(test)]
pub(crate) fn parse_args<A: clap::Args>(argv: &[&str]) -> Result<A, clap::Error> {
    let command = A::augment_args(clap::Command::new("backend"));
    let matches =
        command.try_get_matches_from(std::iter::once("backend").chain(argv.iter().copied()))?;
    A::from_arg_matches(&matches)
}
