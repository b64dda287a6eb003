//! The command line made typed: what the worker loop, the dependency cache and the runtime each
//! need, checked once at start-up.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::Args;
use crate::runtime::MachineShare;

/// Everything the worker needs, from its flags.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: String,
    pub password_file: Option<PathBuf>,
    /// The loop's settings; `agent.work_dir` is the directory as given until
    /// [`crate::prepare_work_dir`] makes it absolute.
    pub agent: AgentConfig,
    pub dependencies: DependencyConfig,
    pub delete_work_dir_on_exit: bool,
    /// `--metrics-addr`: where Prometheus metrics are served, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// The dependency cache's settings.
#[derive(Debug, Clone)]
pub struct DependencyConfig {
    pub max_retries: u32,
    /// `--max-work-dir-size`: the cache's size limit.
    pub max_work_dir_bytes: u64,
    /// `--dependency-cache-dir`: where the cache lives (`None`: the work dir).
    pub cache_dir: Option<PathBuf>,
}

impl Config {
    /// The worker's settings from its flags, with no share of the machine yet (the runtime's
    /// build finds it: [`Config::with_share`]). The runtime's own flags are its own
    /// (`runtime::<name>::args`).
    pub fn from_args(args: &Args) -> Config {
        let hostname = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        Config {
            server: args.server.clone(),
            password_file: args.password_file.clone(),
            agent: AgentConfig {
                worker_id: args.id.clone(),
                work_dir: args.work_dir.clone(),
                cpuset: Vec::new(),
                gpuset: Vec::new(),
                memory_bytes: 0,
                tag: args.tag.clone(),
                group: args.group.clone(),
                tag_exclusive: args.tag_exclusive_effective(),
                shared_file_system: args.shared_file_system,
                exit_when_idle: args.exit_when_idle,
                idle_seconds: args.idle_seconds,
                checkin_frequency: Duration::from_secs(args.checkin_frequency_seconds.max(1)),
                exit_after_num_runs: args.exit_after_num_runs,
                pass_down_termination: args.pass_down_termination,
                preemption_notice: crate::notice::Watch::new(args.preemption_notice),
                preemptible: args.preemptible,
                shm_size_bytes: args.shared_memory_size_gb << 30,
                pids_limit: args.pids_limit,
                run_as_user: args.run_as_user.and_then(|r| r.0),
                hostname,
                ws_url: Some(args.ws_server()),
                prefetch: crate::prefetch::Prefetch {
                    images: args.prefetch_image.clone(),
                    dependencies: args.prefetch_dependency.clone(),
                },
            },
            dependencies: DependencyConfig {
                max_retries: args.download_dependencies_max_retries,
                max_work_dir_bytes: args.max_work_dir_size,
                cache_dir: args.dependency_cache_dir.clone(),
            },
            delete_work_dir_on_exit: args.delete_work_dir_on_exit,
            metrics_addr: args.metrics_addr,
        }
    }

    /// With the machine's share for runs that the runtime found.
    pub fn with_share(mut self, share: MachineShare) -> Config {
        self.agent.cpuset = share.cpuset;
        self.agent.gpuset = share.gpuset;
        self.agent.memory_bytes = share.memory_bytes;
        self
    }
}

/// The worker loop's settings, from the command line.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub worker_id: String,
    pub work_dir: PathBuf,
    pub cpuset: Vec<usize>,
    pub gpuset: Vec<String>,
    pub memory_bytes: u64,
    pub tag: Option<String>,
    pub group: Option<String>,
    pub tag_exclusive: bool,
    pub shared_file_system: bool,
    pub exit_when_idle: bool,
    pub idle_seconds: u64,
    pub checkin_frequency: Duration,
    pub exit_after_num_runs: i64,
    pub pass_down_termination: bool,
    /// `--preemption-notice`: what to poll (`None`: nothing).
    pub preemption_notice: Option<crate::notice::Watch>,
    pub preemptible: bool,
    pub shm_size_bytes: u64,
    pub pids_limit: i64,
    /// `--run-as-user`: who runs every bundle (then owner of its directory, no capabilities).
    pub run_as_user: Option<(u32, u32)>,
    pub hostname: String,
    pub ws_url: Option<String>,
    /// `--prefetch-image`, `--prefetch-dependency`: fetched as the worker starts.
    pub prefetch: crate::prefetch::Prefetch,
}

impl AgentConfig {
    pub fn runs_dir(&self) -> PathBuf {
        self.work_dir.join("runs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(extra: &[&str]) -> Config {
        let mut argv = vec!["cl-worker", "--server", "http://127.0.0.1:2900"];
        argv.extend_from_slice(extra);
        Config::from_args(&Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn the_run_user_is_numeric_never_root_and_can_be_switched_off() {
        let as_user = |v: &str| config(&["--run-as-user", v]).agent.run_as_user;
        assert_eq!(as_user("1000"), Some((1000, 1000)));
        assert_eq!(as_user("1000:2000"), Some((1000, 2000)));
        assert_eq!(as_user("none"), None);
        assert_eq!(as_user(""), None);
        assert_eq!(config(&[]).agent.run_as_user, None);
        for bad in ["0", "0:0", "1000:0", "nobody", "-1"] {
            let argv = ["cl-worker", "--run-as-user", bad];
            assert!(Args::try_parse_from(argv).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_share_is_the_runtimes() {
        let c = config(&["--cpuset", "0"]).with_share(MachineShare {
            cpuset: vec![0],
            gpuset: vec!["GPU-1".into()],
            memory_bytes: 7,
        });
        assert_eq!(
            (c.agent.cpuset, c.agent.gpuset, c.agent.memory_bytes),
            (vec![0], vec!["GPU-1".to_string()], 7)
        );
    }
}
