//! How a runtime is set up, as a backend is: each runtime's flags (its folder's `args.rs`,
//! flattened into the worker's command line) implement [`RuntimeArgs`], whose `build` checks
//! them, readies the runtime and returns it with the machine's share for runs
//! ([`MachineShare`]). `lib.rs` picks the runtime in one `match`.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::BundleRuntime;
use crate::metrics::Metrics;

/// What every runtime's build gets: the worker's machine flags (Python's, shared by every
/// runtime) and what the runtime needs of the worker.
#[derive(Debug, Clone, Copy)]
pub struct BuildContext<'a> {
    /// `--cpuset` as given (`ALL` or CPU numbers).
    pub cpuset: &'a str,
    /// `--gpuset` as given (`ALL`, `NONE`/empty, or indices and UUIDs).
    pub gpuset: &'a str,
    /// `--max-memory`.
    pub max_memory: Option<u64>,
    /// The worker's work dir, already made absolute ([`crate::prepare_work_dir`]).
    pub work_dir: &'a Path,
    /// `--id`.
    pub worker_id: &'a str,
    pub metrics: &'a Arc<Metrics>,
    /// Cancelled when the worker stops (the runtime's background tasks end with it).
    pub shutdown: &'a CancellationToken,
}

/// The CPUs, GPUs and memory of this machine that the worker's runs share, as the runtime
/// found them (the Docker runtime: the host's, narrowed by the flags; Kubernetes: the node's
/// free resources).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineShare {
    pub cpuset: Vec<usize>,
    /// GPU UUIDs (or the runtime's own names for them).
    pub gpuset: Vec<String>,
    pub memory_bytes: u64,
}

/// Why a runtime could not be built. Nothing of the runtime's stays behind.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A flag (or the environment it reads) that cannot work: refused before anything is
    /// reached.
    #[error("{0}")]
    Flag(String),
    /// The engine or API could not be reached or readied.
    #[error("{0}")]
    Start(String),
}

impl BuildError {
    pub(crate) fn flag(e: impl std::fmt::Display) -> Self {
        Self::Flag(e.to_string())
    }

    pub(crate) fn start(e: impl std::fmt::Display) -> Self {
        Self::Start(e.to_string())
    }
}

/// The flags of one runtime, which know how to set it up.
pub trait RuntimeArgs {
    /// The runtime these flags build.
    type Runtime: BundleRuntime;

    /// Checks the flags, connects, readies the runtime (for Docker: the worker's networks, the
    /// GPUs found through the engine, the image cleaner) and returns it with the machine's
    /// share for runs.
    fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> impl Future<Output = Result<(Self::Runtime, MachineShare), BuildError>> + Send;
}
