//! The command line made typed: what the worker loop, the dependency cache and the runtime each
//! need, checked once at start-up.

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{self, Args, RuntimeKind};
use crate::resources;
use crate::runtime::docker::DockerConfig;
use crate::runtime::kubernetes::{self, KubernetesConfig};

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
}

/// Total RAM of the machine.
fn total_memory() -> u64 {
    nix::sys::sysinfo::sysinfo()
        .map(|i| i.ram_total())
        .unwrap_or(0)
}

impl Config {
    /// Checks the flags against this machine (CPUs, GPUs, memory).
    pub fn from_args(args: &Args) -> anyhow::Result<Config> {
        let kubernetes = args.bundle_runtime == RuntimeKind::Kubernetes;
        let (cpuset, gpuset, gpus_from_engine, memory) = if kubernetes {
            // The node's free resources decide, once the runtime has read them.
            for (flag, v) in [("--cpuset", &args.cpuset), ("--gpuset", &args.gpuset)] {
                if v != "ALL" {
                    tracing::warn!(
                        "{flag} is ignored with --bundle-runtime kubernetes: runs get what the \
                         node has free"
                    );
                }
            }
            (
                Vec::new(),
                Vec::new(),
                None,
                args.max_memory.unwrap_or(u64::MAX),
            )
        } else {
            // `nvidia-smi` on this machine first; without it, the Docker engine is asked once
            // connected (`gpus_from_engine`). `NONE` asks nobody.
            let spec = args.gpuset.trim();
            let (gpuset, gpus_from_engine) = if spec.is_empty() || spec == "NONE" {
                tracing::info!("GPUs: none (--gpuset {spec:?})");
                (Vec::new(), None)
            } else {
                let gpus = resources::discover_gpus();
                if gpus.is_empty() {
                    (Vec::new(), Some(args.gpuset.clone()))
                } else {
                    crate::runtime::docker::gpus::log_found("nvidia-smi on this machine", &gpus);
                    let gpuset = resources::parse_gpuset(&args.gpuset, &gpus)
                        .map_err(|e| anyhow::anyhow!("--gpuset: {e}"))?;
                    (gpuset, None)
                }
            };
            let cpuset = cli::parse_cpuset(&args.cpuset, &cli::available_cpus())
                .map_err(|e| anyhow::anyhow!("--cpuset: {e}"))?;
            let memory = match args.max_memory {
                Some(m) => m.min(total_memory()),
                None => total_memory(),
            };
            (cpuset, gpuset, gpus_from_engine, memory)
        };
        let runtime = if kubernetes {
            let node = std::env::var(kubernetes::NODE_ENV)
                .ok()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--bundle-runtime kubernetes needs {} (the node this worker runs on, \
                         from the downward API's spec.nodeName; cl-worker-manager sets it)",
                        kubernetes::NODE_ENV
                    )
                })?;
            RuntimeConfig::Kubernetes(KubernetesConfig {
                access: common::cluster::ClusterAccess {
                    flag_prefix: "kubernetes-",
                    cluster_host: args.kubernetes_cluster_host.clone(),
                    auth_token: args.kubernetes_auth_token.clone(),
                    auth_token_file: args.kubernetes_auth_token_file.clone(),
                    cert_path: args.kubernetes_cert_path.clone(),
                    cert: args.kubernetes_cert.clone(),
                    namespace: args.kubernetes_namespace.clone(),
                    allow_insecure: args.allow_insecure_kubernetes_cluster_host,
                },
                node,
                pod: std::env::var(kubernetes::POD_ENV)
                    .ok()
                    .filter(|n| !n.is_empty()),
                kubelet_stats: args.kubernetes_kubelet_stats,
            })
        } else {
            let docker_host = args.docker_host.clone().filter(|h| !h.is_empty());
            if let Some(host) = docker_host.as_deref() {
                if protocol::net::is_plaintext_remote(host) {
                    if !args.allow_insecure_docker_host {
                        anyhow::bail!(
                            "--docker-host {host}: a Docker API on another machine without TLS \
                             lets anyone on the network run root containers on it; reach it \
                             through a unix socket (e.g. an SSH tunnel), or pass \
                             --allow-insecure-docker-host to accept that"
                        );
                    }
                    tracing::warn!(
                        "--allow-insecure-docker-host: the Docker API at {host} is reached \
                         without TLS"
                    );
                }
            }
            RuntimeConfig::Docker(DockerConfig {
                docker_host,
                network_prefix: args.network_prefix.clone(),
                max_image_cache_bytes: args.max_image_cache_size,
                max_image_bytes: args.max_image_size,
            })
        };
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
                preemptible: args.preemptible,
                shm_size_bytes: args.shared_memory_size_gb << 30,
                pids_limit: args.pids_limit,
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
    pub preemptible: bool,
    pub shm_size_bytes: u64,
    pub pids_limit: i64,
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
}
