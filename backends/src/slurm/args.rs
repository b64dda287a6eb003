//! The `slurm-batch` flags and the builder of a [`SlurmBackend`]: its pre-flight check (every
//! worker shape fits a node of the partition) and the workers' credentials file.

use std::path::{Path, PathBuf};

use clap::Args;

use super::{ContainerEngine, PodmanSettings, SlurmBackend, SlurmConfig};
use crate::{
    write_password_file, BackendArgs, BuildContext, BuildError, Shape, ShapeArgs, WorkerProfile,
};

/// Flags of the `slurm-batch` backend (Python's, with site-neutral defaults).
#[derive(Debug, Clone, Args)]
pub struct SlurmArgs {
    /// Middle part of the job names `<user>-<job-name>-<id>`.
    #[arg(long, default_value = "codalab-slurm-worker")]
    pub job_name: String,
    /// Nodes to run on (`#SBATCH --nodelist`).
    #[arg(long, default_value = "")]
    pub nodelist: String,
    /// Nodes to avoid (`#SBATCH --exclude`).
    #[arg(long, default_value = "")]
    pub exclude: String,
    /// Slurm partition to submit to.
    #[arg(long, required = true)]
    pub partition: String,
    /// `--cpus-per-task`, `--gres=gpu:N` (only when N > 0; Python's default is 1) and `--mem`.
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// GPU type in the gres (`gpu:<type>:N`).
    #[arg(long)]
    pub gpu_type: Option<String>,
    /// Node features (`#SBATCH --constraint`).
    #[arg(long)]
    pub constraint: Option<String>,
    /// Time limit of a worker job (`#SBATCH --time`).
    #[arg(long, default_value = "10-0")]
    pub time: String,
    /// Print the batch scripts instead of submitting them.
    #[arg(long)]
    pub dry_run: bool,
    /// Slurm user whose jobs are listed and whose name prefixes the job names (default: the
    /// current user).
    #[arg(long)]
    pub user: Option<String>,
    /// CodaLab credentials file (username, password; mode 600) on a file system the compute
    /// nodes share; handed to the workers. Without it a copy is written to --slurm-work-dir.
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// Where batch scripts, job output and the workers' credentials file go (shared with the
    /// compute nodes).
    #[arg(long, default_value = "slurm-worker-scratch")]
    pub slurm_work_dir: PathBuf,
    /// Exit once more than this many worker jobs failed.
    #[arg(long)]
    pub exit_after_num_failed: Option<u32>,
    /// Slurm account (`#SBATCH --account`). Python's default is `nlp`.
    #[arg(long)]
    pub account: Option<String>,
    /// Seconds before the time limit at which the worker gets SIGTERM and hands its runs back
    /// (`#SBATCH --signal=B:TERM@<n>`; 0 turns it off).
    #[arg(long, default_value_t = 300)]
    pub signal_seconds: u32,
    /// What runs the bundles on the compute nodes: their Docker daemon, or a Podman service
    /// each job starts on a private socket (for clusters without a Docker daemon).
    #[arg(long, value_enum, default_value = "docker")]
    pub container_engine: EngineArg,
    /// With podman: image storage on the node, shared by the jobs of a user (expanded on the
    /// node). Default `${TMPDIR:-/tmp}/cl-worker-podman-$(id -u)`.
    #[arg(long)]
    pub podman_storage_dir: Option<String>,
    /// With podman: the storage driver (`overlay`, or `vfs` where overlay is unavailable).
    #[arg(long, default_value = "overlay")]
    pub podman_storage_driver: String,
    /// With podman: a containers.conf for the jobs' services (cgroup manager, ulimits, …).
    #[arg(long)]
    pub podman_containers_conf: Option<PathBuf>,
}

/// `--container-engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    Docker,
    Podman,
}

fn current_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_default()
}

fn absolute(p: &Path) -> std::io::Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

/// A warning when the workers' credentials file lies in their shared work dir, where the runs'
/// bundle directories and dependencies live: it belongs in a directory only the Slurm user
/// reads (`--slurm-work-dir`, mode 700, or the user's home), never beside what runs write.
fn credentials_beside_the_runs(password_file: &Path, shared_work_dir: &Path) -> Option<String> {
    password_file.starts_with(shared_work_dir).then(|| {
        format!(
            "--password-file {} is inside the workers' shared work dir {}, beside the runs' \
             bundles: keep it in a directory only this user reads (--slurm-work-dir, mode 700)",
            password_file.display(),
            shared_work_dir.display()
        )
    })
}

/// Python's Slurm jobs each ask for one GPU by default (`--gpus 1`), so its documented commands
/// serve GPU bundles; ours ask for none unless a shape has GPUs, which keeps GPUs free for the
/// bundles that want them. Where the partition has GPU nodes and no shape has GPUs, a `gpu` shape
/// (the default shape with one GPU) serves the GPU bundles.
fn gpu_shape(shapes: &[Shape], partition_gpus: u32, partition: &str) -> Option<Shape> {
    if partition_gpus == 0 {
        return None;
    }
    crate::profile::gpu_shape(shapes, &format!("partition {partition} has GPU nodes"))
}

impl SlurmArgs {
    fn engine(&self) -> Result<ContainerEngine, BuildError> {
        if self.container_engine == EngineArg::Docker {
            return Ok(ContainerEngine::Docker);
        }
        if !matches!(self.podman_storage_driver.as_str(), "overlay" | "vfs") {
            return Err(BuildError::Preflight(format!(
                "--podman-storage-driver {:?}: overlay or vfs",
                self.podman_storage_driver
            )));
        }
        Ok(ContainerEngine::Podman(PodmanSettings {
            storage_dir: self
                .podman_storage_dir
                .clone()
                .unwrap_or_else(|| "${TMPDIR:-/tmp}/cl-worker-podman-$(id -u)".into()),
            storage_driver: self.podman_storage_driver.clone(),
            containers_conf: self
                .podman_containers_conf
                .as_deref()
                .map(absolute)
                .transpose()?,
        }))
    }

    /// A shape larger than every node of the partition would stay PENDING forever: refused
    /// (only warned about with `--dry-run`, which may run away from the cluster). Returns the
    /// GPUs of the partition's largest node (0 when unknown).
    async fn check_nodes(
        &self,
        backend: &SlurmBackend,
        cx: &BuildContext<'_>,
    ) -> Result<u32, BuildError> {
        match backend.largest_node().await {
            Ok((cpus, mem_mb, gpus)) => {
                for sh in cx.shapes {
                    if sh.resources.cpus > cpus
                        || sh.resources.gpus > gpus
                        || sh.resources.memory_bytes >> 20 > mem_mb
                    {
                        let msg = format!(
                            "worker shape {} ({} CPUs, {} GPUs, {} MiB) fits no node of partition {} \
                             (largest: {cpus} CPUs, {gpus} GPUs, {mem_mb} MiB)",
                            sh.name,
                            sh.resources.cpus,
                            sh.resources.gpus,
                            sh.resources.memory_bytes >> 20,
                            self.partition
                        );
                        if self.dry_run {
                            tracing::warn!("{msg}");
                        } else {
                            return Err(BuildError::Preflight(msg));
                        }
                    }
                }
                Ok(gpus)
            }
            Err(e) if self.dry_run => {
                tracing::warn!("cannot read partition {}: {e}", self.partition);
                Ok(0)
            }
            Err(e) => Err(BuildError::Preflight(format!(
                "cannot read partition {}: {e}",
                self.partition
            ))),
        }
    }
}

impl BackendArgs for SlurmArgs {
    type Backend = SlurmBackend;

    fn shape(&self) -> &ShapeArgs {
        &self.shape
    }

    fn password_file(&self) -> Option<&Path> {
        self.password_file.as_deref()
    }

    fn exit_after_num_failed(&self) -> Option<u32> {
        self.exit_after_num_failed
    }

    /// Workers named `<user>-<job-name>-<hex>` sharing Python's scratch work dir, handing their
    /// runs back on SIGTERM, with a credentials file on the shared `--slurm-work-dir`.
    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(SlurmBackend, WorkerProfile), BuildError> {
        let user = self.user.clone().unwrap_or_else(current_user);
        let work_dir = absolute(&self.slurm_work_dir)?;
        let non_empty = |v: &str| Some(v.to_string()).filter(|v| !v.is_empty());
        let backend = SlurmBackend::new(SlurmConfig {
            partition: self.partition.clone(),
            job_name: self.job_name.clone(),
            user: user.clone(),
            nodelist: non_empty(&self.nodelist),
            exclude: non_empty(&self.exclude),
            gpu_type: self.gpu_type.clone(),
            constraint: self.constraint.clone(),
            time: self.time.clone(),
            account: self.account.clone(),
            work_dir: work_dir.clone(),
            signal_secs: self.signal_seconds,
            dry_run: self.dry_run,
            engine: self.engine()?,
        })?;
        let partition_gpus = self.check_nodes(&backend, cx).await?;
        let password_file = match &self.password_file {
            Some(p) => absolute(p)?,
            None if self.dry_run => work_dir.join(".worker-password"),
            None => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&work_dir)?;
                write_password_file(&work_dir, cx.username, cx.password)?
            }
        };
        // Python's shared work dir of all of a user's Slurm workers.
        let base = match cx.work_dir_prefix {
            Some(p) => absolute(Path::new(p))?,
            None => std::env::current_dir()?,
        };
        let shared = base
            .join(format!("{user}-codalab-SlurmBatchWorkerManager-scratch"))
            .join("workdir");
        if let Some(why) = credentials_beside_the_runs(&password_file, &shared) {
            tracing::warn!("{why}");
        }
        let mut profile = WorkerProfile::new(Box::new(move |_| shared.display().to_string()));
        profile.id_prefix = format!("{user}-{}-", self.job_name);
        profile.extra_args = vec!["--pass-down-termination".into()];
        profile.password_file = Some(password_file);
        // The job script adds `--gpuset` from the job's allocation (`NONE` without GPUs).
        profile.sets_gpuset = true;
        profile.extra_shapes = gpu_shape(cx.shapes, partition_gpus, &self.partition)
            .into_iter()
            .collect();
        Ok((backend, profile))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_args;

    #[test]
    fn pythons_flags_and_defaults() {
        let s: SlurmArgs = parse_args(&["--partition", "p"]).unwrap();
        assert_eq!(
            (s.shape.cpus, s.shape.gpus, s.shape.memory_mb),
            (1, 0, 2048)
        );
        assert_eq!(
            (s.job_name.as_str(), s.time.as_str()),
            ("codalab-slurm-worker", "10-0")
        );
        assert_eq!(s.account, None);
        assert_eq!(
            s.slurm_work_dir,
            std::path::Path::new("slurm-worker-scratch")
        );
        // --partition is required, as in Python.
        assert!(parse_args::<SlurmArgs>(&[]).is_err());
    }

    fn shape(name: &str, gpus: u32) -> Shape {
        Shape::new(name, 2, gpus, 4 << 30)
    }

    #[test]
    fn a_credentials_file_among_the_runs_is_warned_about() {
        let shared = Path::new("/nfs/u-codalab-SlurmBatchWorkerManager-scratch/workdir");
        let why = credentials_beside_the_runs(&shared.join(".worker-password"), shared).unwrap();
        assert!(why.contains("beside the runs' bundles"), "{why}");
        assert!(credentials_beside_the_runs(Path::new("/home/u/scratch/.pw"), shared).is_none());
        // A sibling whose name merely starts the same is not inside.
        let sibling = Path::new("/nfs/u-codalab-SlurmBatchWorkerManager-scratch/workdir2/.pw");
        assert!(credentials_beside_the_runs(sibling, shared).is_none());
    }

    #[test]
    fn gpu_bundles_get_a_gpu_shape_only_on_a_gpu_partition_without_one() {
        let s = gpu_shape(&[shape("default", 0)], 2, "p").unwrap();
        assert_eq!(
            (
                s.name.as_str(),
                s.resources.cpus,
                s.resources.gpus,
                s.resources.memory_bytes
            ),
            ("gpu", 2, 1, 4 << 30)
        );
        assert!(gpu_shape(&[shape("default", 0)], 0, "p").is_none());
        assert!(gpu_shape(&[shape("default", 0), shape("big", 4)], 8, "p").is_none());
        assert_eq!(
            gpu_shape(&[shape("default", 0), shape("gpu", 0)], 1, "p")
                .unwrap()
                .name,
            "default-gpu"
        );
    }
}
