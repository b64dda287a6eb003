//! The bookkeeping every backend needs between two listings: which jobs this manager knows,
//! which of them ended or vanished, and that each end is reported exactly once.
//!
//! A backend lists its jobs in one call and hands the snapshot to [`Ledger::observe`]:
//! - a live job (pending or running) becomes known (a restarted manager adopts it this way);
//! - an ended job is reported once, although the backend may keep listing it for a while
//!   (Slurm until `MinJobAge`);
//! - a known job missing from the snapshot has *vanished*: the backend may look up how it ended
//!   (Slurm's `sacct`, AWS's `DescribeJobs`) and [`Observed::resolve`] reports it once as
//!   finished — unsuccessfully when its end is unknown.

use std::collections::{HashMap, HashSet};

use crate::{JobState, JobStatus};

/// A job this manager knows, until its end was reported.
#[derive(Debug, Clone)]
struct Known {
    worker_id: String,
    shape_name: String,
}

/// The jobs of one backend instance between listings.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Live jobs (submitted or listed), by backend id.
    known: HashMap<String, Known>,
    /// Ended jobs already reported that the backend still lists.
    ended: HashSet<String>,
}

impl Ledger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a job this manager just submitted.
    pub fn submitted(&mut self, id: &str, worker_id: &str, shape_name: &str) {
        self.known.insert(
            id.to_string(),
            Known {
                worker_id: worker_id.to_string(),
                shape_name: shape_name.to_string(),
            },
        );
    }

    /// Whether job `id` is known (submitted or listed live, end not reported yet).
    pub fn is_known(&self, id: &str) -> bool {
        self.known.contains_key(id)
    }

    /// Takes a fresh, complete listing of this manager's jobs. Returns the listed jobs to report
    /// (ended ones only the first time; an empty shape name is filled in from what is known)
    /// and the known jobs the listing no longer has.
    pub fn observe(&mut self, listing: Vec<JobStatus>) -> Observed {
        let mut statuses = Vec::with_capacity(listing.len());
        let mut seen = HashSet::with_capacity(listing.len());
        for mut job in listing {
            seen.insert(job.id.clone());
            if job.shape_name.is_empty() {
                if let Some(k) = self.known.get(&job.id) {
                    job.shape_name = k.shape_name.clone();
                }
            }
            match job.state {
                JobState::Finished { .. } => {
                    self.known.remove(&job.id);
                    if !self.ended.insert(job.id.clone()) {
                        continue;
                    }
                }
                JobState::Pending | JobState::Running => {
                    self.submitted(&job.id, &job.worker_id, &job.shape_name);
                }
            }
            statuses.push(job);
        }
        self.ended.retain(|id| seen.contains(id));
        let mut vanished: Vec<JobStatus> = Vec::new();
        self.known.retain(|id, k| {
            if seen.contains(id) {
                return true;
            }
            vanished.push(JobStatus {
                id: id.clone(),
                worker_id: k.worker_id.clone(),
                shape_name: k.shape_name.clone(),
                state: JobState::Finished { success: false },
                detail: None,
            });
            false
        });
        vanished.sort_by(|a, b| a.id.cmp(&b.id));
        Observed { statuses, vanished }
    }
}

/// The outcome of [`Ledger::observe`]: what to report, and the vanished jobs still to resolve.
#[derive(Debug)]
#[must_use = "the vanished jobs are reported by `resolve`"]
pub struct Observed {
    statuses: Vec<JobStatus>,
    vanished: Vec<JobStatus>,
}

impl Observed {
    /// Ids of the known jobs missing from the listing (sorted).
    pub fn vanished_ids(&self) -> Vec<String> {
        self.vanished.iter().map(|j| j.id.clone()).collect()
    }

    /// The jobs to report: the listed ones, then every vanished one as finished with the end
    /// `end_of` gives it. An end that is not [`JobState::Finished`] (still live per the backend
    /// but missing from its listing: lost) or unknown is an unsuccessful finish.
    pub fn resolve(self, mut end_of: impl FnMut(&str) -> Option<JobState>) -> Vec<JobStatus> {
        let mut out = self.statuses;
        for mut job in self.vanished {
            if let Some(end @ JobState::Finished { .. }) = end_of(&job.id) {
                job.state = end;
            }
            out.push(job);
        }
        out
    }

    /// The listed jobs only: for a backend whose vanished jobs were reported elsewhere (a
    /// local job record removed by another manager on the same directory).
    pub fn forget_vanished(self) -> Vec<JobStatus> {
        self.statuses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, shape: &str, state: JobState) -> JobStatus {
        JobStatus {
            id: id.into(),
            worker_id: format!("w{id}"),
            shape_name: shape.into(),
            state,
            detail: None,
        }
    }

    const DONE: JobState = JobState::Finished { success: true };
    const FAILED: JobState = JobState::Finished { success: false };

    #[test]
    fn ended_jobs_are_reported_once_while_listed() {
        let mut l = Ledger::new();
        l.submitted("1", "w1", "gpu");
        let first = l.observe(vec![job("1", "", JobState::Running)]);
        assert!(first.vanished_ids().is_empty());
        assert_eq!(first.resolve(|_| None)[0].shape_name, "gpu");
        let ended = l.observe(vec![job("1", "", DONE)]).resolve(|_| None);
        assert_eq!(ended, [job("1", "gpu", DONE)]);
        // Still listed: not again; then gone from the listing: nothing vanishes.
        assert!(l
            .observe(vec![job("1", "", DONE)])
            .resolve(|_| None)
            .is_empty());
        let gone = l.observe(vec![]);
        assert!(gone.vanished_ids().is_empty());
        assert!(gone.resolve(|_| None).is_empty());
        // Listed again after it left (a stale listing): one more report would be wrong only if
        // the ledger still remembered it; it does not, as the backend no longer listed it.
        assert!(!l.is_known("1"));
    }

    #[test]
    fn vanished_jobs_are_resolved_once() {
        let mut l = Ledger::new();
        l.submitted("1", "w1", "a");
        l.submitted("2", "w2", "b");
        l.submitted("3", "w3", "c");
        let o = l.observe(vec![job("3", "c", JobState::Pending)]);
        assert_eq!(o.vanished_ids(), ["1", "2"]);
        let out = o.resolve(|id| match id {
            "1" => Some(DONE),
            // Still running per the backend's records but not listed: lost.
            _ => Some(JobState::Running),
        });
        assert_eq!(
            out,
            [
                job("3", "c", JobState::Pending),
                job("1", "a", DONE),
                job("2", "b", FAILED)
            ]
        );
        let again = l.observe(vec![job("3", "c", JobState::Pending)]);
        assert!(again.vanished_ids().is_empty());
        let o = l.observe(vec![]);
        assert_eq!(o.vanished_ids(), ["3"]);
        assert!(o.forget_vanished().is_empty());
        assert!(!l.is_known("3"));
    }

    #[test]
    fn listed_jobs_are_adopted() {
        let mut l = Ledger::new();
        let o = l.observe(vec![job("7", "gpu", JobState::Running)]);
        assert_eq!(o.resolve(|_| None).len(), 1);
        assert!(l.is_known("7"));
        let o = l.observe(vec![]);
        assert_eq!(o.resolve(|_| None), [job("7", "gpu", FAILED)]);
    }
}
