//! Decoding request bodies as the API server does: through the typed k8s-openapi structs, so
//! unknown fields are found (and refused with `fieldValidation=Strict`, else dropped with a
//! warning), and wrongly typed values are refused with 400.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use k8s_openapi::api::{apps, batch, coordination, core::v1 as core};

fn round_trip<K: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let typed: K = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// The object re-encoded through its k8s-openapi type, or None for a kind this stand-in does
/// not decode (it is then stored as sent). Err is a decoding error (wrong type of a value).
pub fn decode(group: &str, kind: &str, v: &Value) -> Option<Result<Value, String>> {
    Some(match (group, kind) {
        ("", "Pod") => round_trip::<core::Pod>(v),
        ("", "Secret") => round_trip::<core::Secret>(v),
        ("", "ConfigMap") => round_trip::<core::ConfigMap>(v),
        ("", "PersistentVolumeClaim") => round_trip::<core::PersistentVolumeClaim>(v),
        ("", "PersistentVolume") => round_trip::<core::PersistentVolume>(v),
        ("", "Node") => round_trip::<core::Node>(v),
        ("", "Event") => round_trip::<core::Event>(v),
        ("", "Service") => round_trip::<core::Service>(v),
        ("", "ServiceAccount") => round_trip::<core::ServiceAccount>(v),
        ("batch", "Job") => round_trip::<batch::v1::Job>(v),
        ("apps", "Deployment") => round_trip::<apps::v1::Deployment>(v),
        ("apps", "DaemonSet") => round_trip::<apps::v1::DaemonSet>(v),
        // The managers' leader election (`--lease kubernetes:…`).
        ("coordination.k8s.io", "Lease") => round_trip::<coordination::v1::Lease>(v),
        _ => return None,
    })
}

/// JSON paths (`spec.containers[0].foo`) of fields in `sent` that `decoded` lost: the fields
/// the schema does not know. Nulls count as absent.
pub fn unknown_fields(sent: &Value, decoded: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(sent, decoded, String::new(), &mut out);
    out
}

fn walk(sent: &Value, decoded: &Value, path: String, out: &mut Vec<String>) {
    match (sent, decoded) {
        (Value::Object(s), Value::Object(d)) => {
            for (k, v) in s {
                if v.is_null() {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match d.get(k) {
                    None => out.push(p),
                    Some(dv) => walk(v, dv, p, out),
                }
            }
        }
        (Value::Array(s), Value::Array(d)) if s.len() == d.len() => {
            for (i, (a, b)) in s.iter().zip(d).enumerate() {
                walk(a, b, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_found() {
        let sent = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x", "creationTimestamp": null, "labels": {"app": "w"}},
            "spec": {
                "containers": [{"name": "c", "image": "i", "bogus": 1,
                                "resources": {"limits": {"cpu": 1, "memory": "1Gi"}}}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"podAffinityTerm": {"labelSelector": {}}, "topologyKey": "kubernetes.io/hostname"}]}}
            }
        });
        let decoded = decode("", "Pod", &sent).unwrap().unwrap();
        assert_eq!(
            unknown_fields(&sent, &decoded),
            vec![
                "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm"
                    .to_string(),
                "spec.containers[0].bogus".to_string(),
            ]
        );
        // Integer quantities are accepted, as the API server does.
        assert_eq!(
            decoded["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "1"
        );
    }

    #[test]
    fn wrong_types_are_errors() {
        let sent = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                          "spec": {"containers": "nope"}});
        assert!(decode("", "Pod", &sent).unwrap().is_err());
        assert!(decode("example.com", "Thing", &sent).is_none());
    }
}
