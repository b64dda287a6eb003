//! Every reason of [`BundleWait`] reached by a table of ticks, the tiers' reasons by the
//! routing, and the property that every staged bundle gets exactly one explanation.

use proptest::prelude::*;

use super::super::*;

const GIB: u64 = 1 << 30;
const NOW: f64 = 1000.0;

fn config() -> Config {
    let mut c = Config::with_default_shape(Shape::new("default", 1, 0, 2 * GIB));
    c.shapes.push(Shape::new("gpu", 4, 4, 16 * GIB));
    c.min_workers = 0;
    c
}

fn cpu(uuid: &str) -> StagedBundle {
    StagedBundle::new(uuid, 1, 0, GIB)
}

/// The explanation of each bundle of one tick.
fn explain(
    c: &Config,
    st: &mut PolicyState,
    staged: Vec<StagedBundle>,
    jobs: Result<Vec<Job>, String>,
) -> Vec<BundleWait> {
    let obs = Observation {
        staged,
        jobs,
        now: NOW,
    };
    let p = plan(c, st, &obs);
    assert_eq!(p.waits.len(), obs.staged.len());
    p.waits
}

fn one(c: &Config, st: &mut PolicyState, b: StagedBundle, jobs: Vec<Job>) -> BundleWait {
    explain(c, st, vec![b], Ok(jobs)).remove(0)
}

#[test]
fn unschedulable_names_the_request_over_the_largest_shape() {
    let c = config();
    let w = one(
        &c,
        &mut PolicyState::new(&c),
        StagedBundle::new("0xg", 2, 8, GIB),
        vec![],
    );
    assert_eq!(
        w.reason,
        WaitReason::Unschedulable {
            over: vec![Excess {
                resource: ResourceKind::Gpus,
                requested: 8,
                largest: 4
            }]
        }
    );
    assert_eq!(w.detail, "requests 8 GPUs, the largest shape has 4: 4 over");
    let w = one(
        &c,
        &mut PolicyState::new(&c),
        StagedBundle::new("0xm", 64, 0, 64 * GIB),
        vec![],
    );
    assert_eq!(
        w.detail,
        "requests 64 CPUs, the largest shape has 4: 60 over; requests 64.0 GiB memory, the \
         largest shape has 16.0 GiB: 48.0 GiB over"
    );
    // A queue this manager does not serve: the plan's reason.
    let w = one(
        &c,
        &mut PolicyState::new(&c),
        cpu("0xq").with_queue("gpu"),
        vec![],
    );
    assert_eq!(w.reason, WaitReason::Unschedulable { over: vec![] });
    assert_eq!(
        w.detail,
        "request_queue \"gpu\", but this manager has no worker tag"
    );
}

#[test]
fn waiting_for_a_pending_job_or_a_launch_of_this_tick() {
    let c = config();
    // One pending job: named, since it was first listed.
    let w = one(
        &c,
        &mut PolicyState::new(&c),
        cpu("0x1"),
        vec![Job::pending("j1", "default").submitted_at(900.0)],
    );
    assert_eq!(
        w.reason,
        WaitReason::WaitingForWorker {
            shape: "default".into(),
            job_id: Some("j1".into()),
            pending: 1,
            launched: 0
        }
    );
    assert_eq!(
        (w.since, w.detail.as_str()),
        (Some(900.0), "pending job j1 of shape default can take it")
    );
    // Two pending jobs and two bundles: one of them, since the oldest.
    let jobs = vec![
        Job::pending("j1", "default").submitted_at(950.0),
        Job::pending("j2", "default").submitted_at(920.0),
    ];
    let ws = explain(
        &c,
        &mut PolicyState::new(&c),
        vec![cpu("0x1"), cpu("0x2")],
        Ok(jobs),
    );
    for w in &ws {
        assert!(
            matches!(
                &w.reason,
                WaitReason::WaitingForWorker {
                    job_id: None,
                    pending: 2,
                    ..
                }
            ),
            "{w:?}"
        );
        assert_eq!(w.since, Some(920.0));
        assert_eq!(
            w.detail,
            "one of 2 pending jobs of shape default can take it"
        );
    }
    // No job: a worker launched for it now.
    let w = one(&c, &mut PolicyState::new(&c), cpu("0x1"), vec![]);
    assert!(
        matches!(
            &w.reason,
            WaitReason::WaitingForWorker {
                job_id: None,
                pending: 0,
                launched: 1,
                ..
            }
        ),
        "{w:?}"
    );
    assert_eq!(w.since, Some(NOW));
}

#[test]
fn over_cap_max_workers_and_capacity() {
    let mut c = config();
    c.max_workers = 1;
    let w = one(
        &c,
        &mut PolicyState::new(&c),
        cpu("0x1"),
        vec![Job::active("a", "default")],
    );
    assert_eq!(
        w.reason,
        WaitReason::OverCap {
            cap: CapKind::MaxWorkers,
            max: Some(1),
            current: Some(1)
        }
    );
    assert!(
        w.detail.starts_with("--max-workers 1 reached"),
        "{}",
        w.detail
    );
    // A bounded backend full of workers.
    let mut c = config();
    c.capacity = Some(Resources::new(4, 4, 16 * GIB));
    let w = one(
        &c,
        &mut PolicyState::new(&c),
        cpu("0x1"),
        vec![Job::active("a", "gpu")],
    );
    assert_eq!(
        w.reason,
        WaitReason::OverCap {
            cap: CapKind::Capacity,
            max: None,
            current: None
        }
    );
}

#[test]
fn backing_off_after_failures_and_with_the_breaker_open() {
    let c = config();
    let mut st = PolicyState::new(&c);
    record_submit(&mut st, "default", false, NOW - 1.0);
    let w = one(&c, &mut st, cpu("0x1"), vec![]);
    assert_eq!(
        w.reason,
        WaitReason::BackingOff {
            until: Some(NOW - 1.0 + c.backoff_base_secs),
            breaker: false
        }
    );
    let mut st = PolicyState::new(&c);
    for _ in 0..c.breaker_failure_threshold {
        record_submit(&mut st, "default", false, NOW - 1.0);
    }
    let w = one(&c, &mut st, cpu("0x1"), vec![]);
    assert_eq!(
        w.reason,
        WaitReason::BackingOff {
            until: Some(NOW - 1.0 + c.breaker_cooldown_secs),
            breaker: true
        }
    );
}

#[test]
fn throttled_by_the_round_spacing_and_the_token_bucket() {
    let c = config();
    let mut st = PolicyState::new(&c);
    st.last_round_at = Some(NOW - 10.0);
    let w = one(&c, &mut st, cpu("0x1"), vec![]);
    assert_eq!(
        w.reason,
        WaitReason::Throttled {
            by: ThrottleKind::RoundSpacing,
            until: Some(NOW - 10.0 + c.min_seconds_between_workers)
        }
    );
    let mut st = PolicyState::new(&c);
    st.bucket.tokens = 0.5;
    let w = one(&c, &mut st, cpu("0x1"), vec![]);
    assert_eq!(
        w.reason,
        WaitReason::Throttled {
            by: ThrottleKind::TokenBucket,
            until: Some(NOW + 0.5)
        }
    );
}

#[test]
fn queued_in_a_running_workers_room_or_with_jobs_unknown() {
    let c = config();
    let w = one(
        &c,
        &mut PolicyState::new(&c),
        cpu("0x1"),
        vec![Job::active("a", "default").with_free(Resources::new(1, 0, 2 * GIB))],
    );
    assert_eq!(w.reason, WaitReason::Queued);
    assert!(
        w.detail.starts_with("running worker job a has room for it"),
        "{}",
        w.detail
    );
    let ws = explain(
        &c,
        &mut PolicyState::new(&c),
        vec![cpu("0x1")],
        Err("down".into()),
    );
    assert_eq!(ws[0].reason, WaitReason::Queued);
}

fn tier(name: &str, room: u32, overflow: Option<f64>) -> TierView {
    TierView {
        name: name.into(),
        shapes: vec![Shape::new("cpu", 1, 0, 2 * GIB)],
        overflow_after_secs: overflow,
        can_launch: true,
        room,
        free: Vec::new(),
        price_per_hour: 0.0,
    }
}

fn limits(cap: usize, workers: usize) -> TierLimits {
    TierLimits {
        cap,
        workers,
        held: None,
    }
}

#[test]
fn the_routing_explains_overflow_delay_caps_holds_and_unschedulable() {
    let tiers = vec![tier("campus", 0, Some(30.0)), tier("cloud", 0, None)];
    let lims = vec![limits(1, 1), limits(1, 1)];
    let staged = vec![
        (cpu("0xa"), 10.0),
        (StagedBundle::new("0xbig", 64, 0, GIB), 0.0),
    ];
    let r = route(&tiers, &staged, 10);
    let ws = explain_routes(&tiers, &lims, &staged, &r, (10, 2), NOW);
    let w = ws[0].clone().unwrap();
    assert_eq!(
        w.reason,
        WaitReason::OverflowDelay {
            tier: "campus".into(),
            until: NOW + 20.0
        }
    );
    assert_eq!(
        (w.tier.as_deref(), w.since),
        (Some("campus"), Some(NOW - 10.0))
    );
    let w = ws[1].clone().unwrap();
    assert!(
        matches!(&w.reason, WaitReason::Unschedulable { over } if over.len() == 1),
        "{w:?}"
    );
    // Past the delay, with the cloud full too: the tier's cap.
    let staged = vec![(cpu("0xa"), 40.0)];
    let r = route(&tiers, &staged, 10);
    let w = explain_routes(&tiers, &lims, &staged, &r, (10, 2), NOW)[0]
        .clone()
        .unwrap();
    assert_eq!(
        w.reason,
        WaitReason::OverCap {
            cap: CapKind::TierMaxWorkers,
            max: Some(1),
            current: Some(1)
        }
    );
    // The global cap.
    let tiers = vec![tier("campus", 1, None)];
    let r = route(&tiers, &staged, 0);
    let w = explain_routes(&tiers, &[limits(2, 1)], &staged, &r, (1, 1), NOW)[0]
        .clone()
        .unwrap();
    assert!(
        matches!(
            w.reason,
            WaitReason::OverCap {
                cap: CapKind::MaxWorkers,
                ..
            }
        ),
        "{w:?}"
    );
    // A tier that cannot launch: its hold.
    let mut tiers = vec![tier("campus", 1, None)];
    tiers[0].can_launch = false;
    let held = WaitReason::OverCap {
        cap: CapKind::TierBudget,
        max: None,
        current: None,
    };
    let lims = vec![TierLimits {
        held: Some((held.clone(), "budget spent".into())),
        ..limits(2, 1)
    }];
    let r = route(&tiers, &staged, 10);
    let w = explain_routes(&tiers, &lims, &staged, &r, (10, 1), NOW)[0]
        .clone()
        .unwrap();
    assert_eq!((w.reason, w.detail.as_str()), (held, "budget spent"));
    // A bundle routed into a tier's room: its plan explains it, naming the tier.
    let tiers = vec![tier("campus", 1, None)];
    let r = route(&tiers, &staged, 10);
    let ws = explain_routes(&tiers, &[limits(2, 1)], &staged, &r, (10, 1), NOW);
    assert_eq!(ws, vec![None]);
    let planned = BundleWait::new("0xa", WaitReason::Queued, "x".into(), None);
    let merged = merge_tier_waits(&staged, &r, ws, &[("campus".into(), vec![planned])]);
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].tier.as_deref(), Some("campus"));
}

#[test]
fn every_kind_is_counted_and_the_json_is_flat_and_round_trips() {
    let w = BundleWait::new(
        "0x1",
        WaitReason::OverCap {
            cap: CapKind::MaxWorkers,
            max: Some(10),
            current: Some(10),
        },
        "--max-workers 10 reached".into(),
        None,
    );
    let v = serde_json::to_value(&w).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"uuid": "0x1", "reason": "over_cap", "cap": "max_workers", "max": 10,
            "current": 10, "detail": "--max-workers 10 reached", "since": null})
    );
    assert_eq!(serde_json::from_value::<BundleWait>(v).unwrap(), w);
    // A reason a newer manager added: read as `other`.
    let v = serde_json::json!({"uuid": "0x1", "reason": "new_one", "x": 1, "detail": "", "since": null});
    let w2: BundleWait = serde_json::from_value(v).unwrap();
    assert_eq!(w2.reason, WaitReason::Other);
    let counts = count_waits(&[w, w2]);
    assert_eq!(counts.len(), WaitKind::ALL.len());
    assert!(counts.contains(&(WaitKind::OverCap, 1)));
    assert_eq!(counts.iter().map(|(_, n)| n).sum::<usize>(), 1);
    for k in WaitKind::ALL {
        assert_eq!(serde_json::to_value(k).unwrap(), k.name());
    }
}

fn arb_bundle() -> impl Strategy<Value = StagedBundle> {
    (0u32..40, 1u32..6, 0u32..6, 1u64..24, any::<bool>()).prop_map(|(id, cpus, gpus, mem, q)| {
        let b = StagedBundle::new(format!("0x{id}"), cpus, gpus, mem * GIB);
        if q && id % 5 == 0 {
            b.with_queue("elsewhere")
        } else {
            b
        }
    })
}

fn arb_job() -> impl Strategy<Value = Job> {
    (
        0u32..1000,
        0usize..3,
        any::<bool>(),
        0u32..4,
        proptest::option::of(0.0f64..NOW),
    )
        .prop_map(|(id, shape, active, free, at)| {
            let shape = ["default", "gpu", "gone"][shape];
            let j = if active {
                Job::active(format!("j{id}"), shape).with_free(Resources::new(
                    free,
                    free,
                    u64::from(free) * GIB,
                ))
            } else {
                Job::pending(format!("j{id}"), shape)
            };
            match at {
                Some(t) => j.submitted_at(t),
                None => j,
            }
        })
}

proptest! {
    /// Every staged bundle of the observation gets exactly one explanation, in order, of a
    /// known reason; the unschedulable ones are the plan's; a bundle waits for a worker only
    /// where its shape has a pending job or a launch.
    #[test]
    fn every_staged_bundle_gets_exactly_one_explanation(
        staged in proptest::collection::vec(arb_bundle(), 0..30),
        jobs in proptest::collection::vec(arb_job(), 0..8),
        failed_listing in prop_oneof![9 => Just(false), 1 => Just(true)],
        max_workers in 0usize..10,
        failures in 0u32..7,
        last_round in proptest::option::of(NOW - 100.0..NOW),
        tokens in 0.0f64..5.0,
        capacity in any::<bool>(),
        prefilter in prop_oneof![4 => Just(true), 1 => Just(false)],
    ) {
        let mut c = config();
        c.max_workers = max_workers;
        c.prefilter = prefilter;
        if capacity {
            c.capacity = Some(Resources::new(8, 4, 32 * GIB));
        }
        let mut st = PolicyState::new(&c);
        for _ in 0..failures {
            record_submit(&mut st, "default", false, NOW - 2.0);
        }
        st.last_round_at = last_round;
        st.bucket.tokens = tokens.min(st.bucket.capacity);
        let jobs = if failed_listing { Err("down".to_string()) } else { Ok(jobs) };
        let obs = Observation { staged, jobs, now: NOW };
        let p = plan(&c, &mut st, &obs);
        prop_assert_eq!(p.waits.len(), obs.staged.len());
        for (w, b) in p.waits.iter().zip(&obs.staged) {
            prop_assert_eq!(&w.uuid, &b.uuid);
            prop_assert!(w.reason.kind().is_some());
            prop_assert!(!w.detail.is_empty());
            if let WaitReason::WaitingForWorker { shape, pending, launched, .. } = &w.reason {
                let sp = p.shape(shape).unwrap();
                prop_assert!(*pending + *launched > 0);
                prop_assert_eq!(*launched, sp.launches_granted + sp.floor_launches);
            }
let back: BundleWait =
                serde_json::from_str(&serde_json::to_string(w).unwrap()).unwrap();
            // (Times may lose their last bit in JSON.)
            prop_assert_eq!(back.reason.kind(), w.reason.kind());
            prop_assert_eq!((&back.uuid, &back.detail), (&w.uuid, &w.detail));
        }
        let counts = count_waits(&p.waits);
        prop_assert_eq!(counts.iter().map(|(_, n)| n).sum::<usize>(), obs.staged.len());
        let unsched = counts.iter().find(|(k, _)| *k == WaitKind::Unschedulable).unwrap().1;
        prop_assert_eq!(unsched, p.unschedulable.len());
        if p.listing_error.is_none() {
            let idle: usize = p.shapes.iter().map(|s| s.covered_by_idle).sum();
            let in_room = p.waits.iter().filter(|w| w.detail.starts_with("running worker job")).count();
            prop_assert_eq!(in_room, idle);
        }
    }

    /// With tiers: the routing and the tiers' plans together explain each bundle once.
    #[test]
    fn every_routed_bundle_gets_exactly_one_explanation(
        staged in proptest::collection::vec((arb_bundle(), 0.0f64..100.0), 0..20),
        rooms in proptest::collection::vec((0u32..3, proptest::option::of(0.0f64..60.0), any::<bool>()), 1..4),
        global in 0u32..5,
    ) {
        let tiers: Vec<TierView> = rooms.iter().enumerate().map(|(i, (room, overflow, can))| TierView {
            can_launch: *can,
            ..tier(&format!("t{i}"), *room, *overflow)
        }).collect();
        let lims: Vec<TierLimits> = tiers.iter().map(|t| TierLimits {
            held: (!t.can_launch).then(|| (WaitReason::Queued, "held".into())),
            ..limits(3, 3 - t.room as usize)
        }).collect();
        let r = route(&tiers, &staged, global);
        let ws = explain_routes(&tiers, &lims, &staged, &r, (10, 10 - global as usize), NOW);
        for (w, route) in ws.iter().zip(&r.routes) {
            prop_assert_eq!(w.is_none(), matches!(route, Route::Room(_) | Route::Opened(_)));
        }
        let merged = merge_tier_waits(&staged, &r, ws, &[]);
        prop_assert_eq!(merged.len(), staged.len());
        for (w, (b, _)) in merged.iter().zip(&staged) {
            prop_assert_eq!(&w.uuid, &b.uuid);
        }
    }
}
