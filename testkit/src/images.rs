//! The project's images, built from `docker/Dockerfile` by `tests/peers/images.sh` (on a local
//! Debian base and toolchain image: no registry here). The end-to-end tests that launch worker
//! containers (AWS Batch in moto's Docker mode, the Kubernetes and Azure Batch stand-ins) run
//! this image, as an operator would.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::peers::bash;

/// The worker image's tag (`docker build --target worker`).
pub const WORKER_IMAGE: &str = "cl-worker-test/worker:latest";
/// The manager image's tag (`docker build --target manager`).
pub const MANAGER_IMAGE: &str = "cl-worker-test/manager:latest";

/// `docker ARGS`, which must succeed (its stderr in the panic otherwise).
pub fn docker(args: &[&str]) {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the engine has `image`.
pub fn present(image: &str) -> bool {
    std::process::Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .unwrap()
        .status
        .success()
}

/// Builds the worker image from the Dockerfile once per test process (Docker's layer cache
/// makes a rebuild of unchanged sources a no-op) and returns its tag.
pub fn worker_image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    build(&BUILT, "worker", WORKER_IMAGE)
}

/// Builds the manager image from the Dockerfile once per test process and returns its tag.
pub fn manager_image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    build(&BUILT, "manager", MANAGER_IMAGE)
}

fn build(built: &OnceLock<()>, target: &str, tag: &'static str) -> &'static str {
    built.get_or_init(|| {
        bash(&["tests/peers/images.sh", "build", target], &HashMap::new());
    });
    tag
}

/// The tag of the worker image as the default `codalab/worker:$CODALAB_VERSION` of a manager
/// run with `CODALAB_VERSION` set to this (what an operator's registry serves).
pub const GPU_HOST_VERSION: &str = "clw-gpu-host";

/// The worker image of a site whose GPU nodes are faked (tests/peers/fake-gpu.sh): the worker
/// image with `CL_WORKER_GPU_DISCOVERY_IMAGE` naming the fake CUDA image (a site's mirror of
/// `nvidia/cuda`), tagged `codalab/worker:clw-gpu-host`, so that a manager run with
/// `CODALAB_VERSION=clw-gpu-host` and no `--worker-image` (CodaLab's documented commands)
/// launches it. Made once per test process; returns its tag.
pub fn gpu_host_worker_image() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let fake = crate::peers::start("fake-gpu.sh");
        let base = worker_image();
        let tag = format!("codalab/worker:{GPU_HOST_VERSION}");
        let script = format!(
            "set -e; cid=$(docker create {base}); \
             docker commit --change 'ENV CL_WORKER_GPU_DISCOVERY_IMAGE={}' $cid {tag} >/dev/null; \
             docker rm -f $cid >/dev/null",
            fake["CLW_FAKE_GPU_IMAGE"]
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        tag
    })
}
