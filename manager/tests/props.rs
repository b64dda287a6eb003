//! Property tests of the scaling policy's invariants.

use manager::*;
use proptest::prelude::*;
use std::collections::HashSet;

const GIB: u64 = 1024 * 1024 * 1024;

fn shapes() -> Vec<Shape> {
    vec![
        Shape::new("default", 2, 0, 4 * GIB),
        Shape::new("big", 8, 0, 32 * GIB),
        Shape::new("gpu", 8, 2, 64 * GIB),
    ]
}

fn arb_config() -> impl Strategy<Value = Config> {
    (
        0usize..5,
        0usize..12,
        0.0f64..120.0,
        0u32..8,
        0.0f64..2.0,
        1u32..5,
        any::<bool>(),
        any::<bool>(),
        (
            prop_oneof![4 => Just(true), 1 => Just(false)],
            prop_oneof![3 => Just(None), 1 => (8u32..40, 2u32..6, 64u64..400).prop_map(Some)],
        ),
    )
        .prop_map(
            |(min, extra, spacing, burst, rate, threshold, tagged, exclusive, (prefilter, cap))| {
                let mut c = Config::with_default_shape(shapes()[0].clone());
                c.shapes = shapes();
                c.min_workers = min;
                c.max_workers = min + extra;
                c.min_seconds_between_workers = spacing;
                c.launch_burst = burst;
                c.launch_rate_per_sec = rate;
                c.breaker_failure_threshold = threshold;
                c.breaker_cooldown_secs = 30.0;
                c.backoff_base_secs = 1.0;
                c.backoff_max_secs = 20.0;
                c.worker_tag = tagged.then(|| "nlp".to_string());
                c.worker_tag_exclusive = exclusive;
                c.prefilter = prefilter;
                c.capacity = cap.map(|(cpus, gpus, mem)| Resources::new(cpus, gpus, mem * GIB));
                c
            },
        )
}

fn arb_bundle() -> impl Strategy<Value = StagedBundle> {
    (
        0u32..12,
        prop_oneof![3 => Just(0u32), 1 => 0u32..4],
        0u64..80,
        prop_oneof![4 => Just(None), 1 => Just(Some("nlp")), 1 => Just(Some("cv"))],
    )
        .prop_map(|(cpus, gpus, mem_gib_quarters, q)| {
            let mut b = StagedBundle::new(String::new(), cpus, gpus, mem_gib_quarters * GIB / 4);
            b.request_queue = q.map(str::to_string);
            b
        })
}

/// A bundle that fits the default shape: many of them make prefixes that decide launches.
fn arb_small_bundle() -> impl Strategy<Value = StagedBundle> {
    (0u32..3, 0u64..17).prop_map(|(cpus, mem_gib_quarters)| {
        StagedBundle::new(String::new(), cpus, 0, mem_gib_quarters * GIB / 4)
    })
}

fn arb_job() -> impl Strategy<Value = Job> {
    (
        prop_oneof![Just("default"), Just("big"), Just("gpu"), Just("retired")],
        any::<bool>(),
        proptest::option::of((0u32..8, 0u32..2, 0u64..64)),
        proptest::option::of(0.0f64..1000.0),
    )
        .prop_map(|(shape, active, free, at)| Job {
            id: String::new(),
            shape: shape.to_string(),
            state: if active {
                Occupancy::Active
            } else {
                Occupancy::Pending
            },
            free: if active {
                free.map(|(c, g, m)| Resources::new(c, g, m * GIB))
            } else {
                None
            },
            submitted_at: at,
        })
}

fn arb_observation() -> impl Strategy<Value = Observation> {
    (
        proptest::collection::vec(arb_bundle(), 0..25),
        prop_oneof![5 => proptest::collection::vec(arb_job(), 0..15).prop_map(Ok), 1 => Just(Err("backend down".to_string()))],
        0.0f64..10_000.0,
    )
        .prop_map(|(mut staged, mut jobs, now)| {
            for (i, b) in staged.iter_mut().enumerate() {
                b.uuid = format!("b{i}");
            }
            if let Ok(jobs) = jobs.as_mut() {
                for (i, j) in jobs.iter_mut().enumerate() {
                    j.id = format!("j{i}");
                }
            }
            Observation { staged, jobs, now }
        })
}

/// A policy state with some history: failures and successes at times before `now`.
fn arb_state(config: &Config) -> impl Strategy<Value = PolicyState> {
    let config = config.clone();
    (
        proptest::collection::vec((any::<bool>(), 0.0f64..10_000.0), 0..8),
        proptest::option::of(0.0f64..10_000.0),
        proptest::collection::btree_map(0usize..15, 0.0f64..10_000.0, 0..15),
    )
        .prop_map(move |(outcomes, round, unneeded)| {
            let mut st = PolicyState::new(&config);
            // Jobs (by the ids arb_observation gives) found unneeded at the last tick.
            st.unneeded = unneeded
                .into_iter()
                .map(|(i, since)| (format!("j{i}"), since))
                .collect();
            let mut outcomes = outcomes;
            outcomes.sort_by(|a, b| a.1.total_cmp(&b.1));
            for (ok, at) in outcomes {
                record_submit(&mut st, "default", ok, at);
            }
            st.last_round_at = round;
            st
        })
}

fn arb_case() -> impl Strategy<Value = (Config, PolicyState, Observation)> {
    arb_config().prop_flat_map(|c| {
        let st = arb_state(&c);
        (Just(c), st, arb_observation())
    })
}

fn total_jobs(obs: &Observation) -> Option<usize> {
    obs.jobs.as_ref().ok().map(Vec::len)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_above_max_workers((c, mut st, obs) in arb_case()) {
        let p = plan(&c, &mut st, &obs);
        if let Some(total) = total_jobs(&obs) {
            let launches = p.launches() as usize;
            prop_assert!(launches == 0 || total + launches <= c.max_workers,
                "total {} + launches {} > max {}", total, launches, c.max_workers);
        }
    }

    #[test]
    fn listing_failure_means_no_actions((c, mut st, obs) in arb_case()) {
        let before = st.clone();
        let p = plan(&c, &mut st, &obs);
        if obs.jobs.is_err() {
            prop_assert!(p.actions.is_empty());
            prop_assert!(p.listing_error.is_some());
            prop_assert_eq!(st.last_round_at, before.last_round_at);
            prop_assert_eq!(st.consecutive_failures, before.consecutive_failures);
        }
    }

    #[test]
    fn never_below_min_workers_unless_backend_fails((c, mut st, obs) in arb_case()) {
        let healthy = st.backend_healthy(obs.now);
        let p = plan(&c, &mut st, &obs);
        // A bounded backend may be full: the floor holds only where capacity is unbounded.
        if let (Some(total), true, None) = (total_jobs(&obs), healthy, c.capacity) {
            let after = total - p.cancels().len() + p.launches() as usize;
            prop_assert!(after >= c.min_workers, "after {} < min {}", after, c.min_workers);
        }
    }

    #[test]
    fn no_launch_for_bundles_no_shape_fits((c, mut st, obs) in arb_case()) {
        let mut c = c;
        c.prefilter = true;
        let p = plan(&c, &mut st, &obs);
        // Every bundle is either assigned to its smallest fitting shape or reported unschedulable.
        let assigned: usize = p.shapes.iter().map(|s| s.staged).sum();
        prop_assert_eq!(assigned + p.unschedulable.len(), obs.staged.len());
        let unsched: HashSet<&str> = p.unschedulable.iter().map(|u| u.uuid.as_str()).collect();
        for b in &obs.staged {
            let fits = c.serves_queue(b.request_queue.as_deref())
                && c.shapes.iter().any(|s| s.resources.fits(&b.request));
            prop_assert_eq!(!fits, unsched.contains(b.uuid.as_str()), "bundle {:?}", b);
        }
        for s in &c.shapes {
            let expected = obs.staged.iter().filter(|b| !unsched.contains(b.uuid.as_str())
                && c.smallest_fitting_shape(&b.request).map(|f| &f.name) == Some(&s.name)).count();
            prop_assert_eq!(p.shape(&s.name).unwrap().staged, expected);
        }
        // Launches of a shape: demand (bounded by packed need) plus floor (default shape only).
        for sp in &p.shapes {
            prop_assert!(sp.launches_granted <= sp.launch_wanted);
            prop_assert!(sp.workers_needed as usize <= sp.staged - sp.covered_by_idle);
            if sp.shape != c.shapes[0].name {
                prop_assert_eq!(sp.floor_launches, 0);
            }
        }
        // With only unschedulable bundles, only the floor may launch.
        if p.unschedulable.len() == obs.staged.len() {
            let floor: u32 = p.shapes.iter().map(|s| s.floor_launches).sum();
            prop_assert_eq!(p.launches(), floor);
        }
    }

    #[test]
    fn without_prefilter_only_queues_make_bundles_unschedulable((c, mut st, obs) in arb_case()) {
        let mut c = c;
        c.prefilter = false;
        let p = plan(&c, &mut st, &obs);
        let unsched: HashSet<&str> = p.unschedulable.iter().map(|u| u.uuid.as_str()).collect();
        for b in &obs.staged {
            prop_assert_eq!(!c.serves_queue(b.request_queue.as_deref()), unsched.contains(b.uuid.as_str()));
        }
    }

    #[test]
    fn launches_fit_the_backend_capacity((c, mut st, obs) in arb_case()) {
        let p = plan(&c, &mut st, &obs);
        let (Some(cap), Ok(jobs)) = (c.capacity, &obs.jobs) else { return Ok(()); };
        let res = |name: &str| c.shapes.iter().find(|s| s.name == name).unwrap_or(&c.shapes[0]).resources;
        fn add(used: &mut (u64, u64, u64), r: Resources, n: u64) {
            used.0 += u64::from(r.cpus) * n;
            used.1 += u64::from(r.gpus) * n;
            used.2 += r.memory_bytes * n;
        }
        let mut used = (0u64, 0u64, 0u64);
        for j in jobs {
            add(&mut used, res(&j.shape), 1);
        }
        let before = used;
        for a in &p.actions {
            if let Action::Launch { shape, count } = a {
                add(&mut used, res(shape), u64::from(*count));
            }
        }
        // A launch never takes a dimension over the capacity (one already over it stays put).
        let ok = |u: u64, b: u64, c: u64| u <= c.max(b) && (u == b || u <= c);
        prop_assert!(ok(used.0, before.0, u64::from(cap.cpus)) && ok(used.1, before.1, u64::from(cap.gpus))
            && ok(used.2, before.2, cap.memory_bytes), "{:?} -> {:?} over {:?}", before, used, cap);
    }

    #[test]
    fn cancels_only_unneeded_pending_jobs((c, mut st, obs) in arb_case()) {
        let unneeded_before = st.unneeded.clone();
        let p = plan(&c, &mut st, &obs);
        let Ok(jobs) = &obs.jobs else {
            prop_assert!(st.unneeded.is_empty());
            return Ok(());
        };
        let cancels = p.cancels();
        // Only jobs the last tick found unneeded too, for the grace at least; the others are
        // remembered (since the first tick of their row), not cancelled.
        for id in &cancels {
            let since = unneeded_before.get(*id);
            prop_assert!(since.is_some(), "{} cancelled at its first unneeded tick", id);
            prop_assert!(obs.now - since.unwrap() >= c.cancel_grace_secs);
            prop_assert!(!st.unneeded.contains_key(*id));
        }
        for (id, since) in &st.unneeded {
            prop_assert_eq!(*since, unneeded_before.get(id).copied().unwrap_or(obs.now));
            prop_assert!(jobs.iter().any(|j| &j.id == id && j.state == Occupancy::Pending));
        }
        let unique: HashSet<&str> = cancels.iter().copied().collect();
        prop_assert_eq!(unique.len(), cancels.len());
        for id in &cancels {
            let j = jobs.iter().find(|j| j.id == *id).unwrap();
            prop_assert_eq!(j.state, Occupancy::Pending);
            let sp = p.shape(&j.shape).unwrap();
            prop_assert!(sp.pending > sp.workers_needed);
        }
        for sp in &p.shapes {
            prop_assert!(sp.cancelled <= sp.pending.saturating_sub(sp.workers_needed));
            // Never cancel and launch the same shape in one tick.
            prop_assert!(sp.cancelled == 0 || sp.launches_granted == 0);
        }
    }

    #[test]
    fn breaker_and_backoff_limit_launches((c, mut st, obs) in arb_case()) {
        let mut breaker = st.breaker.clone();
        breaker.advance(obs.now);
        let backoff = st.backoff_until().is_some_and(|t| obs.now < t);
        let p = plan(&c, &mut st, &obs);
        match breaker.allowance() {
            Some(a) => prop_assert!(p.launches() <= a),
            None if backoff => prop_assert_eq!(p.launches(), 0),
            None => {}
        }
    }

    #[test]
    fn demand_launches_respect_bucket_and_spacing((c, mut st, obs) in arb_case()) {
        let mut bucket = st.bucket.clone();
        bucket.refill(obs.now);
        let tokens = bucket.available();
        let spaced = st.last_round_at.is_some_and(|t| obs.now < t + c.min_seconds_between_workers);
        let p = plan(&c, &mut st, &obs);
        let demand: u32 = p.shapes.iter().map(|s| s.launches_granted).sum();
        prop_assert!(demand <= tokens);
        if spaced {
            prop_assert_eq!(demand, 0);
        }
        prop_assert!(st.bucket.tokens >= 0.0);
        for sp in &p.shapes {
            prop_assert_eq!(sp.throttled + sp.over_capacity, sp.launch_wanted - sp.launches_granted);
            prop_assert!(sp.throttled == 0 || sp.over_capacity == 0);
            if c.capacity.is_none() {
                prop_assert_eq!(sp.over_capacity, 0);
            }
        }
    }

    #[test]
    fn plan_is_deterministic((c, st, obs) in arb_case()) {
        let (mut a, mut b) = (st.clone(), st);
        prop_assert_eq!(plan(&c, &mut a, &obs), plan(&c, &mut b, &obs));
        prop_assert_eq!(a, b);
    }

    #[test]
    fn ffd_packing_is_a_valid_packing(reqs in proptest::collection::vec((0u32..9, 0u32..3, 0u64..33), 0..30)) {
        let cap = Resources::new(8, 2, 32);
        let reqs: Vec<Resources> = reqs.into_iter().map(|(c, g, m)| Resources::new(c, g, m)).collect();
        let bins = pack_first_fit_decreasing(cap, &reqs) as u64;
        // At most one bin per request, at least the per-dimension lower bound.
        prop_assert!(bins <= reqs.len() as u64);
        let cpu: u64 = reqs.iter().map(|r| u64::from(r.cpus)).sum();
        let gpu: u64 = reqs.iter().map(|r| u64::from(r.gpus)).sum();
        let mem: u64 = reqs.iter().map(|r| r.memory_bytes).sum();
        prop_assert!(bins >= cpu.div_ceil(8).max(gpu.div_ceil(2)).max(mem.div_ceil(32)));
        prop_assert_eq!(bins == 0, reqs.is_empty());
    }

    /// Many ticks against a simulated backend: the max holds at every tick, and submissions that
    /// always fail stop after the breaker opens.
    #[test]
    fn simulation_respects_max_and_breaker(c in arb_config(), ticks in proptest::collection::vec((arb_observation(), any::<bool>(), any::<bool>()), 1..30)) {
        let mut st = PolicyState::new(&c);
        let mut jobs: Vec<Job> = Vec::new();
        let mut now = 0.0;
        let mut next_id = 0;
        for (obs, submit_ok, listing_ok) in ticks {
            now += 5.0;
            let o = Observation {
                staged: obs.staged,
                jobs: if listing_ok { Ok(jobs.clone()) } else { Err("down".into()) },
                now,
            };
            let p = plan(&c, &mut st, &o);
            prop_assert!(p.launches() == 0 || jobs.len() + p.launches() as usize <= c.max_workers);
            let cancels: HashSet<String> = p.cancels().into_iter().map(str::to_string).collect();
            jobs.retain(|j| !cancels.contains(&j.id));
            for a in &p.actions {
                if let Action::Launch { shape, count } = a {
                    for _ in 0..*count {
                        record_submit(&mut st, shape, submit_ok, now);
                        if submit_ok {
                            next_id += 1;
                            jobs.push(Job::pending(format!("n{next_id}"), shape.clone()).submitted_at(now));
                        }
                    }
                }
            }
            if st.consecutive_failures >= c.breaker_failure_threshold {
                prop_assert!(!matches!(st.breaker.state, BreakerState::Closed));
            }
        }
    }

    /// Where the first staged bundles decide the tick, the plan made with them alone takes the
    /// same actions and leaves the same state as the plan made with the whole list.
    #[test]
    fn a_prefix_that_decides_plans_like_the_whole_list(
        (c, st, obs) in arb_case(),
        more in proptest::collection::vec(arb_small_bundle(), 0..80),
        cut in 0usize..100,
    ) {
        let mut c = c;
        // One shape or all three: with one, prefixes decide often, launches included.
        if cut % 2 == 0 {
            c.shapes.truncate(1);
        }
        assert_prefix_plans_like_whole(&c, &st, &obs, more, cut)?;
    }
}

fn assert_prefix_plans_like_whole(
    c: &Config,
    st: &PolicyState,
    obs: &Observation,
    more: Vec<StagedBundle>,
    cut: usize,
) -> Result<(), TestCaseError> {
    let mut whole = obs.staged.clone();
    whole.extend(more);
    for (i, b) in whole.iter_mut().enumerate() {
        b.uuid = format!("b{i}");
    }
    let prefix = whole[..cut.min(whole.len())].to_vec();
    if !staged_prefix_decides(c, &prefix, &obs.jobs) {
        return Ok(());
    }
    let (mut a, mut b) = (st.clone(), st.clone());
    let with = |staged: Vec<StagedBundle>| Observation {
        staged,
        jobs: obs.jobs.clone(),
        now: obs.now,
    };
    let pa = plan(c, &mut a, &with(prefix));
    let pb = plan(c, &mut b, &with(whole));
    prop_assert_eq!(pa.actions, pb.actions);
    prop_assert_eq!(a, b);
    Ok(())
}

fn one_cpu_bundles(n: usize) -> Vec<StagedBundle> {
    (0..n)
        .map(|i| StagedBundle::new(format!("b{i}"), 1, 0, GIB))
        .collect()
}

#[test]
fn a_prefix_decides_only_when_it_fills_every_shape_up_to_max_workers() {
    let mut c = Config::with_default_shape(shapes()[0].clone());
    c.min_workers = 0;
    c.max_workers = 10;
    // 100 one-CPU bundles need at least 50 two-CPU workers: more than the room for 10.
    assert!(staged_prefix_decides(
        &c,
        &one_cpu_bundles(100),
        &Ok(vec![])
    ));
    // With room for 100 workers, later bundles could still raise the launches.
    c.max_workers = 100;
    assert!(!staged_prefix_decides(
        &c,
        &one_cpu_bundles(100),
        &Ok(vec![])
    ));
    // Two running workers with 10 free CPUs between them may take 10 of the bundles: at least
    // 45 workers still needed, which decides a room of 45 but not of 46.
    let active = |id: &str| {
        let mut j = Job::pending(id, "default");
        j.state = Occupancy::Active;
        j.free = Some(Resources::new(5, 0, 16 * GIB));
        j
    };
    c.max_workers = 48;
    assert!(!staged_prefix_decides(
        &c,
        &one_cpu_bundles(100),
        &Ok(vec![active("a"), active("b")])
    ));
    c.max_workers = 47;
    assert!(staged_prefix_decides(
        &c,
        &one_cpu_bundles(100),
        &Ok(vec![active("a"), active("b")])
    ));
    // --max-workers reached: decided by any bundles, unless a pending job may be unneeded.
    c.max_workers = 0;
    assert!(staged_prefix_decides(&c, &one_cpu_bundles(1), &Ok(vec![])));
    c.max_workers = 1;
    let pending = vec![Job::pending("p", "default")];
    assert!(staged_prefix_decides(
        &c,
        &one_cpu_bundles(2),
        &Ok(pending.clone())
    ));
    assert!(!staged_prefix_decides(&c, &[], &Ok(pending)));
    // A second shape whose bundles may come later: not decided while there is room.
    c.shapes = shapes();
    c.max_workers = 10;
    assert!(!staged_prefix_decides(
        &c,
        &one_cpu_bundles(100),
        &Ok(vec![])
    ));
    // A failed listing decides nothing, so any prefix decides it.
    assert!(staged_prefix_decides(&c, &[], &Err("down".into())));
}
