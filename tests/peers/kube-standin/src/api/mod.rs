//! The HTTP front: serves the Kubernetes REST paths on loopback and forwards resource requests
//! to kube-fake-client's in-memory API (through `kube::Client::send`, which passes raw HTTP
//! requests to its service). Around it, the front adds what an API server does and the fake
//! does not: bearer-token authentication, discovery, `/version`, request decoding through the
//! typed schema (unknown fields, `fieldValidation`), pod and secret defaulting, namespaces,
//! field selectors with `==`/`!=`, pod logs from Docker, and the record of created objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::sched;
use crate::schema;
use crate::state::{Faults, Shared, LABEL_INSTANCE, LABEL_POD_UID};

mod list;
mod stats;
mod write;
use self::list::*;
use self::write::*;

pub type Resp = Response;

/// A Kubernetes `Status` failure response.
pub fn status_error(code: StatusCode, reason: &str, message: impl Into<String>) -> Resp {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message.into(), "reason": reason, "code": code.as_u16(),
    });
    json_response(code, &body)
}

fn json_response(code: StatusCode, v: &Value) -> Resp {
    let mut r = (code, v.to_string()).into_response();
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

/// The parts of an API path.
#[derive(Debug, Clone, PartialEq)]
struct ResPath {
    group: String,
    version: String,
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
    sub: Option<String>,
}

impl ResPath {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn kind(&self) -> Option<&'static str> {
        kube_fake_client::discovery::plural_to_kind(&self.group, &self.version, &self.resource)
    }
}

#[derive(Debug, PartialEq)]
enum Route {
    Version,
    Healthz,
    ApiVersions,
    GroupList,
    Group(String),
    Resources(String, String),
    OpenApiV2,
    OpenApiV3Root,
    OpenApiV3(String, String),
    Resource(ResPath),
    Control(String),
    /// The kubelet's Summary API of a node, through the API server's node proxy.
    NodeStats(String),
    NotFound,
}

fn parse_route(path: &str) -> Route {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match parts.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Healthz,
        ["api"] => Route::ApiVersions,
        ["apis"] => Route::GroupList,
        ["apis", g] => Route::Group(g.to_string()),
        ["api", v] => Route::Resources(String::new(), v.to_string()),
        ["apis", g, v] => Route::Resources(g.to_string(), v.to_string()),
        ["openapi", "v2"] | ["swagger.json"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", "api", v] => Route::OpenApiV3(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => Route::OpenApiV3(g.to_string(), v.to_string()),
        ["standin", "v1", rest @ ..] => Route::Control(rest.join("/")),
        ["api", "v1", "nodes", node, "proxy", "stats", "summary"] => {
            Route::NodeStats(node.to_string())
        }
        ["api", v, rest @ ..] => res_path("", v, rest),
        ["apis", g, v, rest @ ..] => res_path(g, v, rest),
        _ => Route::NotFound,
    }
}

fn res_path(group: &str, version: &str, rest: &[&str]) -> Route {
    let (namespace, rest) = match rest {
        // /namespaces/{ns}/{resource}...; /namespaces[/{name}[/sub]] is the namespace itself.
        ["namespaces", ns, r, tail @ ..] if !matches!(*r, "status" | "finalize") => {
            (Some(ns.to_string()), [&[*r][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let (resource, name, sub) = match rest.as_slice() {
        [r] => (r.to_string(), None, None),
        [r, n] => (r.to_string(), Some(n.to_string()), None),
        [r, n, s] => (r.to_string(), Some(n.to_string()), Some(s.to_string())),
        _ => return Route::NotFound,
    };
    Route::Resource(ResPath {
        group: group.into(),
        version: version.into(),
        namespace,
        resource,
        name,
        sub,
    })
}

fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect()
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
                {
                    Ok(x) => {
                        out.push(x);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn pct_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn query_get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn build_query(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", pct_encode(k), pct_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Sends one request to the in-memory API and returns (status, body).
async fn forward(
    shared: &Shared,
    method: Method,
    path: &str,
    query: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), String> {
    let uri = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req
        .body(kube::client::Body::from(body))
        .map_err(|e| e.to_string())?;
    let resp = shared.client.send(req).await.map_err(|e| e.to_string())?;
    let status =
        StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes))
}

fn bytes_response(code: StatusCode, body: Bytes) -> Resp {
    let mut r = (code, body).into_response();
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

pub async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Resp {
    let path = uri.path().to_string();
    let route = parse_route(&path);
    if route != Route::Healthz {
        if let Some(token) = shared.token.as_deref() {
            let sent = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            if sent != Some(token) {
                return status_error(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
            }
        }
    }
    let query = query_pairs(uri.query());
    let resp = match route {
        Route::Healthz => (StatusCode::OK, "ok").into_response(),
        Route::Version => json_response(StatusCode::OK, &version_doc(&shared)),
        Route::ApiVersions => json_response(
            StatusCode::OK,
            &json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": format!("127.0.0.1:{}", shared.port)}
                ],
            }),
        ),
        Route::GroupList => json_response(StatusCode::OK, &crate::discovery::group_list()),
        Route::Group(g) => match crate::discovery::group(&g) {
            Some(doc) => json_response(StatusCode::OK, &doc),
            None => status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            ),
        },
        Route::Resources(g, v) => match crate::discovery::resource_list(&g, &v) {
            Some(doc) => json_response(StatusCode::OK, &doc),
            None => status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            ),
        },
        // An OpenAPI v2 document without definitions: older kubectl (before v3) downloads it
        // to validate on the client, and skips kinds it does not define. It asks for protobuf,
        // where an empty message is an empty document.
        Route::OpenApiV2 => {
            let accept = headers
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if accept.contains("protobuf") {
                let mut r = (StatusCode::OK, Bytes::new()).into_response();
                r.headers_mut().insert(
                    "content-type",
                    HeaderValue::from_static("application/octet-stream"),
                );
                r
            } else {
                json_response(
                    StatusCode::OK,
                    &json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "unversioned"},
                            "paths": {}, "definitions": {}}),
                )
            }
        }
        Route::OpenApiV3Root => json_response(StatusCode::OK, &crate::discovery::openapi_v3_root()),
        Route::OpenApiV3(g, v) => match crate::discovery::openapi_v3_doc(&g, &v) {
            Some(doc) => json_response(StatusCode::OK, &doc),
            None => status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            ),
        },
        Route::Control(rest) => control(&shared, &method, &rest, &body),
        Route::NodeStats(node) if method == Method::GET => {
            stats::node_summary(&shared, &node).await
        }
        Route::NodeStats(_) => status_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ),
        Route::Resource(rp) => resource(&shared, method, rp, query, &headers, body).await,
        Route::NotFound => status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        ),
    };
    tracing::debug!(target: "kube_standin::http", "{} {} -> {}", uri, path, resp.status());
    resp
}

fn version_doc(shared: &Shared) -> Value {
    let (major, minor) = shared.version;
    json!({
        "major": major.to_string(), "minor": minor.to_string(),
        "gitVersion": format!("v{major}.{minor}.0-kube-standin"),
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

// ---------------------------------------------------------------------------
// Control endpoint: faults
// ---------------------------------------------------------------------------

fn control(shared: &Shared, method: &Method, rest: &str, body: &[u8]) -> Resp {
    match (method.as_str(), rest) {
        ("GET", "faults") => json_response(
            StatusCode::OK,
            &serde_json::to_value(shared.faults()).unwrap_or_default(),
        ),
        ("PUT" | "POST", "faults") => match serde_json::from_slice::<Faults>(body) {
            Ok(f) => {
                for sel in [&f.unschedulable, &f.image_pull, &f.config_error]
                    .into_iter()
                    .flatten()
                {
                    if !sel.is_empty() {
                        if let Err(e) = kube_fake_client::label_selector::parse_label_selector(sel)
                        {
                            return status_error(
                                StatusCode::BAD_REQUEST,
                                "BadRequest",
                                format!("bad selector {sel:?}: {e}"),
                            );
                        }
                    }
                }
                *shared.faults.lock().expect("faults lock") = f.clone();
                shared.wake.notify_one();
                tracing::info!(
                    "faults now {}",
                    serde_json::to_string(&f).unwrap_or_default()
                );
                json_response(StatusCode::OK, &serde_json::to_value(f).unwrap_or_default())
            }
            Err(e) => status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("bad faults document: {e}"),
            ),
        },
        _ => status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no control endpoint {method} /standin/v1/{rest}"),
        ),
    }
}

// ---------------------------------------------------------------------------
// Resources
// ---------------------------------------------------------------------------

fn namespace_doc(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name},
                     "uid": format!("00000000-0000-4000-8000-{:012x}", fnv(name) & 0xffff_ffff_ffff),
                     "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Namespaces are read-only here: the fixed set given at start (kube-fake-client cannot
/// route `/api/v1/namespaces` paths).
fn namespaces(shared: &Shared, method: &Method, rp: &ResPath) -> Resp {
    if method != Method::GET {
        return status_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "namespaces are fixed when kube-standin starts (--namespace); they cannot be created, changed or deleted",
        );
    }
    match rp.name.as_deref() {
        None => json_response(
            StatusCode::OK,
            &json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": "1"},
                    "items": shared.namespaces.iter().map(|n| namespace_doc(n)).collect::<Vec<_>>()}),
        ),
        Some(n) if shared.namespaces.iter().any(|x| x == n) => {
            json_response(StatusCode::OK, &namespace_doc(n))
        }
        Some(n) => status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("namespaces \"{n}\" not found"),
        ),
    }
}

async fn resource(
    shared: &Arc<Shared>,
    method: Method,
    rp: ResPath,
    query: Vec<(String, String)>,
    headers: &HeaderMap,
    body: Bytes,
) -> Resp {
    if rp.group.is_empty() && rp.resource == "namespaces" && rp.namespace.is_none() {
        return namespaces(shared, &method, &rp);
    }
    let Some(kind) = rp.kind() else {
        return status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let namespaced =
        kube_fake_client::discovery::is_namespaced(&rp.group, &rp.version, kind).unwrap_or(true);
    if let Some(ns) = rp.namespace.as_deref() {
        if !namespaced {
            return status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        let writes = matches!(method, Method::POST | Method::PUT | Method::PATCH);
        if writes && !shared.namespaces.iter().any(|n| n == ns) {
            return status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("namespaces \"{ns}\" not found"),
            );
        }
    } else if namespaced && rp.name.is_some() {
        return status_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    }
    match rp.sub.as_deref() {
        None | Some("status") => {}
        Some("log") if kind == "Pod" && method == Method::GET => {
            return pod_log(shared, &rp, &query).await
        }
        Some(s)
            if kube_fake_client::discovery::has_subresource(&rp.group, &rp.version, kind, s) =>
        {
            return status_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("the {s} subresource is not served by kube-standin"),
            );
        }
        Some(_) => {
            return status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
    }
    let path = api_path(&rp);
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match method {
        Method::GET if rp.name.is_none() => list(shared, &rp, kind, &path, query).await,
        Method::GET => pass(shared, Method::GET, &path, "", None, Vec::new()).await,
        Method::POST if rp.name.is_none() => {
            write(shared, Method::POST, headers, &rp, kind, &path, query, body).await
        }
        Method::PUT if rp.name.is_some() => {
            write(shared, Method::PUT, headers, &rp, kind, &path, query, body).await
        }
        Method::PATCH if rp.name.is_some() => {
            let q = build_query(&query);
            let r = pass(
                shared,
                Method::PATCH,
                &path,
                &q,
                content_type.as_deref(),
                body.to_vec(),
            )
            .await;
            shared.wake.notify_one();
            r
        }
        Method::DELETE => delete(shared, &rp, kind, &path, query, body).await,
        _ => status_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not allowed on this path"),
        ),
    }
}

fn api_path(rp: &ResPath) -> String {
    let mut p = if rp.group.is_empty() {
        format!("/api/{}", rp.version)
    } else {
        format!("/apis/{}/{}", rp.group, rp.version)
    };
    if let Some(ns) = &rp.namespace {
        p.push_str(&format!("/namespaces/{ns}"));
    }
    p.push('/');
    p.push_str(&rp.resource);
    if let Some(n) = &rp.name {
        p.push('/');
        p.push_str(n);
    }
    if let Some(s) = &rp.sub {
        p.push('/');
        p.push_str(s);
    }
    p
}

async fn pass(
    shared: &Shared,
    method: Method,
    path: &str,
    query: &str,
    ct: Option<&str>,
    body: Vec<u8>,
) -> Resp {
    match forward(shared, method, path, query, ct, body).await {
        Ok((code, bytes)) => bytes_response(code, bytes),
        Err(e) => status_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e),
    }
}

// ---------------------------------------------------------------------------
// Pod logs (from the pod's Docker containers)
// ---------------------------------------------------------------------------

async fn pod_log(shared: &Shared, rp: &ResPath, query: &[(String, String)]) -> Resp {
    let (code, bytes) = match forward(
        shared,
        Method::GET,
        &api_path(&ResPath {
            sub: None,
            ..rp.clone()
        }),
        "",
        None,
        Vec::new(),
    )
    .await
    {
        Ok(x) => x,
        Err(e) => return status_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e),
    };
    if !code.is_success() {
        return bytes_response(code, bytes);
    }
    let pod: Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let containers: Vec<String> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let name = rp.name.clone().unwrap_or_default();
    let container = match query_get(query, "container") {
        Some(c) => c.to_string(),
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    containers.join(" ")
                ),
            )
        }
    };
    let Ok(docker) = bollard::Docker::connect_with_local_defaults() else {
        return status_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "cannot reach Docker",
        );
    };
    let filters: std::collections::HashMap<String, Vec<String>> = [(
        "label".to_string(),
        vec![
            format!("{LABEL_POD_UID}={uid}"),
            format!("{}={container}", crate::state::LABEL_CONTAINER_NAME),
            format!("{LABEL_INSTANCE}={}", shared.instance),
        ],
    )]
    .into();
    let opts = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let id = match docker.list_containers(Some(opts)).await {
        Ok(list) => list.into_iter().find_map(|c| c.id),
        Err(e) => {
            return status_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            )
        }
    };
    let Some(id) = id else {
        return status_error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"),
        );
    };
    let tail = query_get(query, "tailLines")
        .map(str::to_string)
        .unwrap_or_else(|| "all".into());
    let opts = bollard::query_parameters::LogsOptionsBuilder::default()
        .stdout(true)
        .stderr(true)
        .timestamps(query_get(query, "timestamps") == Some("true"))
        .tail(&tail)
        .build();
    use futures::StreamExt;
    let mut stream = docker.logs(&id, Some(opts));
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => out.extend_from_slice(&c.into_bytes()),
            Err(e) => {
                tracing::warn!("docker logs {id}: {e}");
                break;
            }
        }
    }
    let mut r = (StatusCode::OK, Body::from(out)).into_response();
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("text/plain"));
    r
}

#[cfg(test)]
mod tests;
