//! REST client for the CodaLab server: OAuth2 password grant, worker routes and bundle routes.
//!
//! Retries: idempotent calls (GETs, the token grant, the results `PUT`) are retried with
//! exponential backoff on network errors and 5xx only, with a log line per retry.
//! `start_bundle` is sent again only on a 5xx answer (twice at most: the server's transaction
//! rolled back), never after a network error. Checkins and replies are never re-sent by the
//! client: the caller decides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::{header, Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::auth::Credentials;
use crate::types::{
    parse_checkin_response, Bundle, CheckinRequest, Document, MalformedMessage, Resource,
    ServerMessage,
};

/// OAuth client id the server pre-creates for workers (empty secret).
pub const WORKER_CLIENT_ID: &str = "codalab_worker_client";
/// Most pages a bundle search reads.
const MAX_SEARCH_PAGES: usize = 1000;

/// Tokens are renewed this long before they expire.
pub const TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// Characters kept as they are in path segments, as Python's `urllib.parse.quote` (safe `/`).
const PATH_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'_')
    .remove(b'.')
    .remove(b'-')
    .remove(b'~')
    .remove(b'/');

/// Percent-encodes a path component the way the Python worker does (`/` kept).
pub fn quote(s: &str) -> String {
    utf8_percent_encode(s, PATH_KEEP).to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the CodaLab server ({method} {url}): {message}")]
    Network {
        method: Method,
        url: String,
        message: String,
    },
    #[error("{method} {url} failed with HTTP {status}: {message}")]
    Http {
        method: Method,
        url: String,
        status: StatusCode,
        message: String,
    },
    #[error("login as {username:?} at {server} was refused: {message}")]
    Auth {
        server: String,
        username: String,
        message: String,
    },
    #[error("unexpected response to {method} {url}: {message}")]
    Decode {
        method: Method,
        url: String,
        message: String,
    },
}

impl Error {
    /// Network errors and 5xx answers may succeed when tried again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Network { .. } => true,
            Error::Http { status, .. } => status.is_server_error(),
            Error::Auth { .. } | Error::Decode { .. } => false,
        }
    }

    /// HTTP status, if the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Http { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `--server`, e.g. `https://worksheets.codalab.org`.
    pub server: String,
    /// Timeout of plain JSON calls (`CODALAB_URLOPEN_TIMEOUT_SECONDS`, default 300 s); also the
    /// longest silence tolerated on streamed bodies.
    pub request_timeout: Duration,
    /// Timeout of a checkin (the server long-polls up to 5 s).
    pub checkin_timeout: Duration,
    pub connect_timeout: Duration,
    /// Attempts of idempotent calls on retryable errors.
    pub max_attempts: usize,
    pub user_agent: String,
}

impl ClientConfig {
    pub fn new(server: impl Into<String>) -> Self {
        let request_timeout = std::env::var("CODALAB_URLOPEN_TIMEOUT_SECONDS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(Duration::from_secs(300));
        ClientConfig {
            server: server.into().trim_end_matches('/').to_owned(),
            request_timeout,
            checkin_timeout: Duration::from_secs(60)
                .min(request_timeout.max(Duration::from_secs(10))),
            connect_timeout: Duration::from_secs(10),
            max_attempts: 4,
            user_agent: format!("cl-worker-rs/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

struct Token {
    access_token: String,
    /// When it is renewed: [`TOKEN_REFRESH_MARGIN`] before it expires, or half-way through a
    /// short lifetime.
    renew_at: Instant,
}

/// The shortest and longest token lifetimes believed: a server's `expires_in` is clamped into
/// this range, so that a huge one cannot overflow the clock and a tiny one cannot make every
/// request a password grant.
pub const TOKEN_LIFETIME_RANGE: (Duration, Duration) =
    (Duration::from_secs(60), Duration::from_secs(30 * 24 * 3600));

/// How long after its grant a token with this `expires_in` is renewed.
pub fn token_renewal(expires_in: Option<f64>) -> Duration {
    let (min, max) = TOKEN_LIFETIME_RANGE;
    let secs = match expires_in {
        Some(s) if s.is_nan() => 3600.0,
        Some(s) => s,
        None => 3600.0,
    };
    let lifetime = Duration::from_secs_f64(secs.clamp(min.as_secs_f64(), max.as_secs_f64()));
    lifetime - TOKEN_REFRESH_MARGIN.min(lifetime / 2)
}

/// Shared, cheaply clonable REST client.
#[derive(Clone)]
pub struct RestClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    config: ClientConfig,
    credentials: Credentials,
    token: Mutex<Option<Token>>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<f64>,
}

fn install_crypto_provider() {
    // Ignore the error: another part of the process may have installed one already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl RestClient {
    pub fn new(config: ClientConfig, credentials: Credentials) -> Result<Self> {
        install_crypto_provider();
        if crate::net::is_plaintext_remote(&config.server) {
            // Accepted as CodaLab's own clients accept it, but never silently.
            tracing::warn!(
                "{} is plain HTTP to another machine: the password and every token cross the \
                 network in clear; use https://",
                config.server
            );
        }
        let mut headers = header::HeaderMap::new();
        headers.insert(
            "X-Requested-With",
            header::HeaderValue::from_static("XMLHttpRequest"),
        );
        let builder = || {
            reqwest::Client::builder()
                .default_headers(headers.clone())
                .user_agent(config.user_agent.clone())
                .connect_timeout(config.connect_timeout)
                .read_timeout(config.request_timeout)
                // Servers close idle keep-alive connections after a few seconds (gunicorn: 2 s);
                // reusing one just as it closes fails the request. Keep idle ones shorter.
                .pool_idle_timeout(Duration::from_secs(1))
        };
        let build_error = |e: reqwest::Error| Error::Decode {
            method: Method::GET,
            url: config.server.clone(),
            message: format!(
                "cannot build HTTP client: {}{}",
                error_chain(&e),
                if config.server.starts_with("https:") {
                    " (the machine's CA certificates verify the server: install them, e.g. the \
                     ca-certificates package, or point SSL_CERT_FILE at a PEM bundle)"
                } else {
                    ""
                }
            ),
        };
        let http = match builder().build() {
            Ok(http) => http,
            // The system's TLS verifier needs CA certificates even when no TLS is used; a
            // minimal container image has none. Plain HTTP needs no roots at all.
            Err(e) if config.server.starts_with("http:") => {
                tracing::debug!(
                    "no system TLS roots ({}); plain HTTP needs none",
                    error_chain(&e)
                );
                builder()
                    .tls_certs_only(Vec::new())
                    .build()
                    .map_err(build_error)?
            }
            Err(e) => return Err(build_error(e)),
        };
        Ok(RestClient {
            inner: Arc::new(Inner {
                http,
                config,
                credentials,
                token: Mutex::new(None),
            }),
        })
    }

    pub fn server(&self) -> &str {
        &self.inner.config.server
    }

    pub fn username(&self) -> &str {
        &self.inner.credentials.username
    }

    fn url(&self, path: &str) -> String {
        format!("{}/rest{}", self.inner.config.server, path)
    }

    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(500))
            .with_max_delay(Duration::from_secs(10))
            .with_max_times(self.inner.config.max_attempts.saturating_sub(1))
            .with_jitter()
    }

    /// Runs `f` again on retryable errors, logging each retry.
    async fn retry<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        f.retry(self.backoff())
            .when(Error::is_retryable)
            .notify(|e, delay| {
                tracing::warn!(
                    "{what} failed, retrying in {:.1}s: {e}",
                    delay.as_secs_f64()
                )
            })
            .await
    }

    /// Password grant; fails with [`Error::Auth`] when the server refuses the credentials.
    pub async fn login(&self) -> Result<()> {
        let mut guard = self.inner.token.lock().await;
        let token = self.retry("login", || self.grant()).await?;
        *guard = Some(token);
        Ok(())
    }

    async fn grant(&self) -> Result<Token> {
        let url = self.url("/oauth2/token");
        let creds = &self.inner.credentials;
        let sent = Instant::now();
        let resp = self
            .inner
            .http
            .post(&url)
            .basic_auth(WORKER_CLIENT_ID, Some(""))
            .form(&[
                ("grant_type", "password"),
                ("username", creds.username.as_str()),
                ("password", creds.password.as_str()),
            ])
            .timeout(self.inner.config.request_timeout)
            .send()
            .await
            .map_err(|e| network(Method::POST, &url, e))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if status.is_client_error() {
            let message = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| {
                    v.get("error_description")
                        .or_else(|| v.get("error"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| format!("HTTP {status}"));
            return Err(Error::Auth {
                server: self.inner.config.server.clone(),
                username: creds.username.clone(),
                message,
            });
        }
        if !status.is_success() {
            return Err(Error::Http {
                method: Method::POST,
                url,
                status,
                message: truncate(&body),
            });
        }
        let parsed: TokenResponse = serde_json::from_str(&body).map_err(|e| Error::Decode {
            method: Method::POST,
            url: url.clone(),
            message: format!("token response is not JSON: {e}"),
        })?;
        if let Some(tt) = parsed.token_type.as_deref() {
            if !tt.eq_ignore_ascii_case("bearer") {
                return Err(Error::Decode {
                    method: Method::POST,
                    url,
                    message: format!("token type {tt:?} is not Bearer"),
                });
            }
        }
        Ok(Token {
            access_token: parsed.access_token,
            renew_at: sent + token_renewal(parsed.expires_in),
        })
    }

    /// The current access token, renewed when it expires within [`TOKEN_REFRESH_MARGIN`].
    async fn bearer(&self) -> Result<String> {
        let mut guard = self.inner.token.lock().await;
        let fresh = guard.as_ref().is_some_and(|t| Instant::now() < t.renew_at);
        if !fresh {
            *guard = Some(self.retry("login", || self.grant()).await?);
        }
        Ok(guard
            .as_ref()
            .map(|t| t.access_token.clone())
            .unwrap_or_default())
    }

    /// An authenticated request (the token is fetched or renewed first).
    pub async fn request(&self, method: Method, path: &str) -> Result<RequestBuilder> {
        let token = self.bearer().await?;
        Ok(self
            .inner
            .http
            .request(method, self.url(path))
            .bearer_auth(token))
    }

    /// Sends, and turns non-2xx answers into [`Error::Http`].
    async fn send(&self, method: Method, path: &str, rb: RequestBuilder) -> Result<Response> {
        let url = self.url(path);
        let resp = rb
            .send()
            .await
            .map_err(|e| network(method.clone(), &url, e))?;
        check(method, &url, resp).await
    }

    async fn send_json(&self, method: Method, path: &str, rb: RequestBuilder) -> Result<Value> {
        let url = self.url(path);
        let resp = self.send(method.clone(), path, rb).await?;
        let text = resp
            .text()
            .await
            .map_err(|e| network(method.clone(), &url, e))?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| Error::Decode {
            method,
            url,
            message: format!("not JSON ({e}): {}", truncate(&text)),
        })
    }

    /// A GET returning JSON, retried on network errors and 5xx.
    async fn get_json(&self, what: &str, path: &str, query: &[(&str, String)]) -> Result<Value> {
        self.retry(what, || async {
            let rb = self
                .request(Method::GET, path)
                .await?
                .query(query)
                .timeout(self.inner.config.request_timeout * 2);
            self.send_json(Method::GET, path, rb).await
        })
        .await
    }

    /// `GET /workers/info`: the workers this user may see, with their resources in use.
    pub async fn workers_info(&self) -> Result<Value> {
        self.get_json("workers info", "/workers/info", &[]).await
    }

    /// `POST /workers/<id>/checkin`. Never re-sent by the client: a lost answer may have carried
    /// a message, and the worker's loop checks in again anyway.
    pub async fn checkin(
        &self,
        worker_id: &str,
        body: &CheckinRequest,
    ) -> Result<Vec<std::result::Result<ServerMessage, MalformedMessage>>> {
        let path = format!("/workers/{}/checkin", quote(worker_id));
        let rb = self
            .request(Method::POST, &path)
            .await?
            .json(body)
            .timeout(self.inner.config.checkin_timeout);
        let value = self.send_json(Method::POST, &path, rb).await?;
        Ok(parse_checkin_response(value))
    }

    /// `POST /workers/<id>/start_bundle/<uuid>`: true when the server moved the bundle to
    /// `preparing` for this worker.
    ///
    /// Sent again (twice at most, on the client's back-off from 0.5 s) when the server answered
    /// with a 5xx: its handler makes the move in one transaction, which an error rolls back
    /// (MariaDB's deadlocks under concurrent writes to the bundle are such errors), and a run
    /// left unstarted stays `starting` on the server for minutes. Never after a network error,
    /// when the first request may have made the move.
    pub async fn start_bundle(
        &self,
        worker_id: &str,
        uuid: &str,
        hostname: &str,
        start_time: i64,
    ) -> Result<bool> {
        let path = format!("/workers/{}/start_bundle/{}", quote(worker_id), quote(uuid));
        let once = || async {
            let rb = self
                .request(Method::POST, &path)
                .await?
                .json(&serde_json::json!({"hostname": hostname, "start_time": start_time}))
                .timeout(self.inner.config.request_timeout);
            self.send_json(Method::POST, &path, rb).await
        };
        // The client's own schedule, for two more tries at most; answers only, not the
        // network errors `retry` also takes.
        let v = once
            .retry(self.backoff().with_max_times(2))
            .when(|e: &Error| e.status().is_some_and(|s| s.is_server_error()))
            .notify(|e, _| tracing::warn!("start_bundle for {uuid}: {e}; sending it again"))
            .await?;
        Ok(truthy(&v))
    }

    /// `POST /workers/<id>/reply/<socket_id>` with a JSON message.
    pub async fn reply(&self, worker_id: &str, socket_id: i64, message: &Value) -> Result<()> {
        let path = format!("/workers/{}/reply/{}", quote(worker_id), socket_id);
        let rb = self
            .request(Method::POST, &path)
            .await?
            .json(message)
            .timeout(self.inner.config.request_timeout);
        self.send(Method::POST, &path, rb).await.map(drop)
    }

    /// `POST /workers/<id>/reply_data/<socket_id>?header_message=<json>` with a streamed body.
    pub async fn reply_data(
        &self,
        worker_id: &str,
        socket_id: i64,
        header_message: &Value,
        body: reqwest::Body,
    ) -> Result<()> {
        let path = format!("/workers/{}/reply_data/{}", quote(worker_id), socket_id);
        let rb = self
            .request(Method::POST, &path)
            .await?
            .query(&[("header_message", header_message.to_string())])
            .body(body);
        self.send(Method::POST, &path, rb).await.map(drop)
    }

    /// `PUT /bundles/<uuid>/contents/blob/?filename=bundle.tar.gz&finalize_on_success=0&store=..`
    /// with a streamed tar.gz body. One attempt: the caller re-creates the stream to retry.
    pub async fn upload_bundle_contents(
        &self,
        uuid: &str,
        store: &str,
        body: reqwest::Body,
    ) -> Result<()> {
        let path = format!("/bundles/{}/contents/blob/", quote(uuid));
        let rb = self
            .request(Method::PUT, &path)
            .await?
            .query(&[
                ("filename", "bundle.tar.gz"),
                ("finalize_on_success", "0"),
                ("store", store),
            ])
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        self.send(Method::PUT, &path, rb).await.map(drop)
    }

    /// `GET /bundles/<uuid>/contents/info/<path>` (depth 0): the `data` object.
    pub async fn get_target_info(&self, uuid: &str, subpath: &str) -> Result<Value> {
        let path = format!("/bundles/{}/contents/info/{}", quote(uuid), quote(subpath));
        let v = self.get_json("get target info", &path, &[]).await?;
        Ok(v.get("data").cloned().unwrap_or(Value::Null))
    }

    /// `GET /bundles/<uuid>/contents/blob/<path>?support_redirect=1` asking for gzip. The caller
    /// streams the body; `Content-Encoding` says whether it is gzipped.
    pub async fn download_blob(&self, uuid: &str, subpath: &str) -> Result<Response> {
        let path = format!("/bundles/{}/contents/blob/{}", quote(uuid), quote(subpath));
        self.retry("download", || async {
            let rb = self
                .request(Method::GET, &path)
                .await?
                .query(&[("support_redirect", "1")])
                .header(header::ACCEPT_ENCODING, "gzip");
            self.send(Method::GET, &path, rb).await
        })
        .await
    }

    /// Every bundle matching `keywords` (`GET /bundles?keywords=…`), paged with `.limit` and
    /// `.offset` so that the server's default cap of 10 results never hides any. Bundles that
    /// move between pages while paging are counted once.
    pub async fn search_bundles(
        &self,
        keywords: &[String],
        page_size: usize,
    ) -> Result<Vec<Bundle>> {
        self.search_bundles_from(keywords, page_size, 0).await
    }

    /// As [`search_bundles`](Self::search_bundles), from the `offset`-th match on.
    pub async fn search_bundles_from(
        &self,
        keywords: &[String],
        page_size: usize,
        offset: usize,
    ) -> Result<Vec<Bundle>> {
        let page_size = page_size.max(1);
        let mut out: Vec<Bundle> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for page in 0..MAX_SEARCH_PAGES {
            let found = self
                .search_bundles_page(keywords, page_size, offset + page * page_size)
                .await?;
            let n = found.len();
            out.extend(found.into_iter().filter(|b| seen.insert(b.uuid.clone())));
            if n < page_size {
                return Ok(out);
            }
        }
        tracing::warn!(
            "bundle search stopped after {MAX_SEARCH_PAGES} pages of {page_size}; results are partial"
        );
        Ok(out)
    }

    /// One page of a bundle search: at most `limit` matches, from the `offset`-th on.
    pub async fn search_bundles_page(
        &self,
        keywords: &[String],
        limit: usize,
        offset: usize,
    ) -> Result<Vec<Bundle>> {
        let mut query: Vec<(&str, String)> = vec![("include", "owner".into())];
        query.extend(keywords.iter().map(|k| ("keywords", k.clone())));
        query.push(("keywords", format!(".limit={limit}")));
        query.push(("keywords", format!(".offset={offset}")));
        let path = "/bundles";
        let v = self.get_json("search bundles", path, &query).await?;
        let doc: Document<Vec<Resource>> =
            serde_json::from_value(v).map_err(|e| Error::Decode {
                method: Method::GET,
                url: self.url(path),
                message: e.to_string(),
            })?;
        Ok(doc.data.into_iter().map(Bundle::from_resource).collect())
    }

    /// How many bundles match `keywords` (`GET /bundles?keywords=…&keywords=.count`): the
    /// server counts them in one query, whatever their number.
    pub async fn count_bundles(&self, keywords: &[String]) -> Result<u64> {
        let mut query: Vec<(&str, String)> =
            keywords.iter().map(|k| ("keywords", k.clone())).collect();
        query.push(("keywords", ".count".into()));
        let path = "/bundles";
        let v = self.get_json("count bundles", path, &query).await?;
        v.pointer("/meta/result")
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::Decode {
                method: Method::GET,
                url: self.url(path),
                message: format!("no count in the answer to .count: {v}"),
            })
    }

    /// `GET /bundles/<uuid>`.
    pub async fn get_bundle(&self, uuid: &str) -> Result<Bundle> {
        let path = format!("/bundles/{}", quote(uuid));
        let v = self.get_json("get bundle", &path, &[]).await?;
        let doc: Document<Resource> = serde_json::from_value(v).map_err(|e| Error::Decode {
            method: Method::GET,
            url: self.url(&path),
            message: e.to_string(),
        })?;
        Ok(Bundle::from_resource(doc.data))
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Null => false,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// An error with its causes: reqwest's Display hides the chain ("builder error").
fn error_chain(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message = format!("{message}: {s}");
        source = s.source();
    }
    message
}

fn network(method: Method, url: &str, e: reqwest::Error) -> Error {
    Error::Network {
        method,
        url: url.to_owned(),
        message: error_chain(&e),
    }
}

async fn check(method: Method, url: &str, resp: Response) -> Result<Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp.text().await.unwrap_or_default();
    Err(Error::Http {
        method,
        url: url.to_owned(),
        status,
        message: truncate(&body),
    })
}

fn truncate(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(500) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests;
