//! What one tick decides: the actions and the numbers that explain them.

use super::*;
use serde::{Deserialize, Serialize};

/// One decision for the control loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Submit `count` worker jobs of shape `shape`.
    Launch { shape: String, count: u32 },
    /// Cancel a pending job.
    Cancel { job_id: String },
}

/// A bundle no worker of this manager can run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unschedulable {
    pub uuid: String,
    pub reason: String,
    /// The requests beyond the largest shape, one per resource (empty: its queue is not served
    /// here, or no single shape holds all it asks at once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over: Vec<Excess>,
}

/// Per-shape numbers of one tick.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ShapePlan {
    pub shape: String,
    /// Staged bundles whose smallest fitting shape is this one.
    pub staged: usize,
    /// Of those, bundles that fit in the free capacity of running workers.
    pub covered_by_idle: usize,
    /// Workers of this shape the remaining bundles need (first-fit-decreasing).
    pub workers_needed: u32,
    pub pending: u32,
    pub active: u32,
    /// `workers_needed - pending`, saturating.
    pub launch_wanted: u32,
    /// Demand launches granted (bucket, spacing, max, breaker permitting).
    pub launches_granted: u32,
    /// Extra launches for the min-workers floor.
    pub floor_launches: u32,
    /// Launches wanted but not granted because of the throttle (the token bucket, the round
    /// spacing, `--max-workers`, the back-off or the breaker).
    pub throttled: u32,
    /// Launches wanted but not granted because the backend's capacity (the `local` machine)
    /// holds no more workers of this shape. `throttled + over_capacity` is
    /// `launch_wanted - launches_granted`.
    #[serde(default)]
    pub over_capacity: u32,
    /// Pending jobs of this shape cancelled as unneeded.
    pub cancelled: u32,
}

/// The output of [`plan`]: actions plus everything needed to explain them (`/status` JSON later).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub now: f64,
    pub actions: Vec<Action>,
    /// The job listing error of this tick, if any (then `actions` is empty).
    pub listing_error: Option<String>,
    /// Jobs listed (pending + active), when the listing worked.
    pub total_jobs: Option<usize>,
    pub shapes: Vec<ShapePlan>,
    pub unschedulable: Vec<Unschedulable>,
    /// Staged bundles the server counted beyond those this tick read and planned with: the
    /// first ones already decided the tick ([`staged_prefix_decides`]). Set by the control
    /// loop; 0 when every staged bundle was read.
    #[serde(default)]
    pub staged_unread: u64,
    /// Breaker state after this tick's decisions.
    pub breaker: BreakerState,
    /// Failed launches in a row (refused submits plus workers lost before check-in).
    pub consecutive_failures: u32,
    /// Whole tokens left in the bucket after this tick.
    pub tokens_left: u32,
    /// Human-readable reasons for each decision, for the logs.
    pub reasons: Vec<String>,
    /// Why each staged bundle of the observation is not running yet, one each, in the
    /// observation's order (`explain.rs`). `/status` carries it, bounded, as its `bundles`
    /// (its `plan` without it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<BundleWait>,
}

impl Plan {
    /// Every staged bundle the tick knew of: those read (schedulable or not) and those counted
    /// but not read.
    pub fn staged_total(&self) -> u64 {
        (self.shapes.iter().map(|s| s.staged).sum::<usize>() + self.unschedulable.len()) as u64
            + self.staged_unread
    }

    /// Total workers launched by this plan.
    pub fn launches(&self) -> u32 {
        self.actions
            .iter()
            .map(|a| match a {
                Action::Launch { count, .. } => *count,
                Action::Cancel { .. } => 0,
            })
            .sum()
    }

    /// Job ids cancelled by this plan.
    pub fn cancels(&self) -> Vec<&str> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::Cancel { job_id } => Some(job_id.as_str()),
                Action::Launch { .. } => None,
            })
            .collect()
    }

    pub fn shape(&self, name: &str) -> Option<&ShapePlan> {
        self.shapes.iter().find(|s| s.shape == name)
    }
}
