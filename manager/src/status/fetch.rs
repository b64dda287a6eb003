//! Reading `/status` from a running manager (`cl-worker-manager status`).

use super::{exit, Status};

/// Why `status` got no status.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot reach {0}: {1}")]
    Unreachable(String, String),
    #[error("{0}")]
    Invalid(String),
}

impl FetchError {
    pub fn exit_code(&self) -> u8 {
        match self {
            FetchError::Unreachable(..) => exit::UNREACHABLE,
            FetchError::Invalid(_) => exit::INVALID,
        }
    }
}

/// `http://host:port[/prefix]` (or `host:port`) → (`host:port`, the path of `/status`).
pub fn status_target(url: &str) -> Result<(String, String), FetchError> {
    if url.starts_with("https://") {
        return Err(FetchError::Invalid(format!(
            "{url}: the manager's --metrics-addr speaks plain HTTP (use http:// or a proxy's own client)"
        )));
    }
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() {
        return Err(FetchError::Invalid(format!("{url}: no host")));
    }
    let host = if host.contains(':') && !host.ends_with(']') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    let path = path.strip_suffix("/status").unwrap_or(path);
    Ok((host, format!("{path}/status")))
}

/// `GET <url>/status` (reqwest, plain HTTP), with `timeout` for connecting and for the answer.
pub async fn fetch(url: &str, timeout: std::time::Duration) -> Result<Status, FetchError> {
    let (host, path) = status_target(url)?;
    // reqwest's own text names only the request; its causes say why (refused, timed out).
    let unreachable = |e: &dyn std::error::Error| {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        FetchError::Unreachable(url.into(), text)
    };
    common::install_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(timeout)
        .timeout(timeout)
        .no_proxy()
        .build()
        .map_err(|e| unreachable(&e))?;
    let answer = client
        .get(format!("http://{host}{path}"))
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| unreachable(&e))?;
    let code = answer.status();
    let body = answer.bytes().await.map_err(|e| unreachable(&e))?;
    parse_answer(code, &body)
}

/// The status in an answer of the manager's `/status`.
pub fn parse_answer(code: reqwest::StatusCode, body: &[u8]) -> Result<Status, FetchError> {
    if code != reqwest::StatusCode::OK {
        return Err(FetchError::Invalid(format!("the manager answered {code}")));
    }
    serde_json::from_slice(body)
        .map_err(|e| FetchError::Invalid(format!("not a manager's status: {e}")))
}
