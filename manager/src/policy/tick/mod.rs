//! One tick of the policy: the rules in their documented order. `scale.rs` holds rules 6 to 8
//! (scale-down, the demand's launch budget, the capacity grant, the min-workers floor);
//! `prefix.rs` tells when the first staged bundles already decide the tick.

use super::*;
use std::collections::BTreeMap;

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
            return t.into_plan(state, unschedulable, Vec::new(), Err(e.clone()));
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
    t.into_plan(state, unschedulable, actions, Ok(jobs.len()))
}

fn why_no_shape(config: &Config, need: &Resources) -> String {
    if config.shapes.is_empty() {
        return "no worker shape is configured".to_string();
    }
    let max_cpus = config
        .shapes
        .iter()
        .map(|s| s.resources.cpus)
        .max()
        .unwrap_or(0);
    let max_gpus = config
        .shapes
        .iter()
        .map(|s| s.resources.gpus)
        .max()
        .unwrap_or(0);
    let max_mem = config
        .shapes
        .iter()
        .map(|s| s.resources.memory_bytes)
        .max()
        .unwrap_or(0);
    let mut parts = Vec::new();
    if need.cpus > max_cpus {
        parts.push(format!("{} cpus > largest {}", need.cpus, max_cpus));
    }
    if need.gpus > max_gpus {
        parts.push(format!("{} gpus > largest {}", need.gpus, max_gpus));
    }
    if need.memory_bytes > max_mem {
        parts.push(format!(
            "{} bytes memory > largest {}",
            need.memory_bytes, max_mem
        ));
    }
    if parts.is_empty() {
        format!(
            "no single shape fits {} cpus, {} gpus, {} bytes at once",
            need.cpus, need.gpus, need.memory_bytes
        )
    } else {
        format!("fits no worker shape: {}", parts.join(", "))
    }
}

/// What one call of [`plan`] works on: the shapes in "smallest" order, their plans, the reasons.
struct Tick<'a> {
    config: &'a Config,
    now: f64,
    shapes: Vec<&'a Shape>,
    index: BTreeMap<&'a str, usize>,
    plans: Vec<ShapePlan>,
    reasons: Vec<String>,
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
        }
    }

    /// Rules 1 and 2: eligibility and shape choice. The eligible bundles come with their shape's
    /// index, in first-fit-decreasing order.
    fn eligibility_and_shapes<'b>(
        &mut self,
        staged: &'b [StagedBundle],
    ) -> (Vec<Unschedulable>, Vec<(&'b StagedBundle, usize)>) {
        let config = self.config;
        let mut unschedulable = Vec::new();
        let mut eligible: Vec<(&StagedBundle, usize)> = Vec::new();
        for b in staged {
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
                unschedulable.push(Unschedulable {
                    uuid: b.uuid.clone(),
                    reason,
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
                    eligible.push((b, i));
                }
                None => unschedulable.push(Unschedulable {
                    uuid: b.uuid.clone(),
                    reason: why_no_shape(config, &need),
                }),
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
                    Occupancy::Pending => self.plans[i].pending += 1,
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
        eligible: &[(&StagedBundle, usize)],
    ) -> Vec<Vec<Resources>> {
        let mut idle: Vec<Resources> = jobs
            .iter()
            .filter(|j| j.state == Occupancy::Active)
            .filter_map(|j| j.free)
            .collect();
        let mut remaining: Vec<Vec<Resources>> = vec![Vec::new(); self.plans.len()];
        for (b, i) in eligible {
            // Capped at the shape (only a no-prefilter bundle exceeds it): one whole worker.
            let need = b.request.min_each(&self.shapes[*i].resources);
            match idle.iter_mut().find(|f| f.fits(&need)) {
                Some(f) => {
                    f.subtract(&need);
                    self.plans[*i].covered_by_idle += 1;
                }
                None => remaining[*i].push(need),
            }
        }
        remaining
    }

    /// Rules 4 and 5: packing and pending capacity.
    fn packing_and_pending(&mut self, remaining: &[Vec<Resources>]) {
        for (i, sp) in self.plans.iter_mut().enumerate() {
            sp.workers_needed = pack_first_fit_decreasing(self.shapes[i].resources, &remaining[i]);
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
        }
    }
}
