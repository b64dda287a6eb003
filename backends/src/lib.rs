//! Backends on which the worker manager starts `cl-worker` processes.
//!
//! A backend only knows how to submit a job, list this manager's jobs in one batched call and
//! cancel a job; the scaling policy lives in the manager.

use std::future::Future;
use std::path::PathBuf;

pub mod aws_batch;
pub mod local;
pub mod slurm;

pub use aws_batch::{AwsBatchBackend, AwsBatchConfig};
pub use local::{capacity, gpu_count, Capacity, LocalBackend};
pub use slurm::{SlurmBackend, SlurmConfig};

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
    pub cpus: u32,
    pub gpus: u32,
    pub memory_bytes: u64,
    /// The `cl-worker` argv (program first).
    pub command: Vec<String>,
    /// Non-secret environment variables.
    pub env: Vec<(String, String)>,
    /// Credentials file (mode 600); passed to the worker as `--password-file <path>`. Secrets
    /// never travel through argv or the environment.
    pub password_file: Option<PathBuf>,
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
}

/// An error of a backend; `retryable` says whether the same call may succeed later.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct BackendError {
    message: String,
    retryable: bool,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl BackendError {
    /// A transient error: the call may succeed if repeated.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            source: None,
        }
    }

    /// A permanent error: repeating the call will not help.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// A place where workers run.
pub trait Backend: Send + Sync {
    /// Short name of the backend (e.g. `local`).
    fn name(&self) -> &str;

    /// Starts a job; returns its backend id.
    fn submit(&self, spec: &JobSpec) -> impl Future<Output = Result<String, BackendError>> + Send;

    /// This manager's own jobs, fetched in one batched call.
    fn list(&self) -> impl Future<Output = Result<Vec<JobStatus>, BackendError>> + Send;

    /// Asks a job to stop (gracefully first). Unknown ids are not an error.
    fn cancel(&self, id: &str) -> impl Future<Output = Result<(), BackendError>> + Send;
}
