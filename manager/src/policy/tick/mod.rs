//! One tick of the policy: the rules in their documented order. `scale.rs` holds rules 6 to 8
//! (scale-down, the demand's launch budget, the capacity grant, the min-workers floor);
//! `prefix.rs` tells when the first staged bundles already decide the tick.

use super::*;
use std::collections::BTreeMap;

mod explain;
mod prefix;
mod scale;

pub use prefix::staged_prefix_decides;

/// The scaling policy: decide this tick's launches and cancels. See the module docs for the rules;
/// each has its own function below, called here in the documented order.
pub fn plan(config: &Config, state: &mut PolicyState, obs: &Observation) -> Plan {
    state.bucket.refill(obs.now);
    state.breaker.advance(obs.now);
    let mut t = Tick::new(config, obs.now);
    let (unschedulable, eligible) = t.eligibility_and_shapes(&obs.staged);
    let jobs = match &obs.jobs {
        Ok(jobs) => jobs,
        Err(e) => {
            t.reasons.push(format!(
                "listing jobs failed ({e}): job counts unknown, no launches and no cancels this tick"
            ));
            // Two ticks in a row means two listings in a row.
            state.unneeded.clear();
            let waits = t.explain(&obs.staged, &unschedulable);
            let mut p = t.into_plan(state, unschedulable, Vec::new(), Err(e.clone()));
            p.waits = waits;
            return p;
        }
    };
    t.count_jobs(jobs);
    let remaining = t.idle_capacity(jobs, &eligible);
    t.packing_and_pending(&remaining);
    let mut actions = t.scale_down(state, jobs);
    let limits = t.demand_budget(state, jobs.len());
    let free_capacity = t.grant_within_capacity(state, jobs, limits.budget);
    t.min_workers_floor(state, jobs.len(), &limits, free_capacity);
    t.launch_actions(state, &mut actions);
    let waits = t.explain(&obs.staged, &unschedulable);
    let mut p = t.into_plan(state, unschedulable, actions, Ok(jobs.len()));
    p.waits = waits;
    p
}

fn why_no_shape(config: &Config, need: &Resources) -> (String, Vec<Excess>) {
    if config.shapes.is_empty() {
        return ("no worker shape is configured".to_string(), Vec::new());
    }
    let over = excess_over_largest(&config.shapes, need);
    let parts: Vec<String> = over
        .iter()
        .map(|e| match e.resource {
            ResourceKind::Cpus => format!("{} cpus > largest {}", e.requested, e.largest),
            ResourceKind::Gpus => format!("{} gpus > largest {}", e.requested, e.largest),
            ResourceKind::Memory => {
                format!("{} bytes memory > largest {}", e.requested, e.largest)
            }
        })
        .collect();
    let text = if parts.is_empty() {
        format!(
            "no single shape fits {} cpus, {} gpus, {} bytes at once",
            need.cpus, need.gpus, need.memory_bytes
        )
    } else {
        format!("fits no worker shape: {}", parts.join(", "))
    };
    (text, over)
}

/// What one call of [`plan`] works on: the shapes in "smallest" order, their plans, the reasons.
struct Tick<'a> {
    config: &'a Config,
    now: f64,
    shapes: Vec<&'a Shape>,
    index: BTreeMap<&'a str, usize>,
    plans: Vec<ShapePlan>,
    reasons: Vec<String>,
    /// Where each staged bundle of the observation went, by its position there.
    placed: Vec<Placed>,
    /// Per shape: the first-fit-decreasing bin of each request left after the idle capacity.
    bins: Vec<Vec<u32>>,
    /// Per shape: its pending jobs' ids and the oldest known submission time among them.
    pending_jobs: Vec<(Vec<String>, Option<f64>)>,
    /// What held this tick's demand launches back (rule 7), when something did.
    hold: Option<(WaitReason, String)>,
}

/// Where one staged bundle went in a tick (for [`BundleWait`]).
#[derive(Debug, Clone, PartialEq)]
enum Placed {
    /// Unschedulable: its index in the tick's unschedulable list.
    Unschedulable(usize),
    /// Eligible, but the tick went no further (the job listing failed).
    Eligible,
    /// Into the free room of a running worker: its job id.
    Idle(String),
    /// The `slot`-th request left for `shape` after the idle capacity.
    Shape { shape: usize, slot: usize },
}

/// The limits of rule 7 that rule 8 honours too.
struct LaunchLimits {
    /// Demand launches allowed this tick (tokens taken).
    budget: u32,
    breaker_allowance: Option<u32>,
    backoff_until: Option<f64>,
}

impl<'a> Tick<'a> {
    fn new(config: &'a Config, now: f64) -> Self {
        let shapes = config.shapes_smallest_first();
        let shapes_len = shapes.len();
        let plans = shapes
            .iter()
            .map(|s| ShapePlan {
                shape: s.name.clone(),
                ..ShapePlan::default()
            })
            .collect();
        let index = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        Tick {
            config,
            now,
            shapes,
            index,
            plans,
            reasons: Vec::new(),
            placed: Vec::new(),
            bins: Vec::new(),
            pending_jobs: vec![(Vec::new(), None); shapes_len],
            hold: None,
        }
    }

    /// Rules 1 and 2: eligibility and shape choice. The eligible bundles come with their shape's
    /// index and their position in `staged`, in first-fit-decreasing order.
    fn eligibility_and_shapes<'b>(
        &mut self,
        staged: &'b [StagedBundle],
    ) -> (Vec<Unschedulable>, Vec<(&'b StagedBundle, usize, usize)>) {
        let config = self.config;
        let mut unschedulable = Vec::new();
        let mut eligible: Vec<(&StagedBundle, usize, usize)> = Vec::new();
        self.placed = Vec::with_capacity(staged.len());
        for (k, b) in staged.iter().enumerate() {
            if !config.serves_queue(b.request_queue.as_deref()) {
                let reason = match (&b.request_queue, &config.worker_tag) {
                    (None, _) => {
                        "no request_queue, but this manager's workers are tag-exclusive".into()
                    }
                    (Some(q), Some(t)) => {
                        format!("request_queue {q:?} is not this manager's tag {t:?}")
                    }
                    (Some(q), None) => {
                        format!("request_queue {q:?}, but this manager has no worker tag")
                    }
                };
                self.placed.push(Placed::Unschedulable(unschedulable.len()));
                unschedulable.push(Unschedulable {
                    uuid: b.uuid.clone(),
                    reason,
                    over: Vec::new(),
                });
                continue;
            }
            let need = b.request;
            let fitting = config.smallest_fitting_shape(&need).or_else(|| {
                // Without the prefilter, a bundle too large for every shape still asks for a
                // worker: a whole one of the largest shape.
                (!config.prefilter)
                    .then(|| self.shapes.last().copied())
                    .flatten()
            });
            match fitting {
                Some(s) => {
                    let i = self.index[s.name.as_str()];
                    self.plans[i].staged += 1;
                    self.placed.push(Placed::Eligible);
                    eligible.push((b, i, k));
                }
                None => {
                    let (reason, over) = why_no_shape(config, &need);
                    self.placed.push(Placed::Unschedulable(unschedulable.len()));
                    unschedulable.push(Unschedulable {
                        uuid: b.uuid.clone(),
                        reason,
                        over,
                    });
                }
            }
        }
        for u in &unschedulable {
            self.reasons
                .push(format!("bundle {} is unschedulable: {}", u.uuid, u.reason));
        }
        eligible.sort_by(|a, b| ffd_order(a.0, b.0));
        (unschedulable, eligible)
    }

    /// The listed jobs per shape and state.
    fn count_jobs(&mut self, jobs: &[Job]) {
        for j in jobs {
            match self.index.get(j.shape.as_str()) {
                Some(&i) => match j.state {
                    Occupancy::Pending => {
                        self.plans[i].pending += 1;
                        let (ids, oldest) = &mut self.pending_jobs[i];
                        ids.push(j.id.clone());
                        if let Some(t) = j.submitted_at {
                            *oldest = Some(oldest.map_or(t, |o: f64| o.min(t)));
                        }
                    }
                    Occupancy::Active => self.plans[i].active += 1,
                },
                None => self.reasons.push(format!(
                    "job {} has unknown shape {:?}: counted toward --max-workers, never cancelled",
                    j.id, j.shape
                )),
            }
        }
    }

    /// Rule 3: free capacity of running workers. Returns, per shape, the requests it does not
    /// cover.
    fn idle_capacity(
        &mut self,
        jobs: &[Job],
        eligible: &[(&StagedBundle, usize, usize)],
    ) -> Vec<Vec<Resources>> {
        let mut idle: Vec<(&str, Resources)> = jobs
            .iter()
            .filter(|j| j.state == Occupancy::Active)
            .filter_map(|j| Some((j.id.as_str(), j.free?)))
            .collect();
        let mut remaining: Vec<Vec<Resources>> = vec![Vec::new(); self.plans.len()];
        for (b, i, k) in eligible {
            // Capped at the shape (only a no-prefilter bundle exceeds it): one whole worker.
            let need = b.request.min_each(&self.shapes[*i].resources);
            match idle.iter_mut().find(|(_, f)| f.fits(&need)) {
                Some((job, f)) => {
                    f.subtract(&need);
                    self.plans[*i].covered_by_idle += 1;
                    self.placed[*k] = Placed::Idle((*job).to_owned());
                }
                None => {
                    self.placed[*k] = Placed::Shape {
                        shape: *i,
                        slot: remaining[*i].len(),
                    };
                    remaining[*i].push(need);
                }
            }
        }
        remaining
    }

    /// Rules 4 and 5: packing and pending capacity.
    fn packing_and_pending(&mut self, remaining: &[Vec<Resources>]) {
        self.bins = remaining
            .iter()
            .enumerate()
            .map(|(i, r)| first_fit_decreasing_bins(self.shapes[i].resources, r))
            .collect();
        for (i, sp) in self.plans.iter_mut().enumerate() {
            sp.workers_needed = self.bins[i].iter().max().map_or(0, |b| b + 1);
            sp.launch_wanted = sp.workers_needed.saturating_sub(sp.pending);
            if sp.staged > 0 {
                self.reasons.push(format!(
                    "shape {}: {} staged, {} covered by idle workers, {} workers needed, {} pending, {} active",
                    sp.shape, sp.staged, sp.covered_by_idle, sp.workers_needed, sp.pending, sp.active
                ));
            }
        }
    }

    /// The launch actions of the tick; a tick that launches is a round (and the half-open
    /// breaker's probe).
    fn launch_actions(&mut self, state: &mut PolicyState, actions: &mut Vec<Action>) {
        for sp in &self.plans {
            let count = sp.launches_granted + sp.floor_launches;
            if count > 0 {
                actions.push(Action::Launch {
                    shape: sp.shape.clone(),
                    count,
                });
            }
        }
        let launched: u32 = self
            .plans
            .iter()
            .map(|s| s.launches_granted + s.floor_launches)
            .sum();
        if launched > 0 {
            state.last_round_at = Some(self.now);
            if let BreakerState::HalfOpen { probe_since: None } = state.breaker.state {
                state.breaker.state = BreakerState::HalfOpen {
                    probe_since: Some(self.now),
                };
                self.reasons
                    .push("circuit breaker half-open: this launch is the probe".into());
            }
        }
    }

    /// The plan: the job total, or the listing error that stopped the tick.
    fn into_plan(
        self,
        state: &PolicyState,
        unschedulable: Vec<Unschedulable>,
        actions: Vec<Action>,
        total_jobs: Result<usize, String>,
    ) -> Plan {
        let (total_jobs, listing_error) = match total_jobs {
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e)),
        };
        Plan {
            now: self.now,
            actions,
            listing_error,
            total_jobs,
            shapes: self.plans,
            unschedulable,
            staged_unread: 0,
            breaker: state.breaker.state,
            consecutive_failures: state.failures(),
            tokens_left: state.bucket.available(),
            reasons: self.reasons,
            waits: Vec::new(),
        }
    }
}
