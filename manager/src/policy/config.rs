//! The policy's static configuration and its validation.

use super::*;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// Static policy configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Worker shapes. The **first** one is the default shape (from `--cpus/--gpus/--memory-mb`), used by
    /// the min-workers floor.
    pub shapes: Vec<Shape>,
    /// `--min-workers` (default 1).
    pub min_workers: usize,
    /// `--max-workers` (default 10); pending jobs count.
    pub max_workers: usize,
    /// `--min-seconds-between-workers` (default 60): spacing of launch rounds.
    pub min_seconds_between_workers: f64,
    /// How long a pending job must have been unneeded, over two ticks at least, before it is
    /// cancelled (default 10 s: the server's worker list shows a bundle's assignment only at
    /// the worker's next check-in, every 5 s by default).
    #[serde(default = "default_cancel_grace_secs")]
    pub cancel_grace_secs: f64,
    /// Token bucket refill rate, workers per second.
    pub launch_rate_per_sec: f64,
    /// Token bucket capacity: the largest burst.
    pub launch_burst: u32,
    /// Consecutive submit failures that open the breaker.
    pub breaker_failure_threshold: u32,
    /// How long the breaker stays open before the half-open probe.
    pub breaker_cooldown_secs: f64,
    /// First back-off delay after a submit failure.
    pub backoff_base_secs: f64,
    /// Largest back-off delay.
    pub backoff_max_secs: f64,
    /// `--worker-tag`.
    pub worker_tag: Option<String>,
    /// `--worker-tag-exclusive`.
    pub worker_tag_exclusive: bool,
    /// Drop bundles that fit no shape (the default; `--no-prefilter` turns it off, and such a
    /// bundle then counts as one whole worker of the largest shape, as Python launches for it).
    #[serde(default = "default_true")]
    pub prefilter: bool,
    /// What the backend can hold at once (the `local` machine), if bounded: launches stop where
    /// the shapes of all jobs would no longer fit.
    #[serde(default)]
    pub capacity: Option<Resources>,
}

fn default_true() -> bool {
    true
}

/// A configuration the policy refuses (checked by [`Config::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("--max-workers ({max}) is less than --min-workers ({min})")]
    MaxBelowMin { min: usize, max: usize },
    #[error("no worker shape configured")]
    NoShapes,
    #[error("worker shape name {0:?} is used twice")]
    DuplicateShape(String),
    #[error("{0} must be a finite number >= 0")]
    BadNumber(&'static str),
    #[error("breaker failure threshold must be at least 1")]
    ZeroThreshold,
    #[error(
        "worker shape {name:?} ({cpus} cpus, {gpus} gpus, {memory_bytes} bytes) does not fit in the \
         backend's capacity ({cap_cpus} cpus, {cap_gpus} gpus, {cap_memory_bytes} bytes)"
    )]
    ShapeExceedsCapacity {
        name: String,
        cpus: u32,
        gpus: u32,
        memory_bytes: u64,
        cap_cpus: u32,
        cap_gpus: u32,
        cap_memory_bytes: u64,
    },
}

fn default_cancel_grace_secs() -> f64 {
    10.0
}

impl Config {
    /// The Python defaults with one shape: min 1, max 10, 60 s between rounds; a bucket of burst 50
    /// (one tick can launch a whole queue's worth; `--max-workers` caps it) refilled at one worker
    /// per second; the breaker opens after 5 failures for 300 s; back-off 5 s … 300 s.
    pub fn with_default_shape(shape: Shape) -> Self {
        Config {
            shapes: vec![shape],
            min_workers: 1,
            max_workers: 10,
            min_seconds_between_workers: 60.0,
            cancel_grace_secs: default_cancel_grace_secs(),
            launch_rate_per_sec: 1.0,
            launch_burst: 50,
            breaker_failure_threshold: 5,
            breaker_cooldown_secs: 300.0,
            backoff_base_secs: 5.0,
            backoff_max_secs: 300.0,
            worker_tag: None,
            worker_tag_exclusive: false,
            prefilter: true,
            capacity: None,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_workers < self.min_workers {
            return Err(ConfigError::MaxBelowMin {
                min: self.min_workers,
                max: self.max_workers,
            });
        }
        if self.shapes.is_empty() {
            return Err(ConfigError::NoShapes);
        }
        let mut seen = HashSet::new();
        for s in &self.shapes {
            if !seen.insert(s.name.as_str()) {
                return Err(ConfigError::DuplicateShape(s.name.clone()));
            }
        }
        for (name, v) in [
            (
                "min_seconds_between_workers",
                self.min_seconds_between_workers,
            ),
            ("launch_rate_per_sec", self.launch_rate_per_sec),
            ("breaker_cooldown_secs", self.breaker_cooldown_secs),
            ("backoff_base_secs", self.backoff_base_secs),
            ("backoff_max_secs", self.backoff_max_secs),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(ConfigError::BadNumber(name));
            }
        }
        if self.breaker_failure_threshold == 0 {
            return Err(ConfigError::ZeroThreshold);
        }
        if let Some(cap) = self.capacity {
            if let Some(s) = self.shapes.iter().find(|s| !cap.fits(&s.resources)) {
                return Err(ConfigError::ShapeExceedsCapacity {
                    name: s.name.clone(),
                    cpus: s.resources.cpus,
                    gpus: s.resources.gpus,
                    memory_bytes: s.resources.memory_bytes,
                    cap_cpus: cap.cpus,
                    cap_gpus: cap.gpus,
                    cap_memory_bytes: cap.memory_bytes,
                });
            }
        }
        Ok(())
    }

    /// Whether this manager's workers may run a bundle with this `request_queue` (rule 1).
    pub fn serves_queue(&self, request_queue: Option<&str>) -> bool {
        match (request_queue, self.worker_tag.as_deref()) {
            (None, _) => !self.worker_tag_exclusive,
            (Some(q), Some(t)) => q == t || q.strip_prefix("tag=") == Some(t),
            (Some(_), None) => false,
        }
    }

    /// Shapes in "smallest first" order: `(gpus, cpus, memory_bytes, name)`.
    pub fn shapes_smallest_first(&self) -> Vec<&Shape> {
        let mut v: Vec<&Shape> = self.shapes.iter().collect();
        v.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        v
    }

    /// The smallest shape that fits `need`, if any.
    pub fn smallest_fitting_shape(&self, need: &Resources) -> Option<&Shape> {
        self.shapes_smallest_first()
            .into_iter()
            .find(|s| s.resources.fits(need))
    }
}
