//! The images built from docker/Dockerfile (tests/peers/images.sh, on a debootstrap'd Debian
//! base: no registry here): they run, they carry what an operator and a scanner look for, and
//! they carry nothing they should not.

use std::process::Command;

use testkit::images::{manager_image, worker_image};

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string()
            + &String::from_utf8_lossy(&out.stderr),
    )
}

fn inspect(image: &str, format: &str) -> String {
    let (ok, out) = docker(&["image", "inspect", "--format", format, image]);
    assert!(ok, "{out}");
    out
}

#[test]
fn both_images_run_version_and_say_what_they_are() {
    for (image, bin) in [
        (worker_image(), "cl-worker"),
        (manager_image(), "cl-worker-manager"),
    ] {
        let (ok, out) = docker(&["run", "--rm", image, bin, "--version"]);
        assert!(ok, "{image}: {out}");
        assert!(
            out.starts_with(&format!("{bin} {}", env!("CARGO_PKG_VERSION"))),
            "{image}: {out}"
        );
        assert_eq!(
            inspect(
                image,
                "{{index .Config.Labels \"org.opencontainers.image.title\"}}"
            ),
            bin
        );
        assert_eq!(
            inspect(
                image,
                "{{index .Config.Labels \"org.opencontainers.image.version\"}}"
            ),
            env!("CARGO_PKG_VERSION")
        );
        let revision = inspect(
            image,
            "{{index .Config.Labels \"org.opencontainers.image.revision\"}}",
        );
        assert!(!revision.is_empty(), "{image}: no revision label");
        // CA certificates, for https CodaLab servers and cloud APIs.
        let (ok, out) = docker(&[
            "run",
            "--rm",
            "--entrypoint",
            "sh",
            image,
            "-c",
            "test -s /etc/ssl/certs/ca-certificates.crt",
        ]);
        assert!(ok, "{image}: no CA bundle: {out}");
    }
}

#[test]
fn the_manager_runs_as_a_non_root_user_and_the_worker_has_no_docker_cli() {
    assert_eq!(inspect(manager_image(), "{{.Config.User}}"), "65532:65532");
    let (ok, out) = docker(&["run", "--rm", "--entrypoint", "id", manager_image(), "-u"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "65532");
    // The worker talks to the engine through the mounted socket, not a CLI.
    let (ok, out) = docker(&[
        "run",
        "--rm",
        worker_image(),
        "sh",
        "-c",
        "command -v docker || ls /usr/bin/docker*",
    ]);
    assert!(!ok, "a docker CLI in the worker image: {out}");
}

#[test]
fn the_worker_image_is_under_100_mb() {
    let bytes: u64 = inspect(worker_image(), "{{.Size}}").parse().unwrap();
    assert!(bytes < 100_000_000, "worker image is {bytes} bytes");
}
