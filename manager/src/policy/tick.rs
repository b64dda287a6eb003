//! One tick of the policy: the rules in their documented order.

use super::*;
use std::collections::BTreeMap;

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

/// Whether `staged`, the first bundles of a longer staged list, already decides the tick: for
/// any bundles that may follow, [`plan`] with the whole list takes the same actions as with
/// these. Then the rest need not be read from the server (with 10 000 staged bundles, reading
/// them all costs the server seconds per tick).
///
/// It holds when every shape's demand from these bundles alone covers its pending jobs plus
/// all the room left under `--max-workers`: more bundles only raise demand, so no pending job
/// is cancelled either way, and every shape wants at least the whole budget, which rule 7 then
/// shares out the same way. The demand counted is a lower bound of what packing needs, which
/// more bundles can only raise: per shape and resource, what its bundles request beyond all
/// the free capacity of running workers, in whole workers of the shape. A failed listing
/// decides nothing (no actions), so any prefix does.
pub fn staged_prefix_decides(
    config: &Config,
    staged: &[StagedBundle],
    jobs: &Result<Vec<Job>, String>,
) -> bool {
    let Ok(jobs) = jobs else {
        return true;
    };
    let mut t = Tick::new(config, 0.0);
    let (_, eligible) = t.eligibility_and_shapes(staged);
    t.count_jobs(jobs);
    let room = config.max_workers.saturating_sub(jobs.len()) as u64;
    let mut idle = Resources::default();
    for f in jobs
        .iter()
        .filter(|j| j.state == Occupancy::Active)
        .filter_map(|j| j.free)
    {
        idle.add(&f);
    }
    let mut requested = vec![Resources::default(); t.plans.len()];
    for (b, i) in &eligible {
        requested[*i].add(&b.request().min_each(&t.shapes[*i].resources()));
    }
    let dims = |r: &Resources| [u64::from(r.cpus), u64::from(r.gpus), r.memory_bytes];
    let idle = dims(&idle);
    t.plans.iter().enumerate().all(|(i, sp)| {
        let (cap, req) = (dims(&t.shapes[i].resources()), dims(&requested[i]));
        let lower_bound = (0..3)
            .filter(|&d| cap[d] > 0)
            .map(|d| req[d].saturating_sub(idle[d]).div_ceil(cap[d]))
            .max()
            .unwrap_or(0);
        lower_bound >= u64::from(sp.pending) + room
    })
}

fn why_no_shape(config: &Config, need: &Resources) -> String {
    if config.shapes.is_empty() {
        return "no worker shape is configured".to_string();
    }
    let max_cpus = config.shapes.iter().map(|s| s.cpus).max().unwrap_or(0);
    let max_gpus = config.shapes.iter().map(|s| s.gpus).max().unwrap_or(0);
    let max_mem = config
        .shapes
        .iter()
        .map(|s| s.memory_bytes)
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
            let need = b.request();
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
            let need = b.request().min_each(&self.shapes[*i].resources());
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
            sp.workers_needed =
                pack_first_fit_decreasing(self.shapes[i].resources(), &remaining[i]);
            sp.launch_wanted = sp.workers_needed.saturating_sub(sp.pending);
            if sp.staged > 0 {
                self.reasons.push(format!(
                    "shape {}: {} staged, {} covered by idle workers, {} workers needed, {} pending, {} active",
                    sp.shape, sp.staged, sp.covered_by_idle, sp.workers_needed, sp.pending, sp.active
                ));
            }
        }
    }

    /// Rule 6: scale-down of unneeded pending jobs, newest first, keeping the min-workers floor;
    /// a job is cancelled only at the second tick in a row that does not need it.
    fn scale_down(&mut self, state: &mut PolicyState, jobs: &[Job]) -> Vec<Action> {
        let config = self.config;
        let mut actions = Vec::new();
        let before = std::mem::take(&mut state.unneeded);
        let mut cancel_room = jobs
            .len()
            .saturating_sub(config.min_workers.min(config.max_workers));
        for (i, sp) in self.plans.iter_mut().enumerate() {
            let surplus = sp.pending.saturating_sub(sp.workers_needed);
            if surplus == 0 {
                continue;
            }
            let mut pending: Vec<(usize, &Job)> = jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| j.state == Occupancy::Pending && j.shape == self.shapes[i].name)
                .collect();
            // Newest first: larger submitted_at first, unknown last; later list position first on ties.
            pending.sort_by(|(ia, a), (ib, b)| {
                let ta = a.submitted_at.unwrap_or(f64::NEG_INFINITY);
                let tb = b.submitted_at.unwrap_or(f64::NEG_INFINITY);
                tb.total_cmp(&ta).then(ib.cmp(ia))
            });
            for (_, j) in pending.into_iter().take(surplus as usize) {
                if cancel_room == 0 {
                    self.reasons.push(format!(
                        "shape {}: keeping unneeded pending job {} for --min-workers {}",
                        sp.shape, j.id, config.min_workers
                    ));
                    continue;
                }
                cancel_room -= 1;
                // The server's worker list shows a bundle's assignment only at the worker's
                // next check-in: until then a worker that has just taken a bundle still looks
                // free, and a pending job looks unneeded.
                let since = before.get(&j.id).copied();
                let unneeded_for = since.map_or(0.0, |t| (self.now - t).max(0.0));
                if since.is_none() || unneeded_for < config.cancel_grace_secs {
                    self.reasons.push(format!(
                        "shape {}: pending job {} unneeded for {unneeded_for:.0} s; cancelled \
                         once unneeded for {:.0} s over two ticks",
                        sp.shape, j.id, config.cancel_grace_secs
                    ));
                    state
                        .unneeded
                        .insert(j.id.clone(), since.unwrap_or(self.now));
                    continue;
                }
                sp.cancelled += 1;
                self.reasons.push(format!(
                    "shape {}: cancelling pending job {}: no staged bundle needed it for \
                     {unneeded_for:.0} s",
                    sp.shape, j.id
                ));
                actions.push(Action::Cancel {
                    job_id: j.id.clone(),
                });
            }
        }
        actions
    }

    /// Rule 7: the budget of demand launches under all limits (its tokens are taken).
    fn demand_budget(&mut self, state: &mut PolicyState, total_jobs: usize) -> LaunchLimits {
        let config = self.config;
        let now = self.now;
        let wanted: u32 = self.plans.iter().map(|s| s.launch_wanted).sum();
        let max_room =
            u32::try_from(config.max_workers.saturating_sub(total_jobs)).unwrap_or(u32::MAX);
        let breaker_allowance = state.breaker.allowance();
        let backoff_until = state.backoff_until().filter(|t| now < *t);
        let round_wait = state
            .last_round_at
            .map(|t| t + config.min_seconds_between_workers)
            .filter(|t| now < *t);
        let mut budget = wanted.min(max_room);
        if wanted > 0 {
            if max_room < wanted {
                self.reasons.push(format!(
                    "--max-workers {}: {} jobs exist, room for {} of {} wanted",
                    config.max_workers, total_jobs, max_room, wanted
                ));
            }
            if let Some(t) = round_wait {
                budget = 0;
                self.reasons.push(format!(
                    "--min-seconds-between-workers: next launch round at {t:.1}s"
                ));
            }
            if let Some(t) = backoff_until {
                budget = 0;
                self.reasons.push(format!(
                    "backing off after {} consecutive failed launches ({} refused, {} lost before \
                     check-in) until {t:.1}s",
                    state.failures(),
                    state.consecutive_failures,
                    state.early_exits
                ));
            }
            if let Some(a) = breaker_allowance {
                if a < budget {
                    self.reasons.push(format!(
                        "circuit breaker {:?} allows {a} launch(es)",
                        state.breaker.state
                    ));
                }
                budget = budget.min(a);
            }
            let tokens = state.bucket.available();
            if tokens < budget {
                self.reasons.push(format!(
                    "token bucket: {tokens} token(s) for {budget} launch(es)"
                ));
            }
            budget = state.bucket.take(budget);
        }
        LaunchLimits {
            budget,
            breaker_allowance,
            backoff_until,
        }
    }

    /// Rule 7b: the budget shared round-robin over shapes, while a bounded backend holds the
    /// shapes of every listed job plus this tick's launches. Returns the capacity left.
    fn grant_within_capacity(
        &mut self,
        state: &mut PolicyState,
        jobs: &[Job],
        budget: u32,
    ) -> Option<Resources> {
        let config = self.config;
        let mut free_capacity = config.capacity.map(|cap| {
            let mut used = Resources::default();
            for j in jobs {
                let shape = self
                    .index
                    .get(j.shape.as_str())
                    .map(|&i| self.shapes[i])
                    .or(config.shapes.first());
                if let Some(s) = shape {
                    used.add(&s.resources());
                }
            }
            Resources::new(
                cap.cpus.saturating_sub(used.cpus),
                cap.gpus.saturating_sub(used.gpus),
                cap.memory_bytes.saturating_sub(used.memory_bytes),
            )
        });
        let mut left = budget;
        let mut capacity_limited = false;
        // Shapes the capacity refused: free capacity only shrinks, so what they still wanted is
        // over the capacity, whatever the budget.
        let mut refused = vec![false; self.plans.len()];
        while left > 0 {
            let mut progressed = false;
            for (i, sp) in self.plans.iter_mut().enumerate() {
                if left > 0 && !refused[i] && sp.launches_granted < sp.launch_wanted {
                    let need = self.shapes[i].resources();
                    if let Some(free) = free_capacity.as_mut() {
                        if !free.fits(&need) {
                            capacity_limited = true;
                            refused[i] = true;
                            continue;
                        }
                        free.subtract(&need);
                    }
                    sp.launches_granted += 1;
                    left -= 1;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        // Tokens taken for launches the capacity refused go back.
        state.bucket.give_back(left);
        if capacity_limited {
            self.reasons.push(format!(
                "backend capacity: {} left after the listed jobs and this tick's launches",
                free_capacity.map_or_else(String::new, |f| format!(
                    "{} cpus, {} gpus, {} bytes",
                    f.cpus, f.gpus, f.memory_bytes
                ))
            ));
        }
        for (i, sp) in self.plans.iter_mut().enumerate() {
            let not_granted = sp.launch_wanted - sp.launches_granted;
            // A shape the budget never reached may not fit either: the capacity decides.
            let over = refused[i]
                || free_capacity
                    .as_ref()
                    .is_some_and(|f| not_granted > 0 && !f.fits(&self.shapes[i].resources()));
            (sp.throttled, sp.over_capacity) = if over {
                (0, not_granted)
            } else {
                (not_granted, 0)
            };
            if sp.launch_wanted > 0 {
                let why = match (sp.throttled, sp.over_capacity) {
                    (0, 0) => String::new(),
                    (t, 0) => format!(" ({t} throttled)"),
                    (_, c) => format!(" ({c} over capacity)"),
                };
                self.reasons.push(format!(
                    "shape {}: launching {} of {} wanted{why}",
                    sp.shape, sp.launches_granted, sp.launch_wanted
                ));
            }
        }
        free_capacity
    }

    /// Rule 8: the min-workers floor, with the default shape.
    fn min_workers_floor(
        &mut self,
        state: &mut PolicyState,
        total_jobs: usize,
        limits: &LaunchLimits,
        free_capacity: Option<Resources>,
    ) {
        let config = self.config;
        let granted: u32 = self.plans.iter().map(|s| s.launches_granted).sum();
        let floor = u32::try_from(config.min_workers.min(config.max_workers)).unwrap_or(u32::MAX);
        let after = u32::try_from(total_jobs)
            .unwrap_or(u32::MAX)
            .saturating_add(granted);
        if after >= floor {
            return;
        }
        let short = floor - after;
        let default = config.shapes.first();
        let mut allowed = short;
        if let Some(t) = limits.backoff_until {
            allowed = 0;
            self.reasons.push(format!(
                "--min-workers {}: short by {short}, but backing off until {t:.1}s",
                config.min_workers
            ));
        } else if let Some(a) = limits.breaker_allowance {
            allowed = allowed.min(a.saturating_sub(granted));
            if allowed < short {
                self.reasons.push(format!(
                    "--min-workers {}: short by {short}, circuit breaker {:?} allows {allowed}",
                    config.min_workers, state.breaker.state
                ));
            }
        }
        if let (Some(free), Some(d)) = (free_capacity, default) {
            let need = d.resources();
            let mut fit = 0u32;
            let mut f = free;
            while fit < allowed && f.fits(&need) {
                f.subtract(&need);
                fit += 1;
            }
            if fit < allowed {
                self.reasons.push(format!(
                    "--min-workers {}: short by {short}, backend capacity allows {fit}",
                    config.min_workers
                ));
                allowed = fit;
            }
        }
        match default {
            Some(d) if allowed > 0 => {
                let i = self.index[d.name.as_str()];
                self.plans[i].floor_launches = allowed;
                state.bucket.take(allowed);
                self.reasons.push(format!(
                    "--min-workers {}: {} jobs after demand launches, launching {allowed} of shape {}",
                    config.min_workers, after, d.name
                ));
            }
            None => self
                .reasons
                .push("--min-workers: no shape configured, nothing to launch".into()),
            Some(_) => {}
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
