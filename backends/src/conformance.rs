//! The behaviour every backend must have, as one suite generic over [`Backend`]: it runs against
//! [`FakeBackend`](crate::fake::FakeBackend) in unit tests and against the real backends (local
//! processes, Slurm, AWS Batch on moto, the Kubernetes and Azure Batch stand-ins) in the
//! end-to-end tests.
//!
//! 1. a submitted job is listed, pending or running, under its worker id and shape;
//! 2. a fresh backend instance on the same state (a restarted manager) adopts it;
//! 3. after `cancel`, it is reported finished exactly once, then no more;
//! 4. cancelling an unknown job is not an error;
//! 5. a job the backend cannot run is refused with a permanent error (where it checks jobs).
//!
//! Failures panic with what was observed, as test assertions do.

use std::time::{Duration, Instant};

use crate::{Backend, JobSpec, JobState, JobStatus};

/// What the suite submits and expects of one backend.
#[derive(Debug, Clone)]
pub struct Case {
    /// A job the backend runs until cancelled.
    pub job: JobSpec,
    /// A job the backend must refuse permanently (invalid worker id, empty command, …), when
    /// the backend checks jobs before submitting them.
    pub refused: Option<JobSpec>,
    /// A job id of the backend's form that names no job.
    pub unknown_id: String,
    /// Longest wait for a state change.
    pub timeout: Duration,
    /// Time between two listings while waiting.
    pub poll: Duration,
}

/// Runs the whole suite; `fresh` builds a new backend instance on the same state every call.
pub async fn run<B: Backend>(fresh: impl AsyncFn() -> B, case: &Case) {
    let first = fresh().await;
    let id = submit_is_listed(&first, case).await;
    let adopter = fresh().await;
    adopted_after_restart(&adopter, &id, case).await;
    cancel_finishes_once(&adopter, &id, case).await;
    unknown_cancel_is_ok(&adopter, case).await;
    if let Some(refused) = &case.refused {
        refusal_is_permanent(&adopter, refused).await;
    }
}

fn find<'a>(listed: &'a [JobStatus], id: &str) -> Vec<&'a JobStatus> {
    listed.iter().filter(|j| j.id == id).collect()
}

async fn list<B: Backend>(backend: &B) -> Vec<JobStatus> {
    backend
        .list()
        .await
        .unwrap_or_else(|e| panic!("{}: list failed: {e}", backend.name()))
}

/// Lists until job `id` is listed (never twice in one listing) and `done` holds for it.
async fn wait_for<B: Backend>(
    backend: &B,
    id: &str,
    case: &Case,
    what: &str,
    done: impl Fn(&JobStatus) -> bool,
) -> JobStatus {
    let t0 = Instant::now();
    loop {
        let listed = list(backend).await;
        let found = find(&listed, id);
        assert!(found.len() <= 1, "job {id} listed twice: {listed:?}");
        if let Some(j) = found.first().filter(|j| done(j)) {
            return (*j).clone();
        }
        assert!(
            t0.elapsed() < case.timeout,
            "{}: job {id} {what}: {listed:?}",
            backend.name()
        );
        tokio::time::sleep(case.poll).await;
    }
}

/// Lists until job `id` appears, which must be live; returns it.
async fn wait_live<B: Backend>(backend: &B, id: &str, case: &Case) -> JobStatus {
    let job = wait_for(backend, id, case, "is not listed", |_| true).await;
    assert!(
        matches!(job.state, JobState::Pending | JobState::Running),
        "{}: job {id} should be live: {job:?}",
        backend.name()
    );
    job
}

/// 1. `submit`, then `list` sees the job (pending or running) as submitted.
pub async fn submit_is_listed<B: Backend>(backend: &B, case: &Case) -> String {
    let id = backend
        .submit(&case.job)
        .await
        .unwrap_or_else(|e| panic!("{}: submit failed: {e}", backend.name()));
    assert!(!id.is_empty(), "{}: empty job id", backend.name());
    let job = wait_live(backend, &id, case).await;
    assert_eq!(job.worker_id, case.job.worker_id);
    assert_eq!(job.shape_name, case.job.shape_name);
    id
}

/// 2. A backend instance that never saw the submission lists the job as its own.
pub async fn adopted_after_restart<B: Backend>(fresh: &B, id: &str, case: &Case) {
    let job = wait_live(fresh, id, case).await;
    assert_eq!(job.worker_id, case.job.worker_id);
    assert_eq!(job.shape_name, case.job.shape_name);
}

/// 3. `cancel`, then the job is reported finished exactly once and never again.
pub async fn cancel_finishes_once<B: Backend>(backend: &B, id: &str, case: &Case) {
    backend
        .cancel(id)
        .await
        .unwrap_or_else(|e| panic!("{}: cancel {id} failed: {e}", backend.name()));
    let ended = wait_for(backend, id, case, "never finished after cancel", |j| {
        matches!(j.state, JobState::Finished { .. })
    })
    .await;
    assert_eq!(ended.worker_id, case.job.worker_id);
    for _ in 0..3 {
        tokio::time::sleep(case.poll).await;
        let listed = list(backend).await;
        assert!(
            find(&listed, id).is_empty(),
            "{}: job {id} reported again after its end: {listed:?}",
            backend.name()
        );
    }
}

/// 4. Cancelling a job that does not exist succeeds.
pub async fn unknown_cancel_is_ok<B: Backend>(backend: &B, case: &Case) {
    if let Err(e) = backend.cancel(&case.unknown_id).await {
        panic!(
            "{}: cancelling unknown job {} failed: {e}",
            backend.name(),
            case.unknown_id
        );
    }
}

/// 5. A job the backend cannot run is refused, and retrying would not help.
pub async fn refusal_is_permanent<B: Backend>(backend: &B, refused: &JobSpec) {
    match backend.submit(refused).await {
        Ok(id) => panic!("{}: accepted {refused:?} as job {id}", backend.name()),
        Err(e) => assert!(
            !e.is_retryable(),
            "{}: refusal should be permanent: {e}",
            backend.name()
        ),
    }
}
