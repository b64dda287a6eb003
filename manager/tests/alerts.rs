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
    m.set_waiting(&[]);
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
    assert!(out.contains("SUCCESS: 12 rules found"), "{out}");
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

/// `- alert: NAME` of alerts.yml, in order.
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|n| n.trim().to_string())
        .collect()
}

#[test]
fn every_alert_has_a_case_where_it_fires() {
    // alerts.test.yml names each alert of alerts.yml in a block with expected alerts (one that
    // fires), besides the cases where it must not: promtool (above) runs them.
    let root = testkit::peers::repo_root().join("examples/prometheus");
    let rules = std::fs::read_to_string(root.join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(root.join("alerts.test.yml")).unwrap();
    let names = alert_names(&rules);
    assert_eq!(names.len(), 12, "{names:?}");
    assert!(names.iter().any(|n| n == "CodalabManagerNoLeader"));
    for name in &names {
        let fires = tests.lines().enumerate().any(|(i, l)| {
            l.trim() == format!("alertname: {name}")
                && tests
                    .lines()
                    .nth(i + 1)
                    .is_some_and(|next| next.trim() == "exp_alerts:")
        });
        assert!(fires, "alerts.test.yml: no case where {name} fires");
    }
}

#[test]
fn the_no_leader_alert_reads_the_gauge_every_manager_serves() {
    // The alert sums cl_worker_manager_leader over the managers of a job (0: all standbys)
    // and fires on its absence too (all gone), for two lease periods of the default
    // --lease-duration-seconds 15; a manager without --lease serves 1, so a lone manager
    // never sets it off.
    let rules =
        std::fs::read_to_string(testkit::peers::repo_root().join("examples/prometheus/alerts.yml"))
            .unwrap();
    let rule = rules
        .split("- alert: CodalabManagerNoLeader")
        .nth(1)
        .and_then(|r| r.split("- alert: ").next())
        .expect("alerts.yml: no CodalabManagerNoLeader");
    for want in [
        "sum by (job) (cl_worker_manager_leader) < 1",
        "or absent(cl_worker_manager_leader{job=\"cl-worker-manager\"})",
        "for: 30s",
        "severity: critical",
    ] {
        assert!(
            rule.contains(want),
            "CodalabManagerNoLeader: no `{want}`:\n{rule}"
        );
    }
    let served = every_manager_series();
    assert!(
        served.lines().any(|l| l == "cl_worker_manager_leader 1"),
        "without --lease the manager must serve cl_worker_manager_leader 1:\n{served}"
    );
}
