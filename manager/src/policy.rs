//! The scaling policy of `cl-worker-manager`, as a pure function.
//!
//! Every tick the control loop (a later piece) gathers an [`Observation`]: the staged bundles from the
//! server, the result of listing this manager's jobs on its backend (which may have *failed*), and the
//! current time as plain `f64` seconds. It then calls [`plan`] with the static [`Config`] and the mutable
//! [`PolicyState`], executes the [`Action`]s of the returned [`Plan`], and reports every submit outcome
//! back with [`record_submit`]. The policy itself does no I/O and reads no clock, so every rule below is
//! tested with tables and property tests.
//!
//! # What changed compared to the Python manager
//!
//! The Python manager launched at most **one** worker per iteration, of one fixed shape, spaced by
//! `--min-seconds-between-workers`, and the `--min-workers` rule overrode every check, so a backend that
//! answered "no jobs" on error caused a launch every `--sleep-time`. This policy instead:
//!
//! * computes the **whole demand** in one tick (burst) and launches it, throttled by a token bucket;
//! * supports **several worker shapes** and packs bundles into them;
//! * treats a failed job listing as "unknown", never as "zero": **no launches and no cancels** that tick;
//! * backs off exponentially on submit failures and opens a **circuit breaker**;
//! * **cancels pending jobs** that no staged bundle needs any more.
//!
//! # Rules, in the order `plan` applies them
//!
//! 1. **Eligibility.** A bundle with a `request_queue` is served only if this manager has a worker tag `t`
//!    and the queue is `t` or `tag=t` (the two legacy forms). A bundle without a queue is served
//!    unless the manager is tag-exclusive. Other bundles are *unschedulable* (reported with a reason).
//! 2. **Shape choice.** Each eligible bundle goes to the **smallest shape that fits** it
//!    (`cpus`, `gpus` and `memory_bytes` all at least the request). "Smallest" orders shapes by
//!    `(gpus, cpus, memory_bytes, name)`: GPUs are the scarcest resource, then CPUs, then memory. A bundle
//!    that fits no shape is *unschedulable* with a reason naming the resources that are too large, and
//!    never causes a launch. With `--no-prefilter` ([`Config::prefilter`] false) such a bundle instead
//!    asks for one whole worker of the largest shape, as the Python manager launches for it.
//! 3. **Idle capacity.** Running (`Active`) jobs may report their free resources. Eligible bundles, in
//!    decreasing size order (`gpus`, `cpus`, `memory`, then uuid), are placed first-fit into that free capacity
//!    (any shape: the server hands a bundle to whichever worker has room). A bundle placed there is
//!    "covered by idle" and is not a reason to launch.
//! 4. **Packing.** Per shape, the remaining bundles are packed **first-fit-decreasing** (same order) into
//!    empty workers of that shape; the bin count is `workers_needed`. Several small bundles share a worker
//!    whenever all three resources still fit.
//! 5. **Pending capacity.** Pending jobs of a shape are empty workers of that shape, so they cover
//!    `min(pending, workers_needed)` bins; `launch_wanted = workers_needed - pending` (saturating).
//! 6. **Scale-down.** Pending jobs beyond `workers_needed` are unneeded, newest first (largest
//!    `submitted_at`, unknown times count as oldest, ties by later list position), but never so many that
//!    the job total drops below `--min-workers`, and never a job whose shape is unknown to the config.
//!    An unneeded job is cancelled once it has been unneeded without a break (every listing in
//!    between found it so) over two ticks at least and [`Config::cancel_grace_secs`] (10 s): the
//!    server's worker list lags a bundle's assignment by one check-in, so a worker that has just
//!    taken a bundle still looks free, and a pending job unneeded, until then.
//!    Running workers are never cancelled: they leave by `--exit-when-idle`; a job whose worker has
//!    checked in once is running for the policy from then on (`control::JobBook`). Cancels do not free
//!    `--max-workers` room in the same tick (the cancel may fail).
//! 7. **Demand launches.** The launch budget of the tick is the smallest of: `max_workers - total_jobs`
//!    (every listed job counts, pending included); the whole tokens in the bucket; 0 while
//!    `--min-seconds-between-workers` has not passed since the last launch *round* (a tick that launched
//!    anything); 0 during submit back-off; 0 while the breaker is open, 1 while half-open. The budget is
//!    shared round-robin over shapes (in "smallest" order) so that no shape starves the others. What a
//!    shape wanted but did not get is its `throttled` count.
//!    **Capacity.** A bounded backend ([`Config::capacity`], the `local` machine) gets a launch only
//!    while the shapes of every listed job (unknown shapes count as the default shape) plus the
//!    launches granted so far fit in it; tokens of refused launches go back to the bucket. What a
//!    shape did not get because the capacity refused it is its `over_capacity` count, not
//!    `throttled`.
//! 8. **Min-workers floor.** Python's rule: if `total_jobs + launches < min_workers`, launch the difference
//!    with the **default shape** (the first shape of [`Config::shapes`], built from `--cpus/--gpus/--memory-mb`).
//!    As in Python the floor ignores the token bucket and the round spacing (it still consumes whatever
//!    tokens are left), but unlike Python it **respects** a failed listing, the back-off, the breaker
//!    (half-open: one launch in total) and the backend's capacity.
//!
//! # Throttling and error safety
//!
//! * [`TokenBucket`]: `capacity` tokens (the burst), refilled at `rate_per_sec`; one token per worker.
//!   It is a small pure struct advanced by the clock: [`TokenBucket::refill`] then [`TokenBucket::take`].
//! * Back-off: after `f` consecutive failures (below the breaker threshold) no launch happens before
//!   `last_failure + min(backoff_base * 2^(f-1), backoff_max)`.
//! * [`CircuitBreaker`]: `Closed` → `Open` after `failure_threshold` consecutive failures; `Open` for
//!   `cooldown_secs` → `HalfOpen`, which allows exactly one launch (the probe); the probe's success closes
//!   the breaker, its failure reopens it for another cool-down. A probe whose outcome is never recorded
//!   is retried after one cool-down. A success recorded in any state closes the breaker and resets the
//!   failure count (the backend accepted a job).
//!
//! * **Workers lost before check-in.** A worker job that ends unsuccessfully before its worker ever
//!   checked in (a bad image, refused credentials, a crash at start; not a job this manager cancelled)
//!   is a failed launch too: [`record_early_exit`] counts it with the submit failures for the back-off
//!   and the breaker. A successful submit does not clear it, since the job was accepted before it
//!   died; only a worker that checks in does ([`record_checkin`]). So a crash loop slows down
//!   exponentially and then opens the breaker, one probe per cool-down, instead of launching a job
//!   every tick forever.
//!
//! The policy state is per backend (one manager process drives one backend), so the bucket and the breaker
//! are per backend, as the design asks.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};

/// Resources of a worker or of a bundle request. Memory is in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Resources {
    pub cpus: u32,
    pub gpus: u32,
    pub memory_bytes: u64,
}

impl Resources {
    pub fn new(cpus: u32, gpus: u32, memory_bytes: u64) -> Self {
        Resources {
            cpus,
            gpus,
            memory_bytes,
        }
    }

    /// True when `need` fits in `self` on every dimension.
    pub fn fits(&self, need: &Resources) -> bool {
        need.cpus <= self.cpus && need.gpus <= self.gpus && need.memory_bytes <= self.memory_bytes
    }

    fn subtract(&mut self, need: &Resources) {
        self.cpus -= need.cpus;
        self.gpus -= need.gpus;
        self.memory_bytes -= need.memory_bytes;
    }

    fn add(&mut self, other: &Resources) {
        self.cpus = self.cpus.saturating_add(other.cpus);
        self.gpus = self.gpus.saturating_add(other.gpus);
        self.memory_bytes = self.memory_bytes.saturating_add(other.memory_bytes);
    }

    /// Each dimension capped at `limit`'s.
    fn min_each(&self, limit: &Resources) -> Resources {
        Resources::new(
            self.cpus.min(limit.cpus),
            self.gpus.min(limit.gpus),
            self.memory_bytes.min(limit.memory_bytes),
        )
    }

    /// The order used for "smallest shape" and for first-fit-decreasing: gpus, then cpus, then memory.
    fn size_key(&self) -> (u32, u32, u64) {
        (self.gpus, self.cpus, self.memory_bytes)
    }
}

/// A worker shape: what one launched worker job provides.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub name: String,
    pub cpus: u32,
    pub gpus: u32,
    pub memory_bytes: u64,
}

impl Shape {
    pub fn new(name: impl Into<String>, cpus: u32, gpus: u32, memory_bytes: u64) -> Self {
        Shape {
            name: name.into(),
            cpus,
            gpus,
            memory_bytes,
        }
    }

    /// The default shape from the backend flags `--cpus`, `--gpus` and `--memory-mb` (MiB, as Python's
    /// `parse_size(f"{memory_mb}m")`).
    pub fn from_flags(cpus: u32, gpus: u32, memory_mb: u64) -> Self {
        Shape::new("default", cpus, gpus, memory_mb.saturating_mul(1024 * 1024))
    }

    pub fn resources(&self) -> Resources {
        Resources::new(self.cpus, self.gpus, self.memory_bytes)
    }

    fn order_key(&self) -> ((u32, u32, u64), &str) {
        (self.resources().size_key(), self.name.as_str())
    }
}

/// A staged bundle as the server reports it (`metadata.request_*`, memory already parsed to bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedBundle {
    pub uuid: String,
    pub request_cpus: u32,
    pub request_gpus: u32,
    pub request_memory_bytes: u64,
    /// `metadata.request_queue`, e.g. `gpu` or `tag=gpu`.
    pub request_queue: Option<String>,
}

impl StagedBundle {
    pub fn new(uuid: impl Into<String>, cpus: u32, gpus: u32, memory_bytes: u64) -> Self {
        StagedBundle {
            uuid: uuid.into(),
            request_cpus: cpus,
            request_gpus: gpus,
            request_memory_bytes: memory_bytes,
            request_queue: None,
        }
    }

    pub fn with_queue(mut self, queue: impl Into<String>) -> Self {
        self.request_queue = Some(queue.into());
        self
    }

    pub fn request(&self) -> Resources {
        Resources::new(
            self.request_cpus,
            self.request_gpus,
            self.request_memory_bytes,
        )
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
            if let Some(s) = self.shapes.iter().find(|s| !cap.fits(&s.resources())) {
                return Err(ConfigError::ShapeExceedsCapacity {
                    name: s.name.clone(),
                    cpus: s.cpus,
                    gpus: s.gpus,
                    memory_bytes: s.memory_bytes,
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
            .find(|s| s.resources().fits(need))
    }
}

/// Token bucket: `capacity` tokens, refilled continuously at `rate_per_sec`. Starts full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenBucket {
    pub capacity: f64,
    pub rate_per_sec: f64,
    pub tokens: f64,
    pub last_refill: Option<f64>,
}

impl TokenBucket {
    pub fn new(capacity: u32, rate_per_sec: f64) -> Self {
        TokenBucket {
            capacity: f64::from(capacity),
            rate_per_sec: rate_per_sec.max(0.0),
            tokens: f64::from(capacity),
            last_refill: None,
        }
    }

    /// Advance the bucket to `now`. A clock that goes backwards adds nothing.
    pub fn refill(&mut self, now: f64) {
        if let Some(last) = self.last_refill {
            if now > last {
                self.tokens = (self.tokens + (now - last) * self.rate_per_sec).min(self.capacity);
            }
        }
        self.last_refill = Some(self.last_refill.map_or(now, |l| l.max(now)));
    }

    /// Whole tokens available.
    pub fn available(&self) -> u32 {
        // tokens is within [0, capacity] and capacity came from a u32.
        self.tokens.max(0.0).floor() as u32
    }

    /// Return `n` tokens taken but not used (never above the capacity).
    pub fn give_back(&mut self, n: u32) {
        self.tokens = (self.tokens + f64::from(n)).min(self.capacity);
    }

    /// Take up to `n` tokens; returns how many were granted.
    pub fn take(&mut self, n: u32) -> u32 {
        let granted = n.min(self.available());
        self.tokens -= f64::from(granted);
        granted
    }
}

/// Circuit breaker state, reported in the [`Plan`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    /// No launches until `until`.
    Open {
        until: f64,
    },
    /// One probe launch allowed; `probe_since` is set once it was granted.
    HalfOpen {
        probe_since: Option<f64>,
    },
}

/// Per-backend circuit breaker over submit outcomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CircuitBreaker {
    pub failure_threshold: u32,
    pub cooldown_secs: f64,
    pub state: BreakerState,
}

impl CircuitBreaker {
    pub fn new(failure_threshold: u32, cooldown_secs: f64) -> Self {
        CircuitBreaker {
            failure_threshold: failure_threshold.max(1),
            cooldown_secs,
            state: BreakerState::Closed,
        }
    }

    /// Advance time: `Open` becomes `HalfOpen` after the cool-down; a half-open probe whose outcome
    /// never came is forgotten after one cool-down.
    pub fn advance(&mut self, now: f64) {
        match self.state {
            BreakerState::Open { until } if now >= until => {
                self.state = BreakerState::HalfOpen { probe_since: None }
            }
            BreakerState::HalfOpen {
                probe_since: Some(since),
            } if now - since >= self.cooldown_secs => {
                self.state = BreakerState::HalfOpen { probe_since: None }
            }
            _ => {}
        }
    }

    /// How many launches the breaker allows now (`None` = unlimited). Call [`Self::advance`] first.
    pub fn allowance(&self) -> Option<u32> {
        match self.state {
            BreakerState::Closed => None,
            BreakerState::Open { .. } => Some(0),
            BreakerState::HalfOpen { probe_since: None } => Some(1),
            BreakerState::HalfOpen {
                probe_since: Some(_),
            } => Some(0),
        }
    }

    /// Record one submit outcome; `consecutive_failures` already counts this failure.
    pub fn record(&mut self, ok: bool, consecutive_failures: u32, now: f64) {
        self.state = if ok {
            BreakerState::Closed
        } else {
            match self.state {
                BreakerState::HalfOpen { .. } => BreakerState::Open {
                    until: now + self.cooldown_secs,
                },
                BreakerState::Closed if consecutive_failures >= self.failure_threshold => {
                    BreakerState::Open {
                        until: now + self.cooldown_secs,
                    }
                }
                other => other,
            }
        };
    }
}

/// The last failed submit, for logs and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitFailure {
    pub shape: String,
    pub at: f64,
}

/// Mutable policy state of one backend, carried from tick to tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    pub bucket: TokenBucket,
    pub breaker: CircuitBreaker,
    /// Time of the last tick that launched anything (`None`: never, so the first round is not spaced).
    pub last_round_at: Option<f64>,
    pub consecutive_failures: u32,
    /// Worker jobs lost before their worker checked in, since the last check-in.
    pub early_exits: u32,
    pub last_failure: Option<SubmitFailure>,
    pub backoff_base_secs: f64,
    pub backoff_max_secs: f64,
    /// Pending jobs that no staged bundle needed at the last tick, with the policy time since
    /// which they have been unneeded without a break (rule 6).
    #[serde(default)]
    pub unneeded: std::collections::BTreeMap<String, f64>,
}

impl PolicyState {
    pub fn new(config: &Config) -> Self {
        PolicyState {
            bucket: TokenBucket::new(config.launch_burst, config.launch_rate_per_sec),
            breaker: CircuitBreaker::new(
                config.breaker_failure_threshold,
                config.breaker_cooldown_secs,
            ),
            last_round_at: None,
            consecutive_failures: 0,
            early_exits: 0,
            last_failure: None,
            backoff_base_secs: config.backoff_base_secs,
            backoff_max_secs: config.backoff_max_secs,
            unneeded: Default::default(),
        }
    }

    /// End of the current back-off, if failures are being backed off (only while the breaker is closed;
    /// the breaker's cool-down takes over once it opens).
    pub fn backoff_until(&self) -> Option<f64> {
        let last = self.last_failure.as_ref()?;
        let failures = self.failures();
        if failures == 0 || self.breaker.state != BreakerState::Closed {
            return None;
        }
        let exp = failures.saturating_sub(1).min(62) as i32;
        let delay = (self.backoff_base_secs * 2f64.powi(exp)).min(self.backoff_max_secs);
        Some(last.at + delay)
    }

    /// Failed launches that count for the back-off and the breaker: consecutive refused submits
    /// plus workers lost before check-in.
    pub fn failures(&self) -> u32 {
        self.consecutive_failures.saturating_add(self.early_exits)
    }

    /// The backend is healthy at `now`: breaker closed and no back-off running. Only then does the
    /// min-workers floor hold unconditionally (given a successful listing).
    pub fn backend_healthy(&self, now: f64) -> bool {
        let mut breaker = self.breaker.clone();
        breaker.advance(now);
        breaker.state == BreakerState::Closed && self.backoff_until().is_none_or(|t| now >= t)
    }
}

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

/// Descending size order for first-fit-decreasing; uuid breaks ties so plans are deterministic.
fn ffd_order(a: &StagedBundle, b: &StagedBundle) -> Ordering {
    b.request()
        .size_key()
        .cmp(&a.request().size_key())
        .then_with(|| a.uuid.cmp(&b.uuid))
}

/// First-fit-decreasing: the number of `capacity` bins the (already sorted) requests need.
/// Every request must fit in `capacity`.
pub fn pack_first_fit_decreasing(capacity: Resources, requests: &[Resources]) -> u32 {
    let mut sorted: Vec<Resources> = requests.to_vec();
    sorted.sort_by_key(|r| std::cmp::Reverse(r.size_key()));
    let mut bins: Vec<Resources> = Vec::new();
    for r in &sorted {
        match bins.iter_mut().find(|b| b.fits(r)) {
            Some(b) => b.subtract(r),
            None => {
                let mut b = capacity;
                b.subtract(r);
                bins.push(b);
            }
        }
    }
    bins.len() as u32
}

fn why_no_shape(config: &Config, need: &Resources) -> String {
    if config.shapes.is_empty() {
        return "no worker shape is configured".to_string();
    }
    let max_cpus = config.shapes.iter().map(|s| s.cpus).max().unwrap_or(0);
    let max_gpus = config.shapes.iter().map(|s| s.gpus).max().unwrap_or(0);
    let max_mem = config
        .shapes
        .iter()
        .map(|s| s.memory_bytes)
        .max()
        .unwrap_or(0);
    let mut parts = Vec::new();
    if need.cpus > max_cpus {
        parts.push(format!("{} cpus > largest {}", need.cpus, max_cpus));
    }
    if need.gpus > max_gpus {
        parts.push(format!("{} gpus > largest {}", need.gpus, max_gpus));
    }
    if need.memory_bytes > max_mem {
        parts.push(format!(
            "{} bytes memory > largest {}",
            need.memory_bytes, max_mem
        ));
    }
    if parts.is_empty() {
        format!(
            "no single shape fits {} cpus, {} gpus, {} bytes at once",
            need.cpus, need.gpus, need.memory_bytes
        )
    } else {
        format!("fits no worker shape: {}", parts.join(", "))
    }
}

/// Record the outcome of one worker submission (call once per launched worker).
pub fn record_submit(state: &mut PolicyState, shape: &str, ok: bool, now: f64) {
    if ok {
        state.consecutive_failures = 0;
    } else {
        state.consecutive_failures = state.consecutive_failures.saturating_add(1);
        state.last_failure = Some(SubmitFailure {
            shape: shape.to_string(),
            at: now,
        });
    }
    state.breaker.record(ok, state.failures(), now);
}

/// A worker job of `shape` ended unsuccessfully before its worker checked in: a failed launch.
pub fn record_early_exit(state: &mut PolicyState, shape: &str, now: f64) {
    state.early_exits = state.early_exits.saturating_add(1);
    state.last_failure = Some(SubmitFailure {
        shape: shape.to_string(),
        at: now,
    });
    state.breaker.record(false, state.failures(), now);
}

/// A launched worker checked in: launches work again.
pub fn record_checkin(state: &mut PolicyState) {
    state.early_exits = 0;
}

/// The scaling policy: decide this tick's launches and cancels. See the module docs for the rules;
/// each has its own function below, called here in the documented order.
pub fn plan(config: &Config, state: &mut PolicyState, obs: &Observation) -> Plan {
    state.bucket.refill(obs.now);
    state.breaker.advance(obs.now);
    let mut t = Tick::new(config, obs.now);
    let (unschedulable, eligible) = t.eligibility_and_shapes(&obs.staged);
    let jobs = match &obs.jobs {
        Ok(jobs) => jobs,
        Err(e) => {
            t.reasons.push(format!(
                "listing jobs failed ({e}): job counts unknown, no launches and no cancels this tick"
            ));
            // Two ticks in a row means two listings in a row.
            state.unneeded.clear();
            return t.into_plan(state, unschedulable, Vec::new(), Err(e.clone()));
        }
    };
    t.count_jobs(jobs);
    let remaining = t.idle_capacity(jobs, &eligible);
    t.packing_and_pending(&remaining);
    let mut actions = t.scale_down(state, jobs);
    let limits = t.demand_budget(state, jobs.len());
    let free_capacity = t.grant_within_capacity(state, jobs, limits.budget);
    t.min_workers_floor(state, jobs.len(), &limits, free_capacity);
    t.launch_actions(state, &mut actions);
    t.into_plan(state, unschedulable, actions, Ok(jobs.len()))
}

/// Whether `staged`, the first bundles of a longer staged list, already decides the tick: for
/// any bundles that may follow, [`plan`] with the whole list takes the same actions as with
/// these. Then the rest need not be read from the server (with 10 000 staged bundles, reading
/// them all costs the server seconds per tick).
///
/// It holds when every shape's demand from these bundles alone covers its pending jobs plus
/// all the room left under `--max-workers`: more bundles only raise demand, so no pending job
/// is cancelled either way, and every shape wants at least the whole budget, which rule 7 then
/// shares out the same way. The demand counted is a lower bound of what packing needs, which
/// more bundles can only raise: per shape and resource, what its bundles request beyond all
/// the free capacity of running workers, in whole workers of the shape. A failed listing
/// decides nothing (no actions), so any prefix does.
pub fn staged_prefix_decides(
    config: &Config,
    staged: &[StagedBundle],
    jobs: &Result<Vec<Job>, String>,
) -> bool {
    let Ok(jobs) = jobs else {
        return true;
    };
    let mut t = Tick::new(config, 0.0);
    let (_, eligible) = t.eligibility_and_shapes(staged);
    t.count_jobs(jobs);
    let room = config.max_workers.saturating_sub(jobs.len()) as u64;
    let mut idle = Resources::default();
    for f in jobs
        .iter()
        .filter(|j| j.state == Occupancy::Active)
        .filter_map(|j| j.free)
    {
        idle.add(&f);
    }
    let mut requested = vec![Resources::default(); t.plans.len()];
    for (b, i) in &eligible {
        requested[*i].add(&b.request().min_each(&t.shapes[*i].resources()));
    }
    let dims = |r: &Resources| [u64::from(r.cpus), u64::from(r.gpus), r.memory_bytes];
    let idle = dims(&idle);
    t.plans.iter().enumerate().all(|(i, sp)| {
        let (cap, req) = (dims(&t.shapes[i].resources()), dims(&requested[i]));
        let lower_bound = (0..3)
            .filter(|&d| cap[d] > 0)
            .map(|d| req[d].saturating_sub(idle[d]).div_ceil(cap[d]))
            .max()
            .unwrap_or(0);
        lower_bound >= u64::from(sp.pending) + room
    })
}

/// What one call of [`plan`] works on: the shapes in "smallest" order, their plans, the reasons.
struct Tick<'a> {
    config: &'a Config,
    now: f64,
    shapes: Vec<&'a Shape>,
    index: BTreeMap<&'a str, usize>,
    plans: Vec<ShapePlan>,
    reasons: Vec<String>,
}

/// The limits of rule 7 that rule 8 honours too.
struct LaunchLimits {
    /// Demand launches allowed this tick (tokens taken).
    budget: u32,
    breaker_allowance: Option<u32>,
    backoff_until: Option<f64>,
}

impl<'a> Tick<'a> {
    fn new(config: &'a Config, now: f64) -> Self {
        let shapes = config.shapes_smallest_first();
        let plans = shapes
            .iter()
            .map(|s| ShapePlan {
                shape: s.name.clone(),
                ..ShapePlan::default()
            })
            .collect();
        let index = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        Tick {
            config,
            now,
            shapes,
            index,
            plans,
            reasons: Vec::new(),
        }
    }

    /// Rules 1 and 2: eligibility and shape choice. The eligible bundles come with their shape's
    /// index, in first-fit-decreasing order.
    fn eligibility_and_shapes<'b>(
        &mut self,
        staged: &'b [StagedBundle],
    ) -> (Vec<Unschedulable>, Vec<(&'b StagedBundle, usize)>) {
        let config = self.config;
        let mut unschedulable = Vec::new();
        let mut eligible: Vec<(&StagedBundle, usize)> = Vec::new();
        for b in staged {
            if !config.serves_queue(b.request_queue.as_deref()) {
                let reason = match (&b.request_queue, &config.worker_tag) {
                    (None, _) => {
                        "no request_queue, but this manager's workers are tag-exclusive".into()
                    }
                    (Some(q), Some(t)) => {
                        format!("request_queue {q:?} is not this manager's tag {t:?}")
                    }
                    (Some(q), None) => {
                        format!("request_queue {q:?}, but this manager has no worker tag")
                    }
                };
                unschedulable.push(Unschedulable {
                    uuid: b.uuid.clone(),
                    reason,
                });
                continue;
            }
            let need = b.request();
            let fitting = config.smallest_fitting_shape(&need).or_else(|| {
                // Without the prefilter, a bundle too large for every shape still asks for a
                // worker: a whole one of the largest shape.
                (!config.prefilter)
                    .then(|| self.shapes.last().copied())
                    .flatten()
            });
            match fitting {
                Some(s) => {
                    let i = self.index[s.name.as_str()];
                    self.plans[i].staged += 1;
                    eligible.push((b, i));
                }
                None => unschedulable.push(Unschedulable {
                    uuid: b.uuid.clone(),
                    reason: why_no_shape(config, &need),
                }),
            }
        }
        for u in &unschedulable {
            self.reasons
                .push(format!("bundle {} is unschedulable: {}", u.uuid, u.reason));
        }
        eligible.sort_by(|a, b| ffd_order(a.0, b.0));
        (unschedulable, eligible)
    }

    /// The listed jobs per shape and state.
    fn count_jobs(&mut self, jobs: &[Job]) {
        for j in jobs {
            match self.index.get(j.shape.as_str()) {
                Some(&i) => match j.state {
                    Occupancy::Pending => self.plans[i].pending += 1,
                    Occupancy::Active => self.plans[i].active += 1,
                },
                None => self.reasons.push(format!(
                    "job {} has unknown shape {:?}: counted toward --max-workers, never cancelled",
                    j.id, j.shape
                )),
            }
        }
    }

    /// Rule 3: free capacity of running workers. Returns, per shape, the requests it does not
    /// cover.
    fn idle_capacity(
        &mut self,
        jobs: &[Job],
        eligible: &[(&StagedBundle, usize)],
    ) -> Vec<Vec<Resources>> {
        let mut idle: Vec<Resources> = jobs
            .iter()
            .filter(|j| j.state == Occupancy::Active)
            .filter_map(|j| j.free)
            .collect();
        let mut remaining: Vec<Vec<Resources>> = vec![Vec::new(); self.plans.len()];
        for (b, i) in eligible {
            // Capped at the shape (only a no-prefilter bundle exceeds it): one whole worker.
            let need = b.request().min_each(&self.shapes[*i].resources());
            match idle.iter_mut().find(|f| f.fits(&need)) {
                Some(f) => {
                    f.subtract(&need);
                    self.plans[*i].covered_by_idle += 1;
                }
                None => remaining[*i].push(need),
            }
        }
        remaining
    }

    /// Rules 4 and 5: packing and pending capacity.
    fn packing_and_pending(&mut self, remaining: &[Vec<Resources>]) {
        for (i, sp) in self.plans.iter_mut().enumerate() {
            sp.workers_needed =
                pack_first_fit_decreasing(self.shapes[i].resources(), &remaining[i]);
            sp.launch_wanted = sp.workers_needed.saturating_sub(sp.pending);
            if sp.staged > 0 {
                self.reasons.push(format!(
                    "shape {}: {} staged, {} covered by idle workers, {} workers needed, {} pending, {} active",
                    sp.shape, sp.staged, sp.covered_by_idle, sp.workers_needed, sp.pending, sp.active
                ));
            }
        }
    }

    /// Rule 6: scale-down of unneeded pending jobs, newest first, keeping the min-workers floor;
    /// a job is cancelled only at the second tick in a row that does not need it.
    fn scale_down(&mut self, state: &mut PolicyState, jobs: &[Job]) -> Vec<Action> {
        let config = self.config;
        let mut actions = Vec::new();
        let before = std::mem::take(&mut state.unneeded);
        let mut cancel_room = jobs
            .len()
            .saturating_sub(config.min_workers.min(config.max_workers));
        for (i, sp) in self.plans.iter_mut().enumerate() {
            let surplus = sp.pending.saturating_sub(sp.workers_needed);
            if surplus == 0 {
                continue;
            }
            let mut pending: Vec<(usize, &Job)> = jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| j.state == Occupancy::Pending && j.shape == self.shapes[i].name)
                .collect();
            // Newest first: larger submitted_at first, unknown last; later list position first on ties.
            pending.sort_by(|(ia, a), (ib, b)| {
                let ta = a.submitted_at.unwrap_or(f64::NEG_INFINITY);
                let tb = b.submitted_at.unwrap_or(f64::NEG_INFINITY);
                tb.total_cmp(&ta).then(ib.cmp(ia))
            });
            for (_, j) in pending.into_iter().take(surplus as usize) {
                if cancel_room == 0 {
                    self.reasons.push(format!(
                        "shape {}: keeping unneeded pending job {} for --min-workers {}",
                        sp.shape, j.id, config.min_workers
                    ));
                    continue;
                }
                cancel_room -= 1;
                // The server's worker list shows a bundle's assignment only at the worker's
                // next check-in: until then a worker that has just taken a bundle still looks
                // free, and a pending job looks unneeded.
                let since = before.get(&j.id).copied();
                let unneeded_for = since.map_or(0.0, |t| (self.now - t).max(0.0));
                if since.is_none() || unneeded_for < config.cancel_grace_secs {
                    self.reasons.push(format!(
                        "shape {}: pending job {} unneeded for {unneeded_for:.0} s; cancelled \
                         once unneeded for {:.0} s over two ticks",
                        sp.shape, j.id, config.cancel_grace_secs
                    ));
                    state
                        .unneeded
                        .insert(j.id.clone(), since.unwrap_or(self.now));
                    continue;
                }
                sp.cancelled += 1;
                self.reasons.push(format!(
                    "shape {}: cancelling pending job {}: no staged bundle needed it for \
                     {unneeded_for:.0} s",
                    sp.shape, j.id
                ));
                actions.push(Action::Cancel {
                    job_id: j.id.clone(),
                });
            }
        }
        actions
    }

    /// Rule 7: the budget of demand launches under all limits (its tokens are taken).
    fn demand_budget(&mut self, state: &mut PolicyState, total_jobs: usize) -> LaunchLimits {
        let config = self.config;
        let now = self.now;
        let wanted: u32 = self.plans.iter().map(|s| s.launch_wanted).sum();
        let max_room =
            u32::try_from(config.max_workers.saturating_sub(total_jobs)).unwrap_or(u32::MAX);
        let breaker_allowance = state.breaker.allowance();
        let backoff_until = state.backoff_until().filter(|t| now < *t);
        let round_wait = state
            .last_round_at
            .map(|t| t + config.min_seconds_between_workers)
            .filter(|t| now < *t);
        let mut budget = wanted.min(max_room);
        if wanted > 0 {
            if max_room < wanted {
                self.reasons.push(format!(
                    "--max-workers {}: {} jobs exist, room for {} of {} wanted",
                    config.max_workers, total_jobs, max_room, wanted
                ));
            }
            if let Some(t) = round_wait {
                budget = 0;
                self.reasons.push(format!(
                    "--min-seconds-between-workers: next launch round at {t:.1}s"
                ));
            }
            if let Some(t) = backoff_until {
                budget = 0;
                self.reasons.push(format!(
                    "backing off after {} consecutive failed launches ({} refused, {} lost before \
                     check-in) until {t:.1}s",
                    state.failures(),
                    state.consecutive_failures,
                    state.early_exits
                ));
            }
            if let Some(a) = breaker_allowance {
                if a < budget {
                    self.reasons.push(format!(
                        "circuit breaker {:?} allows {a} launch(es)",
                        state.breaker.state
                    ));
                }
                budget = budget.min(a);
            }
            let tokens = state.bucket.available();
            if tokens < budget {
                self.reasons.push(format!(
                    "token bucket: {tokens} token(s) for {budget} launch(es)"
                ));
            }
            budget = state.bucket.take(budget);
        }
        LaunchLimits {
            budget,
            breaker_allowance,
            backoff_until,
        }
    }

    /// Rule 7b: the budget shared round-robin over shapes, while a bounded backend holds the
    /// shapes of every listed job plus this tick's launches. Returns the capacity left.
    fn grant_within_capacity(
        &mut self,
        state: &mut PolicyState,
        jobs: &[Job],
        budget: u32,
    ) -> Option<Resources> {
        let config = self.config;
        let mut free_capacity = config.capacity.map(|cap| {
            let mut used = Resources::default();
            for j in jobs {
                let shape = self
                    .index
                    .get(j.shape.as_str())
                    .map(|&i| self.shapes[i])
                    .or(config.shapes.first());
                if let Some(s) = shape {
                    used.add(&s.resources());
                }
            }
            Resources::new(
                cap.cpus.saturating_sub(used.cpus),
                cap.gpus.saturating_sub(used.gpus),
                cap.memory_bytes.saturating_sub(used.memory_bytes),
            )
        });
        let mut left = budget;
        let mut capacity_limited = false;
        // Shapes the capacity refused: free capacity only shrinks, so what they still wanted is
        // over the capacity, whatever the budget.
        let mut refused = vec![false; self.plans.len()];
        while left > 0 {
            let mut progressed = false;
            for (i, sp) in self.plans.iter_mut().enumerate() {
                if left > 0 && !refused[i] && sp.launches_granted < sp.launch_wanted {
                    let need = self.shapes[i].resources();
                    if let Some(free) = free_capacity.as_mut() {
                        if !free.fits(&need) {
                            capacity_limited = true;
                            refused[i] = true;
                            continue;
                        }
                        free.subtract(&need);
                    }
                    sp.launches_granted += 1;
                    left -= 1;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        // Tokens taken for launches the capacity refused go back.
        state.bucket.give_back(left);
        if capacity_limited {
            self.reasons.push(format!(
                "backend capacity: {} left after the listed jobs and this tick's launches",
                free_capacity.map_or_else(String::new, |f| format!(
                    "{} cpus, {} gpus, {} bytes",
                    f.cpus, f.gpus, f.memory_bytes
                ))
            ));
        }
        for (i, sp) in self.plans.iter_mut().enumerate() {
            let not_granted = sp.launch_wanted - sp.launches_granted;
            // A shape the budget never reached may not fit either: the capacity decides.
            let over = refused[i]
                || free_capacity
                    .as_ref()
                    .is_some_and(|f| not_granted > 0 && !f.fits(&self.shapes[i].resources()));
            (sp.throttled, sp.over_capacity) = if over {
                (0, not_granted)
            } else {
                (not_granted, 0)
            };
            if sp.launch_wanted > 0 {
                let why = match (sp.throttled, sp.over_capacity) {
                    (0, 0) => String::new(),
                    (t, 0) => format!(" ({t} throttled)"),
                    (_, c) => format!(" ({c} over capacity)"),
                };
                self.reasons.push(format!(
                    "shape {}: launching {} of {} wanted{why}",
                    sp.shape, sp.launches_granted, sp.launch_wanted
                ));
            }
        }
        free_capacity
    }

    /// Rule 8: the min-workers floor, with the default shape.
    fn min_workers_floor(
        &mut self,
        state: &mut PolicyState,
        total_jobs: usize,
        limits: &LaunchLimits,
        free_capacity: Option<Resources>,
    ) {
        let config = self.config;
        let granted: u32 = self.plans.iter().map(|s| s.launches_granted).sum();
        let floor = u32::try_from(config.min_workers.min(config.max_workers)).unwrap_or(u32::MAX);
        let after = u32::try_from(total_jobs)
            .unwrap_or(u32::MAX)
            .saturating_add(granted);
        if after >= floor {
            return;
        }
        let short = floor - after;
        let default = config.shapes.first();
        let mut allowed = short;
        if let Some(t) = limits.backoff_until {
            allowed = 0;
            self.reasons.push(format!(
                "--min-workers {}: short by {short}, but backing off until {t:.1}s",
                config.min_workers
            ));
        } else if let Some(a) = limits.breaker_allowance {
            allowed = allowed.min(a.saturating_sub(granted));
            if allowed < short {
                self.reasons.push(format!(
                    "--min-workers {}: short by {short}, circuit breaker {:?} allows {allowed}",
                    config.min_workers, state.breaker.state
                ));
            }
        }
        if let (Some(free), Some(d)) = (free_capacity, default) {
            let need = d.resources();
            let mut fit = 0u32;
            let mut f = free;
            while fit < allowed && f.fits(&need) {
                f.subtract(&need);
                fit += 1;
            }
            if fit < allowed {
                self.reasons.push(format!(
                    "--min-workers {}: short by {short}, backend capacity allows {fit}",
                    config.min_workers
                ));
                allowed = fit;
            }
        }
        match default {
            Some(d) if allowed > 0 => {
                let i = self.index[d.name.as_str()];
                self.plans[i].floor_launches = allowed;
                state.bucket.take(allowed);
                self.reasons.push(format!(
                    "--min-workers {}: {} jobs after demand launches, launching {allowed} of shape {}",
                    config.min_workers, after, d.name
                ));
            }
            None => self
                .reasons
                .push("--min-workers: no shape configured, nothing to launch".into()),
            Some(_) => {}
        }
    }

    /// The launch actions of the tick; a tick that launches is a round (and the half-open
    /// breaker's probe).
    fn launch_actions(&mut self, state: &mut PolicyState, actions: &mut Vec<Action>) {
        for sp in &self.plans {
            let count = sp.launches_granted + sp.floor_launches;
            if count > 0 {
                actions.push(Action::Launch {
                    shape: sp.shape.clone(),
                    count,
                });
            }
        }
        let launched: u32 = self
            .plans
            .iter()
            .map(|s| s.launches_granted + s.floor_launches)
            .sum();
        if launched > 0 {
            state.last_round_at = Some(self.now);
            if let BreakerState::HalfOpen { probe_since: None } = state.breaker.state {
                state.breaker.state = BreakerState::HalfOpen {
                    probe_since: Some(self.now),
                };
                self.reasons
                    .push("circuit breaker half-open: this launch is the probe".into());
            }
        }
    }

    /// The plan: the job total, or the listing error that stopped the tick.
    fn into_plan(
        self,
        state: &PolicyState,
        unschedulable: Vec<Unschedulable>,
        actions: Vec<Action>,
        total_jobs: Result<usize, String>,
    ) -> Plan {
        let (total_jobs, listing_error) = match total_jobs {
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e)),
        };
        Plan {
            now: self.now,
            actions,
            listing_error,
            total_jobs,
            shapes: self.plans,
            unschedulable,
            staged_unread: 0,
            breaker: state.breaker.state,
            consecutive_failures: state.failures(),
            tokens_left: state.bucket.available(),
            reasons: self.reasons,
        }
    }
}
