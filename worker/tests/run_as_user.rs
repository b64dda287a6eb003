//! `--run-as-user`: defence in depth. A run handed a mount of the host's `/` on purpose (the
//! worst a mount that escaped could give it) reads a root-only marker and reaches the Docker
//! socket when it runs as root, as runs of a root-owned bundle dir do by default; as the
//! unprivileged user, with no capabilities, it reaches neither. On Docker and on Podman, through
//! the worker's own runtime; then a worker with the flag runs a bundle as that user against the
//! real CodaLab server.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use codalab_worker::metrics::Metrics;
use codalab_worker::runtime::conformance::{self, Behaviour};
use codalab_worker::runtime::docker::{DockerConfig, DockerRuntime};
use codalab_worker::runtime::{BundleRuntime, Mount};
use testkit::hostile::Marker;
use testkit::{cl::*, peers::*, podman, worker::*};

const IMAGE: &str = "codalab/default-cpu:latest";
const NOBODY: (u32, u32) = (65534, 65534);

/// What a run printed when handed the host's `/` at `/host`, as `user` (with or without every
/// capability dropped): its attempts at the marker and at the engine's socket.
async fn with_the_host_mounted(
    docker_host: Option<String>,
    socket: &Path,
    marker: &Marker,
    as_user: Option<(u32, u32)>,
) -> String {
    let config = DockerConfig {
        docker_host,
        network_prefix: "clw-run-as-user".into(),
        max_image_cache_bytes: None,
        max_image_bytes: None,
    };
    let work = tempfile::tempdir().unwrap();
    let rt = DockerRuntime::connect(&config, work.path(), Arc::new(Metrics::new()))
        .await
        .expect("connect");
    rt.prepare().await.expect("prepare");
    let mut spec = conformance::spec_in(work.path(), "clw-run-as-user", IMAGE, Behaviour::Exit(0));
    let helper = testkit::binary("clw-unix-connect");
    assert!(
        helper.exists(),
        "{} (cargo build -p codalab-testkit --bins)",
        helper.display()
    );
    spec.mounts = vec![
        Mount {
            host: "/".into(),
            container: "/host".into(),
            read_only: true,
        },
        Mount {
            host: helper,
            container: "/clw-unix-connect".into(),
            read_only: true,
        },
        // The one library the helper needs that the test image lacks (the same Debian).
        Mount {
            host: "/lib/x86_64-linux-gnu/libgcc_s.so.1".into(),
            container: "/clw-lib/libgcc_s.so.1".into(),
            read_only: true,
        },
    ];
    match as_user {
        Some((uid, gid)) => {
            std::os::unix::fs::chown(&spec.bundle_path, Some(uid), Some(gid)).unwrap();
            spec.user = format!("{uid}:{gid}");
            spec.no_capabilities = true;
        }
        None => spec.user = "0:0".into(),
    }
    spec.command = format!(
        "id -u; cat /host{m}/secret 2>&1; echo cat=$?; LD_LIBRARY_PATH=/clw-lib /clw-unix-connect /host{s}; \
         echo connect=$?",
        m = marker.dir.display(),
        // (The host's own path: `/var/run` is a link to `/run`, which inside the container
        // resolves in the container's file system.)
        s = socket.canonicalize().unwrap().display()
    );
    let id = rt.start(&spec, |_| {}).await.expect("start");
    rt.wait(&id).await;
    let out = std::fs::read_to_string(spec.bundle_path.join("stdout")).unwrap_or_default();
    let _ = rt.remove(&spec.uuid).await;
    rt.shutdown().await;
    out
}

async fn an_escaped_mount_holds_nothing(docker_host: Option<String>, socket: &Path) {
    let marker = Marker::plant("run-as-user");
    let m = std::fs::metadata(marker.dir.join("secret")).unwrap();
    assert_eq!(
        (m.uid(), m.mode() & 0o777),
        (0, 0o600),
        "a root-only marker"
    );
    // As root (the default for a root-owned bundle dir): the mount gives the host away. This
    // is what the option is for, and shows that the checks below can fail.
    let root = with_the_host_mounted(docker_host.clone(), socket, &marker, None).await;
    assert!(root.starts_with("0\n"), "{root}");
    assert!(root.contains(&marker.secret), "{root}");
    assert!(root.contains("connect=0"), "{root}");
    // As the unprivileged user with no capabilities: neither.
    let out = with_the_host_mounted(docker_host, socket, &marker, Some(NOBODY)).await;
    assert!(out.starts_with("65534\n"), "{out}");
    assert!(
        out.contains("Permission denied") && out.contains("cat=1"),
        "{out}"
    );
    assert!(out.contains("connect=1"), "{out}");
    marker.assert_untouched(&[&out]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_escaped_mount_holds_nothing_docker() {
    an_escaped_mount_holds_nothing(None, Path::new("/var/run/docker.sock")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_escaped_mount_holds_nothing_podman() {
    an_escaped_mount_holds_nothing(Some(podman::service().to_owned()), podman::socket()).await;
}

/// The flag through the whole worker: the bundle runs as that user, owns its directory (it
/// writes its output there), reads its dependencies, and its results are uploaded.
#[test]
fn a_worker_runs_bundles_as_the_user_it_is_given() {
    let cl = Cl::new("run-as-user");
    let files = tempfile::tempdir().unwrap();
    // Owner-only modes, as a user's umask 077 uploads them: still readable by the run.
    let dir = files.path().join("dep");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("f"), "dependency\n").unwrap();
    for (p, m) in [(dir.join("f"), 0o600), (dir.clone(), 0o700)] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap();
    }
    let dep = testkit::hostile::upload_dir(&cl, &dir);
    let w = WorkerProc::start("run-as-user", &["--run-as-user", "65534:65534"]);
    let run = cl.run_bundle(
        &w.tag,
        &[&format!("d:{dep}")],
        "id -u; id -g; cat d/f; echo written > out; grep CapEff /proc/self/status",
    );
    let b = wait_for(&peer().client(), &run, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(
        cl.stdout(&run),
        "65534\n65534\ndependency\nCapEff:\t0000000000000000\n"
    );
    assert_eq!(cl.cat(&format!("{run}/out")), b"written\n");
}

#[test]
fn root_is_refused_as_the_run_user() {
    let out = std::process::Command::new(testkit::binary("cl-worker"))
        .args(["--run-as-user", "0:0", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must not be root's"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
