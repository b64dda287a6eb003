//! The manager's control loop in-process: `Manager<FakeBackend>` ticks against a CodaLab
//! server stand-in (wiremock answering login, the staged-bundle search and the worker list with
//! the real server's wire format). What the loop does with each tick's plan: launches reach the
//! backend, `--max-workers` caps pending jobs, unneeded pending jobs are cancelled after the
//! grace, a new manager adopts the jobs it finds instead of launching again, failed submits open
//! the breaker, and an unreadable server launches and cancels nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backends::fake::{FakeBackend, FakeCluster};
use backends::{Backend, BackendError, JobState, WorkerProfile};
use clap::Parser;
use manager::cli::GlobalArgs;
use manager::control::Manager;
use manager::metrics::Metrics;
use manager::policy::{BreakerState, Shape};
use protocol::{ClientConfig, Credentials, RestClient};
use testkit::stub::Served;
use wiremock::MockServer;

struct Loop {
    _server: MockServer,
    served: Arc<Mutex<Served>>,
    cluster: Arc<FakeCluster>,
    url: String,
}

impl Loop {
    async fn start() -> Loop {
        let (server, served) = testkit::stub::server().await;
        Loop {
            url: server.uri(),
            _server: server,
            served,
            cluster: FakeCluster::new(),
        }
    }

    fn stage(&self, n: usize) {
        let mut s = self.served.lock().unwrap();
        for _ in 0..n {
            let i = s.staged.len();
            s.staged.push((format!("0x{i:032x}"), 1));
        }
    }

    /// A manager on this loop's cluster, built from these global flags as the binary builds it
    /// (`app::policy_config`, `GlobalArgs::settings`, `GlobalArgs::staged_keywords`).
    fn manager(&self, flags: &[&str]) -> Manager<FakeBackend> {
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            global: GlobalArgs,
        }
        let mut argv = vec!["cl-worker-manager", "--server", &self.url];
        argv.extend_from_slice(flags);
        let g = Flags::try_parse_from(argv).expect("flags").global;
        let config = manager::app::policy_config(&g, Shape::from_flags(1, 0, 1024)).unwrap();
        config.validate().unwrap();
        // One attempt per call: the server's outage shows at once instead of after retries.
        let mut client_config = ClientConfig::new(self.url.clone());
        client_config.max_attempts = 1;
        let client = RestClient::new(
            client_config,
            Credentials {
                username: "codalab".into(),
                password: "not-a-real-password".into(),
            },
        )
        .unwrap();
        Manager::new(
            client,
            FakeBackend::new(self.cluster.clone()),
            WorkerProfile::new(Box::new(|id| format!("/tmp/cl_worker_{id}_work_dir"))),
            config,
            g.settings(),
            g.staged_keywords("codalab"),
            Arc::new(Metrics::new()),
        )
    }

    /// The jobs the batch system lists that have not ended.
    async fn live_jobs(&self) -> Vec<(String, JobState)> {
        FakeBackend::new(self.cluster.clone())
            .list()
            .await
            .unwrap()
            .into_iter()
            .filter(|j| !matches!(j.state, JobState::Finished { .. }))
            .map(|j| (j.id, j.state))
            .collect()
    }
}

/// No floor of workers and no spacing between launch rounds, then `--max-workers N`.
fn flags(max_workers: &str) -> [&str; 6] {
    [
        "--min-workers",
        "0",
        "--min-seconds-between-workers",
        "0",
        "--max-workers",
        max_workers,
    ]
}

#[tokio::test]
async fn staged_bundles_launch_workers_up_to_max_workers_and_pending_ones_count() {
    let l = Loop::start().await;
    l.stage(3);
    let mut m = l.manager(&flags("2"));
    let plan = m.tick(false).await.expect("the server was readable");
    assert_eq!(plan.staged_total(), 3);
    let jobs = l.live_jobs().await;
    assert_eq!(jobs.len(), 2, "capped by --max-workers: {jobs:?}");
    assert!(jobs.iter().all(|(_, s)| *s == JobState::Pending));
    // The pending jobs count toward --max-workers: the next ticks launch nothing more.
    for _ in 0..2 {
        m.tick(false).await.unwrap();
    }
    assert_eq!(l.live_jobs().await.len(), 2);
    // One starts and one more bundle is staged: still no room under the cap.
    let first = jobs[0].0.clone();
    l.cluster.set_state(&first, JobState::Running);
    l.stage(1);
    m.tick(false).await.unwrap();
    assert_eq!(l.live_jobs().await.len(), 2);
}

#[tokio::test]
async fn pending_jobs_no_longer_needed_are_cancelled_after_the_grace_only() {
    let l = Loop::start().await;
    l.stage(2);
    let mut m = l.manager(&flags("4"));
    m.config.cancel_grace_secs = 1.0;
    m.tick(false).await.unwrap();
    assert_eq!(l.live_jobs().await.len(), 2);
    // The bundles went to other workers: one tick alone cancels nothing.
    l.served.lock().unwrap().staged.clear();
    m.tick(false).await.unwrap();
    assert_eq!(l.live_jobs().await.len(), 2, "cancelled before the grace");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    m.tick(false).await.unwrap();
    m.tick(false).await.unwrap();
    assert_eq!(
        l.live_jobs().await,
        Vec::new(),
        "unneeded for two ticks and the grace: cancelled"
    );
}

#[tokio::test]
async fn a_new_manager_adopts_the_jobs_it_finds_instead_of_launching_again() {
    let l = Loop::start().await;
    l.stage(2);
    let mut first = l.manager(&flags("5"));
    first.tick(false).await.unwrap();
    let before = l.live_jobs().await;
    assert_eq!(before.len(), 2);
    drop(first);
    // A restarted manager (a new backend on the same batch system) sees them as its own.
    let mut second = l.manager(&flags("5"));
    let plan = second.tick(false).await.unwrap();
    assert_eq!(plan.total_jobs, Some(2), "{:?}", plan.reasons);
    assert_eq!(
        l.live_jobs().await,
        before,
        "launched again: {:?}",
        plan.reasons
    );
}

/// A backend whose submits fail while `down` is set; listing and cancelling work.
struct SubmitsFail {
    inner: FakeBackend,
    down: Arc<std::sync::atomic::AtomicBool>,
    attempts: Arc<std::sync::atomic::AtomicUsize>,
}

impl Backend for SubmitsFail {
    fn name(&self) -> &str {
        "submits-fail"
    }

    async fn submit(&self, spec: &backends::JobSpec) -> Result<String, BackendError> {
        use std::sync::atomic::Ordering;
        self.attempts.fetch_add(1, Ordering::SeqCst);
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

#[tokio::test]
async fn failed_submits_open_the_breaker_and_stop_launching() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let l = Loop::start().await;
    l.stage(3);
    let fake = l.manager(&flags("3"));
    let down = Arc::new(AtomicBool::new(true));
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut config = fake.config.clone();
    config.breaker_failure_threshold = 2;
    config.backoff_base_secs = 0.0;
    config.backoff_max_secs = 0.0;
    let mut m = Manager::new(
        fake.client.clone(),
        SubmitsFail {
            inner: FakeBackend::new(l.cluster.clone()),
            down: down.clone(),
            attempts: attempts.clone(),
        },
        WorkerProfile::new(Box::new(|id| format!("/tmp/cl_worker_{id}_work_dir"))),
        config,
        fake.settings.clone(),
        fake.keywords.clone(),
        Arc::new(Metrics::new()),
    );
    let mut breaker = BreakerState::Closed;
    for _ in 0..4 {
        breaker = m.tick(false).await.unwrap().breaker;
        if matches!(breaker, BreakerState::Open { .. }) {
            break;
        }
    }
    assert!(
        matches!(breaker, BreakerState::Open { .. }),
        "the breaker stayed {breaker:?} after {} failed submits",
        attempts.load(Ordering::SeqCst)
    );
    // Open: the batch system takes jobs again, yet none is submitted before the cool-down.
    down.store(false, Ordering::SeqCst);
    let tried = attempts.load(Ordering::SeqCst);
    for _ in 0..2 {
        let plan = m.tick(false).await.unwrap();
        assert!(matches!(plan.breaker, BreakerState::Open { .. }));
    }
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        tried,
        "submitted while open"
    );
    assert_eq!(l.live_jobs().await.len(), 0);
}

#[tokio::test]
async fn an_unreadable_server_launches_and_cancels_nothing() {
    let l = Loop::start().await;
    l.stage(2);
    let mut m = l.manager(&flags("4"));
    m.config.cancel_grace_secs = 0.0;
    m.tick(false).await.unwrap();
    assert_eq!(l.live_jobs().await.len(), 2);
    {
        let mut s = l.served.lock().unwrap();
        s.staged.clear();
        s.down = true;
    }
    for _ in 0..3 {
        assert!(m.tick(false).await.is_none(), "a plan without the server");
    }
    // An unknown queue is not an empty one: the pending jobs stay.
    assert_eq!(l.live_jobs().await.len(), 2);
}

/// Workers start warm: each worker launched for staged bundles is told, in its command line,
/// the images and dependencies of the bundles it would hold (as the bundle search gives them),
/// a bundle only once; `--no-worker-prefetch` tells none.
#[tokio::test]
async fn launched_workers_are_told_what_their_bundles_need() {
    let l = Loop::start().await;
    l.stage(3);
    {
        let mut s = l.served.lock().unwrap();
        let dep = format!("0x{:032x}", 0xd);
        for i in 0..3 {
            let uuid = s.staged[i].0.clone();
            s.needs.insert(
                uuid,
                (format!("img:{i}"), vec![(dep.clone(), format!("sub/{i}"))]),
            );
        }
    }
    let mut m = l.manager(&flags("3"));
    m.tick(false).await.expect("the server was readable");
    let commands = l.cluster.commands();
    assert_eq!(commands.len(), 3, "{commands:?}");
    let mut told: Vec<String> = commands
        .values()
        .map(|c| {
            let i = c
                .iter()
                .position(|a| a == "--prefetch-image")
                .expect("an image");
            let d = c
                .iter()
                .position(|a| a == "--prefetch-dependency")
                .expect("a dependency");
            format!("{} {}", c[i + 1], c[d + 1])
        })
        .collect();
    told.sort();
    let dep = format!("0x{:032x}", 0xd);
    assert_eq!(
        told,
        (0..3)
            .map(|i| format!("img:{i} {dep}:sub/{i}"))
            .collect::<Vec<_>>()
    );
    // Switched off: plain commands.
    let l = Loop::start().await;
    l.stage(1);
    l.served.lock().unwrap().needs.insert(
        format!("0x{:032x}", 0),
        ("img".into(), vec![(dep.clone(), String::new())]),
    );
    let mut flags_off = flags("1").to_vec();
    flags_off.push("--no-worker-prefetch");
    let mut m = l.manager(&flags_off);
    m.tick(false).await.unwrap();
    let commands = l.cluster.commands();
    assert_eq!(commands.len(), 1);
    assert!(
        commands
            .values()
            .all(|c| !c.iter().any(|a| a.starts_with("--prefetch"))),
        "{commands:?}"
    );
}
