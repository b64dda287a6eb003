//! `cl-worker-manager` global flags, with the Python manager's names and defaults, and the
//! worker command line built from them.

use clap::{Args, Parser, Subcommand};

/// Launches CodaLab workers on a backend when the server has staged bundles.
#[derive(Debug, Clone, Parser)]
#[command(name = "cl-worker-manager", version, infer_long_args = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub backend: Backend,
}

/// The backend subcommands. More come with their own work.
#[derive(Debug, Clone, Subcommand)]
pub enum Backend {
    /// Workers as child processes on this machine.
    Local(LocalArgs),
    /// Workers as Slurm batch jobs (`sbatch`, then `srun cl-worker` on the compute node).
    SlurmBatch(Box<SlurmArgs>),
    /// Workers as AWS Batch jobs running the worker image.
    AwsBatch(Box<AwsBatchArgs>),
}

/// Flags of the `aws-batch` backend (Python's, plus the image and the password secret).
#[derive(Debug, Clone, Args)]
pub struct AwsBatchArgs {
    /// AWS region of the Batch client.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// Name of the job definition (registered if no equal ACTIVE revision exists); also the
    /// prefix of the job names.
    #[arg(long, default_value = "codalab-worker")]
    pub job_definition_name: String,
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// User the worker container runs as.
    #[arg(long, default_value = "root")]
    pub user: String,
    /// Job queue to submit to and list.
    #[arg(long, default_value = "codalab-batch-cpu")]
    pub job_queue: String,
    /// Regex a job name must fully match to count as this manager's.
    #[arg(long)]
    pub job_filter: Option<String>,
    /// Worker image (default `codalab/worker:$CODALAB_VERSION`, `latest` without it).
    #[arg(long)]
    pub worker_image: Option<String>,
    /// ARN of a Secrets Manager secret or SSM parameter holding the CodaLab password; it
    /// reaches the worker as `CODALAB_PASSWORD` through the job definition's `secrets`.
    #[arg(long, env = "CL_WORKER_MANAGER_PASSWORD_SECRET_ARN")]
    pub password_secret_arn: Option<String>,
    /// Put the password in the job definition's plain environment instead (Python's way;
    /// visible to anyone who can describe the definition).
    #[arg(long)]
    pub allow_plaintext_password: bool,
}

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
    pub password_file: Option<std::path::PathBuf>,
    /// Where batch scripts, job output and the workers' credentials file go (shared with the
    /// compute nodes).
    #[arg(long, default_value = "slurm-worker-scratch")]
    pub slurm_work_dir: std::path::PathBuf,
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
    /// The default shape these flags describe.
    pub fn to_shape(&self) -> crate::policy::Shape {
        crate::policy::Shape::from_flags(self.cpus, self.gpus, self.memory_mb)
    }
}

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

/// Flags that come before the backend name.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// URL of the CodaLab server.
    #[arg(long, default_value = "https://worksheets.codalab.org")]
    pub server: String,
    /// Do not keep the session in a temporary state (the Python flag's inverted name is kept).
    #[arg(long = "temp-session", action = clap::ArgAction::SetFalse)]
    pub temp_session: bool,
    /// Workers to keep at least.
    #[arg(long, default_value_t = 1)]
    pub min_workers: u32,
    /// Workers (pending ones included) to have at most.
    #[arg(long, default_value_t = 10)]
    pub max_workers: u32,
    /// Extra search keywords for staged bundles (e.g. `request_gpus=0`).
    #[arg(long, num_args = 0..)]
    pub search: Vec<String>,
    /// Debug logging.
    #[arg(long)]
    pub verbose: bool,
    /// Seconds between iterations.
    #[arg(long, default_value_t = 5)]
    pub sleep_time: u64,
    /// Restart the manager after this many seconds.
    #[arg(long)]
    pub restart_after_seconds: Option<u64>,
    /// Do not drop bundles that no worker shape fits.
    #[arg(long)]
    pub no_prefilter: bool,
    /// Run one iteration, print the plan and exit.
    #[arg(long)]
    pub once: bool,
    /// Seconds between launch rounds.
    #[arg(long, default_value_t = 60)]
    pub min_seconds_between_workers: u64,
    /// `--tag` of the workers.
    #[arg(long)]
    pub worker_tag: Option<String>,
    /// Base directory of the workers' `--work-dir`.
    #[arg(long)]
    pub worker_work_dir_prefix: Option<String>,
    /// `--max-work-dir-size` of the workers.
    #[arg(long)]
    pub worker_max_work_dir_size: Option<String>,
    /// `--delete-work-dir-on-exit` for the workers.
    #[arg(long)]
    pub worker_delete_work_dir_on_exit: bool,
    /// `--idle-seconds` of the workers (always with `--exit-when-idle`).
    #[arg(long, default_value_t = 600)]
    pub worker_idle_seconds: u64,
    /// `--download-dependencies-max-retries` of the workers.
    #[arg(long, default_value_t = 3)]
    pub worker_download_dependencies_max_retries: u32,
    /// `--checkin-frequency-seconds` of the workers.
    #[arg(long)]
    pub worker_checkin_frequency_seconds: Option<u64>,
    /// `--exit-after-num-runs` of the workers.
    #[arg(long)]
    pub worker_exit_after_num_runs: Option<i64>,
    /// `--pass-down-termination` for the workers.
    #[arg(long)]
    pub worker_pass_down_termination: bool,
    /// `--exit-on-exception` for the workers.
    #[arg(long)]
    pub worker_exit_on_exception: bool,
    /// `--tag-exclusive` for the workers (and only the tag's bundles are considered).
    #[arg(long)]
    pub worker_tag_exclusive: bool,
    /// `--group` of the workers.
    #[arg(long)]
    pub worker_group: Option<String>,
    /// The worker program.
    #[arg(long, default_value = "cl-worker")]
    pub worker_executable: String,
    /// `--shared-memory-size-gb` of the workers.
    #[arg(long)]
    pub worker_shared_memory_size_gb: Option<u64>,
    /// `--preemptible` for the workers.
    #[arg(long)]
    pub worker_preemptible: bool,
    /// TOML file with more worker shapes and the launch throttling (see examples/manager.toml).
    #[arg(long, env = "CL_WORKER_MANAGER_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Serve Prometheus `/metrics`, `/status` (the last plan) and `/healthz` on this address,
    /// e.g. 127.0.0.1:9464.
    #[arg(long, env = "CL_WORKER_MANAGER_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl GlobalArgs {
    /// The worker command line, in the Python manager's exact order: the fixed part, then the
    /// optional flags. Values that Python drops when falsy are dropped the same way.
    /// `network_prefix` replaces Python's per-worker `cl_worker_<id>_network` (workers sharing one
    /// Docker engine share its networks).
    pub fn worker_command(
        &self,
        worker_id: &str,
        work_dir: &str,
        network_prefix: Option<&str>,
    ) -> Vec<String> {
        let mut cmd: Vec<String> = vec![
            self.worker_executable.clone(),
            "--server".into(),
            self.server.clone(),
            "--verbose".into(),
            "--exit-when-idle".into(),
            "--idle-seconds".into(),
            self.worker_idle_seconds.to_string(),
            "--work-dir".into(),
            work_dir.into(),
            "--id".into(),
            format!("host-{worker_id}"),
            "--network-prefix".into(),
            network_prefix.map_or_else(|| format!("cl_worker_{worker_id}_network"), str::to_string),
        ];
        let mut opt = |flag: &str, value: Option<String>| {
            if let Some(v) = value {
                cmd.push(flag.into());
                cmd.push(v);
            }
        };
        opt("--tag", self.worker_tag.clone());
        opt("--group", self.worker_group.clone());
        opt(
            "--exit-after-num-runs",
            self.worker_exit_after_num_runs
                .filter(|n| *n > 0)
                .map(|n| n.to_string()),
        );
        opt(
            "--download-dependencies-max-retries",
            Some(self.worker_download_dependencies_max_retries)
                .filter(|n| *n > 0)
                .map(|n| n.to_string()),
        );
        opt("--max-work-dir-size", self.worker_max_work_dir_size.clone());
        let flags = [
            (
                self.worker_delete_work_dir_on_exit,
                "--delete-work-dir-on-exit",
            ),
            (self.worker_exit_on_exception, "--exit-on-exception"),
            (self.worker_tag_exclusive, "--tag-exclusive"),
            (self.worker_pass_down_termination, "--pass-down-termination"),
        ];
        for (on, flag) in flags {
            if on {
                cmd.push(flag.into());
            }
        }
        if let Some(n) = self.worker_checkin_frequency_seconds.filter(|n| *n > 0) {
            cmd.extend(["--checkin-frequency-seconds".into(), n.to_string()]);
        }
        if let Some(n) = self.worker_shared_memory_size_gb.filter(|n| *n > 0) {
            cmd.extend(["--shared-memory-size-gb".into(), n.to_string()]);
        }
        if self.worker_preemptible {
            cmd.push("--preemptible".into());
        }
        cmd
    }

    /// Keywords of the staged-bundle query: `state=staged`, the `--search` terms, `.mine` unless
    /// the manager runs as the `codalab` root user, and the tag's queue when tag-exclusive.
    pub fn staged_keywords(&self, username: &str) -> Vec<String> {
        let mut k = vec!["state=staged".to_string()];
        k.extend(self.search.iter().cloned());
        if username != "codalab" {
            k.push(".mine".into());
        }
        if let (true, Some(tag)) = (self.worker_tag_exclusive, &self.worker_tag) {
            k.push(format!("request_queue={tag},tag={tag}"));
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).unwrap()
    }

    #[test]
    fn definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn python_defaults() {
        let c = parse(&["cl-worker-manager", "local"]);
        let g = &c.global;
        assert_eq!(g.server, "https://worksheets.codalab.org");
        assert!(g.temp_session);
        assert_eq!((g.min_workers, g.max_workers), (1, 10));
        assert_eq!(g.sleep_time, 5);
        assert_eq!(g.min_seconds_between_workers, 60);
        assert_eq!(g.worker_idle_seconds, 600);
        assert_eq!(g.worker_download_dependencies_max_retries, 3);
        assert_eq!(g.worker_executable, "cl-worker");
        assert!(g.search.is_empty() && !g.once && !g.no_prefilter);
        let Backend::Local(l) = c.backend else {
            panic!("local")
        };
        assert_eq!(
            (l.shape.cpus, l.shape.gpus, l.shape.memory_mb),
            (1, 0, 2048)
        );
        let c = parse(&["cl-worker-manager", "slurm-batch", "--partition", "p"]);
        let Backend::SlurmBatch(s) = c.backend else {
            panic!("slurm")
        };
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
        assert!(Cli::try_parse_from(["cl-worker-manager", "slurm-batch"]).is_err());
        let c = parse(&["cl-worker-manager", "aws-batch"]);
        let Backend::AwsBatch(a) = c.backend else {
            panic!("aws")
        };
        assert_eq!(
            (
                a.region.as_str(),
                a.job_definition_name.as_str(),
                a.job_queue.as_str()
            ),
            ("us-east-1", "codalab-worker", "codalab-batch-cpu")
        );
        assert_eq!(
            (
                a.shape.cpus,
                a.shape.gpus,
                a.shape.memory_mb,
                a.user.as_str()
            ),
            (1, 0, 2048, "root")
        );
        let c = parse(&["cl-worker-manager", "--temp-session", "local"]);
        assert!(
            !c.global.temp_session,
            "the flag turns the temporary session off"
        );
    }

    #[test]
    fn base_worker_command_in_pythons_order() {
        let c = parse(&["cl-worker-manager", "--server", "http://s:2900", "local"]);
        assert_eq!(
            c.global.worker_command("abc", "/w/abc", None),
            [
                "cl-worker",
                "--server",
                "http://s:2900",
                "--verbose",
                "--exit-when-idle",
                "--idle-seconds",
                "600",
                "--work-dir",
                "/w/abc",
                "--id",
                "host-abc",
                "--network-prefix",
                "cl_worker_abc_network",
                "--download-dependencies-max-retries",
                "3",
            ]
        );
    }

    #[test]
    fn every_worker_flag_is_passed_down_in_order() {
        let c = parse(&[
            "cl-worker-manager",
            "--worker-tag",
            "gpu",
            "--worker-group",
            "g",
            "--worker-exit-after-num-runs",
            "2",
            "--worker-download-dependencies-max-retries",
            "5",
            "--worker-max-work-dir-size",
            "20g",
            "--worker-delete-work-dir-on-exit",
            "--worker-exit-on-exception",
            "--worker-tag-exclusive",
            "--worker-pass-down-termination",
            "--worker-checkin-frequency-seconds",
            "7",
            "--worker-shared-memory-size-gb",
            "2",
            "--worker-preemptible",
            "--worker-executable",
            "/opt/cl-worker",
            "local",
        ]);
        let cmd = c.global.worker_command("x", "/w", None);
        assert_eq!(
            cmd[13..],
            [
                "--tag",
                "gpu",
                "--group",
                "g",
                "--exit-after-num-runs",
                "2",
                "--download-dependencies-max-retries",
                "5",
                "--max-work-dir-size",
                "20g",
                "--delete-work-dir-on-exit",
                "--exit-on-exception",
                "--tag-exclusive",
                "--pass-down-termination",
                "--checkin-frequency-seconds",
                "7",
                "--shared-memory-size-gb",
                "2",
                "--preemptible",
            ]
        );
        assert_eq!(cmd[0], "/opt/cl-worker");
    }

    #[test]
    fn falsy_values_are_dropped_like_python() {
        let c = parse(&[
            "cl-worker-manager",
            "--worker-download-dependencies-max-retries",
            "0",
            "--worker-exit-after-num-runs",
            "0",
            "local",
        ]);
        let cmd = c.global.worker_command("x", "/w", None);
        assert_eq!(cmd.len(), 13, "{cmd:?}");
    }

    #[test]
    fn staged_query_keywords() {
        let c = parse(&[
            "cl-worker-manager",
            "--search",
            "request_gpus=0",
            "size=.sort",
            "--worker-tag",
            "t1",
            "--worker-tag-exclusive",
            "local",
        ]);
        assert_eq!(
            c.global.staged_keywords("alice"),
            [
                "state=staged",
                "request_gpus=0",
                "size=.sort",
                ".mine",
                "request_queue=t1,tag=t1"
            ]
        );
        assert_eq!(
            c.global.staged_keywords("codalab")[3],
            "request_queue=t1,tag=t1"
        );
        // A tag without exclusivity adds no queue filter.
        let c = parse(&["cl-worker-manager", "--worker-tag", "t", "local"]);
        assert_eq!(c.global.staged_keywords("bob"), ["state=staged", ".mine"]);
    }

    #[test]
    fn subcommand_is_required() {
        assert!(Cli::try_parse_from(["cl-worker-manager"]).is_err());
    }
}
