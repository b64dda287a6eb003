//! The control loop of several tiers: one read of the staged bundles and one listing per tier,
//! the bundles routed to tiers ([`route`]), then each tier's own policy and execution on its
//! share, with this tick's launches bounded by what the routing opened for it. Costs accrue for
//! the running workers of every tier.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use backends::{Backend, BackendError, DynBackend, JobState, JobStatus};
use protocol::RestClient;
use tokio_util::sync::CancellationToken;

use super::cost::CostBook;
use crate::control::{
    free_capacity, read_rest_of_staged, staged_bundle, tick_until, Exit, Manager, SEARCH_PAGE,
};
use crate::metrics::{Metrics, ShapeLabels};
use crate::policy::{
    explain_routes, merge_tier_waits, route, Action, BreakerState, CapKind, Job, Occupancy,
    Resources, TierLimits, TierView, WaitReason,
};
use crate::settings::Settings;
use crate::status::TierStatus;

/// One tier: its manager (backend, policy, state) and what the tiers' routing needs of it.
pub struct Tier {
    pub name: String,
    pub manager: Manager<DynBackend>,
    /// Its own `max-workers`. (Its `--min-workers` is its policy configuration's: the global
    /// one for the first tier, 0 for the others.)
    pub cap: usize,
    pub overflow_after: Option<f64>,
    /// Shape name → price per hour.
    pub prices: HashMap<String, f64>,
    /// Per calendar month; `None`: unbounded.
    pub budget: Option<f64>,
}

/// Several tiers driven by one loop.
pub struct Tiers {
    pub client: RestClient,
    pub keywords: Vec<String>,
    pub settings: Settings,
    /// The global `--max-workers` over all tiers.
    pub max_workers: usize,
    pub tiers: Vec<Tier>,
    pub costs: CostBook,
    pub cost_file: Option<PathBuf>,
    /// What `--metrics-addr` serves: every tier's metrics, and the status set here.
    pub metrics: Arc<Metrics>,
    /// When each staged bundle was first seen staged (this process's clock).
    first_seen: HashMap<String, f64>,
    /// Why each tier launched nothing at the last tick (`None`: it could launch).
    last_held: HashMap<String, Option<Held>>,
}

/// What one tier did at a tick (for tests, logs and `--once`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TierTick {
    pub tier: String,
    /// Bundles routed to it.
    pub routed: Vec<String>,
    /// Workers the routing let it open.
    pub opened: u32,
    /// Workers it launched.
    pub launched: u32,
    pub can_launch: bool,
}

/// Why a tier launches nothing this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    JobsUnknown,
    BreakerOpen,
    BudgetSpent,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Held::JobsUnknown => "its jobs could not be listed",
            Held::BreakerOpen => "breaker open",
            Held::BudgetSpent => "budget spent",
        })
    }
}

fn now() -> f64 {
    common::now_unix()
}

/// The free capacity of a tier's jobs as bins: a running worker's known free room, a pending
/// job's whole shape.
fn free_bins(manager: &Manager<DynBackend>, jobs: &[Job]) -> Vec<Resources> {
    jobs.iter()
        .filter_map(|j| match j.state {
            Occupancy::Active => j.free,
            Occupancy::Pending => manager
                .config
                .shapes
                .iter()
                .find(|s| s.name == j.shape)
                .map(|s| s.resources),
        })
        .collect()
}

impl Tiers {
    pub fn new(
        client: RestClient,
        keywords: Vec<String>,
        settings: Settings,
        max_workers: usize,
        tiers: Vec<Tier>,
        costs: CostBook,
        cost_file: Option<PathBuf>,
    ) -> Self {
        // What serves the registry the tiers' metrics write into.
        let metrics = Arc::new(
            tiers
                .first()
                .map_or_else(Metrics::tiers_root, |t| t.manager.metrics.root()),
        );
        Tiers {
            client,
            keywords,
            settings,
            max_workers,
            tiers,
            costs,
            cost_file,
            metrics,
            first_seen: HashMap::new(),
            last_held: HashMap::new(),
        }
    }

    /// One tick over every tier; `None` when the staged bundles could not be read (nothing is
    /// launched or cancelled anywhere). With `dry` nothing is submitted or cancelled.
    pub async fn tick(&mut self, dry: bool) -> Option<Vec<TierTick>> {
        // A standby neither observes nor plans (each tier's manager holds the same gate and
        // asks it again before each launch).
        if !dry
            && !self
                .tiers
                .iter()
                .all(|t| crate::control::may_act(&t.manager.lease))
        {
            return None;
        }
        let mut staged = match self.read_staged().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "cannot read staged bundles, nothing launched or cancelled this tick: {e}"
                );
                return None;
            }
        };
        let mut listed = Vec::new();
        for t in &self.tiers {
            listed.push(t.manager.backend.list().await);
        }
        let seen = free_capacity(&self.client, &listed).await;
        seen.drop_taken(&mut staged);
        let now = now();
        self.accrue(now, &listed);
        let jobs: Vec<Result<Vec<Job>, String>> = self
            .tiers
            .iter_mut()
            .zip(listed)
            .map(|(t, l)| t.manager.absorb_listing(l, &seen.free))
            .collect();
        let live: HashSet<&str> = staged.iter().map(|b| b.uuid.as_str()).collect();
        self.first_seen.retain(|u, _| live.contains(u.as_str()));
        for b in &staged {
            self.first_seen.entry(b.uuid.clone()).or_insert(now);
        }
        let helds: Vec<Option<Held>> = self
            .tiers
            .iter()
            .zip(&jobs)
            .map(|(t, j)| self.held(t, j))
            .collect();
        let views: Vec<TierView> = self
            .tiers
            .iter()
            .zip(&jobs)
            .zip(&helds)
            .map(|((t, j), h)| view(t, j, h.is_none()))
            .collect();
        // A tier whose jobs are unknown counts as full: the global cap holds whatever it has.
        let counted: usize = self
            .tiers
            .iter()
            .zip(&jobs)
            .map(|(t, j)| j.as_ref().map_or(t.cap, Vec::len))
            .sum();
        let aged: Vec<_> = staged
            .iter()
            .map(|b| (b.clone(), now - self.first_seen[&b.uuid]))
            .collect();
        let routing = route(
            &views,
            &aged,
            u32::try_from(self.max_workers.saturating_sub(counted)).unwrap_or(u32::MAX),
        );
        // Why each bundle waits: the routing's reasons, else its tier's plan's (below).
        let limits: Vec<TierLimits> = self
            .tiers
            .iter()
            .zip(&jobs)
            .zip(&helds)
            .map(|((t, j), h)| TierLimits {
                cap: t.cap,
                workers: j.as_ref().map_or(t.cap, Vec::len),
                held: h.map(|h| self.held_reason(t, h)),
            })
            .collect();
        let route_waits = explain_routes(
            &views,
            &limits,
            &aged,
            &routing,
            (self.max_workers, counted),
            now,
        );
        let mut tier_waits = Vec::new();
        let mut out = Vec::new();
        let mut statuses = Vec::new();
        let mut first_status = None;
        for (i, ((t, jobs), view)) in self.tiers.iter_mut().zip(jobs).zip(views).enumerate() {
            let mine: Vec<_> = staged
                .iter()
                .zip(&routing.routes)
                .filter(|(_, r)| r.tier() == Some(i))
                .map(|(b, _)| b.clone())
                .collect();
            let routed: Vec<String> = mine.iter().map(|b| b.uuid.clone()).collect();
            let have = jobs.as_ref().map_or(0, Vec::len);
            let (pending, running) =
                jobs.iter()
                    .flatten()
                    .fold((0, 0), |(p, r), j| match j.state {
                        Occupancy::Pending => (p + 1, r),
                        Occupancy::Active => (p, r + 1),
                    });
            // This tick it may launch what the routing opened for it (and its floor).
            let floor = t.manager.config.min_workers;
            t.manager.config.max_workers =
                (have + routing.opened[i] as usize).min(t.cap).max(floor);
            // Each change of whether the tier launches, once, with its reason.
            if self.last_held.get(&t.name) != Some(&helds[i]) {
                let msg = match helds[i] {
                    Some(Held::BudgetSpent) => format!(
                        "tier {}: its budget of {:.2} for {} is spent ({:.2}): it launches \
                         nothing more this month",
                        t.name,
                        t.budget.unwrap_or_default(),
                        self.costs.month_of,
                        self.costs.month_cost(&t.name)
                    ),
                    Some(why) => format!("tier {}: launches nothing ({why})", t.name),
                    None => format!("tier {}: launching", t.name),
                };
                tracing::info!("{msg}");
                t.manager.journal.note(now, msg);
                self.last_held.insert(t.name.clone(), helds[i]);
            }
            let plan = t.manager.plan_with(mine, jobs, 0);
            tier_waits.push((t.name.clone(), plan.waits.clone()));
            t.manager.metrics.observe_plan(&plan);
            if !dry {
                t.manager.execute(&plan).await;
            }
            let launched = plan
                .actions
                .iter()
                .map(|a| match a {
                    Action::Launch { count, .. } => *count,
                    Action::Cancel { .. } => 0,
                })
                .sum::<u32>();
            let status = t.manager.status_after_tick(Some(&plan), now);
            t.manager.metrics.set_status(status.clone());
            // Each tier's tick counts, as a single backend's does.
            t.manager.metrics.ticks.inc();
            first_status.get_or_insert(status);
            statuses.push(TierStatus {
                name: t.name.clone(),
                backend: t.manager.backend.name().to_owned(),
                max_workers: t.cap,
                pending,
                running,
                routed: routed.len(),
                held: helds[i].map(|h| h.to_string()),
                overflow_after_secs: t.overflow_after,
                month: self.costs.month_of.clone(),
                month_cost: self.costs.month_cost(&t.name),
                budget: t.budget,
                total_cost: self.costs.total_cost(&t.name),
            });
            out.push(TierTick {
                tier: t.name.clone(),
                routed,
                opened: routing.opened[i],
                launched,
                can_launch: view.can_launch,
            });
        }
        let waits = merge_tier_waits(&aged, &routing, route_waits, &tier_waits);
        for (i, t) in self.tiers.iter().enumerate() {
            // Each tier's gauges count the bundles that wait for it; the first tier's also
            // those no tier holds.
            let mine: Vec<_> = waits
                .iter()
                .filter(|w| {
                    w.tier.as_deref() == Some(t.name.as_str()) || (i == 0 && w.tier.is_none())
                })
                .cloned()
                .collect();
            t.manager.metrics.set_waiting(&mine);
        }
        if let Some(first) = first_status {
            let (bundles, bundles_unlisted) = crate::status::bounded(&waits, 0);
            self.metrics.set_status(crate::status::Status {
                tiers: statuses,
                bundles,
                bundles_unlisted,
                ..first
            });
        }
        if let Some(path) = &self.cost_file {
            if let Err(e) = self.costs.save(path) {
                tracing::warn!("cannot write the cost file {}: {e}", path.display());
            }
        }
        Some(out)
    }

    /// Why a tier that launches nothing holds its bundles, as their reason.
    fn held_reason(&self, t: &Tier, held: Held) -> (WaitReason, String) {
        match held {
            Held::JobsUnknown => (
                WaitReason::Queued,
                format!("tier {}: its jobs could not be listed at this tick", t.name),
            ),
            Held::BreakerOpen => (
                WaitReason::BackingOff {
                    until: match t.manager.state.breaker.state {
                        BreakerState::Open { until } => Some(until),
                        _ => None,
                    },
                    breaker: true,
                },
                format!("tier {}: its circuit breaker is open", t.name),
            ),
            Held::BudgetSpent => (
                WaitReason::OverCap {
                    cap: CapKind::TierBudget,
                    max: None,
                    current: None,
                },
                format!(
                    "tier {}: its budget of {:.2} for {} is spent ({:.2})",
                    t.name,
                    t.budget.unwrap_or_default(),
                    self.costs.month_of,
                    self.costs.month_cost(&t.name)
                ),
            ),
        }
    }

    /// Why the tier launches nothing this tick, if so.
    fn held(&self, t: &Tier, jobs: &Result<Vec<Job>, String>) -> Option<Held> {
        if jobs.is_err() {
            Some(Held::JobsUnknown)
        } else if matches!(t.manager.state.breaker.state, BreakerState::Open { .. }) {
            Some(Held::BreakerOpen)
        } else if t
            .budget
            .is_some_and(|b| self.costs.month_cost(&t.name) >= b)
        {
            Some(Held::BudgetSpent)
        } else {
            None
        }
    }

    /// Charges the jobs the backends list as running (checked in or not: the machine is
    /// paid for either way).
    fn accrue(&mut self, now: f64, listed: &[Result<Vec<JobStatus>, BackendError>]) {
        let mut running = Vec::new();
        for (t, jobs) in self.tiers.iter().zip(listed) {
            let mut by_shape: HashMap<&str, u32> = HashMap::new();
            for j in jobs.iter().flatten() {
                if j.state == JobState::Running {
                    *by_shape.entry(j.shape_name.as_str()).or_default() += 1;
                }
            }
            for (shape, n) in by_shape {
                let price = t.prices.get(shape).copied().unwrap_or(0.0);
                running.push((t.name.clone(), shape.to_owned(), n, price));
            }
        }
        let dt = self.costs.accrue(now, &running);
        for (tier, shape, n, price) in &running {
            let Some(t) = self.tiers.iter().find(|t| &t.name == tier) else {
                continue;
            };
            let labels = ShapeLabels {
                shape: shape.clone(),
            };
            let secs = dt * f64::from(*n);
            t.manager
                .metrics
                .worker_seconds
                .get_or_create(&labels)
                .inc_by(secs);
            t.manager
                .metrics
                .cost
                .get_or_create(&labels)
                .inc_by(secs * price / 3600.0);
        }
        for t in &self.tiers {
            t.manager
                .metrics
                .month_cost
                .set(self.costs.month_cost(&t.name));
            t.manager.metrics.budget.set(t.budget.unwrap_or(0.0));
        }
    }

    /// Every staged bundle the query finds (each tier's share is planned from them).
    async fn read_staged(&self) -> Result<Vec<crate::policy::StagedBundle>, protocol::Error> {
        let first = self
            .client
            .search_bundles_page(&self.keywords, SEARCH_PAGE, 0)
            .await?;
        let mut staged: Vec<_> = first.iter().map(staged_bundle).collect();
        if first.len() == SEARCH_PAGE {
            read_rest_of_staged(&self.client, &self.keywords, &mut staged).await?;
        }
        Ok(staged)
    }

    /// Ticks every `--sleep-time` until `shutdown` or `--restart-after-seconds`, or until a
    /// tier's `--exit-after-num-failed` has passed.
    pub async fn run(&mut self, shutdown: CancellationToken) -> Exit {
        let settings = self.settings.clone();
        tick_until(&settings, shutdown, async || {
            self.tick(false).await;
            self.tiers.iter().find_map(|t| {
                t.manager
                    .too_many_failures()
                    .map(|why| format!("tier {}: {why}", t.name))
            })
        })
        .await
    }
}

/// A tier as the routing sees it at this tick.
fn view(t: &Tier, jobs: &Result<Vec<Job>, String>, can_launch: bool) -> TierView {
    TierView {
        name: t.name.clone(),
        shapes: t.manager.config.shapes.clone(),
        overflow_after_secs: t.overflow_after,
        can_launch,
        room: jobs.as_ref().map_or(0, |j| {
            u32::try_from(t.cap.saturating_sub(j.len())).unwrap_or(u32::MAX)
        }),
        free: jobs
            .as_ref()
            .map_or_else(|_| Vec::new(), |j| free_bins(&t.manager, j)),
        price_per_hour: t.prices.values().copied().fold(0.0, f64::max),
    }
}
