//! Discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/{group}/{version}`) and a minimal
//! OpenAPI v3 index, all generated from kube-fake-client's built-in resource tables (taken
//! from the upstream discovery data). The OpenAPI documents carry no schemas: only each
//! resource's PATCH operation with its `fieldValidation` parameter, which is what kubectl
//! looks for to leave field validation to the server.

use std::collections::BTreeMap;

use kube_fake_client::discovery as d;
use serde_json::{json, Value};

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
];
const SUBRESOURCES: &[&str] = &[
    "status",
    "log",
    "binding",
    "eviction",
    "exec",
    "attach",
    "portforward",
    "proxy",
    "finalize",
    "scale",
    "ephemeralcontainers",
    "resize",
];

/// group -> versions (in table order).
fn groups() -> BTreeMap<&'static str, Vec<&'static str>> {
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (g, v, _, _) in d::list_resources() {
        let vs = out.entry(*g).or_default();
        if !vs.contains(v) {
            vs.push(v);
        }
    }
    out
}

fn preferred(versions: &[&'static str]) -> &'static str {
    let stable = |v: &&str| !v.contains("alpha") && !v.contains("beta");
    let mut stable_versions: Vec<&str> = versions.iter().copied().filter(stable).collect();
    stable_versions
        .sort_by_key(|v| std::cmp::Reverse(v.trim_start_matches('v').parse::<u32>().unwrap_or(0)));
    stable_versions
        .first()
        .copied()
        .or_else(|| versions.iter().copied().find(|v| v.contains("beta")))
        .unwrap_or(versions[0])
}

fn group_doc(g: &str, versions: &[&'static str]) -> Value {
    let gv = |v: &str| json!({"groupVersion": format!("{g}/{v}"), "version": v});
    json!({
        "name": g,
        "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>(),
        "preferredVersion": gv(preferred(versions)),
    })
}

pub fn group_list() -> Value {
    let groups: Vec<Value> = groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(g: &str) -> Option<Value> {
    let all = groups();
    let vs = all.get(g).filter(|_| !g.is_empty())?;
    let mut doc = group_doc(g, vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

pub fn resource_list(g: &str, v: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for (rg, rv, kind, plural) in d::list_resources() {
        if *rg != g || *rv != v {
            continue;
        }
        let namespaced = d::is_namespaced(g, v, kind).unwrap_or(true);
        let verbs: Vec<&str> = VERBS
            .iter()
            .copied()
            .filter(|verb| d::supports_verb(g, v, kind, verb))
            .collect();
        resources.push(json!({
            "name": plural, "singularName": d::get_singular(g, v, kind).unwrap_or(""),
            "namespaced": namespaced, "kind": kind, "verbs": verbs,
            "shortNames": d::get_short_names(g, v, kind),
        }));
        for sub in SUBRESOURCES {
            if !d::has_subresource(g, v, kind, sub) {
                continue;
            }
            let verbs: &[&str] = match *sub {
                "status" | "scale" => &["get", "patch", "update"],
                "log" => &["get"],
                _ => &["create"],
            };
            resources.push(json!({
                "name": format!("{plural}/{sub}"), "singularName": "", "namespaced": namespaced,
                "kind": kind, "verbs": verbs,
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if g.is_empty() {
        v.to_string()
    } else {
        format!("{g}/{v}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn gv_path(g: &str, v: &str) -> String {
    if g.is_empty() {
        format!("api/{v}")
    } else {
        format!("apis/{g}/{v}")
    }
}

pub fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    for (g, vs) in groups() {
        for v in vs {
            let p = gv_path(g, v);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=0")}),
            );
        }
    }
    json!({"paths": paths})
}

pub fn openapi_v3_doc(g: &str, v: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    let field_validation = json!({
        "name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true},
        "description": "Strict, Warn or Ignore: what the server does with unknown fields",
    });
    for (rg, rv, kind, plural) in d::list_resources() {
        if *rg != g || *rv != v {
            continue;
        }
        let base = if g.is_empty() {
            format!("/api/{v}")
        } else {
            format!("/apis/{g}/{v}")
        };
        let namespaced = d::is_namespaced(g, v, kind).unwrap_or(true);
        let coll = if namespaced {
            format!("{base}/namespaces/{{namespace}}/{plural}")
        } else {
            format!("{base}/{plural}")
        };
        let gvk = json!({"group": g, "version": v, "kind": kind});
        let op = |id: &str| {
            json!({
                "operationId": format!("{id}{kind}"), "x-kubernetes-group-version-kind": gvk,
                "parameters": [field_validation], "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(coll.clone(), json!({"post": op("create")}));
        paths.insert(
            format!("{coll}/{{name}}"),
            json!({"put": op("replace"), "patch": op("patch")}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "unversioned"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_resources() {
        let doc = resource_list("", "v1").unwrap();
        let names: Vec<&str> = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for n in [
            "pods",
            "pods/status",
            "pods/log",
            "secrets",
            "persistentvolumeclaims",
            "nodes",
            "events",
            "namespaces",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        assert!(group("batch").is_some());
        assert!(group("").is_none());
        assert_eq!(preferred(&["v1beta1", "v1", "v2"]), "v2");
        assert!(openapi_v3_doc("", "v1").unwrap()["paths"]
            ["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
            .is_object());
    }
}
