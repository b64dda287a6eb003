//! `cl-worker` command line: every flag of the Python worker, with its defaults.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::format::parse_size;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    Docker,
    Kubernetes,
    /// The Docker runtime on Podman's socket (not a Python value: an addition).
    Podman,
}

fn default_id() -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into());
    format!("{host}({})", std::process::id())
}

fn parse_tag(s: &str) -> Result<String, String> {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        Ok(s.to_owned())
    } else {
        Err("Worker tag must only contain letters, numbers or hyphens.".into())
    }
}

/// `--run-as-user`: a user and group (`None`: the flag switched off, by `none` or an empty
/// value, as an image's `CL_WORKER_RUN_AS_USER` default is switched off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAsUser(pub Option<(u32, u32)>);

/// `UID[:GID]`, numeric, never root's; `none` or empty for none.
fn parse_run_as_user(s: &str) -> Result<RunAsUser, String> {
    if s.is_empty() || s == "none" {
        return Ok(RunAsUser(None));
    }
    let num = |v: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("{v:?} is not a numeric user or group id (UID[:GID])"))
    };
    let (uid, gid) = match s.split_once(':') {
        Some((u, g)) => (num(u)?, num(g)?),
        None => (num(s)?, num(s)?),
    };
    if uid == 0 || gid == 0 {
        return Err(
            "the user and group must not be root's (0): leave the flag out to run bundles as \
                    their directory's owner"
                .into(),
        );
    }
    Ok(RunAsUser(Some((uid, gid))))
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// Runs CodaLab run bundles in Docker containers on this machine.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cl-worker",
    version = common::version_with_commit!(),
    infer_long_args = true
)]
pub struct Args {
    /// `completions SHELL` or `man`: print the worker's own documentation and exit (no other
    /// flag is read).
    #[command(subcommand)]
    pub docs: Option<common::docs::DocCommand>,

    /// Tag (letters, numbers or hyphens) that allows for scheduling runs on specific workers.
    #[arg(long, value_parser = parse_tag)]
    pub tag: Option<String>,

    /// URL of the CodaLab server, <http|https>://<hostname>[:<port>].
    #[arg(long, default_value = "https://worksheets.codalab.org")]
    pub server: String,

    /// URL of the CodaLab websocket server, <ws|wss>://<hostname>[:<port>]; derived from
    /// --server when not given.
    #[arg(long)]
    pub ws_server: Option<String>,

    /// Directory for temporary bundle data: dependencies and the data of run bundles.
    #[arg(long, default_value = "codalab-worker-scratch")]
    pub work_dir: PathBuf,

    /// Comma-separated list of CPUs in which to allow bundle execution (e.g. "0,2,3"), or ALL.
    #[arg(long, value_name = "CPUSET_STR", default_value = "ALL")]
    pub cpuset: String,

    /// Comma-separated list of GPUs (indices or UUIDs) in which to allow bundle execution, ALL,
    /// or NONE.
    #[arg(long, value_name = "GPUSET_STR", default_value = "ALL")]
    pub gpuset: String,

    /// Maximum size of the temporary bundle data (e.g. 3, 3k, 3m, 3g, 3t).
    #[arg(long, value_name = "SIZE", default_value = "10g", value_parser = parse_size_arg)]
    pub max_work_dir_size: u64,

    /// Limit the memory reported to the server (e.g. 3, 3k, 3m, 3g, 3t).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub max_memory: Option<u64>,

    /// File holding the username and the password on separate lines (mode 600), or a
    /// directory holding the files `username` and `password` (a mounted Kubernetes Secret).
    /// Without it, CODALAB_USERNAME and CODALAB_PASSWORD are used.
    #[arg(long)]
    pub password_file: Option<PathBuf>,

    /// Output verbose (debug) log messages.
    #[arg(long)]
    pub verbose: bool,

    /// Quit when there is nothing to run after a checkin (see --idle-seconds).
    #[arg(long)]
    pub exit_when_idle: bool,

    /// The runtime through which bundles run.
    #[arg(long, value_enum, default_value = "docker")]
    pub bundle_runtime: RuntimeKind,

    /// Not running anything for this many seconds constitutes idle.
    #[arg(long, default_value_t = 0)]
    pub idle_seconds: u64,

    /// Seconds between checkins when nothing changes.
    #[arg(long, default_value_t = 5)]
    pub checkin_frequency_seconds: u64,

    /// ID of this worker; use a stable value so that a restarted worker resumes its runs.
    #[arg(long, default_value_t = default_id())]
    pub id: String,

    /// The server and the worker share the bundle store on their file systems.
    #[arg(long)]
    pub shared_file_system: bool,

    /// Name of the group that can run jobs on this worker.
    #[arg(long)]
    pub group: Option<String>,

    /// Only run bundles that request this worker's tag.
    #[arg(long)]
    pub tag_exclusive: bool,

    /// On SIGTERM, SIGINT or SIGHUP, stop all runs and hand them back to the server (staged).
    #[arg(long)]
    pub pass_down_termination: bool,

    /// Poll the cloud's notice of a coming reclaim of this machine (EC2 spot interruption and
    /// rebalance recommendation, Azure Scheduled Events, GCE preemption) once a second from the
    /// worker's process, and hand the runs back before the reclaim; `auto`: the first metadata
    /// service that answers. Not a flag of the Python worker.
    #[arg(long, value_enum, default_value = "none")]
    pub preemption_notice: crate::notice::Source,

    /// Delete the work directory when the worker exits.
    #[arg(long)]
    pub delete_work_dir_on_exit: bool,

    /// Quit after this many runs were assigned to this worker.
    #[arg(long, default_value_t = protocol::DEFAULT_EXIT_AFTER_NUM_RUNS)]
    pub exit_after_num_runs: i64,

    /// Exit after an unexpected error instead of sleeping and going on.
    #[arg(long)]
    pub exit_on_exception: bool,

    /// Attempts at downloading a dependency.
    #[arg(long, default_value_t = 3)]
    pub download_dependencies_max_retries: u32,

    /// Shared memory size of run containers, in GB.
    #[arg(long, default_value_t = 1)]
    pub shared_memory_size_gb: u64,

    /// Most processes and threads one run's container may have (0: no limit). Contains fork
    /// bombs. Not a flag of the Python worker.
    #[arg(long, default_value_t = 4096)]
    pub pids_limit: i64,

    /// Run every bundle as this unprivileged user (`UID[:GID]`, numeric; the group defaults to
    /// the uid), owner of its bundle directory only, with no capabilities: a run that reached a
    /// file of the host still holds only what that user may read. Images that expect root
    /// (installing packages at run time, say) fail under it. Default: the owner of the bundle
    /// directory, as CodaLab does (`none` or an empty value also means that, to switch off an
    /// image's default). Not a flag of the Python worker.
    #[arg(long, value_name = "UID[:GID]", value_parser = parse_run_as_user, env = "CL_WORKER_RUN_AS_USER")]
    pub run_as_user: Option<RunAsUser>,

    /// Log lines as `text` or `json` (one JSON object per line, for log collectors). Not a flag
    /// of the Python worker.
    #[arg(long, value_enum, default_value = "text", env = "CL_WORKER_LOG_FORMAT")]
    pub log_format: common::process::LogFormat,

    /// Serve Prometheus metrics at `/metrics` on this address (e.g. 127.0.0.1:9465); off by
    /// default. Not a flag of the Python worker.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// This worker may be preempted (its runs go back to staged when it disappears).
    #[arg(long)]
    pub preemptible: bool,

    /// The directory of the dependency cache (its `dependencies/`, state file and lock);
    /// default: the work dir. Workers given the same directory share one cache, which outlives
    /// each of them (the manager passes one where each worker has a work dir of its own). On a
    /// network file system too: the cache's lock is NFS-safe. Not a flag of the Python worker.
    #[arg(
        long,
        value_name = "DIR",
        help_heading = "Start warm (not flags of the Python worker)"
    )]
    pub dependency_cache_dir: Option<PathBuf>,

    /// Pull this image as the worker starts, before a run asks for it (repeatable, at most 16;
    /// the manager passes the images of the staged bundles it launched the worker for).
    /// Within `--max-image-size` and `--max-image-cache-size`; a run whose image is still
    /// being pulled waits for that pull. Not a flag of the Python worker.
    #[arg(long, value_name = "IMAGE", value_parser = crate::prefetch::parse_image, help_heading = "Start warm (not flags of the Python worker)")]
    pub prefetch_image: Vec<String>,

    /// Download this dependency (`UUID[:PATH]`) into the dependency cache as the worker starts,
    /// before a run asks for it (repeatable, at most 64), and report it as cached. Within
    /// `--max-work-dir-size`; a run needing it while it downloads waits for that download. Not
    /// a flag of the Python worker.
    #[arg(long, value_name = "UUID[:PATH]", value_parser = crate::prefetch::parse_dependency, help_heading = "Start warm (not flags of the Python worker)")]
    pub prefetch_dependency: Vec<(String, String)>,

    #[command(flatten)]
    pub docker: crate::runtime::docker::args::DockerArgs,

    #[command(flatten)]
    pub kubernetes: crate::runtime::kubernetes::args::KubernetesArgs,
}

impl Args {
    /// At most [`MAX_IMAGES`](crate::prefetch::MAX_IMAGES) `--prefetch-image` and
    /// [`MAX_DEPENDENCIES`](crate::prefetch::MAX_DEPENDENCIES) `--prefetch-dependency`.
    pub fn check_prefetch(&self) -> Result<(), String> {
        use crate::prefetch::{MAX_DEPENDENCIES, MAX_IMAGES};
        if self.prefetch_image.len() > MAX_IMAGES {
            return Err(format!(
                "at most {MAX_IMAGES} --prefetch-image flags (given {})",
                self.prefetch_image.len()
            ));
        }
        if self.prefetch_dependency.len() > MAX_DEPENDENCIES {
            return Err(format!(
                "at most {MAX_DEPENDENCIES} --prefetch-dependency flags (given {})",
                self.prefetch_dependency.len()
            ));
        }
        Ok(())
    }

    /// `--ws-server`, or derived from `--server`: `https`→`wss`, `http`→`ws`, plus `/ws`.
    pub fn ws_server(&self) -> String {
        if let Some(ws) = &self.ws_server {
            return ws.trim_end_matches('/').to_owned();
        }
        let server = self.server.trim_end_matches('/');
        match reqwest::Url::parse(server) {
            Ok(mut u) if matches!(u.scheme(), "http" | "https") => {
                let ws = if u.scheme() == "https" { "wss" } else { "ws" };
                // (http and ws are both special schemes: the change cannot fail.)
                let _ = u.set_scheme(ws);
                let path = format!("{}/ws", u.path().trim_end_matches('/'));
                u.set_path(&path);
                u.to_string()
            }
            _ => format!("{server}/ws"),
        }
    }

    /// `--tag-exclusive` only counts when a tag is set.
    pub fn tag_exclusive_effective(&self) -> bool {
        self.tag_exclusive && self.tag.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_valid() {
        Args::command().debug_assert();
    }

    #[test]
    fn prefetch_flags_repeat_within_their_bounds() {
        let u = |i: usize| format!("0x{i:032x}");
        let mut argv: Vec<String> = vec!["cl-worker".into()];
        for i in 0..crate::prefetch::MAX_IMAGES {
            argv.extend(["--prefetch-image".into(), format!("img{i}")]);
        }
        for i in 0..crate::prefetch::MAX_DEPENDENCIES {
            argv.extend(["--prefetch-dependency".into(), format!("{}:d/{i}", u(i))]);
        }
        let a = Args::try_parse_from(&argv).unwrap();
        assert_eq!(a.prefetch_dependency[3], (u(3), "d/3".to_string()));
        assert!(a.check_prefetch().is_ok());
        let mut more = argv.clone();
        more.extend(["--prefetch-image".into(), "one-more".into()]);
        let e = Args::try_parse_from(&more)
            .unwrap()
            .check_prefetch()
            .unwrap_err();
        assert!(e.contains("at most 16 --prefetch-image"), "{e}");
        let mut more = argv;
        more.extend(["--prefetch-dependency".into(), u(99)]);
        let e = Args::try_parse_from(&more)
            .unwrap()
            .check_prefetch()
            .unwrap_err();
        assert!(e.contains("at most 64 --prefetch-dependency"), "{e}");
        assert!(Args::try_parse_from(["cl-worker", "--prefetch-dependency", "x"]).is_err());
    }

    #[test]
    fn completions_man_page_and_the_commit_in_the_version() {
        let a = Args::try_parse_from(["cl-worker", "completions", "zsh"]).unwrap();
        assert!(matches!(
            a.docs,
            Some(common::docs::DocCommand::Completions { .. })
        ));
        let a = Args::try_parse_from(["cl-worker", "man"]).unwrap();
        assert!(matches!(a.docs, Some(common::docs::DocCommand::Man)));
        let mut page = Vec::new();
        common::docs::DocCommand::Man
            .write(Args::command(), &mut page)
            .unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains("max\\-work\\-dir\\-size"), "{page}");
        let version = Args::command().get_version().unwrap().to_string();
        assert!(
            version.starts_with(env!("CARGO_PKG_VERSION")) && version.ends_with(')'),
            "{version}"
        );
        // The runtimes' flags under their own headings.
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("Docker and Podman runtimes:"), "{help}");
        assert!(help.contains("Kubernetes runtime:"), "{help}");
    }

    #[test]
    fn python_defaults() {
        let a = Args::try_parse_from(["cl-worker"]).unwrap();
        assert_eq!(a.server, "https://worksheets.codalab.org");
        assert_eq!(a.ws_server(), "wss://worksheets.codalab.org/ws");
        assert_eq!(a.work_dir, PathBuf::from("codalab-worker-scratch"));
        assert_eq!(a.docker.network_prefix, "codalab_worker_network");
        assert_eq!(a.cpuset, "ALL");
        assert_eq!(a.gpuset, "ALL");
        assert_eq!(a.max_work_dir_size, 10 << 30);
        assert_eq!(a.idle_seconds, 0);
        assert_eq!(a.checkin_frequency_seconds, 5);
        assert_eq!(a.exit_after_num_runs, 999_999_999);
        assert_eq!(a.download_dependencies_max_retries, 3);
        assert_eq!(a.shared_memory_size_gb, 1);
        assert_eq!(a.bundle_runtime, RuntimeKind::Docker);
        assert!(a.id.ends_with(&format!("({})", std::process::id())));
        assert!(!a.verbose && !a.exit_when_idle && !a.preemptible && !a.tag_exclusive);
        // The additions are off by default.
        assert_eq!(a.log_format, common::process::LogFormat::Text);
        assert_eq!(a.metrics_addr, None);
    }

    #[test]
    fn log_format_and_metrics_addr() {
        let a = Args::try_parse_from([
            "cl-worker",
            "--log-format",
            "json",
            "--metrics-addr",
            "127.0.0.1:9465",
        ])
        .unwrap();
        assert_eq!(a.log_format, common::process::LogFormat::Json);
        assert_eq!(a.metrics_addr, Some("127.0.0.1:9465".parse().unwrap()));
        assert!(Args::try_parse_from(["cl-worker", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn worker_manager_command_line_parses() {
        // What the Python worker managers pass (build_command).
        let a = Args::try_parse_from([
            "cl-worker",
            "--server",
            "http://127.0.0.1:2900",
            "--verbose",
            "--exit-when-idle",
            "--idle-seconds",
            "10",
            "--work-dir",
            "/tmp/w",
            "--id",
            "host-abc",
            "--network-prefix",
            "cl_worker_abc_network",
            "--tag",
            "gpu-a",
            "--tag-exclusive",
            "--pass-down-termination",
            "--exit-after-num-runs",
            "1",
            "--group",
            "g",
            "--password-file",
            "/p",
            "--checkin-frequency-seconds",
            "2",
            "--max-work-dir-size",
            "20g",
            "--max-memory",
            "4g",
            "--shared-file-system",
            "--preemptible",
            "--delete-work-dir-on-exit",
            "--exit-on-exception",
            "--download-dependencies-max-retries",
            "5",
            "--shared-memory-size-gb",
            "2",
            "--max-image-cache-size",
            "50g",
            "--max-image-size",
            "10g",
            "--cpuset",
            "0",
            "--gpuset",
            "NONE",
        ])
        .unwrap();
        assert_eq!(a.ws_server(), "ws://127.0.0.1:2900/ws");
        assert_eq!(a.tag.as_deref(), Some("gpu-a"));
        assert!(a.tag_exclusive_effective());
        assert_eq!(a.max_memory, Some(4 << 30));
        assert_eq!(a.exit_after_num_runs, 1);
    }

    #[test]
    fn argparse_style_abbreviations() {
        let a = Args::try_parse_from(["cl-worker", "--verb", "--work", "x"]).unwrap();
        assert!(a.verbose);
        assert_eq!(a.work_dir, PathBuf::from("x"));
    }

    #[test]
    fn bad_tag_and_size_are_rejected() {
        let e = Args::try_parse_from(["cl-worker", "--tag", "bad_tag"]).unwrap_err();
        assert!(e.to_string().contains("letters, numbers or hyphens"), "{e}");
        assert!(Args::try_parse_from(["cl-worker", "--max-work-dir-size", "lots"]).is_err());
        assert!(Args::try_parse_from(["cl-worker", "--bundle-runtime", "singularity"]).is_err());
    }

    #[test]
    fn kubelet_stats_only_when_asked() {
        // Off by default: the worker never calls nodes/proxy.
        let a = Args::try_parse_from(["cl-worker", "--bundle-runtime", "kubernetes"]).unwrap();
        assert!(!a.kubernetes.kubernetes_kubelet_stats);
        let a = Args::try_parse_from([
            "cl-worker",
            "--bundle-runtime",
            "kubernetes",
            "--kubernetes-namespace",
            "codalab",
            "--kubernetes-kubelet-stats",
        ])
        .unwrap();
        assert!(a.kubernetes.kubernetes_kubelet_stats);
        assert_eq!(a.kubernetes.kubernetes_namespace, "codalab");
        // A switch: it takes no value on the command line.
        assert!(Args::try_parse_from(["cl-worker", "--kubernetes-kubelet-stats=yes"]).is_err());
    }

    #[test]
    fn cpusets() {
        let avail = [0, 1, 2, 3];
        assert_eq!(
            crate::resources::parse_cpuset("ALL", &avail).unwrap(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(
            crate::resources::parse_cpuset("3,1,1", &avail).unwrap(),
            vec![1, 3]
        );
        assert!(crate::resources::parse_cpuset("7", &avail).is_err());
        assert!(crate::resources::parse_cpuset("a", &avail).is_err());
        assert!(crate::resources::parse_cpuset("", &avail).is_err());
        assert!(!crate::resources::available_cpus().is_empty());
    }
}
