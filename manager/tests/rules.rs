//! Table tests, one group per policy rule.

use manager::*;

const GIB: u64 = 1024 * 1024 * 1024;

fn small() -> Shape {
    Shape::new("small", 2, 0, 4 * GIB)
}
fn big() -> Shape {
    Shape::new("big", 8, 0, 32 * GIB)
}
fn gpu() -> Shape {
    Shape::new("gpu", 8, 1, 32 * GIB)
}

/// Unthrottled config: min 0, max 100, no spacing, a large bucket.
fn cfg(shapes: Vec<Shape>) -> Config {
    let mut c = Config::with_default_shape(shapes[0].clone());
    c.shapes = shapes;
    c.min_workers = 0;
    c.max_workers = 100;
    c.min_seconds_between_workers = 0.0;
    c.launch_burst = 1000;
    c.launch_rate_per_sec = 1000.0;
    c.validate().unwrap();
    c
}

fn bundle(i: usize, cpus: u32, gpus: u32, mem: u64) -> StagedBundle {
    StagedBundle::new(format!("0x{i:02}"), cpus, gpus, mem)
}

fn obs(staged: Vec<StagedBundle>, jobs: Vec<Job>, now: f64) -> Observation {
    Observation {
        staged,
        jobs: Ok(jobs),
        now,
    }
}

fn launches_of(p: &Plan, shape: &str) -> u32 {
    p.actions
        .iter()
        .map(|a| match a {
            Action::Launch { shape: s, count } if s == shape => *count,
            _ => 0,
        })
        .sum()
}

// The breaker, the spacing of rounds and the token bucket.
#[path = "rules/limits.rs"]
mod limits;

#[test]
fn burst_launches_everything_needed_in_one_tick() {
    let c = cfg(vec![small()]);
    let mut st = PolicyState::new(&c);
    let staged = (0..7).map(|i| bundle(i, 2, 0, GIB)).collect();
    let p = plan(&c, &mut st, &obs(staged, vec![], 0.0));
    assert_eq!(
        p.actions,
        vec![Action::Launch {
            shape: "small".into(),
            count: 7
        }]
    );
    let sp = p.shape("small").unwrap();
    assert_eq!(
        (
            sp.staged,
            sp.workers_needed,
            sp.launches_granted,
            sp.throttled
        ),
        (7, 7, 7, 0)
    );
}

#[test]
fn pending_capacity_is_subtracted() {
    let c = cfg(vec![small()]);
    for (pending, want) in [(0, 5), (2, 3), (5, 0)] {
        let mut st = PolicyState::new(&c);
        let staged = (0..5).map(|i| bundle(i, 2, 0, GIB)).collect();
        let jobs = (0..pending)
            .map(|i| Job::pending(format!("j{i}"), "small"))
            .collect();
        let p = plan(&c, &mut st, &obs(staged, jobs, 0.0));
        assert_eq!(launches_of(&p, "small"), want, "pending {pending}");
        assert!(p.cancels().is_empty());
    }
}

#[test]
fn pending_of_another_shape_does_not_count() {
    let c = cfg(vec![small(), big()]);
    let mut st = PolicyState::new(&c);
    let p = plan(
        &c,
        &mut st,
        &obs(
            vec![bundle(0, 8, 0, GIB)],
            vec![Job::pending("s", "small")],
            0.0,
        ),
    );
    assert_eq!(launches_of(&p, "big"), 1);
    // The small pending job is not needed any more: cancelled at the second tick that says so.
    assert!(p.cancels().is_empty());
    let p = plan(
        &c,
        &mut st,
        &obs(
            vec![bundle(0, 8, 0, GIB)],
            vec![Job::pending("s", "small"), Job::pending("b", "big")],
            10.0,
        ),
    );
    assert_eq!(p.cancels(), vec!["s"]);
}

/// The server's worker list lags a bundle's assignment by one check-in (5 s by default): a
/// pending job is cancelled only once every listing over two ticks and at least
/// `cancel_grace_secs` (10 s) found it unneeded.
#[test]
fn a_pending_job_is_cancelled_only_when_unneeded_for_two_ticks_and_the_grace() {
    let c = cfg(vec![small()]);
    assert_eq!(c.cancel_grace_secs, 10.0);
    let mut st = PolicyState::new(&c);
    let jobs = || vec![Job::pending("p", "small")];
    let needed = || vec![bundle(0, 2, 0, GIB)];
    let tick = |st: &mut PolicyState, staged: Vec<StagedBundle>, now: f64| {
        plan(&c, st, &obs(staged, jobs(), now)).cancels().len()
    };
    assert_eq!(tick(&mut st, vec![], 0.0), 0, "first tick unneeded");
    assert_eq!(tick(&mut st, needed(), 20.0), 0, "needed again");
    assert_eq!(tick(&mut st, vec![], 30.0), 0, "unneeded, a new row");
    // A failed listing breaks the row.
    let failed = Observation {
        jobs: Err("down".into()),
        ..obs(vec![], vec![], 45.0)
    };
    assert!(plan(&c, &mut st, &failed).cancels().is_empty());
    assert_eq!(tick(&mut st, vec![], 50.0), 0, "after the failed listing");
    // Ticks 2 s apart, faster than check-ins: unneeded at each, but not for 10 s yet.
    for now in [52.0, 54.0, 56.0, 58.0] {
        assert_eq!(tick(&mut st, vec![], now), 0, "at {now}");
    }
    let p = plan(&c, &mut st, &obs(vec![], jobs(), 60.0));
    assert_eq!(p.cancels(), vec!["p"], "{:?}", p.reasons);
    assert!(p
        .reasons
        .iter()
        .any(|r| r.contains("no staged bundle needed it for 10 s")));
}

#[test]
fn idle_capacity_of_running_workers_is_subtracted() {
    let c = cfg(vec![small()]);
    let cases = [
        // (free of the running worker, launches for 3 bundles of 1 cpu / 1 GiB each)
        (None, 2),                                // 3 bundles pack 2 per worker
        (Some(Resources::new(1, 0, 8 * GIB)), 1), // idle worker takes one
        (Some(Resources::new(2, 0, 8 * GIB)), 1), // takes two, one left
        (Some(Resources::new(4, 0, 8 * GIB)), 0), // takes all
        (Some(Resources::new(4, 0, GIB / 2)), 2), // not enough memory: takes none
    ];
    for (free, want) in cases {
        let mut st = PolicyState::new(&c);
        let mut job = Job::active("a", "small");
        job.free = free;
        let staged = (0..3).map(|i| bundle(i, 1, 0, GIB)).collect();
        let p = plan(&c, &mut st, &obs(staged, vec![job], 0.0));
        assert_eq!(launches_of(&p, "small"), want, "free {free:?}");
    }
}

#[test]
fn max_workers_caps_launches_including_pending() {
    let mut c = cfg(vec![small()]);
    c.max_workers = 5;
    for (pending, active, staged, want) in [
        (0, 0, 9, 5),
        (2, 0, 9, 3),
        (1, 3, 9, 1),
        (2, 3, 9, 0),
        (0, 6, 9, 0),
    ] {
        let mut st = PolicyState::new(&c);
        let mut jobs: Vec<Job> = (0..pending)
            .map(|i| Job::pending(format!("p{i}"), "small"))
            .collect();
        jobs.extend((0..active).map(|i| Job::active(format!("a{i}"), "small")));
        let staged = (0..staged).map(|i| bundle(i, 2, 0, GIB)).collect();
        let p = plan(&c, &mut st, &obs(staged, jobs, 0.0));
        assert_eq!(p.launches(), want, "pending {pending} active {active}");
        assert_eq!(p.shape("small").unwrap().throttled, 9 - pending - want);
    }
}

#[test]
fn min_workers_floor_launches_default_shape() {
    let mut c = cfg(vec![big(), small()]);
    c.min_workers = 3;
    for (jobs, staged_small, want_big, want_small) in [
        (0, 0, 3, 0),
        (1, 0, 2, 0),
        (3, 0, 0, 0),
        (0, 2, 1, 2),
        (0, 4, 0, 4),
    ] {
        let mut st = PolicyState::new(&c);
        let jobs = (0..jobs)
            .map(|i| Job::active(format!("a{i}"), "big"))
            .collect();
        let staged = (0..staged_small).map(|i| bundle(i, 2, 0, GIB)).collect();
        let p = plan(&c, &mut st, &obs(staged, jobs, 0.0));
        assert_eq!(launches_of(&p, "big"), want_big);
        assert_eq!(launches_of(&p, "small"), want_small);
    }
}

#[test]
fn min_workers_floor_ignores_spacing_and_bucket_like_python() {
    let mut c = cfg(vec![small()]);
    c.min_workers = 2;
    c.min_seconds_between_workers = 60.0;
    c.launch_burst = 0;
    c.launch_rate_per_sec = 0.0;
    let mut st = PolicyState::new(&c);
    st.last_round_at = Some(0.0);
    let p = plan(&c, &mut st, &obs(vec![], vec![], 1.0));
    assert_eq!(launches_of(&p, "small"), 2);
    assert_eq!(p.shape("small").unwrap().floor_launches, 2);
}

#[test]
fn listing_failure_launches_and_cancels_nothing() {
    let mut c = cfg(vec![small()]);
    c.min_workers = 3;
    let mut st = PolicyState::new(&c);
    let p = plan(
        &c,
        &mut st,
        &Observation {
            staged: (0..5).map(|i| bundle(i, 1, 0, GIB)).collect(),
            jobs: Err("squeue: connection refused".into()),
            now: 0.0,
        },
    );
    assert!(p.actions.is_empty());
    assert_eq!(
        p.listing_error.as_deref(),
        Some("squeue: connection refused")
    );
    assert_eq!(p.total_jobs, None);
    assert!(p.reasons.iter().any(|r| r.contains("listing jobs failed")));
    // Nothing was consumed: the next healthy tick launches at once.
    assert_eq!(st.last_round_at, None);
    let p = plan(&c, &mut st, &obs(vec![], vec![], 1.0));
    assert_eq!(p.launches(), 3);
}

#[test]
fn scale_down_cancels_only_unneeded_pending_newest_first() {
    let c = cfg(vec![small()]);
    let mut st = PolicyState::new(&c);
    let jobs = vec![
        Job::pending("old", "small").submitted_at(1.0),
        Job::pending("newest", "small").submitted_at(9.0),
        Job::pending("mid", "small").submitted_at(5.0),
        Job::pending("unknown-age", "small"),
        Job::active("running", "small"),
    ];
    // Two bundles each needing a whole worker: keep two pending, cancel the two newest.
    let staged = vec![bundle(0, 2, 0, GIB), bundle(1, 2, 0, GIB)];
    let p = plan_twice(&c, &mut st, &obs(staged, jobs.clone(), 10.0));
    assert_eq!(p.cancels(), vec!["newest", "mid"]);
    assert_eq!(p.launches(), 0);
    // Nothing staged: cancel all pending, never the running worker.
    let mut st = PolicyState::new(&c);
    let p = plan_twice(&c, &mut st, &obs(vec![], jobs, 10.0));
    assert_eq!(p.cancels(), vec!["newest", "mid", "old", "unknown-age"]);
}

/// Two ticks on the same observation, the cancel grace apart; the first cancels nothing.
fn plan_twice(c: &Config, st: &mut PolicyState, o: &Observation) -> Plan {
    let first = plan(c, st, o);
    assert!(first.cancels().is_empty(), "{:?}", first.reasons);
    let later = Observation {
        now: o.now + c.cancel_grace_secs,
        ..o.clone()
    };
    plan(c, st, &later)
}

#[test]
fn scale_down_keeps_min_workers() {
    let mut c = cfg(vec![small()]);
    c.min_workers = 2;
    let mut st = PolicyState::new(&c);
    let jobs = vec![
        Job::active("a", "small"),
        Job::pending("p1", "small").submitted_at(1.0),
        Job::pending("p2", "small").submitted_at(2.0),
    ];
    let p = plan_twice(&c, &mut st, &obs(vec![], jobs, 10.0));
    assert_eq!(p.cancels(), vec!["p2"]);
    assert_eq!(p.launches(), 0);
}

#[test]
fn jobs_of_unknown_shape_count_but_are_never_cancelled() {
    let mut c = cfg(vec![small()]);
    c.max_workers = 2;
    let mut st = PolicyState::new(&c);
    let staged = (0..5).map(|i| bundle(i, 2, 0, GIB)).collect();
    let p = plan(
        &c,
        &mut st,
        &obs(staged, vec![Job::pending("x", "retired")], 0.0),
    );
    assert_eq!(p.launches(), 1);
    assert!(p.cancels().is_empty());
}

#[test]
fn unschedulable_bundles_are_reported_and_launch_nothing() {
    let c = cfg(vec![small(), big()]);
    let mut st = PolicyState::new(&c);
    let staged = vec![
        bundle(0, 16, 0, GIB),
        bundle(1, 1, 1, GIB),
        bundle(2, 1, 0, 64 * GIB),
        bundle(3, 1, 0, GIB).with_queue("other"),
    ];
    let p = plan(&c, &mut st, &obs(staged, vec![], 0.0));
    assert!(p.actions.is_empty());
    let reasons: Vec<(&str, &str)> = p
        .unschedulable
        .iter()
        .map(|u| (u.uuid.as_str(), u.reason.as_str()))
        .collect();
    assert_eq!(reasons.len(), 4);
    assert!(reasons[0].1.contains("16 cpus > largest 8"), "{reasons:?}");
    assert!(reasons[1].1.contains("1 gpus > largest 0"), "{reasons:?}");
    assert!(reasons[2].1.contains("bytes memory"), "{reasons:?}");
    assert!(reasons[3].1.contains("request_queue"), "{reasons:?}");
    assert!(p.shapes.iter().all(|s| s.staged == 0));
}

#[test]
fn no_single_shape_fits_all_dimensions() {
    // 8 cpus fit "big", 1 gpu fits "gpu1" but no shape has both.
    let c = cfg(vec![big(), Shape::new("gpu1", 2, 1, 8 * GIB)]);
    let mut st = PolicyState::new(&c);
    let p = plan(&c, &mut st, &obs(vec![bundle(0, 8, 1, GIB)], vec![], 0.0));
    assert!(p.actions.is_empty());
    assert!(p.unschedulable[0].reason.contains("no single shape"));
}

#[test]
fn request_queue_rules() {
    let mut c = cfg(vec![small()]);
    c.worker_tag = Some("nlp".into());
    let cases = [
        (None, false, true),
        (Some("nlp"), false, true),
        (Some("tag=nlp"), false, true),
        (Some("cv"), false, false),
        (None, true, false),
        (Some("nlp"), true, true),
    ];
    for (queue, exclusive, served) in cases {
        c.worker_tag_exclusive = exclusive;
        assert_eq!(
            c.serves_queue(queue),
            served,
            "{queue:?} exclusive {exclusive}"
        );
    }
    c.worker_tag = None;
    c.worker_tag_exclusive = false;
    assert!(!c.serves_queue(Some("nlp")));
}

#[test]
fn smallest_fitting_shape_is_chosen() {
    let c = cfg(vec![gpu(), big(), small()]);
    let mut st = PolicyState::new(&c);
    let staged = vec![
        bundle(0, 1, 0, GIB),     // small
        bundle(1, 2, 0, 4 * GIB), // small, exactly
        bundle(2, 3, 0, GIB),     // big
        bundle(3, 1, 0, 5 * GIB), // big (memory)
        bundle(4, 1, 1, GIB),     // gpu
    ];
    let p = plan(&c, &mut st, &obs(staged, vec![], 0.0));
    let staged_per: Vec<(&str, usize)> = p
        .shapes
        .iter()
        .map(|s| (s.shape.as_str(), s.staged))
        .collect();
    assert_eq!(staged_per, vec![("small", 2), ("big", 2), ("gpu", 1)]);
    assert_eq!(launches_of(&p, "small"), 2);
    assert_eq!(launches_of(&p, "big"), 1);
    assert_eq!(launches_of(&p, "gpu"), 1);
}

#[test]
fn several_bundles_pack_into_one_worker() {
    let c = cfg(vec![big()]);
    let cases: Vec<(Vec<(u32, u64)>, u32)> = vec![
        (vec![(2, GIB); 4], 1), // 8 cpus exactly
        (vec![(2, GIB); 5], 2),
        (vec![(1, 16 * GIB); 3], 2),                       // memory-bound
        (vec![(6, GIB), (2, GIB), (6, GIB), (2, GIB)], 2), // FFD pairs 6+2
        (vec![(5, GIB), (5, GIB), (3, GIB), (3, GIB)], 2),
    ];
    for (reqs, want) in cases {
        let mut st = PolicyState::new(&c);
        let staged = reqs
            .iter()
            .enumerate()
            .map(|(i, (cpu, mem))| bundle(i, *cpu, 0, *mem))
            .collect();
        let p = plan(&c, &mut st, &obs(staged, vec![], 0.0));
        assert_eq!(p.shape("big").unwrap().workers_needed, want, "{reqs:?}");
        assert_eq!(p.launches(), want);
    }
}

#[test]
fn budget_is_shared_round_robin_over_shapes() {
    let mut c = cfg(vec![small(), big()]);
    c.max_workers = 3;
    let mut st = PolicyState::new(&c);
    let mut staged: Vec<StagedBundle> = (0..5).map(|i| bundle(i, 2, 0, GIB)).collect();
    staged.extend((5..10).map(|i| bundle(i, 8, 0, GIB)));
    let p = plan(&c, &mut st, &obs(staged, vec![], 0.0));
    assert_eq!(launches_of(&p, "small"), 2);
    assert_eq!(launches_of(&p, "big"), 1);
}

#[test]
fn plan_serializes_to_json() {
    let c = cfg(vec![small()]);
    let mut st = PolicyState::new(&c);
    let p = plan(
        &c,
        &mut st,
        &obs(
            vec![bundle(0, 1, 0, GIB), bundle(1, 99, 0, GIB)],
            vec![Job::pending("p", "small")],
            0.0,
        ),
    );
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["breaker"]["state"], "closed");
    assert_eq!(v["shapes"][0]["shape"], "small");
    assert_eq!(v["unschedulable"][0]["uuid"], "0x01");
    let back: Plan = serde_json::from_value(v).unwrap();
    assert_eq!(back, p);
    let a = serde_json::to_value(Action::Launch {
        shape: "small".into(),
        count: 2,
    })
    .unwrap();
    assert_eq!(
        a,
        serde_json::json!({"action": "launch", "shape": "small", "count": 2})
    );
}

#[test]
fn config_validation() {
    let mut c = Config::with_default_shape(Shape::from_flags(1, 0, 2048));
    assert_eq!(c.shapes[0].resources.memory_bytes, 2 * GIB);
    assert!(c.validate().is_ok());
    c.min_workers = 11;
    assert_eq!(
        c.validate(),
        Err(ConfigError::MaxBelowMin { min: 11, max: 10 })
    );
    c.min_workers = 1;
    c.shapes.push(Shape::from_flags(2, 0, 1));
    assert_eq!(
        c.validate(),
        Err(ConfigError::DuplicateShape("default".into()))
    );
    c.shapes.clear();
    assert_eq!(c.validate(), Err(ConfigError::NoShapes));
}

#[test]
fn capacity_bounds_launches_and_the_floor() {
    let mut c = cfg(vec![small(), big()]);
    // Room for the running small job plus 2 more small ones (6 cpus, 12 GiB).
    c.capacity = Some(Resources::new(6, 0, 12 * GIB));
    c.min_workers = 5;
    c.validate().unwrap_err();
    c.capacity = Some(Resources::new(8, 0, 32 * GIB));
    c.validate().unwrap();
    c.capacity = Some(Resources::new(6, 0, 12 * GIB));
    c.shapes = vec![small()];
    c.validate().unwrap();
    let mut st = PolicyState::new(&c);
    let tokens = st.bucket.available();
    let staged = (0..5).map(|i| bundle(i, 2, 0, GIB)).collect();
    let p = plan(
        &c,
        &mut st,
        &obs(staged, vec![Job::active("j1", "small")], 0.0),
    );
    assert_eq!(launches_of(&p, "small"), 2, "{:?}", p.reasons);
    let sp = p.shape("small").unwrap();
    // The capacity, not the throttle, held the other 3: the log says so.
    assert_eq!(
        (
            sp.launch_wanted,
            sp.launches_granted,
            sp.throttled,
            sp.over_capacity
        ),
        (5, 2, 0, 3)
    );
    assert_eq!(sp.floor_launches, 0);
    assert!(
        p.reasons.iter().any(|r| r.contains("backend capacity")),
        "{:?}",
        p.reasons
    );
    assert!(
        p.reasons
            .iter()
            .any(|r| r == "shape small: launching 2 of 5 wanted (3 over capacity)"),
        "{:?}",
        p.reasons
    );
    // With a bucket of one token the throttle holds them first: 1 granted, 4 throttled.
    let mut c1 = c.clone();
    c1.launch_burst = 1;
    let mut st1 = PolicyState::new(&c1);
    let p1 = plan(
        &c1,
        &mut st1,
        &obs(
            (0..5).map(|i| bundle(i, 2, 0, GIB)).collect(),
            vec![Job::active("j1", "small")],
            0.0,
        ),
    );
    let sp1 = p1.shape("small").unwrap();
    assert_eq!(
        (sp1.launches_granted, sp1.throttled, sp1.over_capacity),
        (1, 4, 0),
        "{:?}",
        p1.reasons
    );
    assert!(
        p1.reasons
            .iter()
            .any(|r| r == "shape small: launching 1 of 5 wanted (4 throttled)"),
        "{:?}",
        p1.reasons
    );
    // Only the two launches consumed tokens.
    assert_eq!(st.bucket.available(), tokens - 2);
    // The min-workers floor stops at the capacity too.
    let mut st = PolicyState::new(&c);
    let p = plan(&c, &mut st, &obs(vec![], vec![], 0.0));
    assert_eq!(launches_of(&p, "small"), 3, "{:?}", p.reasons);
}

#[test]
fn no_prefilter_gives_an_oversized_bundle_a_whole_largest_worker() {
    let mut c = cfg(vec![small(), big()]);
    let huge = bundle(1, 64, 0, GIB);
    let mut st = PolicyState::new(&c);
    let p = plan(&c, &mut st, &obs(vec![huge.clone()], vec![], 0.0));
    assert!(p.actions.is_empty());
    assert_eq!(p.unschedulable.len(), 1);
    assert!(p.unschedulable[0].reason.contains("64 cpus > largest 8"));
    c.prefilter = false;
    let mut st = PolicyState::new(&c);
    let p = plan(
        &c,
        &mut st,
        &obs(vec![huge, bundle(2, 1, 0, GIB)], vec![], 0.0),
    );
    assert!(p.unschedulable.is_empty());
    assert_eq!((launches_of(&p, "big"), launches_of(&p, "small")), (1, 1));
}
