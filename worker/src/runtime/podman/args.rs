//! `--bundle-runtime podman`: the Docker runtime's flags, with Podman's own socket where
//! `--docker-host` is not given (`/run/podman/podman.sock` for root, else
//! `$XDG_RUNTIME_DIR/podman/podman.sock`, where `podman system service` and the
//! `podman.socket` unit listen), and an engine that must answer as Podman.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cli::Args;
use crate::config::{Config, MachineResources};
use crate::metrics::Metrics;
use crate::runtime::docker::{self, DockerConfig, DockerRuntime, Engine};
use crate::runtime::BundleRuntime;

/// Podman's API socket for this user, as `podman system service` opens it by default.
pub fn default_socket(root: bool, runtime_dir: Option<&str>) -> String {
    match runtime_dir.filter(|d| !root && !d.is_empty()) {
        Some(dir) => format!("unix://{}/podman/podman.sock", dir.trim_end_matches('/')),
        None => "unix:///run/podman/podman.sock".into(),
    }
}

pub fn config(args: &Args) -> anyhow::Result<DockerConfig> {
    let mut c = docker::args::config(args)?;
    if c.docker_host.is_none() {
        let runtime_dir = std::env::var("XDG_RUNTIME_DIR").ok();
        c.docker_host = Some(default_socket(
            nix::unistd::geteuid().is_root(),
            runtime_dir.as_deref(),
        ));
    }
    Ok(c)
}

/// The machine's share, as under Docker.
pub fn resources(args: &Args) -> anyhow::Result<MachineResources> {
    docker::args::resources(args)
}

/// The Docker runtime's start-up, refused when the socket answers as another engine (a Docker
/// engine there would run the bundles without Podman's rootless isolation the operator chose).
pub async fn start(
    c: &DockerConfig,
    config: &mut Config,
    metrics: Arc<Metrics>,
    shutdown: &CancellationToken,
) -> anyhow::Result<DockerRuntime> {
    let runtime = docker::args::start(c, config, metrics, shutdown).await?;
    if runtime.kind() != Engine::Podman {
        runtime.shutdown().await;
        anyhow::bail!(
            "--bundle-runtime podman: {} answers as a Docker engine, not Podman (use \
             --bundle-runtime docker for it)",
            c.docker_host.as_deref().unwrap_or("the socket")
        );
    }
    Ok(runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podmans_socket_for_root_and_for_a_user() {
        assert_eq!(
            default_socket(true, Some("/run/user/0")),
            "unix:///run/podman/podman.sock"
        );
        assert_eq!(
            default_socket(false, Some("/run/user/1000/")),
            "unix:///run/user/1000/podman/podman.sock"
        );
        assert_eq!(
            default_socket(false, None),
            "unix:///run/podman/podman.sock"
        );
    }
}
