//! The example alert rules (examples/prometheus/alerts.yml) against promtool, and the metrics
//! they use against the metrics the binaries serve.

use std::collections::HashMap;

/// Metric names (`# TYPE name …`, counters with their `_total`) of a text exposition.
fn names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (name, kind) = (it.next()?, it.next()?);
            Some(match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            })
        })
        .collect()
}

/// The manager's metrics with a series in every family (a family without one is not encoded).
fn every_manager_series() -> String {
    use manager::metrics::*;
    let m = Metrics::new();
    let shape = || ShapeLabels {
        shape: "default".into(),
    };
    let _ = m.workers.get_or_create(&WorkerLabels {
        shape: "default".into(),
        state: "pending".into(),
    });
    let _ = m.workers_needed.get_or_create(&shape());
    let _ = m.launches.get_or_create(&shape());
    let _ = m.submit_failures.get_or_create(&shape());
    let _ = m.failed_launches.get_or_create(&FailedLaunchLabels {
        shape: "default".into(),
        reason: "exited".into(),
    });
    let _ = m.interrupted.get_or_create(&FailedLaunchLabels {
        shape: "default".into(),
        reason: "exited".into(),
    });
    m.observation_error("server");
    m.observe_pool(&backends::PoolStatus {
        id: "pool".into(),
        state: "active".into(),
        allocation_state: "steady".into(),
        current_dedicated_nodes: 0,
        current_low_priority_nodes: 0,
        target_dedicated_nodes: 0,
        target_low_priority_nodes: 0,
        task_slots_per_node: None,
        auto_scale: None,
        resize_errors: vec![backends::PoolError {
            code: "AccountCoreQuotaReached".into(),
            message: String::new(),
        }],
        unhealthy_nodes: Vec::new(),
        removed_nodes: Vec::new(),
        repair_error: None,
    });
    m.encode()
}

#[test]
fn alert_rules_pass_promtool_and_use_served_metrics() {
    let manager = every_manager_series();
    let worker = worker::metrics::Metrics::new().encode();
    // promtool check rules, and test rules: each alert fires when it should, and only then.
    let out = testkit::peers::bash(&["tests/examples/check-prometheus.sh"], &HashMap::new());
    assert!(out.contains("SUCCESS: 11 rules found"), "{out}");
    // Every cl_worker_manager_* name in the rules is one the manager serves.
    let served = names(&manager);
    let rules =
        std::fs::read_to_string(testkit::peers::repo_root().join("examples/prometheus/alerts.yml"))
            .unwrap();
    let used: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| t.starts_with("cl_worker_manager_"))
        .collect();
    assert!(used.len() >= 6, "{used:?}");
    for name in used {
        assert!(
            served.iter().any(|s| s == name),
            "{name} is not served: {served:?}"
        );
    }
    // And every metric of both binaries is documented.
    let doc = std::fs::read_to_string(testkit::peers::repo_root().join("docs/metrics.md")).unwrap();
    for name in served.iter().chain(&names(&worker)) {
        assert!(
            doc.contains(&format!("`{name}`")),
            "{name} is not in docs/metrics.md"
        );
    }
}
