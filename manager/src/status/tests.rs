use super::*;
use crate::policy::{plan, Config, Job, Observation, StagedBundle};

/// A status with a plan: 3 staged bundles of which one is unschedulable, a pending job,
/// one worker lost before check-in and two decisions.
pub(crate) fn sample_status() -> Status {
    let mut c = Config::with_default_shape(Shape::from_flags(1, 0, 2048));
    c.min_workers = 0;
    c.max_workers = 6;
    let mut st = PolicyState::new(&c);
    let obs = Observation {
        staged: vec![
            StagedBundle::new("0x1", 1, 0, 1 << 30),
            StagedBundle::new("0x2", 1, 0, 1 << 30),
            StagedBundle::new("0x3", 64, 0, 1 << 30),
        ],
        jobs: Ok(vec![Job::pending("j1", "default")]),
        now: 1000.0,
    };
    let mut p = plan(&c, &mut st, &obs);
    let mut j = Journal::default();
    j.note(990.0, "bundle 0x3 is unschedulable: fits no worker shape");
    j.note(1000.0, "launched 1 worker of shape default");
    j.lost("default");
    j.sample(Sample {
        at: 1000.0,
        staged: 3,
        pending: 1,
        running: 0,
        launches: 1,
    });
    Status {
        backend: "local".into(),
        server: "http://127.0.0.1:2900".into(),
        updated_at: Some(1000.0),
        workers: j.workers(&c.shapes, Some(&p)),
        shapes: c.shapes.clone(),
        min_workers: 0,
        max_workers: 6,
        capacity: None,
        pool: None,
        breaker: BreakerStatus::of(&st, 1000.0),
        health: Health::default(),
        decisions: j.decisions(),
        history: j.history(),
        bundles: std::mem::take(&mut p.waits),
        bundles_unlisted: 0,
        plan: Some(p),
        tiers: Vec::new(),
        lease: None,
    }
}

#[test]
fn table_shows_demand_workers_decisions_breaker_and_health() {
    let s = sample_status();
    let t = render_table(&s, 1003.0);
    for want in [
        "cl-worker-manager: local backend, server http://127.0.0.1:2900",
        "Last tick:  3s ago (00:16:40Z)",
        "Health:     server ok; backend ok",
        "Breaker:    closed, 0 failed launches in a row, no back-off",
        "Staged bundles: 3 (1 unschedulable)",
        "unschedulable 0x3: fits no worker shape: 64 cpus > largest 1",
        "Workers: 1 (1 pending, 0 running; min 0, max 6)",
        "00:16:40Z  launched 1 worker of shape default",
    ] {
        assert!(t.contains(want), "{want:?} not in\n{t}");
    }
    // The shape's row: 2 schedulable bundles staged, each needing a 1-CPU worker.
    let demand = t
        .lines()
        .find(|l| l.trim_start().starts_with("default  1 CPU"))
        .unwrap();
    let cols: Vec<&str> = demand.split_whitespace().collect();
    assert_eq!(cols[..2], ["default", "1"], "{demand}");
    assert_eq!(cols[7], "2", "staged: {demand}");
    let workers = t
        .lines()
        .skip_while(|l| !l.starts_with("Workers:"))
        .nth(2)
        .unwrap();
    assert_eq!(
        workers.split_whitespace().collect::<Vec<_>>(),
        ["default", "1", "0", "1"],
        "{t}"
    );
    assert_eq!(s.exit_code(), exit::HEALTHY);
}

#[test]
fn exit_codes_and_lines_of_a_sick_manager() {
    let mut s = sample_status();
    s.health.backend_error = Some("squeue: connection refused".into());
    assert_eq!(s.exit_code(), exit::DEGRADED);
    assert!(render_table(&s, 1000.0)
        .contains("Health:     server ok; backend ERROR: squeue: connection refused"));
    s.breaker = BreakerStatus {
        state: "open".into(),
        consecutive_failures: 5,
        open_for_secs: Some(125.0),
        backoff_secs: 0.0,
    };
    assert_eq!(s.exit_code(), exit::BREAKER_OPEN);
    assert_eq!(
        s.breaker_line(),
        "OPEN (probe launch in 2m05s), 5 failed launches in a row, no back-off"
    );
    s.breaker.state = "half_open".into();
    assert_eq!(s.exit_code(), exit::BREAKER_OPEN);
    // Before the first tick: no plan, healthy.
    let empty = Status {
        breaker: BreakerStatus {
            state: "closed".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(empty.exit_code(), exit::HEALTHY);
    assert!(render_table(&empty, 0.0).contains("Last tick:  none yet"));
}

#[test]
fn journal_is_bounded_by_age_and_count() {
    let mut j = Journal::default();
    for i in 0..5000 {
        j.sample(Sample {
            at: f64::from(i),
            ..Default::default()
        });
        j.note(f64::from(i), format!("d{i}"));
    }
    let h = j.history();
    assert!(h.len() <= HISTORY_MAX);
    assert!(h.first().unwrap().at >= 4999.0 - HISTORY_SECS, "{:?}", h[0]);
    assert_eq!(h.last().unwrap().at, 4999.0);
    let d = j.decisions();
    assert_eq!(d.len(), DECISIONS_MAX);
    assert_eq!(d.last().unwrap().text, "d4999");
    // A sparse history keeps an hour, whatever the count.
    let mut j = Journal::default();
    for t in [0.0, 1000.0, 3000.0, 4000.0] {
        j.sample(Sample {
            at: t,
            ..Default::default()
        });
    }
    let at: Vec<f64> = j.history().iter().map(|s| s.at).collect();
    assert_eq!(at, [1000.0, 3000.0, 4000.0]);
}

#[test]
fn status_round_trips_through_json() {
    let s = sample_status();
    let json = serde_json::to_string(&s).unwrap();
    let back: Status = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    // The keys that /status always had are still there.
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for k in [
        "backend",
        "server",
        "shapes",
        "min_workers",
        "max_workers",
        "plan",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
    assert_eq!(v["plan"]["unschedulable"][0]["uuid"], "0x3");
    // A shape keeps its flat form: its resources beside its name.
    assert_eq!(
        v["shapes"][0],
        serde_json::json!({"name": "default", "cpus": 1, "gpus": 0, "memory_bytes": 2048u64 << 20})
    );
}

#[test]
fn urls_and_answers() {
    assert_eq!(
        status_target("http://127.0.0.1:9464").unwrap().as_str(),
        "http://127.0.0.1:9464/status"
    );
    assert_eq!(
        status_target("127.0.0.1:9464/").unwrap().as_str(),
        "http://127.0.0.1:9464/status"
    );
    assert_eq!(
        status_target("http://mgr.example/cl/status")
            .unwrap()
            .as_str(),
        "http://mgr.example/cl/status"
    );
    assert_eq!(
        status_target("[::1]:9464/cl/").unwrap().as_str(),
        "http://[::1]:9464/cl/status"
    );
    for bad in ["https://x:1", "http://", "ftp://x/", "http://x:99999"] {
        assert!(status_target(bad).is_err(), "{bad}");
    }
    let body = serde_json::to_string(&sample_status()).unwrap();
    use reqwest::StatusCode;
    assert_eq!(
        parse_answer(StatusCode::OK, body.as_bytes()).unwrap(),
        sample_status()
    );
    let e = parse_answer(StatusCode::NOT_FOUND, b"").unwrap_err();
    assert_eq!(e.exit_code(), exit::INVALID);
    assert_eq!(e.to_string(), "the manager answered 404 Not Found");
    let e = parse_answer(StatusCode::OK, b"{\"plan\": 3}").unwrap_err();
    assert_eq!(e.exit_code(), exit::INVALID);
}

#[test]
fn formats() {
    assert_eq!(duration(45.2), "45s");
    assert_eq!(duration(185.0), "3m05s");
    assert_eq!(duration(7800.0), "2h10m");
    assert_eq!(bytes(2 << 30), "2.0 GiB");
    assert_eq!(bytes(512 << 20), "512 MiB");
    assert_eq!(clock(86_400.0 + 3661.0), "01:01:01Z");
}

#[test]
fn exit_codes_are_distinct_and_never_a_usage_error() {
    let codes = [
        exit::HEALTHY,
        exit::BREAKER_OPEN,
        exit::DEGRADED,
        exit::INVALID,
        exit::UNREACHABLE,
        exit::CANNOT_START,
    ];
    let mut sorted = codes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), codes.len(), "{codes:?}");
    assert!(!codes.contains(&2), "2 is clap's usage error: {codes:?}");
    for c in codes.iter().filter(|c| **c != 0) {
        assert!(exit::HELP.contains(&format!(" {c} ")), "{c} not in --help");
    }
}

/// With `--lease`: the table and the page say who holds it, since when, and what this manager
/// is; a holder's name is the operator's text, escaped on the page.
#[test]
fn the_lease_holder_and_this_managers_role_are_shown() {
    let mut s = sample_status();
    assert_eq!(s.lease_line(), None);
    assert!(!render_table(&s, 1003.0).contains("Lease:"));
    s.lease = Some(crate::lease::LeaseStatus {
        lease: "file:/shared/manager.lease".into(),
        me: "b".into(),
        leader: false,
        holder: "a<script>".into(),
        since: Some(990.0),
        renewed_at: Some(1000.0),
        duration_s: 15.0,
        transitions: 1,
        error: None,
    });
    let t = render_table(&s, 1003.0);
    assert!(
        t.contains(
            "Lease:      held by a<script> since 00:16:30Z: this manager is a standby \
             (b, file:/shared/manager.lease; 15s)"
        ),
        "{t}"
    );
    let page = crate::page::render_html(&s, 1003.0);
    assert!(
        page.contains("<span id=\"lease\" class=\"muted\">held by a&lt;script&gt;"),
        "{page}"
    );
    assert_eq!(s.exit_code(), super::exit::HEALTHY, "a standby is healthy");
    s.lease.as_mut().unwrap().leader = true;
    assert!(s
        .lease_line()
        .unwrap()
        .contains("this manager is in charge"));
    s.lease.as_mut().unwrap().error = Some("cannot read the lease: timed out".into());
    assert_eq!(s.exit_code(), super::exit::DEGRADED);
    assert!(render_table(&s, 1003.0).contains("; cannot read the lease: timed out"));
}
