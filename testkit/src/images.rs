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
