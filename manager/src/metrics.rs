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
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
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

/// Every metric of the manager. Cheap to share: the metric types are atomics behind `Arc`s.
pub struct Metrics {
    registry: Registry,
    pub staged: Gauge,
    pub unschedulable: Gauge,
    pub workers: Family<WorkerLabels, Gauge>,
    pub workers_needed: Family<ShapeLabels, Gauge>,
    pub launches: Family<ShapeLabels, Counter>,
    pub submit_failures: Family<ShapeLabels, Counter>,
    pub cancels: Counter,
    pub cancel_failures: Counter,
    /// Worker jobs that ended unsuccessfully before their worker checked in.
    pub early_exits: Counter,
    /// The same, by shape and reason.
    pub failed_launches: Family<FailedLaunchLabels, Counter>,
    /// Worker jobs that ended unsuccessfully after their worker checked in, not cancelled by
    /// this manager (reclaimed or preempted capacity, deleted pods, lost nodes, crashes), by
    /// shape and reason.
    pub interrupted: Family<FailedLaunchLabels, Counter>,
    /// Seconds until the back-off after failed launches allows the next one (0: none).
    pub launch_backoff: Gauge<f64, AtomicU64>,
    pub observation_errors: Family<ErrorLabels, Counter>,
    pub consecutive_submit_failures: Gauge,
    /// 0 closed, 1 half-open, 2 open.
    pub breaker_state: Gauge,
    pub tick_duration: Histogram,
    pub ticks: Counter,
    /// Nodes of the backend's pool (`--pool-id`), current and target.
    pub pool_nodes: Family<PoolLabels, Gauge>,
    /// 1 for the pool's allocation state, 0 for the others.
    pub pool_allocation_state: Family<PoolStateLabels, Gauge>,
    /// 1 for each error code of the pool's last resize, as the service reports it.
    pub pool_resize_errors: Family<PoolErrorLabels, Gauge>,
    /// The pool's nodes that take no work, by state.
    pub pool_unhealthy_nodes: Family<PoolNodeStateLabels, Gauge>,
    /// Unhealthy nodes whose removal the manager asked for, by the state they were in.
    pub pool_nodes_removed: Family<PoolNodeStateLabels, Counter>,
    /// Seconds of running workers, by shape (tiers: every tier's, labelled with it).
    pub worker_seconds: Family<ShapeLabels, Counter<f64, AtomicU64>>,
    /// What those seconds cost at the tier's prices, by shape.
    pub cost: Family<ShapeLabels, Counter<f64, AtomicU64>>,
    /// This month's cost of the tier, and its budget (none: no series).
    pub month_cost: Gauge<f64, AtomicU64>,
    pub budget: Gauge<f64, AtomicU64>,
    status: Mutex<Status>,
    /// With several tiers: the metrics of each (this one only serves them).
    parts: Vec<Arc<Metrics>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::in_registry(Registry::with_prefix("cl_worker_manager"))
    }

    /// The metrics of one tier: every series carries `tier="<name>"`.
    pub fn for_tier(name: &str) -> Self {
        Self::in_registry(Registry::with_prefix_and_labels(
            "cl_worker_manager",
            [(Cow::Borrowed("tier"), Cow::Owned(name.to_owned()))].into_iter(),
        ))
    }

    /// Serves the metrics of every tier as one exposition (each family once, the samples of
    /// every tier under it), and the status the tiers' loop sets.
    pub fn of_tiers(parts: Vec<Arc<Metrics>>) -> Self {
        Metrics {
            parts,
            ..Self::new()
        }
    }

    fn in_registry(mut registry: Registry) -> Self {
        let m = Metrics {
            staged: Gauge::default(),
            unschedulable: Gauge::default(),
            workers: Family::default(),
            workers_needed: Family::default(),
            launches: Family::default(),
            submit_failures: Family::default(),
            cancels: Counter::default(),
            cancel_failures: Counter::default(),
            early_exits: Counter::default(),
            failed_launches: Family::default(),
            interrupted: Family::default(),
            launch_backoff: Gauge::default(),
            observation_errors: Family::default(),
            consecutive_submit_failures: Gauge::default(),
            breaker_state: Gauge::default(),
            tick_duration: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            ticks: Counter::default(),
            pool_nodes: Family::default(),
            pool_allocation_state: Family::default(),
            pool_resize_errors: Family::default(),
            pool_unhealthy_nodes: Family::default(),
            pool_nodes_removed: Family::default(),
            worker_seconds: Family::default(),
            cost: Family::default(),
            month_cost: Gauge::default(),
            budget: Gauge::default(),
            // Until the first tick.
            status: Mutex::new(Status::default()),
            parts: Vec::new(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "staged_bundles",
            "Staged bundles this manager considers",
            m.staged.clone(),
        );
        r.register(
            "unschedulable_bundles",
            "Staged bundles no worker shape of this manager can run",
            m.unschedulable.clone(),
        );
        r.register(
            "workers",
            "Worker jobs of this manager by shape and state",
            m.workers.clone(),
        );
        r.register(
            "workers_needed",
            "Workers the staged bundles need, by shape",
            m.workers_needed.clone(),
        );
        r.register("launches", "Worker jobs submitted", m.launches.clone());
        r.register(
            "submit_failures",
            "Worker job submissions the backend refused",
            m.submit_failures.clone(),
        );
        r.register("cancels", "Pending jobs cancelled", m.cancels.clone());
        r.register(
            "cancel_failures",
            "Cancels the backend refused",
            m.cancel_failures.clone(),
        );
        r.register(
            "workers_lost_before_checkin",
            "Worker jobs that ended unsuccessfully before their worker checked in (failed launches)",
            m.early_exits.clone(),
        );
        r.register(
            "failed_launches",
            "Worker jobs lost before their worker checked in, by shape and reason",
            m.failed_launches.clone(),
        );
        r.register(
            "workers_interrupted",
            "Worker jobs that ended unsuccessfully after their worker checked in, not cancelled by this manager (reclaimed or preempted capacity, deleted pods, lost nodes, crashes), by shape and the backend's reason",
            m.interrupted.clone(),
        );
        r.register(
            "launch_backoff_seconds",
            "Seconds until the back-off after failed launches allows the next launch (0: none)",
            m.launch_backoff.clone(),
        );
        r.register(
            "observation_errors",
            "Ticks skipped or limited because the server or the backend could not be read",
            m.observation_errors.clone(),
        );
        r.register(
            "consecutive_submit_failures",
            "Failed launches in a row: refused submits, and workers lost before check-in since the last check-in",
            m.consecutive_submit_failures.clone(),
        );
        r.register(
            "circuit_breaker_state",
            "Submit circuit breaker: 0 closed, 1 half-open, 2 open",
            m.breaker_state.clone(),
        );
        r.register(
            "tick_duration_seconds",
            "Duration of one control-loop tick",
            m.tick_duration.clone(),
        );
        r.register("ticks", "Control-loop ticks", m.ticks.clone());
        r.register(
            "pool_nodes",
            "Nodes of the backend's pool, current and target, dedicated and low-priority",
            m.pool_nodes.clone(),
        );
        r.register(
            "pool_allocation_state",
            "1 for the backend pool's allocation state (steady, resizing, stopping), 0 otherwise",
            m.pool_allocation_state.clone(),
        );
        r.register(
            "pool_resize_errors",
            "1 for each error code of the backend pool's last resize (quota, allocation failures)",
            m.pool_resize_errors.clone(),
        );
        r.register(
            "pool_unhealthy_nodes",
            "Nodes of the backend's pool that take no work (unusable, starttaskfailed)",
            m.pool_unhealthy_nodes.clone(),
        );
        r.register(
            "pool_nodes_removed",
            "Unhealthy nodes of the backend's pool whose removal the manager asked for",
            m.pool_nodes_removed.clone(),
        );
        r.register(
            "worker_seconds",
            "Seconds of running workers (several tiers: each tier's), by shape",
            m.worker_seconds.clone(),
        );
        r.register(
            "cost",
            "What the running workers' seconds cost at the tier's price per hour, by shape",
            m.cost.clone(),
        );
        r.register(
            "month_cost",
            "What the tier's workers cost this calendar month (UTC)",
            m.month_cost.clone(),
        );
        r.register(
            "budget",
            "The tier's monthly budget (0: none)",
            m.budget.clone(),
        );
        Metrics { registry, ..m }
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
        self.pool_resize_errors.clear();
        for e in &p.resize_errors {
            self.pool_resize_errors
                .get_or_create(&PoolErrorLabels {
                    pool: p.id.clone(),
                    code: e.code.clone(),
                })
                .set(1);
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

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        if self.parts.is_empty() {
            return common::http::encode(&self.registry);
        }
        let texts: Vec<String> = self.parts.iter().map(|m| m.encode()).collect();
        merge_expositions(&texts)
    }

    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// One exposition of registries that hold the same families (the tiers'): each family's
/// `# HELP`/`# TYPE`/`# UNIT` lines once, then the samples of every registry, one `# EOF`. The
/// client library encodes one registry at a time and has no merge of its own.
pub fn merge_expositions(texts: &[String]) -> String {
    // Family name → (header lines, sample lines), in the order first met.
    let mut order: Vec<String> = Vec::new();
    let mut families: std::collections::HashMap<String, (Vec<String>, Vec<String>)> =
        std::collections::HashMap::new();
    for text in texts {
        let mut current = String::new();
        for line in text.lines() {
            if line == "# EOF" || line.is_empty() {
                continue;
            }
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
                .or_else(|| line.strip_prefix("# UNIT "))
            {
                current = rest.split(' ').next().unwrap_or_default().to_owned();
                let entry = families.entry(current.clone()).or_insert_with(|| {
                    order.push(current.clone());
                    Default::default()
                });
                if !entry.0.iter().any(|h| h == line) {
                    entry.0.push(line.to_owned());
                }
            } else {
                families
                    .entry(current.clone())
                    .or_insert_with(|| {
                        order.push(current.clone());
                        Default::default()
                    })
                    .1
                    .push(line.to_owned());
            }
        }
    }
    let mut out = String::new();
    for name in &order {
        let (headers, samples) = &families[name];
        for l in headers.iter().chain(samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
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
        let (a, b) = (
            Arc::new(Metrics::for_tier("campus")),
            Arc::new(Metrics::for_tier("cloud")),
        );
        a.ticks.inc();
        b.ticks.inc();
        b.ticks.inc();
        b.cost
            .get_or_create(&ShapeLabels {
                shape: "gpu".into(),
            })
            .inc_by(2.5);
        let front = Metrics::of_tiers(vec![a, b]);
        let text = front.encode();
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
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
