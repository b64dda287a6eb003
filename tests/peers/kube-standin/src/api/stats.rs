//! The kubelet's Summary API (`/api/v1/nodes/{node}/proxy/stats/summary`), as the API server
//! proxies it: per pod and container, cumulative CPU time and memory in use, read from Docker's
//! stats of the containers the node agent runs.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use bollard::query_parameters::{ListContainersOptionsBuilder, StatsOptionsBuilder};
use bollard::Docker;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use serde_json::{json, Value};

use super::{status_error, Resp};
use crate::state::{Shared, LABEL_CONTAINER_NAME, LABEL_INSTANCE, LABEL_POD_UID};

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// One container's `cpu` and `memory` blocks of the Summary API.
async fn container_stats(docker: &Docker, id: &str) -> Option<(Value, Value)> {
    let opts = StatsOptionsBuilder::default()
        .stream(false)
        .one_shot(true)
        .build();
    let s = docker.stats(id, Some(opts)).next().await?.ok()?;
    let cpu = s.cpu_stats.unwrap_or_default();
    let usage = cpu.cpu_usage.and_then(|u| u.total_usage).unwrap_or(0);
    let mem = s.memory_stats.unwrap_or_default();
    let used = mem.usage.unwrap_or(0);
    // cgroup v2 calls it inactive_file, v1 total_inactive_file: the working set excludes it.
    let inactive = mem
        .stats
        .as_ref()
        .and_then(|m| {
            m.get("inactive_file")
                .or_else(|| m.get("total_inactive_file"))
        })
        .copied()
        .unwrap_or(0);
    let t = now();
    Some((
        json!({"time": t, "usageCoreNanoSeconds": usage}),
        json!({"time": t, "usageBytes": used, "workingSetBytes": used.saturating_sub(inactive)}),
    ))
}

/// `GET /api/v1/nodes/{node}/proxy/stats/summary`.
pub async fn node_summary(shared: &Arc<Shared>, node: &str) -> Resp {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    match nodes.get_opt(node).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return status_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("nodes \"{node}\" not found"),
            )
        }
        Err(e) => {
            return status_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            )
        }
    }
    let pods: Api<Pod> = Api::all(shared.client.clone());
    let pods = match pods.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            return status_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            )
        }
    };
    let docker = match Docker::connect_with_local_defaults() {
        Ok(d) => d,
        Err(e) => {
            return status_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                e.to_string(),
            )
        }
    };
    let opts = ListContainersOptionsBuilder::default()
        .all(false)
        .filters(&std::collections::HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_INSTANCE}={}", shared.instance)],
        )]))
        .build();
    let containers = docker.list_containers(Some(opts)).await.unwrap_or_default();
    let mut by_pod: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for c in containers {
        let labels = c.labels.unwrap_or_default();
        if let (Some(uid), Some(name), Some(id)) = (
            labels.get(LABEL_POD_UID),
            labels.get(LABEL_CONTAINER_NAME),
            c.id,
        ) {
            by_pod
                .entry(uid.clone())
                .or_default()
                .push((name.clone(), id));
        }
    }
    let mut out = Vec::new();
    for p in pods {
        let on_node = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let Some(ctrs) = by_pod.get(&uid).filter(|_| on_node) else {
            continue;
        };
        let mut containers = Vec::new();
        let (mut cpu_ns, mut ws) = (0u64, 0u64);
        for (name, id) in ctrs {
            if let Some((cpu, mem)) = container_stats(&docker, id).await {
                cpu_ns += cpu["usageCoreNanoSeconds"].as_u64().unwrap_or(0);
                ws += mem["workingSetBytes"].as_u64().unwrap_or(0);
                containers.push(json!({"name": name, "cpu": cpu, "memory": mem}));
            }
        }
        let t = now();
        out.push(json!({
            "podRef": {
                "name": p.metadata.name,
                "namespace": p.metadata.namespace,
                "uid": uid,
            },
            "containers": containers,
            "cpu": {"time": t, "usageCoreNanoSeconds": cpu_ns},
            "memory": {"time": t, "workingSetBytes": ws},
        }));
    }
    let body = json!({"node": {"nodeName": node}, "pods": out});
    let mut r = axum::response::IntoResponse::into_response((StatusCode::OK, body.to_string()));
    r.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}
