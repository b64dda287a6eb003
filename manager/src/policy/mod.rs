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
//!    "covered by idle" and is not a reason to launch. (A bundle the worker list shows a worker
//!    already holding, handed over between the two reads, is not staged any more: the loop drops
//!    it before planning, `control::WorkersSeen`.)
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

mod config;
mod explain;
mod limits;
mod plan;
mod resources;
mod tick;
mod tiers;

pub use config::*;
pub use explain::*;
pub use limits::*;
pub use plan::*;
pub use resources::*;
pub use tick::*;
pub use tiers::*;
