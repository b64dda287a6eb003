//! Lists: label and field selectors, as a real API server applies them.

use super::*;

/// One requirement of a field selector.
#[derive(Debug, PartialEq)]
pub(super) struct FieldReq {
    pub(super) field: String,
    pub(super) value: String,
    pub(super) equal: bool,
}

pub(super) fn parse_field_selector(s: &str) -> Result<Vec<FieldReq>, String> {
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
pub(super) fn field_value(kind: &str, obj: &Value, field: &str) -> Option<Option<String>> {
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

pub(super) async fn list(
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
