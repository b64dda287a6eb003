//! A backend that keeps its jobs in memory: a [`FakeCluster`] plays the batch system (its jobs
//! change state when a test says so, ended jobs stay listed until purged, purged ones keep their
//! end in a history as accounting would) and a [`FakeBackend`] is one manager's view of it.
//! The [`conformance`](crate::conformance) suite runs against it in unit tests.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Backend, BackendError, JobSpec, JobState, JobStatus, Ledger};

#[derive(Debug, Clone)]
struct FakeJob {
    worker_id: String,
    shape_name: String,
    command: Vec<String>,
    state: JobState,
}

#[derive(Debug, Default)]
struct ClusterState {
    next_id: u64,
    jobs: BTreeMap<String, FakeJob>,
    /// Ends of purged jobs (the batch system's accounting).
    history: HashMap<String, JobState>,
    /// Errors the next calls return, in order.
    failures: VecDeque<BackendError>,
}

/// The batch system behind [`FakeBackend`]s: several backends built on one cluster see the
/// same jobs, as a restarted manager does.
#[derive(Debug, Default)]
pub struct FakeCluster {
    state: Mutex<ClusterState>,
}

impl FakeCluster {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn lock(&self) -> MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves job `id` to `state` (the batch system started or ended it).
    pub fn set_state(&self, id: &str, state: JobState) {
        if let Some(job) = self.lock().jobs.get_mut(id) {
            job.state = state;
        }
    }

    /// Job `id` leaves the listing; its end stays in the history when it had ended.
    pub fn purge(&self, id: &str) {
        let mut s = self.lock();
        if let Some(job) = s.jobs.remove(id) {
            if matches!(job.state, JobState::Finished { .. }) {
                s.history.insert(id.to_string(), job.state);
            }
        }
    }

    /// The worker command of each listed job, by job id.
    pub fn commands(&self) -> BTreeMap<String, Vec<String>> {
        self.lock()
            .jobs
            .iter()
            .map(|(id, j)| (id.clone(), j.command.clone()))
            .collect()
    }

    /// The next call of any backend on this cluster fails with `error`.
    pub fn fail_next(&self, error: BackendError) {
        self.lock().failures.push_back(error);
    }

    fn take_failure(&self) -> Result<(), BackendError> {
        self.lock().failures.pop_front().map_or(Ok(()), Err)
    }
}

/// One manager's backend on a [`FakeCluster`].
#[derive(Debug)]
pub struct FakeBackend {
    cluster: Arc<FakeCluster>,
    ledger: tokio::sync::Mutex<Ledger>,
}

impl FakeBackend {
    pub fn new(cluster: Arc<FakeCluster>) -> Self {
        Self {
            cluster,
            ledger: tokio::sync::Mutex::default(),
        }
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &str {
        "fake"
    }

    async fn submit(&self, spec: &JobSpec) -> Result<String, BackendError> {
        self.cluster.take_failure()?;
        if spec.worker_id.is_empty() || spec.command.is_empty() {
            return Err(BackendError::permanent(
                "a job needs a worker id and a command",
            ));
        }
        let id = {
            let mut s = self.cluster.lock();
            s.next_id += 1;
            let id = format!("fake-{}", s.next_id);
            s.jobs.insert(
                id.clone(),
                FakeJob {
                    worker_id: spec.worker_id.clone(),
                    shape_name: spec.shape_name.clone(),
                    command: spec.command.clone(),
                    state: JobState::Pending,
                },
            );
            id
        };
        self.ledger
            .lock()
            .await
            .submitted(&id, &spec.worker_id, &spec.shape_name);
        Ok(id)
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        self.cluster.take_failure()?;
        let (listing, history) = {
            let s = self.cluster.lock();
            let listing: Vec<JobStatus> = s
                .jobs
                .iter()
                .map(|(id, j)| JobStatus {
                    id: id.clone(),
                    worker_id: j.worker_id.clone(),
                    shape_name: j.shape_name.clone(),
                    state: j.state,
                    detail: None,
                })
                .collect();
            (listing, s.history.clone())
        };
        let observed = self.ledger.lock().await.observe(listing);
        Ok(observed.resolve(|id| history.get(id).copied()))
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        self.cluster.take_failure()?;
        if let Some(job) = self.cluster.lock().jobs.get_mut(id) {
            if !matches!(job.state, JobState::Finished { .. }) {
                job.state = JobState::Finished { success: true };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::conformance::{self, Case};
    use crate::Resources;

    fn spec(worker_id: &str) -> JobSpec {
        JobSpec {
            worker_id: worker_id.into(),
            shape_name: "small".into(),
            resources: Resources::new(1, 0, 1 << 30),
            command: vec!["cl-worker".into()],
            env: Vec::new(),
        }
    }

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        let cluster = FakeCluster::new();
        let case = Case {
            job: spec("w1"),
            refused: Some(spec("")),
            unknown_id: "fake-999".into(),
            timeout: Duration::from_secs(5),
            poll: Duration::from_millis(10),
        };
        conformance::run(async || FakeBackend::new(cluster.clone()), &case).await;
    }

    #[tokio::test]
    async fn ended_and_purged_jobs_are_reported_once_with_their_end() {
        let cluster = FakeCluster::new();
        let b = FakeBackend::new(cluster.clone());
        let a = b.submit(&spec("a")).await.unwrap();
        let c = b.submit(&spec("c")).await.unwrap();
        cluster.set_state(&a, JobState::Running);
        let listed = b.list().await.unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].state, JobState::Running);
        // `c` fails and is purged before the next listing: accounting has its end.
        cluster.set_state(&c, JobState::Finished { success: false });
        cluster.purge(&c);
        // `a` is lost without a trace: an unsuccessful end.
        cluster.purge(&a);
        let listed = b.list().await.unwrap();
        let ends: Vec<(&str, JobState)> = listed.iter().map(|j| (j.id.as_str(), j.state)).collect();
        assert_eq!(
            ends,
            [
                (a.as_str(), JobState::Finished { success: false }),
                (c.as_str(), JobState::Finished { success: false })
            ]
        );
        assert!(b.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn injected_errors_keep_their_kind() {
        let cluster = FakeCluster::new();
        let b = FakeBackend::new(cluster.clone());
        cluster.fail_next(BackendError::retryable("throttled"));
        let e = b.submit(&spec("a")).await.unwrap_err();
        assert!(e.is_retryable());
        assert_eq!(e.to_string(), "throttled");
        cluster.fail_next(BackendError::permanent("no such queue"));
        assert!(!b.list().await.unwrap_err().is_retryable());
        assert!(b.list().await.unwrap().is_empty());
    }
}
