//! Why each staged bundle of a tick is not running yet ([`BundleWait`]), from where the tick's
//! rules put it: unschedulable (rules 1 and 2), into a running worker's room (rule 3), into a
//! bin that a pending job covers or a launch of this tick opens (rules 4, 5, 7, 8), or into a
//! bin whose launch a limit held back (rule 7: the first limit that holds, in the order
//! `--max-workers` with no room at all, the breaker, the back-off, `--max-workers`, the round
//! spacing, a half-open breaker's single probe, the token bucket; or the backend's capacity).

use super::*;

impl Tick<'_> {
    /// What held the demand's launches back at this tick (rule 7), as a reason; `round_wait`:
    /// the end of the round spacing, when it holds.
    pub(super) fn what_holds(
        &self,
        state: &PolicyState,
        total_jobs: usize,
        max_room: u32,
        wanted: u32,
        round_wait: Option<f64>,
    ) -> (WaitReason, String) {
        let config = self.config;
        let cap = || {
            (
                WaitReason::OverCap {
                    cap: CapKind::MaxWorkers,
                    max: Some(config.max_workers as u64),
                    current: Some(total_jobs as u64),
                },
                format!(
                    "--max-workers {} reached: {total_jobs} jobs listed, room for {max_room} of \
                     {wanted} launches wanted",
                    config.max_workers
                ),
            )
        };
        if max_room == 0 {
            return cap();
        }
        let failures = state.failures();
        match state.breaker.state {
            BreakerState::Open { until } => {
                return (
                    WaitReason::BackingOff {
                        until: Some(until),
                        breaker: true,
                    },
                    format!(
                        "the circuit breaker is open after {failures} failed launches in a row: \
                         no launch before its probe"
                    ),
                )
            }
            BreakerState::HalfOpen {
                probe_since: Some(t),
            } => {
                return (
                    WaitReason::BackingOff {
                        until: Some(t + state.breaker.cooldown_secs),
                        breaker: true,
                    },
                    "the circuit breaker's probe launch is out: no other launch until it checks \
                     in or the cool-down passes"
                        .to_string(),
                )
            }
            _ => {}
        }
        if let Some(t) = state.backoff_until().filter(|t| self.now < *t) {
            return (
                WaitReason::BackingOff {
                    until: Some(t),
                    breaker: false,
                },
                format!("backing off after {failures} failed launches in a row"),
            );
        }
        if max_room < wanted {
            return cap();
        }
        if let Some(t) = round_wait {
            return (
                WaitReason::Throttled {
                    by: ThrottleKind::RoundSpacing,
                    until: Some(t),
                },
                format!(
                    "--min-seconds-between-workers {}: the next launch round is not due yet",
                    config.min_seconds_between_workers
                ),
            );
        }
        if let BreakerState::HalfOpen { probe_since: None } = state.breaker.state {
            return (
                WaitReason::BackingOff {
                    until: None,
                    breaker: true,
                },
                "the circuit breaker is half-open: one probe launch first".to_string(),
            );
        }
        let b = &state.bucket;
        let until = (b.rate_per_sec > 0.0)
            .then(|| self.now + (1.0 - b.tokens.clamp(0.0, 1.0)) / b.rate_per_sec);
        (
            WaitReason::Throttled {
                by: ThrottleKind::TokenBucket,
                until,
            },
            format!(
                "the launch token bucket is empty (burst {}, {} per second)",
                b.capacity, b.rate_per_sec
            ),
        )
    }

    /// One explanation per bundle of `staged` (the tick's observation), in its order.
    pub(super) fn explain(
        &self,
        staged: &[StagedBundle],
        unschedulable: &[Unschedulable],
    ) -> Vec<BundleWait> {
        staged
            .iter()
            .zip(&self.placed)
            .map(|(b, placed)| {
                let (reason, detail, since) = self.explain_one(placed, unschedulable);
                BundleWait::new(&b.uuid, reason, detail, since)
            })
            .collect()
    }

    fn explain_one(
        &self,
        placed: &Placed,
        unschedulable: &[Unschedulable],
    ) -> (WaitReason, String, Option<f64>) {
        match placed {
            Placed::Unschedulable(u) => {
                let u = &unschedulable[*u];
                let detail = if u.over.is_empty() {
                    u.reason.clone()
                } else {
                    u.over
                        .iter()
                        .map(Excess::text)
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                let over = u.over.clone();
                (WaitReason::Unschedulable { over }, detail, None)
            }
            Placed::Eligible => (
                WaitReason::Queued,
                "the backend's jobs could not be listed at this tick: nothing launched".into(),
                None,
            ),
            Placed::Idle(job) => (
                WaitReason::Queued,
                format!(
                    "running worker job {job} has room for it; the server has not handed it \
                     over yet"
                ),
                None,
            ),
            Placed::Shape { shape, slot } => {
                let sp = &self.plans[*shape];
                let bin = self.bins[*shape][*slot];
                let launched = sp.launches_granted + sp.floor_launches;
                let (ids, oldest) = &self.pending_jobs[*shape];
                let waiting = |job_id: Option<String>| WaitReason::WaitingForWorker {
                    shape: sp.shape.clone(),
                    job_id,
                    pending: sp.pending,
                    launched,
                };
                if bin < sp.pending {
                    let (job_id, detail) = match &ids[..] {
                        [one] => (
                            Some(one.clone()),
                            format!("pending job {one} of shape {} can take it", sp.shape),
                        ),
                        _ => (
                            None,
                            format!(
                                "one of {} pending jobs of shape {} can take it",
                                sp.pending, sp.shape
                            ),
                        ),
                    };
                    (waiting(job_id), detail, *oldest)
                } else if bin < sp.pending + launched {
                    (
                        waiting(None),
                        format!(
                            "a worker of shape {} was launched for it at this tick",
                            sp.shape
                        ),
                        Some(self.now),
                    )
                } else if sp.over_capacity > 0 {
                    (
                        WaitReason::OverCap {
                            cap: CapKind::Capacity,
                            max: None,
                            current: None,
                        },
                        format!(
                            "the backend's capacity holds no more workers of shape {}",
                            sp.shape
                        ),
                        None,
                    )
                } else {
                    match &self.hold {
                        Some((r, d)) => (r.clone(), d.clone(), None),
                        None => (
                            WaitReason::Queued,
                            format!("shape {}: no launch for it at this tick", sp.shape),
                            None,
                        ),
                    }
                }
            }
        }
    }
}
