//! Writes: create, replace, patch (merge, strategic merge, JSON patch, server-side apply) and
//! delete, with the defaults a real API server fills in on create and the record of every
//! request for the tests.

use super::*;

/// Records a client's object (its request body as sent) for `k8s.sh validate`.
pub(super) fn record(shared: &Shared, verb: &str, kind: &str, ns: &str, name: &str, body: &[u8]) {
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

pub(super) fn random_suffix() -> String {
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

pub(super) fn uuid_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn write(
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
pub(super) fn default_on_create(kind: &str, obj: &mut Value) {
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

pub(super) async fn delete(
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
