//! A small typed client of the Azure Batch REST API on `azure_core`'s HTTP pipeline: the six
//! operations the backend uses, nothing more (no maintained Rust crate for the Batch data plane
//! exists).
//!
//! The pipeline is `azure_core`'s: client request ids, then its retry policy (which honours
//! `Retry-After`/`retry-after-ms` on 429 and 503 and retries transport errors, 408 and 5xx),
//! then — on every try, because a SharedKey signature covers the date — the authorization
//! policy, then the transport (the workspace's reqwest client with rustls).
//!
//! SharedKey signing follows the Batch service's specification, and requests are built the way
//! Microsoft's Batch SDK builds them (same path, query, headers and body bytes): the golden
//! tests compare the two request for request, signatures included.

use std::sync::Arc;

use azure_core::credentials::{Secret, TokenCredential};
use azure_core::http::policies::{ClientRequestIdPolicy, Policy, PolicyResult};
use azure_core::http::request::options::ClientRequestId;
use azure_core::http::{
    ClientOptions, Context, ExponentialRetryOptions, Method, Pipeline, PipelineSendOptions,
    RawResponse, Request, RetryOptions, Transport, Url,
};
use azure_core::time::{Duration, OffsetDateTime};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::model::{ErrorBody, Job, Node, NodePage, NodeRemove, Pool, Task, TaskAdd, TaskPage};
use crate::BackendError;

/// The Batch data-plane API version, pinned here and nowhere else.
pub const API_VERSION: &str = "2025-06-01";
/// The Microsoft Entra ID scope of the Batch service (the SDK's, double slash included).
pub const BATCH_SCOPE: &str = "https://batch.core.windows.net//.default";
/// Content type of request bodies, as the Batch SDK sends it.
const JSON_CONTENT_TYPE: &str = "application/json; odata=minimalmetadata";
/// The header the Batch service echoes in its logs (the SDK's name, not `x-ms-client-request-id`).
const CLIENT_REQUEST_ID: &str = "client-request-id";
/// Characters left as they are in query values: RFC 3986's unreserved ones (so a space is `%20`,
/// as the SDK sends it).
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// How requests are authorized.
pub enum Auth {
    /// The account name and its base64 key (SharedKey).
    SharedKey { account: String, key: Secret },
    /// Microsoft Entra ID: a token for [`BATCH_SCOPE`] from `credential` on every try.
    Token(Arc<dyn TokenCredential>),
}

impl Auth {
    /// SharedKey with `account` and its base64 `key`.
    pub fn shared_key(account: impl Into<String>, key: impl Into<String>) -> Self {
        Auth::SharedKey {
            account: account.into(),
            key: Secret::new(key.into()),
        }
    }

    /// Entra ID with the token kept in `path` by another process.
    pub fn token_file(path: impl Into<std::path::PathBuf>) -> Self {
        Auth::Token(Arc::new(FileTokenCredential { path: path.into() }))
    }
}

/// A token kept fresh in a file by another process (a sidecar, `az account get-access-token`
/// on a timer); read again for every request.
#[derive(Debug)]
pub struct FileTokenCredential {
    pub path: std::path::PathBuf,
}

#[async_trait::async_trait]
impl TokenCredential for FileTokenCredential {
    async fn get_token(
        &self,
        _scopes: &[&str],
        _options: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<azure_core::credentials::AccessToken> {
        let token = tokio::fs::read_to_string(&self.path).await.map_err(|e| {
            azure_core::Error::with_message(
                azure_core::error::ErrorKind::Credential,
                format!("--access-token-file {}: {e}", self.path.display()),
            )
        })?;
        Ok(azure_core::credentials::AccessToken {
            token: Secret::new(token.trim().to_string()),
            expires_on: OffsetDateTime::now_utc() + Duration::minutes(5),
        })
    }
}

/// The HTTP client under the Batch pipeline (and the Entra ID credentials'): the workspace's
/// reqwest with rustls on ring, no redirects (a Batch answer is never a redirect).
pub fn transport() -> Result<reqwest::Client, BackendError> {
    common::install_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(20))
        .read_timeout(std::time::Duration::from_secs(60))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| BackendError::permanent(format!("cannot build the HTTP client: {e}")))
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::SharedKey { account, .. } => write!(f, "SharedKey({account})"),
            Auth::Token(_) => f.write_str("EntraId"),
        }
    }
}

/// A failed Batch call: the HTTP status (0 when no response came), the service's error code
/// and message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct BatchError {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub details: Vec<(String, String)>,
}

impl BatchError {
    fn transport(e: &azure_core::Error) -> Self {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        Self {
            status: 0,
            code: "ConnectionError".into(),
            message,
            details: Vec::new(),
        }
    }

    /// The error of a response with `status` and the service's error `body`.
    pub fn from_response(status: u16, body: &[u8]) -> Self {
        let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
        let message = parsed
            .message
            .and_then(|m| m.value)
            .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(300).collect());
        Self {
            status,
            code: parsed.code.unwrap_or_else(|| format!("HTTP{status}")),
            message,
            details: parsed
                .values
                .into_iter()
                .map(|d| (d.key.unwrap_or_default(), d.value.unwrap_or_default()))
                .collect(),
        }
    }

    /// Whether the same call may succeed later (after the pipeline's own retries).
    pub fn is_retryable(&self) -> bool {
        matches!(self.status, 0 | 408 | 429) || self.status >= 500
    }

    /// `Code (HTTP status): first line of the message`, plus the authentication detail.
    fn describe(&self) -> String {
        let first = self.message.lines().next().unwrap_or("");
        let mut s = if self.status == 0 {
            format!("cannot reach the Batch service: {first}")
        } else {
            format!("{} (HTTP {}): {first}", self.code, self.status)
        };
        for (k, v) in &self.details {
            if k == "AuthenticationErrorDetail" || k == "Reason" {
                s.push_str(&format!(" [{k}: {v}]"));
            }
        }
        if self.code == "AuthenticationFailed" {
            s.push_str(" — check --account-name and the account key (or the Entra ID identity)");
        }
        s
    }

    /// As a backend error of operation `what`.
    pub fn into_backend(self, what: &str) -> BackendError {
        let msg = format!("{what}: {self}");
        if self.is_retryable() {
            BackendError::retryable(msg).with_source(self)
        } else {
            BackendError::permanent(msg).with_source(self)
        }
    }
}

/// A fixed `ocp-date` for one call (golden tests only: the signing policy otherwise stamps the
/// current time on every try).
#[derive(Debug, Clone)]
pub struct FixedDate(pub String);

/// The list-tasks query.
#[derive(Debug, Clone, PartialEq)]
pub struct ListQuery {
    pub filter: Option<String>,
    pub select: Vec<String>,
    pub max_results: Option<u32>,
}

/// A Batch account's data-plane client.
#[derive(Debug, Clone)]
pub struct BatchClient {
    endpoint: Url,
    pipeline: Pipeline,
    fixed: Option<(FixedDate, String)>,
}

/// The retries of every call: up to 4 more tries within 60 s, at least 0.5 s apart, longer when
/// the service says so (`Retry-After`).
pub fn retry_options() -> RetryOptions {
    RetryOptions::exponential(ExponentialRetryOptions {
        initial_delay: Duration::milliseconds(500),
        max_retries: 4,
        max_total_elapsed: Duration::seconds(60),
        max_delay: Duration::seconds(30),
    })
}

impl BatchClient {
    /// A client of the account at `endpoint` (`https://<account>.<region>.batch.azure.com`).
    /// `options.transport` must be set (the crate has no default HTTP client).
    pub fn new(endpoint: &str, auth: Auth, options: ClientOptions) -> Result<Self, BackendError> {
        let endpoint = Url::parse(endpoint.trim_end_matches('/')).map_err(|e| {
            BackendError::permanent(format!("--service-url {endpoint:?} is not a URL: {e}"))
        })?;
        if !matches!(endpoint.scheme(), "https" | "http") {
            return Err(BackendError::permanent(format!(
                "--service-url {endpoint}: https:// expected"
            )));
        }
        let per_try: Arc<dyn Policy> = match auth {
            Auth::SharedKey { account, key } => {
                // Fail now, not at the first request, on a key that is not base64.
                azure_core::hmac::hmac_sha256("", &key).map_err(|e| {
                    BackendError::permanent(format!("the Batch account key is not base64: {e}"))
                })?;
                Arc::new(SharedKeyPolicy { account, key })
            }
            Auth::Token(credential) => {
                if endpoint.scheme() == "http" && !is_loopback(&endpoint) {
                    return Err(BackendError::permanent(format!(
                        "--service-url {endpoint}: an Entra ID token is only sent over https \
                         (or to a loopback test service)"
                    )));
                }
                Arc::new(BearerPolicy { credential })
            }
        };
        let pipeline = Pipeline::new(
            Some(env!("CARGO_PKG_NAME")),
            Some(env!("CARGO_PKG_VERSION")),
            options,
            vec![Arc::new(ClientRequestIdPolicy::with_header_name(
                CLIENT_REQUEST_ID,
            ))],
            vec![per_try],
            None,
        );
        Ok(Self {
            endpoint,
            pipeline,
            fixed: None,
        })
    }

    /// Client options with `transport` and the backend's retries.
    pub fn options(transport: reqwest::Client) -> ClientOptions {
        ClientOptions {
            transport: Some(Transport::new(Arc::new(transport))),
            retry: retry_options(),
            ..Default::default()
        }
    }

    /// A client with [`transport`] and the backend's retries.
    pub fn with_default_transport(endpoint: &str, auth: Auth) -> Result<Self, BackendError> {
        Self::new(endpoint, auth, Self::options(transport()?))
    }

    /// Every request gets this `ocp-date` and `client-request-id` (golden tests).
    pub fn with_fixed_date_and_request_id(mut self, date: &str, request_id: &str) -> Self {
        self.fixed = Some((FixedDate(date.to_string()), request_id.to_string()));
        self
    }

    /// `/<segments…>?api-version=…` on the endpoint; segments are percent-encoded.
    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.endpoint.clone();
        {
            let mut path = url.path_segments_mut().expect("http(s) URLs have paths");
            path.pop_if_empty();
            path.extend(segments);
        }
        let mut q = format!("api-version={API_VERSION}");
        for (name, value) in query {
            q.push('&');
            q.push_str(name);
            q.push('=');
            q.push_str(value);
        }
        url.set_query(Some(&q));
        url
    }

    fn context(&self) -> Context<'static> {
        let ctx = Context::new();
        match &self.fixed {
            Some((date, id)) => ctx
                .with_value(date.clone())
                .with_value(ClientRequestId::new(id.clone())),
            None => ctx,
        }
    }

    /// Sends `request`; returns the response if its status is one of `ok`.
    async fn send(&self, mut request: Request, ok: &[u16]) -> Result<RawResponse, BatchError> {
        let ctx = self.context();
        let response = self
            .pipeline
            .send(
                &ctx,
                &mut request,
                Some(PipelineSendOptions {
                    skip_checks: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| BatchError::transport(&e))?;
        let status = u16::from(response.status());
        if ok.contains(&status) {
            Ok(response)
        } else {
            Err(BatchError::from_response(status, response.body()))
        }
    }

    async fn get_json<T: DeserializeOwned>(&self, url: Url, accept: &str) -> Result<T, BatchError> {
        let mut req = Request::new(url, Method::Get);
        req.insert_header("accept", accept.to_string());
        let response = self.send(req, &[200]).await?;
        serde_json::from_slice(response.body()).map_err(|e| BatchError {
            status: 200,
            code: "InvalidResponse".into(),
            message: format!("cannot parse the service's answer: {e}"),
            details: Vec::new(),
        })
    }

    /// *Add Task*: `POST /jobs/{job}/tasks`.
    pub async fn add_task(&self, job: &str, task: &TaskAdd) -> Result<(), BatchError> {
        let mut req = Request::new(self.url(&["jobs", job, "tasks"], &[]), Method::Post);
        req.insert_header("accept", "*/*");
        req.insert_header("content-type", JSON_CONTENT_TYPE);
        req.set_body(sdk_json(task));
        self.send(req, &[201]).await.map(drop)
    }

    /// *List Tasks*, every page (following `odata.nextLink`); also returns the number of pages.
    pub async fn list_tasks(
        &self,
        job: &str,
        query: &ListQuery,
    ) -> Result<(Vec<Task>, usize), BatchError> {
        self.list_all::<TaskPage, Task>(&["jobs", job, "tasks"], query, |p| {
            (std::mem::take(&mut p.value), p.next_link.take())
        })
        .await
    }

    /// *List Nodes* of a pool, every page; also returns the number of pages.
    pub async fn list_nodes(
        &self,
        pool: &str,
        query: &ListQuery,
    ) -> Result<(Vec<Node>, usize), BatchError> {
        self.list_all::<NodePage, Node>(&["pools", pool, "nodes"], query, |p| {
            (std::mem::take(&mut p.value), p.next_link.take())
        })
        .await
    }

    /// A listing's every page: the first at `segments` with `query`, then each
    /// `odata.nextLink` as given (as the SDK: with a generic Accept).
    async fn list_all<P: DeserializeOwned, T>(
        &self,
        segments: &[&str],
        query: &ListQuery,
        split: impl Fn(&mut P) -> (Vec<T>, Option<String>),
    ) -> Result<(Vec<T>, usize), BatchError> {
        let mut q = Vec::new();
        if let Some(n) = query.max_results {
            q.push(("maxresults", n.to_string()));
        }
        if let Some(f) = &query.filter {
            q.push(("$filter", utf8_percent_encode(f, QUERY_VALUE).to_string()));
        }
        if !query.select.is_empty() {
            let names: Vec<String> = query
                .select
                .iter()
                .map(|s| utf8_percent_encode(s, QUERY_VALUE).to_string())
                .collect();
            q.push(("$select", names.join(",")));
        }
        let mut page: P = self
            .get_json(self.url(segments, &q), "application/json")
            .await?;
        let (mut items, mut next) = split(&mut page);
        let mut pages = 1;
        while let Some(link) = next {
            let url = self.next_link(&link)?;
            let mut page: P = self.get_json(url, "*/*").await?;
            let (mut more, link) = split(&mut page);
            items.append(&mut more);
            next = link;
            pages += 1;
        }
        Ok((items, pages))
    }

    /// An `odata.nextLink`, which must point at this endpoint (it is signed and sent with our
    /// credentials).
    fn next_link(&self, link: &str) -> Result<Url, BatchError> {
        let bad = |why: &str| BatchError {
            status: 200,
            code: "InvalidResponse".into(),
            message: format!("odata.nextLink {link:?} {why}"),
            details: Vec::new(),
        };
        let url = self.endpoint.join(link).map_err(|_| bad("is not a URL"))?;
        if url.origin() != self.endpoint.origin() {
            return Err(bad("points away from the Batch account"));
        }
        Ok(url)
    }

    /// *Terminate Task*: `POST /jobs/{job}/tasks/{task}/terminate`.
    pub async fn terminate_task(&self, job: &str, task: &str) -> Result<(), BatchError> {
        let mut req = Request::new(
            self.url(&["jobs", job, "tasks", task, "terminate"], &[]),
            Method::Post,
        );
        req.insert_header("accept", "*/*");
        req.set_body(Vec::<u8>::new());
        self.send(req, &[204, 200]).await.map(drop)
    }

    /// *Delete Task*: `DELETE /jobs/{job}/tasks/{task}`.
    pub async fn delete_task(&self, job: &str, task: &str) -> Result<(), BatchError> {
        let mut req = Request::new(self.url(&["jobs", job, "tasks", task], &[]), Method::Delete);
        req.insert_header("accept", "*/*");
        // Signed as 0 (not a GET); the transport sends no length for an empty DELETE unless told.
        req.insert_header("content-length", "0");
        req.set_body(Vec::<u8>::new());
        self.send(req, &[200, 202, 204]).await.map(drop)
    }

    /// *Remove Nodes*: `POST /pools/{pool}/removenodes` (the pool must be `steady`).
    pub async fn remove_nodes(&self, pool: &str, body: &NodeRemove) -> Result<(), BatchError> {
        let mut req = Request::new(self.url(&["pools", pool, "removenodes"], &[]), Method::Post);
        req.insert_header("accept", "*/*");
        req.insert_header("content-type", JSON_CONTENT_TYPE);
        req.set_body(sdk_json(body));
        self.send(req, &[202, 200]).await.map(drop)
    }

    /// *Get Pool*: `GET /pools/{pool}`.
    pub async fn get_pool(&self, pool: &str) -> Result<Pool, BatchError> {
        self.get_json(self.url(&["pools", pool], &[]), "application/json")
            .await
    }

    /// *Get Job*: `GET /jobs/{job}`.
    pub async fn get_job(&self, job: &str) -> Result<Job, BatchError> {
        self.get_json(self.url(&["jobs", job], &[]), "application/json")
            .await
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

/// JSON as the Batch SDK (Python's `json.dumps`) writes it: `", "` between items and `": "`
/// after keys. The body's length is part of the SharedKey signature, so writing it the same way
/// makes our requests byte-for-byte comparable with the SDK's; the service accepts either.
pub fn sdk_json<T: Serialize>(value: &T) -> Vec<u8> {
    struct SdkFormatter;
    fn separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    impl serde_json::ser::Formatter for SdkFormatter {
        fn begin_array_value<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            separator(w, first)
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> std::io::Result<()> {
            separator(w, first)
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(
            &mut self,
            w: &mut W,
        ) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, SdkFormatter);
    value
        .serialize(&mut ser)
        .expect("task bodies are plain data");
    out
}

/// Signs every try with the account key: `ocp-date` (now, unless the call fixes it), then
/// `Authorization: SharedKey <account>:<signature>`.
#[derive(Debug)]
struct SharedKeyPolicy {
    account: String,
    key: Secret,
}

#[async_trait::async_trait]
impl Policy for SharedKeyPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let date = match ctx.value::<FixedDate>() {
            Some(d) => d.0.clone(),
            None => azure_core::time::to_rfc7231(&OffsetDateTime::now_utc()),
        };
        request.insert_header("ocp-date", date);
        let sts = string_to_sign(request, &self.account);
        let signature = azure_core::hmac::hmac_sha256(&sts, &self.key)?;
        request.insert_header(
            "authorization",
            format!("SharedKey {}:{signature}", self.account),
        );
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// The SharedKey string-to-sign of `request` (see the Batch service's *Authenticate requests*):
/// the verb, eleven standard headers, the `ocp-` headers, `/<account><path>` and the sorted,
/// decoded query parameters.
pub fn string_to_sign(request: &Request, account: &str) -> String {
    let method = request.method();
    let header = |name: &str| -> String {
        request
            .headers()
            .iter()
            .find(|(k, _)| k.as_str().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str().to_string())
            .unwrap_or_default()
    };
    let len = request.body().len().unwrap_or(0);
    let content_length = if len > 0 {
        len.to_string()
    } else if matches!(method, Method::Get | Method::Head) {
        String::new()
    } else {
        "0".to_string()
    };
    let mut lines = vec![method.to_string()];
    for name in [
        "content-encoding",
        "content-language",
        "content-length",
        "content-md5",
        "content-type",
        "date",
        "if-modified-since",
        "if-match",
        "if-none-match",
        "if-unmodified-since",
        "range",
    ] {
        lines.push(if name == "content-length" {
            content_length.clone()
        } else {
            header(name)
        });
    }
    let mut out = lines.join("\n");
    out.push('\n');
    let mut ocp: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_ascii_lowercase(), v.as_str().to_string()))
        .filter(|(k, v)| k.contains("ocp-") && !v.is_empty())
        .collect();
    ocp.sort();
    for (k, v) in ocp {
        out.push_str(&format!("{k}:{v}\n"));
    }
    out.push('/');
    out.push_str(account);
    out.push_str(request.url().path());
    let mut params: Vec<(String, String)> = Vec::new();
    for pair in request.url().query().unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        let (name, value) = (decode(name), decode(value));
        // The first value of a repeated name, as the SDK signs it.
        if !name.is_empty() && !value.is_empty() && params.iter().all(|(n, _)| *n != name) {
            params.push((name, value));
        }
    }
    params.sort();
    for (name, value) in params {
        out.push_str(&format!("\n{name}:{value}"));
    }
    out
}

/// Authorizes every try with a Microsoft Entra ID token for [`BATCH_SCOPE`] (the credential
/// caches and refreshes it). `azure_core`'s own bearer policy refuses plain http, which the
/// loopback stand-in serves; this one allows it only for loopback hosts ([`BatchClient::new`]).
#[derive(Debug)]
struct BearerPolicy {
    credential: Arc<dyn TokenCredential>,
}

#[async_trait::async_trait]
impl Policy for BearerPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let token = self.credential.get_token(&[BATCH_SCOPE], None).await?;
        request.insert_header("authorization", format!("Bearer {}", token.token.secret()));
        if let Some(d) = ctx.value::<FixedDate>() {
            request.insert_header("ocp-date", d.0.clone());
        }
        next[0].send(ctx, request, &next[1..]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_json_spacing() {
        let v = serde_json::json!({"a": [1, 2], "b": {"c": "x y"}});
        assert_eq!(
            String::from_utf8(sdk_json(&v)).unwrap(),
            r#"{"a": [1, 2], "b": {"c": "x y"}}"#
        );
    }

    #[test]
    fn string_to_sign_of_a_list_request() {
        let mut req = Request::new(
            Url::parse(
                "http://h/jobs/j/tasks?api-version=2025-06-01&maxresults=3&$filter=startswith%28id%2C%27a%27%29%20and%20x&$select=id,state",
            )
            .unwrap(),
            Method::Get,
        );
        req.insert_header("ocp-date", "Tue, 01 Dec 2026 10:00:00 GMT");
        assert_eq!(
            string_to_sign(&req, "acct"),
            "GET\n\n\n\n\n\n\n\n\n\n\n\nocp-date:Tue, 01 Dec 2026 10:00:00 GMT\n/acct/jobs/j/tasks\n$filter:startswith(id,'a') and x\n$select:id,state\napi-version:2025-06-01\nmaxresults:3"
        );
        let mut post = Request::new(
            Url::parse("http://h/jobs/j/tasks/t/terminate?api-version=1").unwrap(),
            Method::Post,
        );
        post.set_body(Vec::<u8>::new());
        assert!(string_to_sign(&post, "a").starts_with("POST\n\n\n0\n"));
    }

    #[test]
    fn errors_name_the_code_and_the_auth_detail() {
        let body = include_bytes!("../../../tests/peers/azure/fixtures/error-auth-failed.json");
        let e = BatchError::from_response(403, body);
        assert_eq!(e.code, "AuthenticationFailed");
        assert!(!e.is_retryable());
        let s = e.to_string();
        assert!(
            s.starts_with("AuthenticationFailed (HTTP 403): Server failed to authenticate"),
            "{s}"
        );
        assert!(
            s.contains("AuthenticationErrorDetail") && s.contains("--account-name"),
            "{s}"
        );
        assert!(!s.contains("RequestId"), "only the first line: {s}");
        let busy = include_bytes!("../../../tests/peers/azure/fixtures/error-server-busy.json");
        assert!(BatchError::from_response(503, busy).is_retryable());
        let garbage = BatchError::from_response(502, b"<html>bad gateway</html>");
        assert_eq!(garbage.code, "HTTP502");
        assert!(garbage.message.contains("bad gateway"));
    }
}
