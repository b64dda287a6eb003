//! What the server's worker list (`/rest/workers/info`) tells the loop: the free capacity of
//! the checked-in workers and the runs they already hold.

use std::collections::{HashMap, HashSet};

use backends::{JobState, JobStatus};
use protocol::RestClient;
use serde_json::Value;

use crate::policy::{Resources, StagedBundle};

/// Free resources of checked-in workers (`/rest/workers/info`), by worker id. A worker with
/// runs is credited with what its runs did not request (memory in proportion to free CPUs: the
/// server does not report memory in use).
pub fn free_by_worker(info: &Value) -> HashMap<String, Resources> {
    let mut out = HashMap::new();
    for w in info
        .get("data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let id = w
            .get("worker_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let n = |k: &str| w.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (cpus, gpus, mem) = (n("cpus"), n("gpus"), n("memory_bytes"));
        let free_cpus = cpus.saturating_sub(n("cpus_in_use"));
        let free_gpus = gpus.saturating_sub(n("gpus_in_use"));
        let free_mem = mem.checked_div(cpus).unwrap_or(0) * free_cpus;
        // A worker takes no run once terminating, and at most its remaining
        // `exit_after_num_runs` more: every bundle asks for at least one CPU, so its free CPUs
        // are capped at that number (a worker of 8 free CPUs with one run left covers one
        // bundle, not eight).
        let runs_left = if w.get("is_terminating").and_then(Value::as_bool) == Some(true) {
            0
        } else {
            w.get("exit_after_num_runs")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX)
        };
        let free_cpus = free_cpus.min(runs_left);
        out.insert(
            id,
            Resources::new(free_cpus as u32, free_gpus as u32, free_mem),
        );
    }
    out
}

/// What the server's worker list said this tick: the free capacity of the checked-in workers
/// (by server worker id) and the runs they hold.
#[derive(Debug, Default)]
pub struct WorkersSeen {
    pub free: HashMap<String, Resources>,
    /// Runs the workers hold (`run_uuids`). The staged bundles are read before the worker
    /// list, so a bundle the server handed to a worker in between is on both: staged, and in
    /// its worker's `cpus_in_use`. Counted twice, it would launch a worker for a bundle that
    /// already has one.
    pub taken: HashSet<String>,
}

impl WorkersSeen {
    pub fn from_info(info: &Value) -> Self {
        let taken = info
            .get("data")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|w| w.get("run_uuids").and_then(Value::as_array))
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        WorkersSeen {
            free: free_by_worker(info),
            taken,
        }
    }

    /// Drops from `staged` the bundles a worker already holds.
    pub fn drop_taken(&self, staged: &mut Vec<StagedBundle>) {
        if !self.taken.is_empty() {
            staged.retain(|b| !self.taken.contains(&b.uuid));
        }
    }
}

/// The server's worker list ([`WorkersSeen`]), read only when one of the listings has a
/// running job: no request while none runs.
pub async fn free_capacity(
    client: &RestClient,
    listed: &[Result<Vec<JobStatus>, backends::BackendError>],
) -> WorkersSeen {
    let any_running = listed.iter().any(|l| {
        l.as_ref()
            .is_ok_and(|l| l.iter().any(|j| j.state == JobState::Running))
    });
    if !any_running {
        return WorkersSeen::default();
    }
    match client.workers_info().await {
        Ok(v) => WorkersSeen::from_info(&v),
        Err(e) => {
            // Unknown free capacity: started workers count as pending, none is doubled.
            tracing::warn!("cannot read /rest/workers/info: {e}");
            WorkersSeen::default()
        }
    }
}
