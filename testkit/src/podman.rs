//! Podman's own (libpod) API, which the Docker engine does not serve: how the tests see that a
//! run's container is Podman's.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::peers::{bash, exports};

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::Value;

/// `GET /v4.0.0/libpod<path>` on the Podman service at socket `sock`.
pub fn libpod(sock: &Path, path: &str) -> Value {
    crate::json_stdout(
        Command::new("curl")
            .args(["-fsS", "--unix-socket"])
            .arg(sock)
            .arg(format!("http://d/v4.0.0/libpod{path}")),
    )
}

/// Ids of the containers (running or not) with `label` (`key=value`) in the service at `sock`.
pub fn containers_labelled(sock: &Path, label: &str) -> Vec<String> {
    let filters = format!(r#"{{"label":["{label}"]}}"#);
    let q = utf8_percent_encode(&filters, NON_ALPHANUMERIC);
    libpod(sock, &format!("/containers/json?all=true&filters={q}"))
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["Id"].as_str().unwrap().to_string())
        .collect()
}

/// The Podman service's Docker-compatible socket (`unix://…`), started once per test binary
/// with the test image (all its names) in Podman's store.
pub fn service() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let none = Default::default();
        bash(&["tests/peers/test-image.sh"], &none);
        bash(&["tests/peers/podman.sh", "start"], &none);
        bash(
            &[
                "tests/peers/podman.sh",
                "load",
                "cl-worker-test/base:latest",
                "codalab/default-cpu:latest",
                "codalab/default-gpu:latest",
            ],
            &none,
        );
        exports(&bash(&["tests/peers/podman.sh", "env"], &none))["CLW_PODMAN_HOST"].clone()
    })
}

/// The Podman service's socket path.
pub fn socket() -> &'static Path {
    Path::new(service().strip_prefix("unix://").expect("a unix:// socket"))
}
