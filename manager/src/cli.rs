//! `cl-worker-manager` global flags, with the Python manager's names and defaults, the typed
//! [`Settings`] built from them, and the backend subcommands (each backend owns its flags).

use std::time::Duration;

use backends::{AwsBatchArgs, AzureBatchArgs, KubernetesArgs, LocalArgs, SlurmArgs};
use clap::{Args, Parser, Subcommand};

use crate::settings::{Settings, WorkerFlags};

/// Launches CodaLab workers on a backend when the server has staged bundles.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cl-worker-manager",
    version = common::version_with_commit!(),
    infer_long_args = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The backend; none with `--config` naming `[[tier]]` sections (several backends).
    #[command(subcommand)]
    pub backend: Option<BackendCommand>,
}

/// The backend subcommands, each wrapping its backend's own flags, and `status`.
#[derive(Debug, Clone, Subcommand)]
pub enum BackendCommand {
    /// Workers as child processes on this machine.
    Local(LocalArgs),
    /// Workers as Slurm batch jobs (`sbatch`, then `srun cl-worker` on the compute node).
    SlurmBatch(Box<SlurmArgs>),
    /// Workers as AWS Batch jobs running the worker image.
    AwsBatch(Box<AwsBatchArgs>),
    /// Workers as Azure Batch tasks running the worker image, in a job on an autoscale pool.
    AzureBatch(Box<AzureBatchArgs>),
    /// Workers as Kubernetes pods (one per worker), on any cluster.
    Kubernetes(Box<KubernetesArgs>),
    /// Print the status of a running manager (its --metrics-addr) as a table; the exit status
    /// tells its health (0 healthy, 3 breaker open, 4 degraded, 65 not a manager's answer, 69
    /// unreachable).
    #[command(after_help = crate::status::exit::HELP)]
    Status(StatusArgs),
    /// `completions SHELL` or `man`: print the manager's own documentation.
    #[command(flatten)]
    Docs(common::docs::DocCommand),
}

/// `cl-worker-manager status [URL]`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The manager's --metrics-addr as a URL (default: http:// + the global --metrics-addr or
    /// CL_WORKER_MANAGER_METRICS_ADDR, else http://127.0.0.1:9464).
    pub url: Option<String>,
    /// Print the status as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// After the table, list the staged bundles, each with why it is not running yet.
    #[arg(long)]
    pub bundles: bool,
    /// Seconds to wait for the manager's answer.
    #[arg(long, default_value_t = 5)]
    pub timeout: u64,
}

impl StatusArgs {
    /// The URL to read: the argument, else the global `--metrics-addr`, else the default port.
    pub fn url(&self, metrics_addr: Option<std::net::SocketAddr>) -> String {
        match (&self.url, metrics_addr) {
            (Some(u), _) => u.clone(),
            (None, Some(a)) => format!("http://{a}"),
            (None, None) => "http://127.0.0.1:9464".into(),
        }
    }
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
    /// Log lines as `text` or `json` (one JSON object per line, for log collectors).
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "CL_WORKER_MANAGER_LOG_FORMAT"
    )]
    pub log_format: common::process::LogFormat,
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
    /// Where the lease lives that lets only one of several managers launch:
    /// `file:PATH` (a file on a file system every manager shares) or
    /// `kubernetes:[NAMESPACE/]NAME` (a coordination.k8s.io/v1 Lease). Without it this manager
    /// is alone in charge.
    #[arg(
        long,
        help_heading = "Leader election",
        env = "CL_WORKER_MANAGER_LEASE"
    )]
    pub lease: Option<crate::lease::LeaseSpec>,
    /// Seconds the holder gives the others: it renews every third of it, stops launching at
    /// two thirds without a renewal, and another takes over once it has gone unrenewed for the
    /// whole of it.
    #[arg(
        long,
        help_heading = "Leader election",
        default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(3..=3600)
    )]
    pub lease_duration_seconds: u64,
    /// This manager's identity in the lease (default: host name, process id and a random
    /// suffix; unique per process).
    #[arg(long, help_heading = "Leader election")]
    pub lease_identity: Option<String>,
    /// Seconds between launch rounds.
    #[arg(long, default_value_t = 60)]
    pub min_seconds_between_workers: u64,
    /// `--tag` of the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_tag: Option<String>,
    /// Base directory of the workers' `--work-dir`.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_work_dir_prefix: Option<String>,
    /// `--max-work-dir-size` of the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_max_work_dir_size: Option<String>,
    /// `--delete-work-dir-on-exit` for the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_delete_work_dir_on_exit: bool,
    /// `--idle-seconds` of the workers (always with `--exit-when-idle`).
    #[arg(
        long,
        help_heading = "Worker launch (passed to every worker)",
        default_value_t = 600
    )]
    pub worker_idle_seconds: u64,
    /// `--download-dependencies-max-retries` of the workers.
    #[arg(
        long,
        help_heading = "Worker launch (passed to every worker)",
        default_value_t = 3
    )]
    pub worker_download_dependencies_max_retries: u32,
    /// `--checkin-frequency-seconds` of the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_checkin_frequency_seconds: Option<u64>,
    /// `--exit-after-num-runs` of the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_exit_after_num_runs: Option<i64>,
    /// `--pass-down-termination` for the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_pass_down_termination: bool,
    /// `--exit-on-exception` for the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_exit_on_exception: bool,
    /// `--tag-exclusive` for the workers (and only the tag's bundles are considered).
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_tag_exclusive: bool,
    /// `--group` of the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_group: Option<String>,
    /// The worker program.
    #[arg(
        long,
        help_heading = "Worker launch (passed to every worker)",
        default_value = "cl-worker"
    )]
    pub worker_executable: String,
    /// `--shared-memory-size-gb` of the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_shared_memory_size_gb: Option<u64>,
    /// `--preemptible` for the workers.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub worker_preemptible: bool,
    /// `--preemption-notice` of the workers: on spot or low-priority capacity, `aws`, `azure`,
    /// `gcp` or `auto` makes them read the cloud's notice of a coming reclaim and hand their
    /// runs back before it; `none` switches it off. Default: `aws` on `aws-batch` (as
    /// CodaLab's AWS Batch job command watches for EC2 spot interruptions), `none` elsewhere.
    /// Needs workers of this project. Not a flag of the Python manager.
    #[arg(long, help_heading = "Worker launch (passed to every worker)", value_parser = ["none", "auto", "aws", "azure", "gcp"])]
    pub worker_preemption_notice: Option<String>,
    /// `--run-as-user` of the workers: every bundle runs as this unprivileged `UID[:GID]`, with
    /// no capabilities (see docs/security.md); `none` runs bundles as their directory's owner
    /// even in a worker image that sets another default. Needs workers of this project. Not a
    /// flag of the Python manager.
    #[arg(long, help_heading = "Worker launch (passed to every worker)", value_name = "UID[:GID]", value_parser = parse_run_as_user)]
    pub worker_run_as_user: Option<String>,
    /// Do not start workers warm. By default each new worker is told the images and
    /// dependencies of the staged bundles it is launched for (`--prefetch-image`,
    /// `--prefetch-dependency`), which it fetches as it starts, before the server hands it a
    /// run; and where each worker has a work dir of its own (local, AWS Batch) the workers
    /// share one dependency cache beside them (`--dependency-cache-dir`) that outlives each
    /// worker. Python's `cl-worker` refuses those flags: workers of Python's image need this
    /// switch. Not a flag of the Python manager.
    #[arg(long, help_heading = "Worker launch (passed to every worker)")]
    pub no_worker_prefetch: bool,
    /// TOML file with more worker shapes and the launch throttling (see examples/manager.toml),
    /// or, without a backend subcommand, the [[tier]] sections of several backends (see
    /// examples/tiers.toml).
    #[arg(long, env = "CL_WORKER_MANAGER_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Serve Prometheus `/metrics`, `/status` (the last plan) and `/healthz` on this address,
    /// e.g. 127.0.0.1:9464.
    #[arg(long, env = "CL_WORKER_MANAGER_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// `--worker-run-as-user`: numeric `UID[:GID]`, not root's, as the worker checks it, or `none`
/// (passed on: it switches off a worker image's `CL_WORKER_RUN_AS_USER`); empty passes nothing.
fn parse_run_as_user(s: &str) -> Result<String, String> {
    if s.is_empty() || s == "none" {
        return Ok(s.to_owned());
    }
    let ids: Vec<_> = s.split(':').collect();
    let ok = (1..=2).contains(&ids.len())
        && ids.iter().all(|i| {
            i.parse::<u32>().is_ok_and(|n| n != 0) && i.chars().all(|c| c.is_ascii_digit())
        });
    ok.then(|| s.to_owned())
        .ok_or_else(|| format!("{s:?}: expected a numeric, non-root UID or UID:GID (or none)"))
}

impl GlobalArgs {
    /// The global flags' part of a policy configuration.
    pub fn apply_policy_flags(&self, config: &mut crate::policy::Config) {
        config.min_workers = self.min_workers as usize;
        config.max_workers = self.max_workers as usize;
        config.min_seconds_between_workers = self.min_seconds_between_workers as f64;
        config.worker_tag = self.worker_tag.clone();
        config.worker_tag_exclusive = self.worker_tag_exclusive;
        config.prefilter = !self.no_prefilter;
    }

    /// The typed settings of the control loop and of the worker command line.
    pub fn settings(&self) -> Settings {
        Settings {
            server: self.server.clone(),
            sleep_time: Duration::from_secs(self.sleep_time.max(1)),
            restart_after: self.restart_after_seconds.map(Duration::from_secs),
            worker: WorkerFlags {
                executable: self.worker_executable.clone(),
                server: self.server.clone(),
                idle_seconds: self.worker_idle_seconds,
                tag: self.worker_tag.clone(),
                group: self.worker_group.clone(),
                exit_after_num_runs: self.worker_exit_after_num_runs,
                download_dependencies_max_retries: self.worker_download_dependencies_max_retries,
                max_work_dir_size: self.worker_max_work_dir_size.clone(),
                delete_work_dir_on_exit: self.worker_delete_work_dir_on_exit,
                exit_on_exception: self.worker_exit_on_exception,
                tag_exclusive: self.worker_tag_exclusive,
                pass_down_termination: self.worker_pass_down_termination,
                checkin_frequency_seconds: self.worker_checkin_frequency_seconds,
                shared_memory_size_gb: self.worker_shared_memory_size_gb,
                preemptible: self.worker_preemptible,
                preemption_notice: self.worker_preemption_notice.clone(),
                run_as_user: self.worker_run_as_user.clone().filter(|u| !u.is_empty()),
                env: crate::settings::sentry_env(|k| std::env::var(k).ok()),
                prefetch: !self.no_worker_prefetch,
            },
        }
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
    fn completions_man_page_and_the_commit_in_the_version() {
        let c = parse(&["cl-worker-manager", "completions", "bash"]);
        assert!(matches!(
            c.backend,
            Some(BackendCommand::Docs(
                common::docs::DocCommand::Completions { .. }
            ))
        ));
        let mut script = Vec::new();
        common::docs::DocCommand::Completions {
            shell: clap_complete::Shell::Bash,
        }
        .write(Cli::command(), &mut script)
        .unwrap();
        let script = String::from_utf8(script).unwrap();
        assert!(
            script.contains("aws-batch") && script.contains("--job-queue"),
            "{script}"
        );
        let c = parse(&["cl-worker-manager", "man"]);
        assert!(matches!(
            c.backend,
            Some(BackendCommand::Docs(common::docs::DocCommand::Man))
        ));
        let version = Cli::command().get_version().unwrap().to_string();
        assert!(
            version.starts_with(env!("CARGO_PKG_VERSION")) && version.ends_with(')'),
            "{version}"
        );
        // The workers' flags under their own heading.
        let help = Cli::command().render_long_help().to_string();
        let heading = help
            .find("Worker launch (passed to every worker):")
            .expect(&help);
        assert!(help[heading..].contains("--worker-idle-seconds"), "{help}");
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
        // Each backend's own flags and defaults are tested beside its args.rs; here, that
        // every subcommand reaches its backend.
        for (name, extra) in [
            ("local", &[][..]),
            ("slurm-batch", &["--partition", "p"][..]),
            ("aws-batch", &[]),
            ("kubernetes", &[]),
            (
                "azure-batch",
                &[
                    "--service-url",
                    "https://a.westus2.batch.azure.com",
                    "--job-id",
                    "j",
                    "--log-container-url",
                    "https://l.blob.core.windows.net/w",
                ],
            ),
        ] {
            let mut argv = vec!["cl-worker-manager", name];
            argv.extend_from_slice(extra);
            let c = parse(&argv);
            let picked = match c.backend {
                Some(BackendCommand::Local(_)) => "local",
                Some(BackendCommand::SlurmBatch(_)) => "slurm-batch",
                Some(BackendCommand::AwsBatch(_)) => "aws-batch",
                Some(BackendCommand::AzureBatch(_)) => "azure-batch",
                Some(BackendCommand::Kubernetes(_)) => "kubernetes",
                Some(BackendCommand::Status(_)) => "status",
                Some(BackendCommand::Docs(_)) => "docs",
                None => "none",
            };
            assert_eq!(picked, name);
        }
        assert!(Cli::try_parse_from(["cl-worker-manager", "slurm-batch"]).is_err());
        let c = parse(&["cl-worker-manager", "--temp-session", "local"]);
        assert!(
            !c.global.temp_session,
            "the flag turns the temporary session off"
        );
    }

    #[test]
    fn status_subcommand_and_log_format() {
        let c = parse(&["cl-worker-manager", "status"]);
        let Some(BackendCommand::Status(a)) = &c.backend else {
            panic!("status")
        };
        assert_eq!(a.url(None), "http://127.0.0.1:9464");
        assert_eq!(
            a.url(Some("127.0.0.1:9500".parse().unwrap())),
            "http://127.0.0.1:9500"
        );
        let c = parse(&["cl-worker-manager", "status", "http://m:1", "--json"]);
        let Some(BackendCommand::Status(a)) = &c.backend else {
            panic!("status")
        };
        assert_eq!((a.url(None).as_str(), a.json), ("http://m:1", true));
        // The backends parse as before, and the log format is a global flag.
        let c = parse(&["cl-worker-manager", "--log-format", "json", "local"]);
        assert_eq!(c.global.log_format, common::process::LogFormat::Json);
        assert!(matches!(c.backend, Some(BackendCommand::Local(_))));
        // No subcommand: the tiers of --config name the backends.
        assert!(parse(&["cl-worker-manager", "--config", "t.toml"])
            .backend
            .is_none());
        assert_eq!(
            parse(&["cl-worker-manager", "local"]).global.log_format,
            common::process::LogFormat::Text
        );
    }

    #[test]
    fn base_worker_command_in_pythons_order() {
        let c = parse(&["cl-worker-manager", "--server", "http://s:2900", "local"]);
        assert_eq!(
            c.global.settings().worker.command("abc", "/w/abc", None),
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
            "--worker-preemption-notice",
            "aws",
            "--worker-run-as-user",
            "1000:1000",
            "--worker-executable",
            "/opt/cl-worker",
            "local",
        ]);
        let cmd = c.global.settings().worker.command("x", "/w", None);
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
                "--preemption-notice",
                "aws",
                "--run-as-user",
                "1000:1000",
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
        let cmd = c.global.settings().worker.command("x", "/w", None);
        assert_eq!(cmd.len(), 13, "{cmd:?}");
    }

    #[test]
    fn the_workers_run_user_is_checked_and_none_passes_nothing() {
        for ok in ["1000", "1000:2000"] {
            assert!(Cli::try_parse_from(["m", "--worker-run-as-user", ok, "local"]).is_ok());
        }
        for bad in ["0", "0:0", "1000:0", "nobody", "1:2:3", "+5", ""] {
            let parsed = Cli::try_parse_from(["m", "--worker-run-as-user", bad, "local"]);
            if bad.is_empty() {
                let c = parsed.unwrap();
                let cmd = c.global.settings().worker.command("x", "/w", None);
                assert!(!cmd.contains(&"--run-as-user".to_string()), "{cmd:?}");
            } else {
                assert!(parsed.is_err(), "{bad}");
            }
        }
        // `none` is passed on: it switches off the worker image's default.
        let c = parse(&["m", "--worker-run-as-user", "none", "local"]);
        let cmd = c.global.settings().worker.command("x", "/w", None);
        assert!(
            cmd.ends_with(&["--run-as-user".to_string(), "none".into()]),
            "{cmd:?}"
        );
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

    /// Without a subcommand the backends come from --config's [[tier]] sections; without
    /// them the start-up says what to give.
    #[tokio::test]
    async fn a_backend_or_tiers_are_required() {
        let c = Cli::try_parse_from(["cl-worker-manager"]).unwrap();
        assert!(c.backend.is_none());
        let stop = tokio_util::sync::CancellationToken::new();
        let e = crate::tiers::start::start(&c.global, &stop)
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("name a backend (local, slurm-batch"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shapes.toml");
        std::fs::write(
            &path,
            "[[shape]]\nname = \"big\"\ncpus = 8\nmemory_mb = 1024\n",
        )
        .unwrap();
        let c =
            Cli::try_parse_from(["cl-worker-manager", "--config", path.to_str().unwrap()]).unwrap();
        let e = crate::tiers::start::start(&c.global, &stop)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no [[tier]] section"), "{e}");
        // And a tiers file with a backend subcommand is refused.
        std::fs::write(&path, "[[tier]]\nname = \"a\"\nbackend = \"local\"\n").unwrap();
        let c = Cli::try_parse_from([
            "cl-worker-manager",
            "--config",
            path.to_str().unwrap(),
            "local",
        ])
        .unwrap();
        let e = crate::app::policy_config(&c.global, crate::policy::Shape::from_flags(1, 0, 1024))
            .unwrap_err();
        assert!(
            e.to_string().contains("without a backend subcommand"),
            "{e}"
        );
    }
}
