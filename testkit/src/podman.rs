//! Podman's own (libpod) API, which the Docker engine does not serve: how the tests see that a
//! run's container is Podman's.

use std::path::Path;
use std::process::Command;

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
