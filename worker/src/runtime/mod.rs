//! Where runs execute. The run state machine, preparation, monitoring, upload and reads speak
//! only to [`BundleRuntime`]; Docker ([`docker`], also on Podman: [`podman`]) and Kubernetes pods
//! ([`kubernetes`]) are its implementations; tests use an in-memory one (`fake`, with the
//! `fake-runtime` feature). Each runtime's folder owns its flags, which build it
//! ([`build::RuntimeArgs`] in its `args.rs`).

use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use common::Resources;

pub use build::{BuildContext, BuildError, MachineShare, RuntimeArgs};

pub mod build;
#[cfg(any(test, feature = "fake-runtime"))]
pub mod conformance;
pub mod docker;
#[cfg(any(test, feature = "fake-runtime"))]
pub mod fake;
pub mod kubernetes;
pub mod podman;

/// Label on every run container: the worker id that started it.
pub const LABEL_WORKER_ID: &str = "org.codalab.worker-id";
/// Label on every run container: the bundle uuid.
pub const LABEL_BUNDLE_UUID: &str = "org.codalab.bundle-uuid";

/// An image spec with `:latest` added when it names no tag, as the server and Python worker do.
pub fn normalize_image(spec: &str) -> String {
    if spec.contains(':') || spec.contains('@') {
        spec.to_owned()
    } else {
        format!("{spec}:latest")
    }
}

/// The bash wrapper: the command's stdout and stderr go to files in the bundle dir.
pub fn wrapped_command(command: &str) -> Vec<String> {
    let mut cmd = command.trim_end().to_owned();
    if !cmd.ends_with(';') {
        cmd.push(';');
    }
    vec![
        "/bin/bash".into(),
        "-c".into(),
        format!("( {cmd} ) >stdout 2>stderr"),
    ]
}

/// A failure of the runtime. The texts are the runtime's own messages, shown to users as they
/// are (after a prefix such as `Cannot start Docker container: `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The container, image or network does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (e.g. a container that is not running).
    #[error("{0}")]
    Conflict(String),
    /// The runtime cannot be reached.
    #[error("{0}")]
    Unavailable(String),
    /// The run's image cannot be had (e.g. a pull that keeps failing).
    #[error("{0}")]
    Image(String),
    #[error("{0}")]
    Other(String),
}

/// A directory of the host visible in the run's container. Both paths must be
/// [`carried_exactly`]: runtimes refuse a mount whose paths are not ([`exact`]), and preparation
/// never makes one (it mounts a worker-made directory at a worker-chosen alias instead).
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub host: PathBuf,
    pub container: String,
    pub read_only: bool,
}

/// Whether every engine and API the worker speaks to receives `name` (a path or one of its
/// components) byte for byte: valid UTF-8 (JSON carries nothing else), no control character,
/// no `,` (Podman's Docker-compatible API re-parses a structured mount as
/// `type=bind,source=…,dst=…`, where a comma starts another option) and no `:` (a kubelet on
/// Docker, through cri-dockerd, hands a pod's mounts to the engine as `source:target:ro`
/// strings). A name that fails this is never approximated (`to_string_lossy`, `display`): an
/// approximation can name another entry, such as a link with the replacement character's
/// bytes beside a directory whose name is not UTF-8.
pub fn carried_exactly(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|s| !s.chars().any(|c| c == ',' || c == ':' || c.is_control()))
}

/// `path` as the string handed to an engine or API, when it is [`carried_exactly`]; otherwise
/// a refusal that names the path's bytes (escaped), never an approximation of it.
pub fn exact(path: &Path) -> Result<&str, RuntimeError> {
    match path.to_str() {
        Some(s) if carried_exactly(path.as_os_str()) => Ok(s),
        _ => Err(RuntimeError::Other(format!(
            "the path {} cannot be handed to the container engine exactly (it is not UTF-8, \
             or holds a comma, a colon or a control character)",
            path.as_os_str().as_bytes().escape_ascii()
        ))),
    }
}

/// Capabilities dropped from the container runtime's default set (Docker's, Podman's, a
/// kubelet's): none of them is needed to install packages or run programs, and each widens
/// what a run can do to its neighbours.
pub const DROPPED_CAPABILITIES: [&str; 6] = [
    "NET_RAW",
    "MKNOD",
    "SYS_CHROOT",
    "SETFCAP",
    "SETPCAP",
    "AUDIT_WRITE",
];

/// The capabilities a run's container drops: [`DROPPED_CAPABILITIES`], or all of them under
/// `--run-as-user`.
pub fn dropped_capabilities(spec: &RunSpec) -> Vec<String> {
    if spec.no_capabilities {
        return vec!["ALL".into()];
    }
    DROPPED_CAPABILITIES.iter().map(|c| c.to_string()).collect()
}

/// Everything a runtime needs to start a run. Inside, the command runs in `/<uuid>` (also
/// `HOME`), where the bundle dir is mounted read-write; dependencies are mounted read-only.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    pub uuid: String,
    /// The bundle's command, before [`wrapped_command`].
    pub command: String,
    pub image: String,
    pub bundle_path: PathBuf,
    pub mounts: Vec<Mount>,
    /// `uid:gid` to run as.
    pub user: String,
    /// Memory limit (also the limit with swap); 0 for none.
    pub memory_bytes: u64,
    pub cpuset: Vec<usize>,
    pub gpu_uuids: Vec<String>,
    pub shm_size_bytes: u64,
    /// Whether the run may reach the outside network.
    pub network: bool,
    /// Labelled on the run, to find it again after a restart.
    pub worker_id: String,
    /// Most processes (threads included) the run may have; 0 for no limit.
    pub pids_limit: i64,
    /// Every capability dropped (`--run-as-user`): nothing bypasses file permissions.
    pub no_capabilities: bool,
}

/// State of a run's container.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStatus {
    pub running: bool,
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    /// Unix seconds.
    pub started_at: Option<f64>,
    pub finished_at: Option<f64>,
    /// Why the run stopped when it was not its command's exit (e.g. an evicted pod).
    pub failure: Option<String>,
}

/// One resource-use sample of a run: cumulative CPU times and the host's CPU clock, so that two
/// samples give a CPU share.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub cpu_total_ns: u64,
    pub cpu_user_ns: u64,
    pub cpu_system_ns: u64,
    pub system_ns: u64,
    pub online_cpus: u32,
    pub memory_bytes: u64,
    pub memory_limit: u64,
}

/// A run found in the runtime, labelled with a worker id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnRun {
    pub id: String,
    pub uuid: String,
}

/// What the worker needs from a place that runs bundles. Runs are named by their bundle uuid for
/// `kill`/`remove`, and by the id that [`BundleRuntime::start`] returned for the rest (that id is
/// saved in the state file).
pub trait BundleRuntime: Clone + Send + Sync + 'static {
    /// Shared set-up (Docker: the worker's networks); at start-up and before each run.
    fn prepare(&self) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Makes `image` available (fetched only when absent; size-limited) and holds it for a run
    /// until [`BundleRuntime::unpin_image`]. Returns its digest.
    fn ensure_image(
        &self,
        image: &str,
        progress: impl FnMut(String) + Send,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// Holds an image for a run resumed after a restart.
    fn pin_image(&self, image: &str);

    /// A run no longer uses the image.
    fn unpin_image(&self, image: &str);

    /// Removes unused images while the image cache is over its limit.
    fn clean_images(&self) -> impl Future<Output = ()> + Send;

    /// Starts a run; returns its id. A leftover run of the same bundle is removed first.
    /// `progress` gets the reason while the start waits (e.g. for a cluster's scheduler).
    fn start(
        &self,
        spec: &RunSpec,
        progress: impl FnMut(String) + Send,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// `None` when the run does not exist.
    fn inspect(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<RunStatus>, RuntimeError>> + Send;

    /// Resolves when the run stops (or the wait breaks: callers inspect to tell).
    fn wait(&self, id: &str) -> impl Future<Output = ()> + Send;

    /// One resource-use sample.
    fn sample(&self, id: &str) -> impl Future<Output = Result<Sample, RuntimeError>> + Send;

    /// Bytes the run wrote outside its bundle dir and mounts, in its own file system (Docker's
    /// writable layer, `SizeRw`): they count against its disk limit. `None` where the runtime
    /// does not tell (a Kubernetes pod: the kubelet's ephemeral-storage accounting).
    fn writable_bytes(&self, _id: &str) -> impl Future<Output = Option<u64>> + Send {
        async { None }
    }

    /// Kills a bundle's run; one that is gone or already stopped is fine.
    fn kill(&self, uuid: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Removes a bundle's run, killing it if needed; one that is gone is fine.
    fn remove(&self, uuid: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// The address at which the worker reaches the run's ports (netcat).
    fn address(
        &self,
        uuid: &str,
        id: &str,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// The runs labelled with this worker id (to resume or remove after a restart).
    fn list_own(
        &self,
        worker_id: &str,
    ) -> impl Future<Output = Result<Vec<OwnRun>, RuntimeError>> + Send;

    /// Undoes [`BundleRuntime::prepare`] when the worker exits cleanly.
    fn shutdown(&self) -> impl Future<Output = ()> + Send;

    /// What the place runs go can still give this worker's runs, to report in check-ins
    /// instead of the machine's, when the runtime knows better (a Kubernetes node's free
    /// allocatable resources; read in the background: this does not wait).
    fn capacity(&self) -> Option<Resources> {
        None
    }

    /// What the runtime talks to, as failure messages name it (e.g. "Docker engine").
    fn engine(&self) -> &'static str {
        "container runtime"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names() {
        assert_eq!(normalize_image("ubuntu"), "ubuntu:latest");
        assert_eq!(
            normalize_image("codalab/default-cpu"),
            "codalab/default-cpu:latest"
        );
        assert_eq!(normalize_image("a/b:1.0"), "a/b:1.0");
        assert_eq!(normalize_image("a@sha256:00"), "a@sha256:00");
    }

    #[test]
    fn command_wrapper() {
        assert_eq!(
            wrapped_command("echo hi"),
            vec!["/bin/bash", "-c", "( echo hi; ) >stdout 2>stderr"]
        );
        assert_eq!(wrapped_command("true;")[2], "( true; ) >stdout 2>stderr");
    }
}
