//! The command line made typed: what the worker loop, the dependency cache and the runtime each
//! need, checked once at start-up.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{Args, RuntimeKind};
use crate::runtime::docker::{self, DockerConfig};
use crate::runtime::kubernetes::{self, KubernetesConfig};
use crate::runtime::podman;

/// Everything the worker needs, from its flags.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: String,
    pub password_file: Option<PathBuf>,
    /// The loop's settings; `agent.work_dir` is the directory as given until
    /// [`crate::prepare_work_dir`] makes it absolute.
    pub agent: AgentConfig,
    pub dependencies: DependencyConfig,
    pub runtime: RuntimeConfig,
    pub delete_work_dir_on_exit: bool,
    /// `--metrics-addr`: where Prometheus metrics are served, if anywhere.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `--gpuset`, to resolve against the GPUs the Docker engine finds once connected: set when
    /// no `nvidia-smi` on this machine found any (a worker in a container).
    pub gpus_from_engine: Option<String>,
}

/// The dependency cache's settings.
#[derive(Debug, Clone)]
pub struct DependencyConfig {
    pub max_retries: u32,
    /// `--max-work-dir-size`: the cache's size limit.
    pub max_work_dir_bytes: u64,
}

/// Where runs execute, with that runtime's own settings.
#[derive(Debug, Clone)]
pub enum RuntimeConfig {
    Docker(DockerConfig),
    Kubernetes(KubernetesConfig),
    /// The Docker runtime on Podman's socket, which must answer as Podman.
    Podman(DockerConfig),
}

/// Total RAM of the machine.
/// The CPUs, GPUs and memory the worker's runs share, as its runtime finds them
/// (`runtime::<name>::args::resources`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineResources {
    pub cpuset: Vec<usize>,
    pub gpuset: Vec<String>,
    /// `--gpuset` to resolve through the Docker engine once connected (no `nvidia-smi` here).
    pub gpus_from_engine: Option<String>,
    pub memory_bytes: u64,
}

impl Config {
    pub fn from_args(args: &Args) -> anyhow::Result<Config> {
        // The one place that knows every runtime: each one's folder reads its own flags.
        let (machine, runtime) = match args.bundle_runtime {
            RuntimeKind::Docker => (
                docker::args::resources(args)?,
                RuntimeConfig::Docker(docker::args::config(args)?),
            ),
            RuntimeKind::Kubernetes => (
                kubernetes::args::resources(args),
                RuntimeConfig::Kubernetes(kubernetes::args::config(args)?),
            ),
            RuntimeKind::Podman => (
                podman::args::resources(args)?,
                RuntimeConfig::Podman(podman::args::config(args)?),
            ),
        };
        let MachineResources {
            cpuset,
            gpuset,
            gpus_from_engine,
            memory_bytes: memory,
        } = machine;
        let hostname = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        Ok(Config {
            server: args.server.clone(),
            password_file: args.password_file.clone(),
            agent: AgentConfig {
                worker_id: args.id.clone(),
                work_dir: args.work_dir.clone(),
                cpuset,
                gpuset,
                memory_bytes: memory,
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
            },
            dependencies: DependencyConfig {
                max_retries: args.download_dependencies_max_retries,
                max_work_dir_bytes: args.max_work_dir_size,
            },
            runtime,
            delete_work_dir_on_exit: args.delete_work_dir_on_exit,
            metrics_addr: args.metrics_addr,
            gpus_from_engine,
        })
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

    fn config(extra: &[&str]) -> anyhow::Result<Config> {
        let mut argv = vec!["cl-worker", "--server", "http://127.0.0.1:2900"];
        argv.extend_from_slice(extra);
        Config::from_args(&Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn the_run_user_is_numeric_never_root_and_can_be_switched_off() {
        let as_user = |v: &str| config(&["--run-as-user", v]).unwrap().agent.run_as_user;
        assert_eq!(as_user("1000"), Some((1000, 1000)));
        assert_eq!(as_user("1000:2000"), Some((1000, 2000)));
        assert_eq!(as_user("none"), None);
        assert_eq!(as_user(""), None);
        assert_eq!(config(&[]).unwrap().agent.run_as_user, None);
        for bad in ["0", "0:0", "1000:0", "nobody", "-1"] {
            let argv = ["cl-worker", "--run-as-user", bad];
            assert!(Args::try_parse_from(argv).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_remote_docker_host_without_tls_needs_the_opt_in() {
        let e = config(&["--docker-host", "tcp://10.0.0.7:2375"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--allow-insecure-docker-host"), "{e}");
        let c = config(&[
            "--docker-host",
            "tcp://10.0.0.7:2375",
            "--allow-insecure-docker-host",
        ])
        .unwrap();
        assert!(matches!(c.runtime, RuntimeConfig::Docker(ref d)
            if d.docker_host.as_deref() == Some("tcp://10.0.0.7:2375")));
        // A local socket or this machine's own port needs nothing.
        for host in ["unix:///run/podman/podman.sock", "tcp://127.0.0.1:2375"] {
            assert!(config(&["--docker-host", host]).is_ok(), "{host}");
        }
    }

    #[test]
    fn each_runtime_reads_its_own_flags() {
        // Podman: the Docker runtime's flags, on Podman's socket unless --docker-host says.
        let c = config(&["--bundle-runtime", "podman"]).unwrap();
        let runtime_dir = std::env::var("XDG_RUNTIME_DIR").ok();
        let default =
            podman::args::default_socket(nix::unistd::geteuid().is_root(), runtime_dir.as_deref());
        assert!(
            matches!(c.runtime, RuntimeConfig::Podman(ref d) if d.docker_host.as_deref() == Some(default.as_str())),
            "{:?}",
            c.runtime
        );
        let c = config(&[
            "--bundle-runtime",
            "podman",
            "--docker-host",
            "unix:///p.sock",
        ])
        .unwrap();
        assert!(matches!(c.runtime, RuntimeConfig::Podman(ref d)
            if d.docker_host.as_deref() == Some("unix:///p.sock")));
        // Its --docker-host is checked as Docker's.
        let e = config(&[
            "--bundle-runtime",
            "podman",
            "--docker-host",
            "tcp://10.0.0.7:2375",
        ])
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("--allow-insecure-docker-host"), "{e}");
        // Docker: the machine's CPUs are the worker's.
        let c = config(&["--cpuset", "0"]).unwrap();
        assert!(matches!(c.runtime, RuntimeConfig::Docker(_)));
        assert_eq!(c.agent.cpuset, vec![0]);
        assert!(config(&["--cpuset", "100000"]).is_err());
        // Kubernetes: the node's (read at start); its node comes from the manager's pod spec.
        if std::env::var(kubernetes::NODE_ENV).is_err() {
            let e = config(&["--bundle-runtime", "kubernetes"])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(kubernetes::NODE_ENV), "{e}");
        }
    }
}
