//! What the backend's listings said between ticks (`JobBook`): checked-in workers, this
//! manager's cancels, failed jobs, and when each job was submitted or first listed.

use std::collections::{HashMap, HashSet};

use backends::{JobState, JobStatus};
use common::now_unix as now;

use crate::policy::{Job, Resources};

/// The bookkeeping of the backend's listings between ticks: which jobs have a checked-in
/// worker, which this manager cancelled, how many failed.
#[derive(Debug, Default)]
pub struct JobBook {
    /// Worker jobs that ended in failure so far.
    pub failed_jobs: u32,
    /// Jobs whose worker has checked in (seen in `/rest/workers/info`).
    checked_in: HashSet<String>,
    /// Jobs this manager cancelled: their end is no failure.
    cancelled: HashSet<String>,
    /// When each listed job was submitted by this manager or, adopted, first listed (unix
    /// time): the jobs' `submitted_at` for the policy (the newest pending job is cancelled
    /// first; a bundle waiting for a pending job waits since the oldest one's).
    first_seen: HashMap<String, f64>,
}

/// What one listing means for the policy.
#[derive(Debug, Default)]
pub struct Absorbed {
    /// The live jobs, as the policy sees them.
    pub jobs: Vec<Job>,
    /// Shapes of the jobs that ended unsuccessfully before their worker checked in, with the
    /// reason when the backend knows it.
    pub lost: Vec<(String, Option<String>)>,
    /// The same for jobs whose worker had checked in and that this manager did not cancel:
    /// reclaimed, preempted, deleted, lost with their node.
    pub interrupted: Vec<(String, Option<String>)>,
    /// Whether a worker checked in for the first time.
    pub checked_in: bool,
}

impl JobBook {
    /// Takes one listing and the free capacity of the checked-in workers (by server worker id).
    pub fn absorb(
        &mut self,
        listed: Vec<JobStatus>,
        free: &HashMap<String, Resources>,
    ) -> Absorbed {
        let mut out = Absorbed::default();
        let ids: HashSet<String> = listed.iter().map(|j| j.id.clone()).collect();
        for j in listed {
            let server_id = format!("host-{}", j.worker_id);
            let at = *self.first_seen.entry(j.id.clone()).or_insert_with(now);
            match j.state {
                JobState::Finished { success } => {
                    let seen = self.checked_in.remove(&j.id);
                    let ours = self.cancelled.remove(&j.id);
                    let early = !success && !seen && !ours;
                    let why = j
                        .detail
                        .as_deref()
                        .map(|d| format!(" ({d})"))
                        .unwrap_or_default();
                    tracing::info!(
                        "job {} (worker {server_id}) ended{}{why}",
                        j.id,
                        match (success, early) {
                            (true, _) => "",
                            (false, true) => " unsuccessfully before its worker checked in",
                            (false, false) => " unsuccessfully",
                        }
                    );
                    if !success {
                        self.failed_jobs += 1;
                    }
                    if early {
                        out.lost.push((j.shape_name, j.detail));
                    } else if seen && !ours && (!success || taken_away(j.detail.as_deref())) {
                        out.interrupted.push((j.shape_name, j.detail));
                    }
                }
                JobState::Pending => {
                    out.jobs
                        .push(Job::pending(j.id, j.shape_name).submitted_at(at));
                }
                // A worker that has not checked in yet is as good as pending: it will take
                // bundles but has not said so.
                // A worker that has checked in once leaves only by its own idle exit: missing
                // from one worker list (the server's list lags), it is still running, with no
                // free room known.
                JobState::Running => out.jobs.push(
                    match free.get(&server_id) {
                        Some(f) => {
                            out.checked_in |= self.checked_in.insert(j.id.clone());
                            Job::active(j.id, j.shape_name).with_free(*f)
                        }
                        None if self.checked_in.contains(&j.id) => Job::active(j.id, j.shape_name),
                        None => Job::pending(j.id, j.shape_name),
                    }
                    .submitted_at(at),
                ),
            }
        }
        // Jobs the backend no longer lists are forgotten.
        self.checked_in.retain(|id| ids.contains(id));
        self.cancelled.retain(|id| ids.contains(id));
        self.first_seen.retain(|id, _| ids.contains(id));
        out
    }

    /// Job `id` was submitted by this manager at `at` (unix time).
    pub fn submitted(&mut self, id: &str, at: f64) {
        self.first_seen.insert(id.to_owned(), at);
    }

    /// Job `id` was cancelled by this manager: its end is no failure.
    pub fn cancelled(&mut self, id: &str) {
        self.cancelled.insert(id.to_owned());
    }
}

/// Whether a job that ended as expected (its worker is gone, nothing failed) was taken away
/// from its worker rather than left by it: Slurm's `PREEMPTED`, `CANCELLED by <uid>` (not by
/// this manager, whose cancels are known), `TIMEOUT` (the time limit, or a preemption with a
/// grace time, which Slurm 22.05 records so) and `DEADLINE`.
fn taken_away(detail: Option<&str>) -> bool {
    let word = detail.and_then(|d| d.split_whitespace().next());
    matches!(
        word,
        Some("PREEMPTED" | "CANCELLED" | "TIMEOUT" | "DEADLINE")
    )
}
