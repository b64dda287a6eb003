//! End to end under Podman: the real CodaLab server, our `cl-worker --docker-host` pointed at a
//! `podman system service` socket (tests/peers/podman.sh: Debian's podman 4.3, no Docker daemon
//! involved in the runs), the test image loaded into Podman's own store.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use testkit::{cl::*, peers::*, podman, worker::*};

fn podman_host() -> &'static str {
    podman::service()
}

/// `--bundle-runtime podman` on the peer's socket (the Docker runtime on `--docker-host` alone
/// finds Podman by itself too: the runtime conformance suite runs it that way).
fn worker(name: &str) -> WorkerProc {
    WorkerProc::start(
        name,
        &["--bundle-runtime", "podman", "--docker-host", podman_host()],
    )
}

fn sock() -> &'static Path {
    podman::socket()
}

/// Ids of the containers labelled with bundle `uuid`: through Podman's libpod API, or through
/// the Docker engine's CLI.
fn containers_of(engine: &str, uuid: &str) -> Vec<String> {
    let label = format!("org.codalab.bundle-uuid={uuid}");
    if engine == "podman" {
        return podman::containers_labelled(sock(), &label);
    }
    let o = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label={label}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn podman_runs_bundles_with_read_only_dependencies_exit_codes_and_its_own_containers() {
    let cl = Cl::new("podman-run");
    let dir = tempfile::tempdir().unwrap();
    let dep = cl.upload_text(dir.path(), "dep.txt", "dependency under podman\n");
    let w = worker("podman-run");
    let client = peer().client();
    let uuid = cl.run_bundle(
        &w.tag,
        &["--request-memory", "300m", &format!("d:{dep}")],
        "cat d; echo > d 2>/dev/null || echo read-only; sleep 15; echo done",
    );
    wait_for(&client, &uuid, T, |s| s == "running" || is_final(s));
    // The run's container is Podman's, not the Docker engine's.
    let ids = containers_of("podman", &uuid);
    assert_eq!(
        ids.len(),
        1,
        "podman lists the run's container\n{}",
        w.log_text()
    );
    assert!(containers_of("docker", &uuid).is_empty());
    assert!(
        w.log_text().contains("bundles run through Podman"),
        "{}",
        w.log_text()
    );
    // The memory limit is requested from Podman (this VM cannot enforce it: see the note).
    let inspect = podman::libpod(sock(), &format!("/containers/{}/json", ids[0]));
    let memory = inspect["HostConfig"]["Memory"]
        .as_u64()
        .unwrap_or(0)
        .to_string();
    assert_eq!(memory.trim(), (300u64 << 20).to_string());
    let b = wait_for(&client, &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(
        cl.stdout(&uuid),
        "dependency under podman\nread-only\ndone\n"
    );
    assert!(
        containers_of("podman", &uuid).is_empty(),
        "removed after the run"
    );

    let failing = cl.run_bundle(&w.tag, &[], "echo oops >&2; exit 3");
    let b = wait_for(&client, &failing, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    assert_eq!(b.metadata("exitcode"), Some(&Value::from(3)));
    assert_eq!(cl.cat(&format!("{failing}/stderr")), b"oops\n");
}

/// `--bundle-runtime podman` names the operator's choice: a socket that answers as a Docker
/// engine is refused at start, naming the value to use for it, and the worker exits.
#[test]
fn bundle_runtime_podman_refuses_a_docker_engine() {
    let mut w = WorkerProc::start(
        "podman-refuses-docker",
        &[
            "--bundle-runtime",
            "podman",
            "--docker-host",
            "unix:///var/run/docker.sock",
        ],
    );
    let status = w.wait_exit(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| !s.success()),
        "{status:?}\n{}",
        w.log_text()
    );
    let log = w.log_text();
    assert!(
        log.contains("answers as a Docker engine, not Podman")
            && log.contains("--bundle-runtime docker"),
        "{log}"
    );
}
