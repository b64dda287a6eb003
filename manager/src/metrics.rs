//! Prometheus metrics and the manager's status, served on `--metrics-addr`.
//!
//! Endpoints: `GET /` (the status page, [`crate::page`]), `GET /metrics` (Prometheus text
//! format), `GET /status` (the [`Status`] of the last tick as JSON) and `GET /healthz`.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::{
    EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::policy::{BreakerState, Plan};
use crate::status::Status;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShapeLabels {
    pub shape: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub shape: String,
    /// `pending` or `active`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailedLaunchLabels {
    pub shape: String,
    /// Why the job ended, as the backend says (`ImagePullBackOff`, `Unschedulable`,
    /// `OOMKilled`, `PREEMPTED`, `NodeLost`, ...), else `exited`: of a failed launch, or of an
    /// interrupted worker.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    /// `current_dedicated`, `current_low_priority`, `target_dedicated`, `target_low_priority`.
    pub nodes: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStateLabels {
    pub pool: String,
    /// `steady`, `resizing`, `stopping`.
    pub allocation_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolErrorLabels {
    pub pool: String,
    /// The service's code (`AccountCoreQuotaReached`, `AllocationFailed`, ...).
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolNodeStateLabels {
    pub pool: String,
    /// `unusable` or `starttaskfailed`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `server` (staged-bundle search), `backend_list` or `backend_pool`.
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// Why the bundles wait: a [`crate::policy::WaitKind`] (`waiting_for_worker`, `over_cap`,
    /// `overflow_delay`, `backing_off`, `throttled`, `unschedulable`, `queued`).
    pub reason: String,
}

/// The `tier` label of a series: none for a manager of one backend.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct TierLabel(Option<Arc<str>>);

impl EncodeLabelSet for TierLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        match &self.0 {
            Some(t) => ("tier", t.as_ref()).encode(encoder.encode_label()),
            None => Ok(()),
        }
    }
}

/// Metrics without labels of their own (a counter or gauge of the whole manager, or of one
/// tier): each tier's series is a plain metric its handle holds; the family encodes them all
/// under one header, labelled with their tier (a manager of one backend: one series, no label).
#[derive(Debug)]
pub struct Scalars<M> {
    series: Arc<Mutex<Vec<(TierLabel, M)>>>,
}

impl<M> Clone for Scalars<M> {
    fn clone(&self) -> Self {
        Scalars {
            series: self.series.clone(),
        }
    }
}

impl<M: Clone> Scalars<M> {
    fn new() -> Self {
        Scalars {
            series: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A series of `tier` in this family: `metric`, which the caller keeps and writes.
    fn add(&self, tier: &TierLabel, metric: &M) {
        if let Ok(mut s) = self.series.lock() {
            s.push((tier.clone(), metric.clone()));
        }
    }
}

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Scalars<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let series = self.series.lock().map_err(|_| std::fmt::Error)?;
        if let [(TierLabel(None), m)] = &series[..] {
            return m.encode(encoder);
        }
        for (tier, m) in series.iter() {
            m.encode(encoder.encode_family(tier)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn is_empty(&self) -> bool {
        self.series.lock().map_or(true, |s| s.is_empty())
    }
}

/// One family with labels as one tier (or the one backend) writes into it: every series it
/// creates carries the tier's label first. The tiers share the family, so that the exposition
/// names each family once, with the series of every tier under it.
#[derive(Debug)]
pub struct Tiered<L, M> {
    tier: TierLabel,
    family: Family<(TierLabel, L), M>,
}

impl<L, M> Tiered<L, M>
where
    L: Clone + std::hash::Hash + Eq,
    M: Default,
{
    fn of(tier: &TierLabel, family: &Family<(TierLabel, L), M>) -> Self {
        Tiered {
            tier: tier.clone(),
            family: family.clone(),
        }
    }

    /// This tier's series of `labels`.
    pub fn get_or_create(&self, labels: &L) -> impl std::ops::Deref<Target = M> + '_ {
        self.family
            .get_or_create(&(self.tier.clone(), labels.clone()))
    }

    /// Removes this tier's series of `labels`.
    pub fn remove(&self, labels: &L) -> bool {
        self.family.remove(&(self.tier.clone(), labels.clone()))
    }
}

fn tick_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// Declares the manager's metrics once: the families of the one registry (in this order), and
/// each tier's handles on them.
macro_rules! metrics {
    (
        scalars { $( $(#[$sdoc:meta])* $sfield:ident : $smetric:ty = $snew:expr => $sname:literal, $shelp:literal; )* }
        families { $( $(#[$doc:meta])* $field:ident : $labels:ty, $metric:ty => $name:literal, $help:literal; )* }
    ) => {
        /// The manager's families, in the one registry that `/metrics` encodes.
        #[derive(Debug, Clone)]
        struct Families {
            $( $sfield: Scalars<$smetric>, )*
            $( $field: Family<(TierLabel, $labels), $metric>, )*
        }

        impl Families {
            fn register(registry: &mut Registry) -> Self {
                let f = Families {
                    $( $sfield: Scalars::new(), )*
                    $( $field: Family::default(), )*
                };
                $( registry.register($sname, $shelp, f.$sfield.clone()); )*
                $( registry.register($name, $help, f.$field.clone()); )*
                f
            }
        }

        /// Every metric of the manager (or of one tier of it). Cheap to share: the metric
        /// types are atomics behind `Arc`s.
        pub struct Metrics {
            registry: Arc<Registry>,
            families: Families,
            tier: TierLabel,
            $( $(#[$sdoc])* pub $sfield: $smetric, )*
            $( $(#[$doc])* pub $field: Tiered<$labels, $metric>, )*
            status: Mutex<Status>,
            /// The lease (`--lease`): process-wide, shared by every tier's handle.
            pub lease: LeaseMetrics,
            /// The pool error codes of the last resize with a series (cleared at the next).
            resize_errors: Mutex<Vec<PoolErrorLabels>>,
        }

        impl Metrics {
            /// Handles of `tier` on `families`; with `series`, its scalar series are in them.
            fn with_tier(
                registry: Arc<Registry>,
                families: Families,
                tier: TierLabel,
                series: bool,
                lease: LeaseMetrics,
            ) -> Self {
                let m = Metrics {
                    $( $sfield: $snew, )*
                    $( $field: Tiered::of(&tier, &families.$field), )*
                    registry,
                    families,
                    tier,
                    status: Mutex::new(Status::default()),
                    lease,
                    resize_errors: Mutex::new(Vec::new()),
                };
                if series {
                    $( m.families.$sfield.add(&m.tier, &m.$sfield); )*
                }
                m
            }
        }
    };
}

metrics! {
    scalars {
        staged: Gauge = Gauge::default() => "staged_bundles", "Staged bundles this manager considers";
        unschedulable: Gauge = Gauge::default() => "unschedulable_bundles",
            "Staged bundles no worker shape of this manager can run";
        cancels: Counter = Counter::default() => "cancels", "Pending jobs cancelled";
        cancel_failures: Counter = Counter::default() => "cancel_failures",
            "Cancels the backend refused";
        /// Worker jobs that ended unsuccessfully before their worker checked in.
        early_exits: Counter = Counter::default() => "workers_lost_before_checkin",
            "Worker jobs that ended unsuccessfully before their worker checked in (failed launches)";
        /// Seconds until the back-off after failed launches allows the next one (0: none).
        launch_backoff: Gauge<f64, AtomicU64> = Gauge::default() => "launch_backoff_seconds",
            "Seconds until the back-off after failed launches allows the next launch (0: none)";
        consecutive_submit_failures: Gauge = Gauge::default() => "consecutive_submit_failures",
            "Failed launches in a row: refused submits, and workers lost before check-in since the last check-in";
        /// 0 closed, 1 half-open, 2 open.
        breaker_state: Gauge = Gauge::default() => "circuit_breaker_state",
            "Submit circuit breaker: 0 closed, 1 half-open, 2 open";
        tick_duration: Histogram = tick_histogram() => "tick_duration_seconds",
            "Duration of one control-loop tick";
        ticks: Counter = Counter::default() => "ticks", "Control-loop ticks";
        /// This month's cost of the tier, and its budget.
        month_cost: Gauge<f64, AtomicU64> = Gauge::default() => "month_cost",
            "What the tier's workers cost this calendar month (UTC)";
        budget: Gauge<f64, AtomicU64> = Gauge::default() => "budget",
            "The tier's monthly budget (0: none)";
    }
    families {
        workers: WorkerLabels, Gauge => "workers", "Worker jobs of this manager by shape and state";
        workers_needed: ShapeLabels, Gauge => "workers_needed",
            "Workers the staged bundles need, by shape";
        launches: ShapeLabels, Counter => "launches", "Worker jobs submitted";
        submit_failures: ShapeLabels, Counter => "submit_failures",
            "Worker job submissions the backend refused";
        /// Worker jobs lost before their worker checked in, by shape and reason.
        failed_launches: FailedLaunchLabels, Counter => "failed_launches",
            "Worker jobs lost before their worker checked in, by shape and reason";
        /// Worker jobs that ended unsuccessfully after their worker checked in, not cancelled by
        /// this manager (reclaimed or preempted capacity, deleted pods, lost nodes, crashes), by
        /// shape and reason.
        interrupted: FailedLaunchLabels, Counter => "workers_interrupted",
            "Worker jobs that ended unsuccessfully after their worker checked in, not cancelled by this manager (reclaimed or preempted capacity, deleted pods, lost nodes, crashes), by shape and the backend's reason";
        observation_errors: ErrorLabels, Counter => "observation_errors",
            "Ticks skipped or limited because the server or the backend could not be read";
        /// Nodes of the backend's pool (`--pool-id`), current and target.
        pool_nodes: PoolLabels, Gauge => "pool_nodes",
            "Nodes of the backend's pool, current and target, dedicated and low-priority";
        /// 1 for the pool's allocation state, 0 for the others.
        pool_allocation_state: PoolStateLabels, Gauge => "pool_allocation_state",
            "1 for the backend pool's allocation state (steady, resizing, stopping), 0 otherwise";
        /// 1 for each error code of the pool's last resize, as the service reports it.
        pool_resize_errors: PoolErrorLabels, Gauge => "pool_resize_errors",
            "1 for each error code of the backend pool's last resize (quota, allocation failures)";
        /// The pool's nodes that take no work, by state.
        pool_unhealthy_nodes: PoolNodeStateLabels, Gauge => "pool_unhealthy_nodes",
            "Nodes of the backend's pool that take no work (unusable, starttaskfailed)";
        /// Unhealthy nodes whose removal the manager asked for, by the state they were in.
        pool_nodes_removed: PoolNodeStateLabels, Counter => "pool_nodes_removed",
            "Unhealthy nodes of the backend's pool whose removal the manager asked for";
        /// Seconds of running workers, by shape (tiers: every tier's, labelled with it).
        worker_seconds: ShapeLabels, Counter<f64, AtomicU64> => "worker_seconds",
            "Seconds of running workers (several tiers: each tier's), by shape";
        /// What those seconds cost at the tier's prices, by shape.
        cost: ShapeLabels, Counter<f64, AtomicU64> => "cost",
            "What the running workers' seconds cost at the tier's price per hour, by shape";
        /// Staged bundles by why they are not running yet (every reason, 0 when none).
        waiting_bundles: WaitLabels, Gauge => "waiting_bundles",
            "Staged bundles read at the last tick by why they are not running yet";
    }
}

/// The lease's metrics and its status (`--lease`), one per process: `leader` 1 while this
/// manager holds the lease, `lease_transitions` each time it took or lost it.
#[derive(Clone, Default)]
pub struct LeaseMetrics {
    pub leader: Gauge,
    pub transitions: Counter,
    gate: Arc<Mutex<Option<crate::lease::Gate>>>,
}

impl LeaseMetrics {
    fn register(registry: &mut Registry) -> Self {
        let m = LeaseMetrics::default();
        registry.register(
            "leader",
            "1 while this manager holds the lease (--lease) and may launch; without --lease, 1",
            m.leader.clone(),
        );
        registry.register(
            "lease_transitions",
            "Times this manager took the lease or lost it",
            m.transitions.clone(),
        );
        // Alone in charge until a lease says otherwise.
        m.leader.set(1);
        m
    }

    /// The lease this process runs (its status is then part of `/status`).
    pub fn follow(&self, gate: crate::lease::Gate) {
        self.leader.set(i64::from(gate.may_act()));
        if let Ok(mut g) = self.gate.lock() {
            *g = Some(gate);
        }
    }

    pub fn status(&self) -> Option<crate::lease::LeaseStatus> {
        self.gate.lock().ok()?.as_ref().map(|g| g.status())
    }
}

impl std::fmt::Debug for LeaseMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseMetrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The metrics of a manager of one backend: no `tier` label.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cl_worker_manager");
        let families = Families::register(&mut registry);
        let lease = LeaseMetrics::register(&mut registry);
        Self::with_tier(
            Arc::new(registry),
            families,
            TierLabel::default(),
            true,
            lease,
        )
    }

    /// The registry of a manager of several tiers, which serves what [`Metrics::tier`] handles
    /// write into it; it has no series of its own.
    pub fn tiers_root() -> Self {
        let mut registry = Registry::with_prefix("cl_worker_manager");
        let families = Families::register(&mut registry);
        let lease = LeaseMetrics::register(&mut registry);
        Self::with_tier(
            Arc::new(registry),
            families,
            TierLabel::default(),
            false,
            lease,
        )
    }

    /// What serves this registry: no series of its own.
    pub fn root(&self) -> Self {
        Self::with_tier(
            self.registry.clone(),
            self.families.clone(),
            TierLabel::default(),
            false,
            self.lease.clone(),
        )
    }

    /// The metrics of one tier, in this root's registry: every series carries `tier="<name>"`.
    pub fn tier(&self, name: &str) -> Self {
        Self::with_tier(
            self.registry.clone(),
            self.families.clone(),
            TierLabel(Some(name.into())),
            true,
            self.lease.clone(),
        )
    }

    /// Records the numbers of one plan (gauges).
    pub fn observe_plan(&self, plan: &Plan) {
        self.staged.set(plan.staged_total() as i64);
        self.unschedulable.set(plan.unschedulable.len() as i64);
        if plan.total_jobs.is_some() {
            for s in &plan.shapes {
                for (state, n) in [("pending", s.pending), ("active", s.active)] {
                    self.workers
                        .get_or_create(&WorkerLabels {
                            shape: s.shape.clone(),
                            state: state.into(),
                        })
                        .set(i64::from(n));
                }
            }
        }
        for s in &plan.shapes {
            self.workers_needed
                .get_or_create(&ShapeLabels {
                    shape: s.shape.clone(),
                })
                .set(i64::from(s.workers_needed));
        }
        self.set_breaker(plan.breaker, plan.consecutive_failures);
        self.set_waiting(&plan.waits);
    }

    /// The `waiting_bundles` gauges of `waits`: every reason, 0 when none.
    pub fn set_waiting(&self, waits: &[crate::policy::BundleWait]) {
        for (kind, n) in crate::policy::count_waits(waits) {
            self.waiting_bundles
                .get_or_create(&WaitLabels {
                    reason: kind.name().into(),
                })
                .set(n as i64);
        }
    }

    /// Keeps the status of the last tick for `/status` and `/`.
    pub fn set_status(&self, status: Status) {
        if let Ok(mut s) = self.status.lock() {
            *s = status;
        }
    }

    /// Records the backend's pool.
    pub fn observe_pool(&self, p: &backends::PoolStatus) {
        for (nodes, n) in [
            ("current_dedicated", p.current_dedicated_nodes),
            ("current_low_priority", p.current_low_priority_nodes),
            ("target_dedicated", p.target_dedicated_nodes),
            ("target_low_priority", p.target_low_priority_nodes),
        ] {
            self.pool_nodes
                .get_or_create(&PoolLabels {
                    pool: p.id.clone(),
                    nodes: nodes.into(),
                })
                .set(i64::from(n));
        }
        for state in ["steady", "resizing", "stopping"] {
            self.pool_allocation_state
                .get_or_create(&PoolStateLabels {
                    pool: p.id.clone(),
                    allocation_state: state.into(),
                })
                .set(i64::from(p.allocation_state == state));
        }
        // Only the codes of the last resize: a cleared error leaves no series behind.
        if let Ok(mut last) = self.resize_errors.lock() {
            for l in last.drain(..) {
                self.pool_resize_errors.remove(&l);
            }
            for e in &p.resize_errors {
                let l = PoolErrorLabels {
                    pool: p.id.clone(),
                    code: e.code.clone(),
                };
                self.pool_resize_errors.get_or_create(&l).set(1);
                last.push(l);
            }
        }
        let labels = |state: &str| PoolNodeStateLabels {
            pool: p.id.clone(),
            state: state.into(),
        };
        for state in backends::azure_batch::heal::UNHEALTHY {
            let n = p
                .unhealthy_nodes
                .iter()
                .filter(|n| n.state == state)
                .count();
            self.pool_unhealthy_nodes
                .get_or_create(&labels(state))
                .set(n as i64);
        }
        for state in backends::azure_batch::heal::UNHEALTHY {
            // The series exist from the first reading, so that rates start at 0.
            let _ = self.pool_nodes_removed.get_or_create(&labels(state));
        }
        for n in &p.removed_nodes {
            self.pool_nodes_removed
                .get_or_create(&labels(&n.state))
                .inc();
        }
    }

    pub fn set_breaker(&self, state: BreakerState, consecutive_failures: u32) {
        self.breaker_state.set(match state {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen { .. } => 1,
            BreakerState::Open { .. } => 2,
        });
        self.consecutive_submit_failures
            .set(i64::from(consecutive_failures));
    }

    pub fn observation_error(&self, source: &str) {
        self.observation_errors
            .get_or_create(&ErrorLabels {
                source: source.into(),
            })
            .inc();
    }

    /// The Prometheus text exposition of every metric (of every tier, in one registry).
    pub fn encode(&self) -> String {
        common::http::encode(&self.registry)
    }

    pub fn status(&self) -> Status {
        let mut s = self.status.lock().map(|s| s.clone()).unwrap_or_default();
        s.lease = self.lease.status();
        s
    }
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    common::http::metrics_response(m.encode())
}

async fn status_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    axum::Json(m.status())
}

async fn page_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    Html(crate::page::render_html(&m.status(), common::now_unix()))
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

/// Binds `addr` now (so a taken port fails start-up) and serves until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let app = Router::new()
        .route("/", get(page_handler))
        .route("/metrics", get(metrics_handler))
        .route("/status", get(status_handler))
        .route("/healthz", get(healthz))
        .with_state(metrics);
    // The status page is at `/` of the same address.
    common::http::serve(addr, app, "/metrics and /status", shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{plan, Config, Observation, PolicyState, Shape, StagedBundle};

    #[test]
    fn the_tiers_metrics_are_one_exposition_with_each_family_once() {
        let front = Metrics::tiers_root();
        let (a, b) = (front.tier("campus"), front.tier("cloud"));
        a.ticks.inc();
        b.ticks.inc();
        b.ticks.inc();
        b.cost
            .get_or_create(&ShapeLabels {
                shape: "gpu".into(),
            })
            .inc_by(2.5);
        // A pool's resize errors: a tier's new reading clears its own old codes only.
        let pool = |code: &str| backends::PoolStatus {
            id: "p".into(),
            allocation_state: "steady".into(),
            resize_errors: vec![backends::PoolError {
                code: code.into(),
                message: String::new(),
            }],
            ..Default::default()
        };
        a.observe_pool(&pool("AccountCoreQuotaReached"));
        b.observe_pool(&pool("AllocationFailed"));
        a.observe_pool(&pool("AllocationTimedOut"));
        let text = front.encode();
        for (tier, code, there) in [
            ("campus", "AccountCoreQuotaReached", false),
            ("campus", "AllocationTimedOut", true),
            ("cloud", "AllocationFailed", true),
        ] {
            let line = format!(
                "cl_worker_manager_pool_resize_errors{{tier=\"{tier}\",pool=\"p\",code=\"{code}\"}} 1\n"
            );
            assert_eq!(text.contains(&line), there, "{line}: {text}");
        }
        // The root of the tiers has no series of its own.
        assert!(!text.contains("cl_worker_manager_ticks_total 0"), "{text}");
        assert_eq!(
            text.matches("# TYPE cl_worker_manager_ticks ").count(),
            1,
            "{text}"
        );
        assert!(
            text.contains("cl_worker_manager_ticks_total{tier=\"campus\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("cl_worker_manager_ticks_total{tier=\"cloud\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("cl_worker_manager_cost_total{tier=\"cloud\",shape=\"gpu\"} 2.5\n"),
            "{text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn plan_numbers_become_metrics() {
        let mut c = Config::with_default_shape(Shape::from_flags(1, 0, 2048));
        c.min_workers = 0;
        let mut st = PolicyState::new(&c);
        let obs = Observation {
            staged: vec![
                StagedBundle::new("0x1", 1, 0, 1 << 30),
                StagedBundle::new("0x2", 1, 0, 1 << 30),
                StagedBundle::new("0x3", 1, 4, 1 << 30),
            ],
            jobs: Ok(vec![crate::policy::Job::pending("j1", "default")]),
            now: 0.0,
        };
        let p = plan(&c, &mut st, &obs);
        let m = Metrics::new();
        m.observe_plan(&p);
        m.launches
            .get_or_create(&ShapeLabels {
                shape: "default".into(),
            })
            .inc_by(1);
        let text = m.encode();
        for line in [
            "cl_worker_manager_staged_bundles 3",
            "cl_worker_manager_unschedulable_bundles 1",
            "cl_worker_manager_workers{shape=\"default\",state=\"pending\"} 1",
            "cl_worker_manager_workers_needed{shape=\"default\"} 2",
            "cl_worker_manager_launches_total{shape=\"default\"} 1",
            "cl_worker_manager_circuit_breaker_state 0",
            // 0x1 waits for j1, 0x2 for the worker launched for it; 0x3 fits no shape.
            "cl_worker_manager_waiting_bundles{reason=\"waiting_for_worker\"} 2\n",
            "cl_worker_manager_waiting_bundles{reason=\"unschedulable\"} 1\n",
            "cl_worker_manager_waiting_bundles{reason=\"over_cap\"} 0\n",
            "cl_worker_manager_waiting_bundles{reason=\"overflow_delay\"} 0\n",
            "cl_worker_manager_waiting_bundles{reason=\"backing_off\"} 0\n",
            "cl_worker_manager_waiting_bundles{reason=\"throttled\"} 0\n",
            "cl_worker_manager_waiting_bundles{reason=\"queued\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
