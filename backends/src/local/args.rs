//! The `local` flags and the builder of a [`LocalBackend`].

use std::path::PathBuf;

use clap::Args;

use super::{capacity, LocalBackend};
use crate::{
    write_password_file, BackendArgs, BuildContext, BuildError, Resources, ShapeArgs, WorkerProfile,
};

/// Work directories and job records of the local workers without `--worker-work-dir-prefix`.
pub const DEFAULT_PREFIX: &str = "cl-worker-manager-local";

/// Flags of the `local` backend.
#[derive(Debug, Clone, Args)]
pub struct LocalArgs {
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// CPUs the local workers may hold in total (default: this machine's). A larger value
    /// overcommits: workers then share cores evenly.
    #[arg(long)]
    pub machine_cpus: Option<u32>,
    /// GPUs of this machine for the workers (default: those `nvidia-smi` lists).
    #[arg(long)]
    pub machine_gpus: Option<u32>,
    /// Memory the local workers may hold in total, in MiB (default: this machine's).
    #[arg(long)]
    pub machine_memory_mb: Option<u64>,
    /// `--network-prefix` of the local workers. They share one Docker engine, so they share
    /// its networks (one set per worker would exhaust Docker's address pools at ~10 workers).
    #[arg(long, default_value = "codalab_worker_network")]
    pub network_prefix: String,
}

impl BackendArgs for LocalArgs {
    type Backend = LocalBackend;

    fn shape(&self) -> &ShapeArgs {
        &self.shape
    }

    /// The machine (or the `--machine-*` flags): what the local workers may hold together.
    fn capacity(&self) -> Result<Option<Resources>, BuildError> {
        let machine = capacity()?;
        Ok(Some(Resources {
            cpus: self.machine_cpus.unwrap_or(machine.cpus),
            gpus: self.machine_gpus.unwrap_or(machine.gpus),
            memory_bytes: self
                .machine_memory_mb
                .map_or(machine.memory_bytes, |mb| mb.saturating_mul(1 << 20)),
        }))
    }

    /// Workers under `<prefix>/<worker id>` with their credentials in `<prefix>`.
    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(LocalBackend, WorkerProfile), BuildError> {
        let prefix = PathBuf::from(cx.work_dir_prefix.unwrap_or(DEFAULT_PREFIX));
        tracing::info!(
            "local workers under {}, machine capacity {:?}",
            prefix.display(),
            cx.capacity
        );
        let gpus = cx.capacity.map_or(0, |c| c.gpus);
        let backend = LocalBackend::new(&prefix)?.with_gpus(gpus);
        let password_file = write_password_file(&prefix, cx.username, cx.password)?;
        let work_root = prefix.clone();
        let mut profile = WorkerProfile::new(Box::new(move |id| {
            work_root.join(id).join("work").display().to_string()
        }));
        profile.network_prefix = Some(self.network_prefix.clone());
        profile.password_file = Some(password_file);
        // One cache for the machine's workers, which outlives each of them.
        profile.dependency_cache_dir = Some(prefix.join("dependency-cache").display().to_string());
        // The backend gives each worker the GPUs it picked (`NONE` without).
        profile.sets_gpuset = true;
        Ok((backend, profile))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_args;

    #[test]
    fn pythons_defaults() {
        let l: LocalArgs = parse_args(&[]).unwrap();
        assert_eq!(
            (l.shape.cpus, l.shape.gpus, l.shape.memory_mb),
            (1, 0, 2048)
        );
    }
}
