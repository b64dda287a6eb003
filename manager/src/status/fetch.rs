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

/// `http://host:port[/prefix]` (or `host[:port][/prefix]`) → the URL of its `/status`.
pub fn status_target(url: &str) -> Result<reqwest::Url, FetchError> {
    let invalid = |why: &str| FetchError::Invalid(format!("{url}: {why}"));
    let given = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    let mut u = reqwest::Url::parse(&given).map_err(|e| invalid(&e.to_string()))?;
    match u.scheme() {
        "http" => {}
        "https" => return Err(invalid(
            "the manager's --metrics-addr speaks plain HTTP (use http:// or a proxy's own client)",
        )),
        other => return Err(invalid(&format!("{other}: not an http:// URL"))),
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    let path = u.path().trim_end_matches('/');
    let path = format!("{}/status", path.strip_suffix("/status").unwrap_or(path));
    u.set_path(&path);
    u.set_query(None);
    u.set_fragment(None);
    Ok(u)
}

/// `GET <url>/status` (reqwest, plain HTTP), with `timeout` for connecting and for the answer.
pub async fn fetch(url: &str, timeout: std::time::Duration) -> Result<Status, FetchError> {
    let target = status_target(url)?;
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
        .get(target)
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
