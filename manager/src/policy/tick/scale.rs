//! Rules 6 to 8 of a tick: scale-down, the launch budget of the demand, the grant within a
//! bounded backend's capacity, and the min-workers floor.

use super::*;

impl Tick<'_> {
    /// Rule 6: scale-down of unneeded pending jobs, newest first, keeping the min-workers floor;
    /// a job is cancelled only at the second tick in a row that does not need it.
    pub(super) fn scale_down(&mut self, state: &mut PolicyState, jobs: &[Job]) -> Vec<Action> {
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
    pub(super) fn demand_budget(
        &mut self,
        state: &mut PolicyState,
        total_jobs: usize,
    ) -> LaunchLimits {
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
            let limited = budget.min(tokens) < wanted;
            budget = state.bucket.take(budget);
            if limited {
                self.hold = Some(self.what_holds(state, total_jobs, max_room, wanted, round_wait));
            }
        }
        LaunchLimits {
            budget,
            breaker_allowance,
            backoff_until,
        }
    }

    /// Rule 7b: the budget shared round-robin over shapes, while a bounded backend holds the
    /// shapes of every listed job plus this tick's launches. Returns the capacity left.
    pub(super) fn grant_within_capacity(
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
                    used.add(&s.resources);
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
                    let need = self.shapes[i].resources;
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
                    .is_some_and(|f| not_granted > 0 && !f.fits(&self.shapes[i].resources));
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
    pub(super) fn min_workers_floor(
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
            let need = d.resources;
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
}
