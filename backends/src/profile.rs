//! What a backend hands the manager at start-up: the [`BackendArgs`] a backend's flags
//! implement, the [`BuildContext`] they are built in, and the [`WorkerProfile`] of its workers.

use std::future::Future;
use std::path::{Path, PathBuf};

use clap::Args;

pub use common::resources::{Resources, Shape};

use crate::{Backend, BuildError};

/// The worker image: `--worker-image`, else Python's `codalab/worker:$CODALAB_VERSION`
/// (`latest` without it).
pub fn worker_image(flag: Option<&str>) -> String {
    flag.map(str::to_string).unwrap_or_else(|| {
        format!(
            "codalab/worker:{}",
            std::env::var("CODALAB_VERSION").unwrap_or_else(|_| "latest".into())
        )
    })
}

/// `CODALAB_BUNDLE_MOUNT` where `CODALAB_SHARED_FILE_SYSTEM=true` (CodaLab's two variables for
/// the bundle store on a shared file system): the path the backends that start workers in
/// containers mount at the same path, as CodaLab's AWS and Azure managers do.
pub fn shared_bundle_mount() -> Option<String> {
    let shared = std::env::var("CODALAB_SHARED_FILE_SYSTEM").is_ok_and(|v| v == "true");
    std::env::var("CODALAB_BUNDLE_MOUNT")
        .ok()
        .filter(|p| shared && !p.is_empty())
}

/// How a backend names the work directory of a new worker (from its worker id).
pub type WorkDirFn = Box<dyn Fn(&str) -> String + Send + Sync>;

/// How the workers of one backend are started: everything of the worker command line that
/// depends on the backend.
pub struct WorkerProfile {
    /// Start of every worker id (Slurm: `<user>-<job-name>-`; empty elsewhere).
    pub id_prefix: String,
    /// The `--work-dir` of a worker.
    pub work_dir: WorkDirFn,
    /// Replaces the per-worker `--network-prefix` (workers sharing one Docker engine).
    pub network_prefix: Option<String>,
    /// Flags added after the common worker command (each once).
    pub extra_args: Vec<String>,
    /// The workers' `--preemption-notice` when the manager's `--worker-preemption-notice` is
    /// not given (AWS Batch: `aws`, as CodaLab's job command starts its EC2 spot-interruption
    /// watcher in every worker job).
    pub default_preemption_notice: Option<&'static str>,
    /// A mode-600 credentials file at the same path where the workers run (local, Slurm): the
    /// manager adds `--password-file <path>` to every worker command. `None` where the backend
    /// delivers the credentials itself (AWS Batch: the job's secrets; Azure Batch: the file
    /// it mounts; Kubernetes: the Secret it mounts).
    pub password_file: Option<PathBuf>,
    /// Shapes the backend adds to the manager's (e.g. Slurm's `gpu` shape on a partition with
    /// GPU nodes when no shape has GPUs).
    pub extra_shapes: Vec<Shape>,
    /// The backend gives each worker its `--gpuset` itself (local: the GPUs it picked; Slurm:
    /// the GPUs of the job's allocation, `NONE` without). Elsewhere the manager adds
    /// `--gpuset NONE` to the workers of a shape without GPUs, so that a worker on a GPU host
    /// offers none of the host's GPUs (it would find them all through the engine).
    pub sets_gpuset: bool,
    /// The backend's compute pool, for `/status` and `/metrics` (Azure Batch's `--pool-id`).
    pub pool: Option<std::sync::Arc<dyn crate::PoolSource>>,
    /// Where each worker's own work dir would hold a dependency cache that ends with it
    /// (local, AWS Batch), a directory beside the work dirs where every worker of the backend
    /// keeps one shared cache (`--dependency-cache-dir`), so that a dependency downloaded by
    /// one worker is found by the next one after the first exited. `None` where the workers
    /// already share one work dir (Slurm, Azure Batch's pool, Kubernetes).
    pub dependency_cache_dir: Option<String>,
}

impl WorkerProfile {
    /// A profile with plain ids, no extra flags and no credentials file.
    pub fn new(work_dir: WorkDirFn) -> Self {
        Self {
            id_prefix: String::new(),
            work_dir,
            network_prefix: None,
            extra_args: Vec::new(),
            default_preemption_notice: None,
            password_file: None,
            extra_shapes: Vec::new(),
            sets_gpuset: false,
            pool: None,
            dependency_cache_dir: None,
        }
    }

    /// The work directory of worker `id`.
    pub fn work_dir(&self, id: &str) -> String {
        (self.work_dir)(id)
    }
}

impl std::fmt::Debug for WorkerProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerProfile")
            .field("id_prefix", &self.id_prefix)
            .field("network_prefix", &self.network_prefix)
            .field("extra_args", &self.extra_args)
            .field("default_preemption_notice", &self.default_preemption_notice)
            .field("password_file", &self.password_file)
            .field("sets_gpuset", &self.sets_gpuset)
            .field("pool", &self.pool.is_some())
            .field("dependency_cache_dir", &self.dependency_cache_dir)
            .finish_non_exhaustive()
    }
}

/// What a builder gets from the manager's common start-up.
#[derive(Debug, Clone, Copy)]
pub struct BuildContext<'a> {
    /// The CodaLab user the workers log in as.
    pub username: &'a str,
    /// Its password (written to the workers' credentials file, or into a job definition).
    pub password: &'a str,
    /// `--worker-work-dir-prefix`.
    pub work_dir_prefix: Option<&'a str>,
    /// Every worker shape the manager may launch (the default one and the `--config` ones).
    pub shapes: &'a [Shape],
    /// What [`BackendArgs::capacity`] returned.
    pub capacity: Option<Resources>,
}

/// The default worker shape, flags every backend has (Python's names and defaults).
#[derive(Debug, Clone, Args)]
pub struct ShapeArgs {
    /// CPUs of one worker.
    #[arg(long, default_value_t = 1)]
    pub cpus: u32,
    /// GPUs of one worker.
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Memory of one worker, in MiB.
    #[arg(long, default_value_t = 2048)]
    pub memory_mb: u64,
}

impl ShapeArgs {
    /// The worker's resources (`--memory-mb` in bytes, saturating).
    pub fn resources(&self) -> Resources {
        Resources::from_mb(self.cpus, self.gpus, self.memory_mb)
    }
}

/// The flags of one backend, which know how to set it up.
pub trait BackendArgs {
    /// The backend these flags build.
    type Backend: Backend;

    /// The default worker shape.
    fn shape(&self) -> &ShapeArgs;

    /// A CodaLab credentials file given among the backend's flags.
    fn password_file(&self) -> Option<&Path> {
        None
    }

    /// What the workers may hold together, when the backend is bounded.
    fn capacity(&self) -> Result<Option<Resources>, BuildError> {
        Ok(None)
    }

    /// Exit once more than this many worker jobs failed.
    fn exit_after_num_failed(&self) -> Option<u32> {
        None
    }

    /// Where its Kubernetes API is, for a backend that has one (a `--lease kubernetes:…`
    /// lives there).
    fn cluster_access(&self) -> Option<common::cluster::ClusterAccess> {
        None
    }

    /// Builds the backend and the profile of its workers, after the backend's pre-flight check.
    fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> impl Future<Output = Result<(Self::Backend, WorkerProfile), BuildError>> + Send;
}

/// Where the backend's machines have GPUs (`why` says how it knows) and no worker shape has
/// any: a `gpu` shape (the default shape with one GPU; `default-gpu` if `gpu` is taken) for the
/// bundles that ask for GPUs, so that they get a worker given a GPU rather than none.
pub fn gpu_shape(shapes: &[Shape], why: &str) -> Option<Shape> {
    if shapes.iter().any(|s| s.resources.gpus > 0) {
        return None;
    }
    let base = shapes
        .iter()
        .find(|s| s.name == "default")
        .or(shapes.first())?;
    let name = if shapes.iter().any(|s| s.name == "gpu") {
        "default-gpu"
    } else {
        "gpu"
    };
    tracing::info!(
        "{why} and no worker shape has GPUs: bundles asking for GPUs get jobs of shape {name} \
         ({} CPUs, 1 GPU, {} MiB); --gpus N or a shape with GPUs in --config sizes them \
         otherwise",
        base.resources.cpus,
        base.resources.memory_bytes >> 20
    );
    Some(Shape {
        name: name.into(),
        resources: Resources {
            gpus: 1,
            ..base.resources
        },
    })
}

/// Writes `<dir>/.worker-password` (username and password lines, mode 600), creating `dir`.
pub fn write_password_file(dir: &Path, username: &str, password: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(".worker-password");
    let body = format!("{username}\n{password}\n");
    common::write_atomic(&path, body.as_bytes(), Some(0o600))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn password_file_is_private() {
        let d = tempfile::tempdir().unwrap();
        let p = write_password_file(d.path(), "u", "p").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read_to_string(p).unwrap(), "u\np\n");
    }
}
