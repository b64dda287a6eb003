//! `--bundle-runtime podman`: the Docker runtime's flags, with Podman's own socket where
//! `--docker-host` is not given (`/run/podman/podman.sock` for root, else
//! `$XDG_RUNTIME_DIR/podman/podman.sock`, where `podman system service` and the
//! `podman.socket` unit listen), and an engine that must answer as Podman.

use crate::runtime::docker::args::DockerArgs;
use crate::runtime::docker::{self, DockerConfig, DockerRuntime, Engine};
use crate::runtime::{BuildContext, BuildError, BundleRuntime, MachineShare, RuntimeArgs};

/// Podman's API socket for this user, as `podman system service` opens it by default.
pub fn default_socket(root: bool, runtime_dir: Option<&str>) -> String {
    match runtime_dir.filter(|d| !root && !d.is_empty()) {
        Some(dir) => format!("unix://{}/podman/podman.sock", dir.trim_end_matches('/')),
        None => "unix:///run/podman/podman.sock".into(),
    }
}

/// The Podman runtime: the Docker runtime's flags ([`DockerArgs`]), on Podman's socket unless
/// `--docker-host` says otherwise.
#[derive(Debug, Clone, Copy)]
pub struct PodmanArgs<'a>(pub &'a DockerArgs);

impl PodmanArgs<'_> {
    pub fn config(&self) -> Result<DockerConfig, BuildError> {
        let mut c = self.0.config()?;
        if c.docker_host.is_none() {
            let runtime_dir = std::env::var("XDG_RUNTIME_DIR").ok();
            c.docker_host = Some(default_socket(
                nix::unistd::geteuid().is_root(),
                runtime_dir.as_deref(),
            ));
        }
        Ok(c)
    }
}

impl RuntimeArgs for PodmanArgs<'_> {
    type Runtime = DockerRuntime;

    /// The Docker runtime's start-up, refused when the socket answers as another engine (a
    /// Docker engine there would run the bundles without Podman's rootless isolation the
    /// operator chose).
    async fn build(
        &self,
        cx: &BuildContext<'_>,
    ) -> Result<(DockerRuntime, MachineShare), BuildError> {
        let c = self.config()?;
        let (runtime, share) = docker::args::start(&c, cx).await?;
        if runtime.kind() != Engine::Podman {
            runtime.shutdown().await;
            return Err(BuildError::Flag(format!(
                "--bundle-runtime podman: {} answers as a Docker engine, not Podman (use \
                 --bundle-runtime docker for it)",
                c.docker_host.as_deref().unwrap_or("the socket")
            )));
        }
        Ok((runtime, share))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    fn config(extra: &[&str]) -> Result<DockerConfig, BuildError> {
        let mut argv = vec!["cl-worker"];
        argv.extend_from_slice(extra);
        PodmanArgs(&crate::cli::Args::try_parse_from(argv).unwrap().docker).config()
    }

    #[test]
    fn the_docker_runtimes_flags_on_podmans_socket() {
        let runtime_dir = std::env::var("XDG_RUNTIME_DIR").ok();
        let default = default_socket(nix::unistd::geteuid().is_root(), runtime_dir.as_deref());
        assert_eq!(config(&[]).unwrap().docker_host, Some(default));
        assert_eq!(
            config(&["--docker-host", "unix:///p.sock"])
                .unwrap()
                .docker_host
                .as_deref(),
            Some("unix:///p.sock")
        );
        // Its --docker-host is checked as Docker's.
        let e = config(&["--docker-host", "tcp://10.0.0.7:2375"])
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("--allow-insecure-docker-host"),
            "{e}"
        );
    }

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
