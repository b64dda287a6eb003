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
            crate::stats::node_summary(&shared, &node).await
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

/// One requirement of a field selector.
#[derive(Debug, PartialEq)]
struct FieldReq {
    field: String,
    value: String,
    equal: bool,
}

fn parse_field_selector(s: &str) -> Result<Vec<FieldReq>, String> {
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, true)
        } else {
            return Err(format!(
                "invalid selector: '{s}'; can't understand '{term}'"
            ));
        };
        out.push(FieldReq {
            field: field.trim().into(),
            value: value.trim().into(),
            equal,
        });
    }
    Ok(out)
}

/// Fields a field selector may name, per kind (the API server's supported set).
fn field_value(kind: &str, obj: &Value, field: &str) -> Option<Option<String>> {
    let get = |ptr: &str| {
        obj.pointer(ptr).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let ptr = match (kind, field) {
        (_, "metadata.name") => "/metadata/name",
        (_, "metadata.namespace") => "/metadata/namespace",
        ("Pod", "spec.nodeName") => "/spec/nodeName",
        ("Pod", "spec.restartPolicy") => "/spec/restartPolicy",
        ("Pod", "spec.schedulerName") => "/spec/schedulerName",
        ("Pod", "spec.serviceAccountName") => "/spec/serviceAccountName",
        ("Pod", "spec.hostNetwork") => "/spec/hostNetwork",
        ("Pod", "status.phase") => "/status/phase",
        ("Pod", "status.podIP") => "/status/podIP",
        ("Pod", "status.nominatedNodeName") => "/status/nominatedNodeName",
        ("Event", "involvedObject.kind") => "/involvedObject/kind",
        ("Event", "involvedObject.namespace") => "/involvedObject/namespace",
        ("Event", "involvedObject.name") => "/involvedObject/name",
        ("Event", "involvedObject.uid") => "/involvedObject/uid",
        ("Event", "involvedObject.fieldPath") => "/involvedObject/fieldPath",
        ("Event", "reason") => "/reason",
        ("Event", "type") => "/type",
        ("Secret", "type") => "/type",
        ("Node", "spec.unschedulable") => "/spec/unschedulable",
        _ => return None,
    };
    Some(get(ptr))
}

async fn list(
    shared: &Shared,
    rp: &ResPath,
    kind: &str,
    path: &str,
    mut query: Vec<(String, String)>,
) -> Resp {
    if matches!(query_get(&query, "watch"), Some("1" | "true")) {
        return status_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "watch is not supported by kube-standin: poll with list",
        );
    }
    if let Some(sel) = query_get(&query, "labelSelector") {
        if let Err(e) = kube_fake_client::label_selector::parse_label_selector(sel) {
            return status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("unable to parse requirement: {e}"),
            );
        }
    }
    // Field selectors are applied here (the in-memory API knows only "a=b").
    let reqs = match query_get(&query, "fieldSelector").map(parse_field_selector) {
        None => Vec::new(),
        Some(Ok(r)) => r,
        Some(Err(e)) => return status_error(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    for r in &reqs {
        if field_value(kind, &json!({}), &r.field).is_none() {
            return status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("field label not supported: {}", r.field),
            );
        }
    }
    query.retain(|(k, _)| k == "labelSelector");
    let (code, bytes) = match forward(
        shared,
        Method::GET,
        path,
        &build_query(&query),
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
    let Ok(mut doc) = serde_json::from_slice::<Value>(&bytes) else {
        return bytes_response(code, bytes);
    };
    let mut max_rv = 1u64;
    if let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) {
        items.retain(|o| {
            reqs.iter().all(|r| {
                let v = field_value(kind, o, &r.field).flatten().unwrap_or_default();
                (v == r.value) == r.equal
            })
        });
        // Stable order: namespace, then name (as the API server lists from etcd).
        items.sort_by_key(|o| {
            (
                o.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                o.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            )
        });
        for o in items.iter_mut() {
            if let Some(rv) = o
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
            {
                max_rv = max_rv.max(rv.parse().unwrap_or(0));
            }
            // List items carry no kind/apiVersion in a real API server's JSON.
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
        }
    }
    doc["metadata"] = json!({"resourceVersion": max_rv.to_string()});
    doc["apiVersion"] = json!(rp.api_version());
    json_response(StatusCode::OK, &doc)
}

/// Records a client's object (its request body as sent) for `k8s.sh validate`.
fn record(shared: &Shared, verb: &str, kind: &str, ns: &str, name: &str, body: &[u8]) {
    let seq = shared.next_seq();
    let clean = |s: &str| {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect::<String>()
    };
    let file = shared.objects_dir.join(format!(
        "{seq:06}-{verb}-{}-{}-{}.json",
        clean(kind),
        clean(if ns.is_empty() { "_" } else { ns }),
        clean(if name.is_empty() { "_" } else { name })
    ));
    if let Err(e) = std::fs::write(&file, body) {
        tracing::warn!("cannot record {}: {e}", file.display());
    }
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = u64::from_le_bytes(uuid_bytes()[..8].try_into().unwrap_or([7; 8]));
    (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
            x /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn uuid_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b
}

#[allow(clippy::too_many_arguments)]
async fn write(
    shared: &Arc<Shared>,
    method: Method,
    headers: &HeaderMap,
    rp: &ResPath,
    kind: &str,
    path: &str,
    query: Vec<(String, String)>,
    body: Bytes,
) -> Resp {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if !content_type.contains("json") {
        return status_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json (kube-standin decodes no {content_type})"),
        );
    }
    let mut obj: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the request body is not a JSON object",
            )
        }
        Err(e) => {
            return status_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("kube-standin accepts JSON bodies only: {e}"),
            )
        }
    };
    let is_status = rp.sub.as_deref() == Some("status");
    let sent_kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or(kind)
        .to_string();
    let sent_av = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| rp.api_version());
    if sent_kind != kind || sent_av != rp.api_version() {
        return status_error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("the API version in the data ({sent_av}) and kind ({sent_kind}) do not match the request path ({}, {kind})", rp.api_version()),
        );
    }
    obj["kind"] = json!(kind);
    obj["apiVersion"] = json!(sent_av);
    // Name: from the body, or generated from metadata.generateName on create.
    let meta = obj.as_object_mut().and_then(|o| {
        o.entry("metadata").or_insert_with(|| json!({}));
        o.get_mut("metadata")
    });
    let Some(Value::Object(meta)) = meta else {
        return status_error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "metadata must be an object",
        );
    };
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name.is_empty() && method == Method::POST {
        if let Some(prefix) = meta.get("generateName").and_then(Value::as_str) {
            name = format!("{prefix}{}", random_suffix());
            meta.insert("name".into(), json!(name));
        }
    }
    if name.is_empty() {
        return status_error(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", format!("{kind} \"\" is invalid: metadata.name: Required value: name or generateName is required"));
    }
    if let Some(n) = rp.name.as_deref() {
        if n != name {
            return status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the name of the object ({name}) does not match the name on the URL ({n})"),
            );
        }
    }
    let path_ns = rp.namespace.clone().unwrap_or_default();
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != path_ns && !path_ns.is_empty() => {
            return status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
        _ => {}
    }
    if !path_ns.is_empty() {
        meta.insert("namespace".into(), json!(path_ns));
    }

    // Decode through the schema: unknown fields and wrong types.
    let mut warnings = Vec::new();
    let validation = query_get(&query, "fieldValidation")
        .unwrap_or("Warn")
        .to_string();
    if let Some(decoded) = schema::decode(&rp.group, kind, &obj) {
        let decoded = match decoded {
            Ok(d) => d,
            Err(e) => {
                return status_error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!(
                        "{kind} in version \"{}\" cannot be handled as a {kind}: {e}",
                        rp.version
                    ),
                );
            }
        };
        let unknown = schema::unknown_fields(&obj, &decoded);
        if !unknown.is_empty() && validation == "Strict" {
            let list = unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect::<Vec<_>>()
                .join(", ");
            return status_error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("strict decoding error: {list}"),
            );
        }
        if validation == "Warn" {
            warnings = unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect();
        }
        obj = decoded;
    }
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
            "managedFields",
            "selfLink",
        ] {
            m.remove(k);
        }
        if method == Method::POST {
            m.remove("resourceVersion");
        }
    }
    if method == Method::POST {
        default_on_create(kind, &mut obj);
    }
    let q = build_query(
        &query
            .into_iter()
            .filter(|(k, _)| k == "fieldManager")
            .collect::<Vec<_>>(),
    );
    let bytes = serde_json::to_vec(&obj).unwrap_or_default();
    let verb = if method == Method::POST {
        "create"
    } else {
        "replace"
    };
    let mut resp = pass(shared, method, path, &q, Some("application/json"), bytes).await;
    // The record keeps what the client sent, for objects the API accepted.
    if !is_status && resp.status().is_success() {
        record(shared, verb, kind, &path_ns, &name, &body);
    }
    for w in warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "\\\""))) {
            resp.headers_mut().append("warning", v);
        }
    }
    shared.wake.notify_one();
    resp
}

/// What the API server fills in on create (the parts clients read back).
fn default_on_create(kind: &str, obj: &mut Value) {
    match kind {
        "Pod" => {
            let qos = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(obj.clone())
                .map(|p| sched::qos_class(&p))
                .unwrap_or("BestEffort");
            let spec = &mut obj["spec"];
            if spec.is_object() {
                let set = |spec: &mut Value, k: &str, v: Value| {
                    if spec.get(k).is_none_or(Value::is_null) {
                        spec[k] = v;
                    }
                };
                set(spec, "restartPolicy", json!("Always"));
                set(spec, "terminationGracePeriodSeconds", json!(30));
                set(spec, "dnsPolicy", json!("ClusterFirst"));
                set(spec, "schedulerName", json!("default-scheduler"));
                set(spec, "securityContext", json!({}));
                set(spec, "enableServiceLinks", json!(true));
                set(spec, "priority", json!(0));
                for list in ["containers", "initContainers"] {
                    for c in spec
                        .get_mut(list)
                        .and_then(Value::as_array_mut)
                        .into_iter()
                        .flatten()
                    {
                        let image = c
                            .get("image")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string();
                        if c.get("imagePullPolicy").is_none_or(Value::is_null) {
                            let tagged = image
                                .rsplit('/')
                                .next()
                                .is_some_and(|last| last.contains(':'))
                                || image.contains('@');
                            let latest = !tagged || image.ends_with(":latest");
                            c["imagePullPolicy"] =
                                json!(if latest { "Always" } else { "IfNotPresent" });
                        }
                        if c.get("terminationMessagePath").is_none_or(Value::is_null) {
                            c["terminationMessagePath"] = json!("/dev/termination-log");
                        }
                        if c.get("terminationMessagePolicy").is_none_or(Value::is_null) {
                            c["terminationMessagePolicy"] = json!("File");
                        }
                        // Requests default to limits.
                        if let Some(limits) = c
                            .pointer("/resources/limits")
                            .cloned()
                            .and_then(|l| l.as_object().cloned())
                        {
                            let req = &mut c["resources"]["requests"];
                            if !req.is_object() {
                                *req = json!({});
                            }
                            for (k, v) in limits {
                                if req.get(&k).is_none() {
                                    req[k] = v;
                                }
                            }
                        }
                    }
                }
            }
            obj["status"] = json!({"phase": "Pending", "qosClass": qos});
        }
        "Secret" => {
            if obj.get("type").is_none_or(Value::is_null) {
                obj["type"] = json!("Opaque");
            }
            // stringData is write-only: merged into data, base64-encoded by the typed encoder.
            if let Some(sd) = obj.get("stringData").and_then(Value::as_object).cloned() {
                if let Ok(mut s) =
                    serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(obj.clone())
                {
                    let data = s.data.get_or_insert_with(BTreeMap::new);
                    for (k, v) in sd {
                        data.insert(
                            k,
                            k8s_openapi::ByteString(v.as_str().unwrap_or("").as_bytes().to_vec()),
                        );
                    }
                    s.string_data = None;
                    if let Ok(v) = serde_json::to_value(s) {
                        *obj = v;
                    }
                }
            }
        }
        "PersistentVolumeClaim" => {
            obj["status"] = json!({"phase": "Pending"});
        }
        "Node" => {}
        _ => {
            if let Some(o) = obj.as_object_mut() {
                if o.get("status").is_some() && kind != "Event" {
                    o.remove("status");
                }
            }
        }
    }
}

async fn delete(
    shared: &Arc<Shared>,
    rp: &ResPath,
    kind: &str,
    path: &str,
    query: Vec<(String, String)>,
    body: Bytes,
) -> Resp {
    let mut grace: Option<i64> =
        query_get(&query, "gracePeriodSeconds").and_then(|v| v.parse().ok());
    if grace.is_none() && !body.is_empty() {
        if let Ok(v) = serde_json::from_slice::<Value>(&body) {
            grace = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        }
    }
    let q = build_query(
        &query
            .iter()
            .filter(|(k, _)| k == "propagationPolicy" || k == "labelSelector")
            .cloned()
            .collect::<Vec<_>>(),
    );
    let (code, bytes) = match forward(
        shared,
        Method::DELETE,
        path,
        &q,
        Some("application/json"),
        Vec::new(),
    )
    .await
    {
        Ok(x) => x,
        Err(e) => return status_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e),
    };
    if code.is_success() && kind == "Pod" && rp.name.is_some() {
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            if let (Some(uid), Some(g)) =
                (v.pointer("/metadata/uid").and_then(Value::as_str), grace)
            {
                shared
                    .grace
                    .lock()
                    .expect("grace lock")
                    .insert(uid.to_string(), g);
            }
        }
    }
    shared.wake.notify_one();
    bytes_response(code, bytes)
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
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(parse_route("/version"), Route::Version);
        assert_eq!(
            parse_route("/api/v1"),
            Route::Resources(String::new(), "v1".into())
        );
        let Route::Resource(rp) = parse_route("/api/v1/namespaces/default/pods/p1/status") else {
            panic!()
        };
        assert_eq!(
            (
                rp.namespace.as_deref(),
                rp.resource.as_str(),
                rp.name.as_deref(),
                rp.sub.as_deref()
            ),
            (Some("default"), "pods", Some("p1"), Some("status"))
        );
        let Route::Resource(rp) = parse_route("/api/v1/namespaces/default") else {
            panic!()
        };
        assert_eq!(
            (rp.namespace, rp.resource.as_str(), rp.name.as_deref()),
            (None, "namespaces", Some("default"))
        );
        let Route::Resource(rp) = parse_route("/api/v1/nodes/a") else {
            panic!()
        };
        assert_eq!(
            (rp.resource.as_str(), rp.name.as_deref()),
            ("nodes", Some("a"))
        );
        let Route::Resource(rp) = parse_route("/apis/batch/v1/namespaces/x/jobs") else {
            panic!()
        };
        assert_eq!((rp.group.as_str(), rp.kind()), ("batch", Some("Job")));
    }

    #[test]
    fn field_selectors() {
        assert_eq!(
            parse_field_selector("status.phase==Running,spec.nodeName!=a,metadata.name=x").unwrap(),
            vec![
                FieldReq {
                    field: "status.phase".into(),
                    value: "Running".into(),
                    equal: true
                },
                FieldReq {
                    field: "spec.nodeName".into(),
                    value: "a".into(),
                    equal: false
                },
                FieldReq {
                    field: "metadata.name".into(),
                    value: "x".into(),
                    equal: true
                },
            ]
        );
        assert!(parse_field_selector("status.phase").is_err());
        let pod = json!({"spec": {}, "status": {"phase": "Pending"}});
        assert_eq!(field_value("Pod", &pod, "spec.nodeName"), Some(None));
        assert_eq!(
            field_value("Pod", &pod, "status.phase"),
            Some(Some("Pending".into()))
        );
        assert_eq!(field_value("Pod", &pod, "spec.bogus"), None);
    }

    #[test]
    fn percent_coding() {
        assert_eq!(
            pct_decode("app%3Dcl-worker%2Cx+in+%28a%29"),
            "app=cl-worker,x in (a)"
        );
        assert_eq!(pct_decode("100%"), "100%");
        assert_eq!(pct_encode("a=b,c"), "a%3Db%2Cc");
    }
}

/// kube-rs (the client the Rust backend uses) against the front over real HTTP, without the
/// node agent: pods stay Pending.
#[cfg(test)]
mod kube_rs_tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
    use kube::config::{KubeConfigOptions, Kubeconfig};

    use crate::state::{Faults, Shared};

    async fn serve(token: Option<&str>) -> (u16, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let client = kube_fake_client::ClientBuilder::new()
            .with_status_subresource::<Pod>()
            .with_status_subresource::<Node>()
            .build()
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            client,
            token: token.map(str::to_string),
            namespaces: vec!["default".into()],
            objects_dir: dir.path().to_path_buf(),
            state_dir: dir.path().to_path_buf(),
            seq: AtomicU64::new(0),
            faults: Mutex::new(Faults::default()),
            wake: tokio::sync::Notify::new(),
            grace: Mutex::new(Default::default()),
            instance: "test".into(),
            version: (1, 36),
            port,
        });
        let app = axum::Router::new()
            .fallback(super::handle)
            .with_state(shared);
        tokio::spawn(async move { axum::serve(listener, app).await });
        (port, dir)
    }

    async fn client(port: u16, token: &str) -> kube::Client {
        // kube-fake-client's dependencies turn on rustls' aws-lc-rs next to ring: with both,
        // rustls cannot pick a provider by itself.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n\
             contexts:\n- name: s\n  context: {{cluster: s, user: u}}\ncurrent-context: s\n\
             users:\n- name: u\n  user: {{token: '{token}'}}\n"
        );
        let kc = Kubeconfig::from_yaml(&yaml).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    fn pod(name: &str, app: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "img",
                     "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn kube_rs_crud_selectors_conflicts_and_auth() {
        let (port, dir) = serve(Some("s3cret")).await;
        let bad: Api<Pod> = Api::namespaced(client(port, "wrong").await, "default");
        match bad.list(&ListParams::default()).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 401),
            other => panic!("wrong token: {other:?}"),
        }
        let c = client(port, "s3cret").await;
        let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
        let created = pods
            .create(&PostParams::default(), &pod("w1", "cl-worker"))
            .await
            .unwrap();
        assert!(created.metadata.uid.is_some());
        assert_eq!(
            created.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Pending")
        );
        // Defaulting: requests from limits.
        let req = created.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .requests
            .clone();
        assert_eq!(req.unwrap()["cpu"].0, "1");
        pods.create(&PostParams::default(), &pod("other", "x"))
            .await
            .unwrap();
        match pods
            .create(&PostParams::default(), &pod("w1", "cl-worker"))
            .await
        {
            Err(kube::Error::Api(e)) => {
                assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"))
            }
            other => panic!("duplicate: {other:?}"),
        }
        let listed = pods
            .list(&ListParams::default().labels("app=cl-worker"))
            .await
            .unwrap();
        assert_eq!(listed.items.len(), 1);
        // The manager's way of counting workers.
        let patched = pods
            .patch_status(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"phase": "Running"}})),
            )
            .await
            .unwrap();
        assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Running"));
        let running = pods
            .list(&ListParams::default().fields("status.phase==Running"))
            .await
            .unwrap();
        assert_eq!(
            running
                .items
                .iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect::<Vec<_>>(),
            ["w1"]
        );
        let not_running = pods
            .list(&ListParams::default().fields("status.phase!=Running"))
            .await
            .unwrap();
        assert_eq!(not_running.items.len(), 1);
        // A stale resourceVersion on replace is a 409 Conflict.
        let mut stale = created.clone();
        stale.metadata.labels = Some([("app".to_string(), "changed".to_string())].into());
        match pods.replace("w1", &PostParams::default(), &stale).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 409),
            other => panic!("stale replace: {other:?}"),
        }
        // Unknown namespace.
        let elsewhere: Api<Pod> = Api::namespaced(c.clone(), "nope");
        match elsewhere
            .create(&PostParams::default(), &pod("w2", "x"))
            .await
        {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 404),
            other => panic!("unknown namespace: {other:?}"),
        }
        pods.delete("w1", &Default::default()).await.unwrap();
        assert!(pods.get_opt("w1").await.unwrap().is_none());
        // Both accepted creates were recorded for the validation oracle.
        let recorded = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(recorded, 2);
        // Watches are refused rather than answered with a list.
        match pods.watch(&kube::api::WatchParams::default(), "0").await {
            Err(_) => {}
            Ok(stream) => {
                use futures::TryStreamExt;
                let first = Box::pin(stream).try_next().await;
                assert!(first.is_err(), "watch answered {first:?}");
            }
        }
    }
}
