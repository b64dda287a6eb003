//! The launch limits: the circuit breaker, its probe, the spacing of launch rounds and the
//! token bucket.

use super::*;

#[test]
fn breaker_opens_after_k_failures_and_half_opens_after_cooldown() {
    let mut c = cfg(vec![small()]);
    c.breaker_failure_threshold = 3;
    c.breaker_cooldown_secs = 100.0;
    c.backoff_base_secs = 1.0;
    c.backoff_max_secs = 4.0;
    let mut st = PolicyState::new(&c);
    let staged: Vec<StagedBundle> = (0..4).map(|i| bundle(i, 2, 0, GIB)).collect();

    // Failure 1 and 2: exponential back-off 1 s then 2 s.
    record_submit(&mut st, "small", false, 10.0);
    assert_eq!(st.backoff_until(), Some(11.0));
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 10.5)).launches(),
        0
    );
    record_submit(&mut st, "small", false, 11.0);
    assert_eq!(st.backoff_until(), Some(13.0));
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 12.9)).launches(),
        0
    );
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 13.0)).launches(),
        4
    );
    assert_eq!(st.breaker.state, BreakerState::Closed);

    // Failure 3 opens the breaker.
    record_submit(&mut st, "small", false, 13.0);
    assert_eq!(st.breaker.state, BreakerState::Open { until: 113.0 });
    let p = plan(&c, &mut st, &obs(staged.clone(), vec![], 50.0));
    assert_eq!(p.launches(), 0);
    assert_eq!(p.breaker, BreakerState::Open { until: 113.0 });

    // After the cool-down: half-open, one probe only.
    let p = plan(&c, &mut st, &obs(staged.clone(), vec![], 113.0));
    assert_eq!(p.launches(), 1);
    assert_eq!(
        p.breaker,
        BreakerState::HalfOpen {
            probe_since: Some(113.0)
        }
    );
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 114.0)).launches(),
        0
    );

    // Probe fails: open again for a cool-down.
    record_submit(&mut st, "small", false, 115.0);
    assert_eq!(st.breaker.state, BreakerState::Open { until: 215.0 });
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 200.0)).launches(),
        0
    );
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 215.0)).launches(),
        1
    );

    // Probe succeeds: closed, full burst again.
    record_submit(&mut st, "small", true, 216.0);
    assert_eq!(st.breaker.state, BreakerState::Closed);
    assert_eq!(st.consecutive_failures, 0);
    assert_eq!(plan(&c, &mut st, &obs(staged, vec![], 217.0)).launches(), 4);
}

#[test]
fn workers_lost_before_checkin_back_off_and_open_the_breaker_despite_accepted_submits() {
    let mut c = cfg(vec![small()]);
    c.breaker_failure_threshold = 3;
    c.breaker_cooldown_secs = 100.0;
    c.backoff_base_secs = 1.0;
    c.backoff_max_secs = 60.0;
    let mut st = PolicyState::new(&c);
    let staged = vec![bundle(0, 2, 0, GIB)];

    // A crash loop: every submit is accepted, every job dies before its worker checks in.
    record_submit(&mut st, "small", true, 10.0);
    record_early_exit(&mut st, "small", 12.0);
    assert_eq!(st.backoff_until(), Some(13.0));
    let p = plan(&c, &mut st, &obs(staged.clone(), vec![], 12.5));
    assert_eq!(p.launches(), 0);
    assert!(
        p.reasons
            .iter()
            .any(|r| r.contains("1 lost before check-in")),
        "{:?}",
        p.reasons
    );
    assert_eq!(p.consecutive_failures, 1);
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 13.0)).launches(),
        1
    );
    // The accepted submit does not clear the count: the back-off doubles.
    record_submit(&mut st, "small", true, 13.0);
    record_early_exit(&mut st, "small", 15.0);
    assert_eq!(st.failures(), 2);
    assert_eq!(st.backoff_until(), Some(17.0));
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 16.9)).launches(),
        0
    );
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 17.0)).launches(),
        1
    );
    // The third loss opens the breaker: one probe per cool-down from now on.
    record_submit(&mut st, "small", true, 17.0);
    record_early_exit(&mut st, "small", 19.0);
    assert_eq!(st.breaker.state, BreakerState::Open { until: 119.0 });
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 100.0)).launches(),
        0
    );
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 119.0)).launches(),
        1
    );
    // The probe's worker checks in: launches are healthy again.
    record_submit(&mut st, "small", true, 119.0);
    record_checkin(&mut st);
    assert_eq!(st.failures(), 0);
    assert_eq!(st.breaker.state, BreakerState::Closed);
    assert!(st.backend_healthy(120.0));
    let more: Vec<StagedBundle> = (0..3).map(|i| bundle(i, 2, 0, GIB)).collect();
    assert_eq!(plan(&c, &mut st, &obs(more, vec![], 120.0)).launches(), 3);
}

#[test]
fn breaker_blocks_min_workers_floor_too() {
    let mut c = cfg(vec![small()]);
    c.min_workers = 2;
    c.breaker_failure_threshold = 1;
    c.breaker_cooldown_secs = 10.0;
    let mut st = PolicyState::new(&c);
    record_submit(&mut st, "small", false, 0.0);
    assert_eq!(plan(&c, &mut st, &obs(vec![], vec![], 5.0)).launches(), 0);
    // Half-open: the floor gets its one probe.
    assert_eq!(plan(&c, &mut st, &obs(vec![], vec![], 10.0)).launches(), 1);
}

#[test]
fn unrecorded_probe_is_retried_after_a_cooldown() {
    let mut c = cfg(vec![small()]);
    c.breaker_failure_threshold = 1;
    c.breaker_cooldown_secs = 10.0;
    let mut st = PolicyState::new(&c);
    record_submit(&mut st, "small", false, 0.0);
    let staged = vec![bundle(0, 1, 0, GIB)];
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 10.0)).launches(),
        1
    );
    assert_eq!(
        plan(&c, &mut st, &obs(staged.clone(), vec![], 19.0)).launches(),
        0
    );
    assert_eq!(plan(&c, &mut st, &obs(staged, vec![], 20.0)).launches(), 1);
}

#[test]
fn min_seconds_between_workers_spaces_rounds_not_workers() {
    let mut c = cfg(vec![small()]);
    c.min_seconds_between_workers = 60.0;
    let mut st = PolicyState::new(&c);
    let staged = |n: usize| (0..n).map(|i| bundle(i, 2, 0, GIB)).collect::<Vec<_>>();
    // First round is never spaced, and launches all 3 at once.
    assert_eq!(
        plan(&c, &mut st, &obs(staged(3), vec![], 0.0)).launches(),
        3
    );
    let pending = |n: usize| {
        (0..n)
            .map(|i| Job::pending(format!("p{i}"), "small"))
            .collect::<Vec<_>>()
    };
    let p = plan(&c, &mut st, &obs(staged(5), pending(3), 30.0));
    assert_eq!(p.launches(), 0);
    assert_eq!(p.shape("small").unwrap().throttled, 2);
    assert!(p
        .reasons
        .iter()
        .any(|r| r.contains("--min-seconds-between-workers")));
    assert_eq!(
        plan(&c, &mut st, &obs(staged(5), pending(3), 60.0)).launches(),
        2
    );
    // A tick without launches does not move the round time.
    assert_eq!(
        plan(&c, &mut st, &obs(staged(5), pending(5), 100.0)).launches(),
        0
    );
    assert_eq!(st.last_round_at, Some(60.0));
}

#[test]
fn token_bucket_throttles_a_burst() {
    let mut c = cfg(vec![small()]);
    c.launch_burst = 3;
    c.launch_rate_per_sec = 0.5;
    let mut st = PolicyState::new(&c);
    let staged = (0..10).map(|i| bundle(i, 2, 0, GIB)).collect::<Vec<_>>();
    let p = plan(&c, &mut st, &obs(staged.clone(), vec![], 0.0));
    assert_eq!(p.launches(), 3);
    assert_eq!(p.shape("small").unwrap().throttled, 7);
    assert_eq!(p.tokens_left, 0);
    let pending = (0..3)
        .map(|i| Job::pending(format!("p{i}"), "small"))
        .collect::<Vec<_>>();
    // 4 s later: 2 tokens.
    assert_eq!(plan(&c, &mut st, &obs(staged, pending, 4.0)).launches(), 2);
}

#[test]
fn token_bucket_struct() {
    let mut b = TokenBucket::new(4, 1.0);
    b.refill(0.0);
    assert_eq!(b.take(3), 3);
    assert_eq!(b.take(3), 1);
    assert_eq!(b.take(1), 0);
    b.refill(2.5);
    assert_eq!(b.available(), 2);
    b.refill(1.0); // clock went backwards: no change
    assert_eq!(b.available(), 2);
    b.refill(100.0);
    assert_eq!(b.available(), 4);
}
