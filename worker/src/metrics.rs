//! The worker's Prometheus metrics, served on `--metrics-addr` (off by default: a worker is
//! often not reachable). One [`Metrics`] per process, shared as an `Arc` by the loop (runs,
//! check-ins, outcomes), the upload, the dependency cache and the image cache.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::run::state::{RunState, Stage};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// `preparing`, `running`, `cleaning_up`, `uploading_results`, `finalizing`, `restaged`.
    pub stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `succeeded`, `failed`, `killed` or `restaged`.
    pub outcome: String,
}

/// The stages a run of this worker can be in, with their label values.
const STAGES: [(Stage, &str); 6] = [
    (Stage::Preparing, "preparing"),
    (Stage::Running, "running"),
    (Stage::CleaningUp, "cleaning_up"),
    (Stage::UploadingResults, "uploading_results"),
    (Stage::Finalizing, "finalizing"),
    (Stage::Restaged, "restaged"),
];

/// The label values of [`outcome`].
const OUTCOMES: [&str; 4] = ["succeeded", "failed", "killed", "restaged"];

/// How a run ended, as far as this worker knows: when it reaches `finalizing` (the server then
/// makes it `ready`, `failed` or `killed`) or is handed back (`restaged`). `None` for a run
/// that has not ended.
pub fn outcome(run: &RunState) -> Option<&'static str> {
    match run.stage {
        Stage::Restaged => Some("restaged"),
        Stage::Finalizing | Stage::Finished => Some(if run.is_killed {
            "killed"
        } else if run
            .failure_message
            .as_deref()
            .is_some_and(|m| !m.is_empty())
            || run.exitcode.is_some_and(|c| c != 0)
        {
            "failed"
        } else {
            "succeeded"
        }),
        _ => None,
    }
}

/// Every metric of the worker. Cheap to share: the metric types are atomics behind `Arc`s.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Runs of this worker by stage.
    pub runs: Family<StageLabels, Gauge>,
    /// Duration of check-ins (the server long-polls for messages, up to a few seconds).
    pub checkin_duration: Histogram,
    pub checkin_failures: Counter,
    pub uploaded_bytes: Counter,
    pub downloaded_bytes: Counter,
    pub dependency_cache_bytes: Gauge,
    pub dependency_cache_hits: Counter,
    pub dependency_cache_misses: Counter,
    pub dependency_cache_evictions: Counter,
    pub image_cache_bytes: Gauge,
    /// Pulls this worker asked its engine for (an image already present is not pulled).
    pub image_pulls: Counter,
    /// Images and dependencies fetched before any run asked for them (`--prefetch-image`,
    /// `--prefetch-dependency`).
    pub prefetched_images: Counter,
    pub prefetched_dependencies: Counter,
    pub run_outcomes: Family<OutcomeLabels, Counter>,
    /// Notices of a coming reclaim read from the cloud (`--preemption-notice`).
    pub reclaim_notices: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cl_worker");
        let m = Metrics {
            registry: Registry::default(),
            runs: Family::default(),
            checkin_duration: Histogram::new([
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
            checkin_failures: Counter::default(),
            uploaded_bytes: Counter::default(),
            downloaded_bytes: Counter::default(),
            dependency_cache_bytes: Gauge::default(),
            dependency_cache_hits: Counter::default(),
            dependency_cache_misses: Counter::default(),
            dependency_cache_evictions: Counter::default(),
            image_cache_bytes: Gauge::default(),
            image_pulls: Counter::default(),
            prefetched_images: Counter::default(),
            prefetched_dependencies: Counter::default(),
            run_outcomes: Family::default(),
            reclaim_notices: Counter::default(),
        };
        let r = &mut registry;
        r.register("runs", "Runs of this worker by stage", m.runs.clone());
        r.register(
            "checkin_duration_seconds",
            "Duration of check-ins, the server's long poll for messages included",
            m.checkin_duration.clone(),
        );
        r.register(
            "checkin_failures",
            "Check-ins that failed (network, server error, refused)",
            m.checkin_failures.clone(),
        );
        r.register(
            "uploaded_bytes",
            "Bytes of run results sent to the server (archived size, retried attempts included)",
            m.uploaded_bytes.clone(),
        );
        r.register(
            "downloaded_bytes",
            "Bytes of dependencies downloaded from the server by this worker",
            m.downloaded_bytes.clone(),
        );
        r.register(
            "dependency_cache_bytes",
            "Size of the (possibly shared) dependency cache, downloads in progress included",
            m.dependency_cache_bytes.clone(),
        );
        r.register(
            "dependency_cache_hits",
            "Dependencies a run found ready in the cache",
            m.dependency_cache_hits.clone(),
        );
        r.register(
            "dependency_cache_misses",
            "Dependencies a run had to download or wait for",
            m.dependency_cache_misses.clone(),
        );
        r.register(
            "dependency_cache_evictions",
            "Dependencies this worker deleted from the cache to stay within --max-work-dir-size",
            m.dependency_cache_evictions.clone(),
        );
        r.register(
            "image_cache_bytes",
            "Size of the Docker images this worker's runs used (what --max-image-cache-size bounds)",
            m.image_cache_bytes.clone(),
        );
        r.register(
            "image_pulls",
            "Image pulls this worker asked its engine for (present images are not pulled; a run waits for a pull of its image already under way)",
            m.image_pulls.clone(),
        );
        r.register(
            "prefetched_images",
            "Images made present as the worker started, before a run asked for them (--prefetch-image)",
            m.prefetched_images.clone(),
        );
        r.register(
            "prefetched_dependencies",
            "Dependencies made ready in the cache as the worker started, before a run asked for them (--prefetch-dependency)",
            m.prefetched_dependencies.clone(),
        );
        r.register(
            "run_outcomes",
            "Runs that ended, by outcome (succeeded, failed, killed, restaged)",
            m.run_outcomes.clone(),
        );
        r.register(
            "reclaim_notices",
            "Notices of a coming reclaim of the machine read from the cloud's metadata service (--preemption-notice); each hands the runs back",
            m.reclaim_notices.clone(),
        );
        let m = Metrics { registry, ..m };
        // Every stage and outcome is a series from the start, at 0.
        m.set_runs([]);
        for outcome in OUTCOMES {
            let _ = m.run_outcomes.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
        }
        m
    }

    /// Sets the by-stage gauge from the stages of the current runs (every stage is set, to 0
    /// when no run is in it).
    pub fn set_runs<'a>(&self, stages: impl IntoIterator<Item = &'a Stage>) {
        let mut counts = [0i64; STAGES.len()];
        for s in stages {
            if let Some(i) = STAGES.iter().position(|(st, _)| st == s) {
                counts[i] += 1;
            }
        }
        for ((_, label), n) in STAGES.iter().zip(counts) {
            self.runs
                .get_or_create(&StageLabels {
                    stage: (*label).into(),
                })
                .set(n);
        }
    }

    /// Counts one ended run.
    pub fn run_ended(&self, outcome: &str) {
        self.run_outcomes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        common::http::encode(&self.registry)
    }
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    common::http::metrics_response(m.encode())
}

/// Serves `GET /metrics` on `addr` until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(metrics);
    common::http::serve(addr, app, "/metrics", shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_and_outcomes_become_series() {
        let m = Metrics::new();
        m.set_runs(&[Stage::Running, Stage::Running, Stage::Finalizing]);
        m.run_ended("succeeded");
        m.checkin_duration.observe(0.2);
        let text = m.encode();
        for line in [
            "cl_worker_runs{stage=\"running\"} 2",
            "cl_worker_runs{stage=\"finalizing\"} 1",
            "cl_worker_runs{stage=\"preparing\"} 0",
            "cl_worker_run_outcomes_total{outcome=\"failed\"} 0",
            "cl_worker_run_outcomes_total{outcome=\"succeeded\"} 1",
            "cl_worker_checkin_duration_seconds_count 1",
            "cl_worker_uploaded_bytes_total 0",
            "cl_worker_dependency_cache_evictions_total 0",
            "cl_worker_image_cache_bytes 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // The stages are recounted, not accumulated.
        m.set_runs(&[]);
        assert!(m.encode().contains("cl_worker_runs{stage=\"running\"} 0"));
    }

    #[test]
    fn outcome_of_a_run() {
        let bundle: protocol::BundleInfo =
            serde_json::from_value(serde_json::json!({"uuid": "0xa", "command": "true"})).unwrap();
        let resources: protocol::RunResources = serde_json::from_value(serde_json::json!({
            "cpus": 1, "gpus": 0, "docker_image": "i", "time": 0, "memory": 0, "disk": 0,
            "network": true}))
        .unwrap();
        let mut r = RunState::new(bundle, resources, "/w/0xa".into(), 0.0);
        assert_eq!(outcome(&r), None);
        r.stage = Stage::Finalizing;
        r.exitcode = Some(0);
        assert_eq!(outcome(&r), Some("succeeded"));
        r.exitcode = Some(1);
        assert_eq!(outcome(&r), Some("failed"));
        r.exitcode = Some(0);
        r.failure_message = Some("Memory limit exceeded.".into());
        assert_eq!(outcome(&r), Some("failed"));
        r.is_killed = true;
        assert_eq!(outcome(&r), Some("killed"));
        r.stage = Stage::Restaged;
        assert_eq!(outcome(&r), Some("restaged"));
    }
}
