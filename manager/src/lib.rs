//! `cl-worker-manager`: the Rust replacement of CodaLab's worker manager.
//!
//! - [`app`]: the start-up the binary runs (the backend picked by one `match`, the common and the
//!   backend's own set-up, then the loop); `main.rs` is only the command line and the exit;
//! - [`policy`]: the scaling policy, a pure function from observations (staged bundles, this
//!   manager's backend jobs, the clock) to actions (launch workers of a shape, cancel a job);
//! - [`control`]: the thin control loop around it (server and backend I/O);
//! - [`cli`]: Python's flags; [`settings`]: the typed settings built from them and the worker
//!   command line; [`config`]: the TOML shapes file;
//! - [`metrics`]: Prometheus metrics and the HTTP endpoints of `--metrics-addr`; [`status`]: the
//!   status model, its table (`cl-worker-manager status`) and its JSON; [`page`]: the status
//!   page at `/`.

pub mod app;
pub mod cli;
pub mod config;
pub mod control;
pub mod lease;
pub mod metrics;
pub mod page;
pub mod policy;
pub mod settings;
pub mod setup;
pub mod status;
pub mod tiers;

pub use policy::{
    pack_first_fit_decreasing, plan, record_checkin, record_early_exit, record_submit,
    staged_prefix_decides, Action, BreakerState, CircuitBreaker, Config, ConfigError, Job,
    Observation, Occupancy, Plan, PolicyState, Resources, Shape, ShapePlan, StagedBundle,
    SubmitFailure, TokenBucket, Unschedulable,
};
