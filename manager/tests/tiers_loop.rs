//! The tiers' control loop in-process: two tiers on in-memory backends (`FakeBackend`, each on
//! its own batch system) against a CodaLab server stand-in. The first tier fills to its cap at
//! once; the rest waits for it until `overflow-after`, then goes to the second tier; the global
//! `--max-workers` holds over both; a tier whose breaker is open or whose budget is spent passes
//! its bundles on at once; costs accrue for running workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backends::fake::{FakeBackend, FakeCluster};
use backends::{Backend, BackendError, DynBackend, JobState, WorkerProfile};
use clap::Parser;
use manager::cli::GlobalArgs;
use manager::control::Manager;
use manager::metrics::Metrics;
use manager::policy::Shape;
use manager::tiers::cost::CostBook;
use manager::tiers::run::{Tier, Tiers};
use protocol::{ClientConfig, Credentials, RestClient};
use testkit::stub::Served;
use wiremock::MockServer;

/// Refuses every submit while `down`.
struct Switchable {
    inner: FakeBackend,
    down: Arc<AtomicBool>,
}

impl Backend for Switchable {
    fn name(&self) -> &str {
        "switchable"
    }

    async fn submit(&self, spec: &backends::JobSpec) -> Result<String, BackendError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(BackendError::retryable("the batch system refuses jobs"));
        }
        self.inner.submit(spec).await
    }

    async fn list(&self) -> Result<Vec<backends::JobStatus>, BackendError> {
        self.inner.list().await
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        self.inner.cancel(id).await
    }
}

struct Setup {
    _server: MockServer,
    served: Arc<Mutex<Served>>,
    url: String,
    g: GlobalArgs,
    metrics: Arc<Metrics>,
}

impl Setup {
    async fn new(max_workers: &str) -> Setup {
        let (server, served) = testkit::stub::server().await;
        let url = server.uri();
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            global: GlobalArgs,
        }
        let g = Flags::try_parse_from([
            "cl-worker-manager",
            "--server",
            &url,
            "--min-workers",
            "0",
            "--min-seconds-between-workers",
            "0",
            "--max-workers",
            max_workers,
        ])
        .unwrap()
        .global;
        Setup {
            metrics: Arc::new(Metrics::tiers_root()),
            _server: server,
            served,
            url,
            g,
        }
    }

    fn stage(&self, n: usize) {
        let mut s = self.served.lock().unwrap();
        for _ in 0..n {
            let i = s.staged.len();
            s.staged.push((format!("0x{i:032x}"), 1));
        }
    }

    fn client(&self) -> RestClient {
        let mut c = ClientConfig::new(self.url.clone());
        c.max_attempts = 1;
        RestClient::new(
            c,
            Credentials {
                username: "codalab".into(),
                password: "not-a-real-password".into(),
            },
        )
        .unwrap()
    }

    fn tier(&self, name: &str, backend: impl Backend + 'static, cap: usize) -> Tier {
        let mut config =
            manager::app::policy_config(&self.g, Shape::from_flags(1, 0, 1024)).unwrap();
        config.breaker_failure_threshold = 1;
        config.backoff_base_secs = 0.0;
        config.backoff_max_secs = 0.0;
        config.validate().unwrap();
        Tier {
            name: name.into(),
            manager: Manager::new(
                self.client(),
                DynBackend::new(backend),
                WorkerProfile::new(Box::new(|id| format!("/tmp/cl_worker_{id}_work_dir"))),
                config,
                self.g.settings(),
                self.g.staged_keywords("codalab"),
                Arc::new(self.metrics.tier(name)),
            ),
            cap,
            overflow_after: None,
            prices: HashMap::new(),
            budget: None,
        }
    }

    fn tiers(&self, tiers: Vec<Tier>) -> Tiers {
        Tiers::new(
            self.client(),
            self.g.staged_keywords("codalab"),
            self.g.settings(),
            self.g.max_workers as usize,
            tiers,
            CostBook::default(),
            None,
        )
    }
}

async fn live(cluster: &Arc<FakeCluster>) -> usize {
    FakeBackend::new(cluster.clone())
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|j| !matches!(j.state, JobState::Finished { .. }))
        .count()
}

#[tokio::test]
async fn the_first_tier_fills_then_bundles_overflow_after_their_wait() {
    let s = Setup::new("10").await;
    s.stage(3);
    let (campus, cloud) = (FakeCluster::new(), FakeCluster::new());
    let mut first = s.tier("campus", FakeBackend::new(campus.clone()), 1);
    first.overflow_after = Some(1.5);
    let second = s.tier("cloud", FakeBackend::new(cloud.clone()), 10);
    let mut t = s.tiers(vec![first, second]);
    // At once: campus launches its one worker; the other two wait for it.
    let ticks = t.tick(false).await.unwrap();
    assert_eq!((ticks[0].launched, ticks[1].launched), (1, 0), "{ticks:?}");
    assert_eq!(ticks[0].routed.len(), 3);
    t.tick(false).await.unwrap();
    assert_eq!((live(&campus).await, live(&cloud).await), (1, 0));
    // Past overflow-after: the two that campus cannot start go to the cloud. The one campus's
    // pending worker will take stays.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let ticks = t.tick(false).await.unwrap();
    assert_eq!(ticks[1].routed.len(), 2, "{ticks:?}");
    assert_eq!((live(&campus).await, live(&cloud).await), (1, 2));
    // Steady: nothing more anywhere.
    t.tick(false).await.unwrap();
    assert_eq!((live(&campus).await, live(&cloud).await), (1, 2));
}

#[tokio::test]
async fn the_global_cap_holds_over_every_tier() {
    let s = Setup::new("2").await;
    s.stage(5);
    let (campus, cloud) = (FakeCluster::new(), FakeCluster::new());
    let mut first = s.tier("campus", FakeBackend::new(campus.clone()), 1);
    first.overflow_after = Some(0.0);
    let second = s.tier("cloud", FakeBackend::new(cloud.clone()), 10);
    let mut t = s.tiers(vec![first, second]);
    for _ in 0..3 {
        t.tick(false).await.unwrap();
        assert!(live(&campus).await + live(&cloud).await <= 2);
    }
    assert_eq!((live(&campus).await, live(&cloud).await), (1, 1));
}

#[tokio::test]
async fn a_tier_with_its_breaker_open_passes_its_bundles_on_at_once() {
    let s = Setup::new("10").await;
    s.stage(2);
    let (campus, cloud) = (FakeCluster::new(), FakeCluster::new());
    let down = Arc::new(AtomicBool::new(true));
    let mut first = s.tier(
        "campus",
        Switchable {
            inner: FakeBackend::new(campus.clone()),
            down: down.clone(),
        },
        5,
    );
    // No overflow-after: only an unavailable tier lets its bundles go.
    first.overflow_after = None;
    let second = s.tier("cloud", FakeBackend::new(cloud.clone()), 10);
    let mut t = s.tiers(vec![first, second]);
    // The first tick's submits fail and open campus's breaker (threshold 1).
    let ticks = t.tick(false).await.unwrap();
    assert_eq!(ticks[1].launched, 0, "{ticks:?}");
    // The next tick: campus cannot launch, the cloud takes both at once.
    let ticks = t.tick(false).await.unwrap();
    assert!(!ticks[0].can_launch, "{ticks:?}");
    assert_eq!(ticks[1].launched, 2, "{ticks:?}");
    assert_eq!((live(&campus).await, live(&cloud).await), (0, 2));
}

#[tokio::test]
async fn a_spent_budget_stops_a_tiers_launches_and_running_workers_cost() {
    let s = Setup::new("10").await;
    s.stage(1);
    let cloud = FakeCluster::new();
    let mut only = s.tier("cloud", FakeBackend::new(cloud.clone()), 10);
    only.prices = HashMap::from([("default".to_string(), 3600.0)]);
    only.budget = Some(1.0);
    let mut t = s.tiers(vec![only]);
    assert_eq!(t.tick(false).await.unwrap()[0].launched, 1);
    // The worker runs: a second of it costs 1.0, the whole budget.
    let id = FakeBackend::new(cloud.clone()).list().await.unwrap()[0]
        .id
        .clone();
    cloud.set_state(&id, JobState::Running);
    t.tick(false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    t.tick(false).await.unwrap();
    assert!(t.costs.month_cost("cloud") >= 1.0, "{:?}", t.costs);
    // Spent: a new bundle launches nothing, and the log says why.
    s.stage(1);
    let ticks = t.tick(false).await.unwrap();
    assert!(!ticks[0].can_launch);
    assert_eq!(ticks[0].launched, 0);
    assert_eq!(live(&cloud).await, 1);
    assert!(t.tiers[0]
        .manager
        .journal
        .decisions()
        .iter()
        .any(|d| d.text.contains("budget")));
}
