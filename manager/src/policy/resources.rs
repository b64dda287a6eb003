//! Resources, shapes, bundles and jobs as the policy sees them, and first-fit-decreasing packing.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

pub use common::resources::{Resources, Shape};

/// A staged bundle as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedBundle {
    pub uuid: String,
    /// `metadata.request_cpus`, `request_gpus` and `request_memory` (already parsed to bytes).
    pub request: Resources,
    /// `metadata.request_queue`, e.g. `gpu` or `tag=gpu`.
    pub request_queue: Option<String>,
    /// What a worker launched for it can fetch before the server hands it the run
    /// (`--worker-prefetch`): its image and dependencies. No part of the scaling decision.
    #[serde(default, skip_serializing_if = "Needs::is_empty")]
    pub needs: Needs,
}

/// A staged bundle's `metadata.request_docker_image` (empty: the server's default, unknown
/// here) and its dependencies as `(parent_uuid, parent_path)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needs {
    pub image: Option<String>,
    pub dependencies: Vec<(String, String)>,
}

impl Needs {
    pub fn is_empty(&self) -> bool {
        self.image.is_none() && self.dependencies.is_empty()
    }
}

impl StagedBundle {
    pub fn new(uuid: impl Into<String>, cpus: u32, gpus: u32, memory_bytes: u64) -> Self {
        StagedBundle {
            uuid: uuid.into(),
            request: Resources::new(cpus, gpus, memory_bytes),
            request_queue: None,
            needs: Needs::default(),
        }
    }

    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.request_queue = Some(queue.into());
        self
    }
}

/// What a backend job that runs (or will run) one worker means for the policy: a pending one is
/// an empty worker to come, an active one may report free room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Occupancy {
    /// Submitted, not running yet (queued, scheduling, pulling the image...).
    Pending,
    /// Running.
    Active,
}

/// One of this manager's backend jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    /// Name of the [`Shape`] it was launched with.
    pub shape: String,
    pub state: Occupancy,
    /// For running workers: their free resources, when known (from the server's worker list).
    pub free: Option<Resources>,
    /// Submission time on the policy clock, when known; used to cancel the newest pending jobs first.
    pub submitted_at: Option<f64>,
}

impl Job {
    pub fn pending(id: impl Into<String>, shape: impl Into<String>) -> Self {
        Job {
            id: id.into(),
            shape: shape.into(),
            state: Occupancy::Pending,
            free: None,
            submitted_at: None,
        }
    }

    pub fn active(id: impl Into<String>, shape: impl Into<String>) -> Self {
        Job {
            state: Occupancy::Active,
            ..Job::pending(id, shape)
        }
    }

    pub fn with_free(mut self, free: Resources) -> Self {
        self.free = Some(free);
        self
    }

    pub fn submitted_at(mut self, at: f64) -> Self {
        self.submitted_at = Some(at);
        self
    }
}

/// What the control loop saw this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub staged: Vec<StagedBundle>,
    /// This manager's jobs, or the listing error. An error means "unknown", never "zero".
    pub jobs: Result<Vec<Job>, String>,
    /// Policy clock, seconds.
    pub now: f64,
}

/// Descending size order for first-fit-decreasing; uuid breaks ties so plans are deterministic.
pub(crate) fn ffd_order(a: &StagedBundle, b: &StagedBundle) -> Ordering {
    b.request
        .size_key()
        .cmp(&a.request.size_key())
        .then_with(|| a.uuid.cmp(&b.uuid))
}

/// First-fit-decreasing: the number of `capacity` bins the (already sorted) requests need.
/// Every request must fit in `capacity`.
pub fn pack_first_fit_decreasing(capacity: Resources, requests: &[Resources]) -> u32 {
    first_fit_decreasing_bins(capacity, requests)
        .into_iter()
        .max()
        .map_or(0, |b| b + 1)
}

/// First-fit-decreasing, bin by bin: the index of the `capacity` bin each request goes to, in
/// the order given (bins numbered as they are opened, largest requests first, ties in the
/// order given). Every request must fit in `capacity`.
pub fn first_fit_decreasing_bins(capacity: Resources, requests: &[Resources]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(requests[i].size_key()));
    let mut bins: Vec<Resources> = Vec::new();
    let mut out = vec![0u32; requests.len()];
    for i in order {
        let r = &requests[i];
        out[i] = match bins.iter_mut().position(|b| b.fits(r)) {
            Some(k) => {
                bins[k].subtract(r);
                k as u32
            }
            None => {
                let mut b = capacity;
                b.subtract(r);
                bins.push(b);
                (bins.len() - 1) as u32
            }
        };
    }
    out
}
