//! `cl-worker-manager`: the Rust replacement of CodaLab's worker manager.
//!
//! For now this crate holds the scaling policy, a pure function from observations (staged bundles,
//! this manager's backend jobs, the clock) to actions (launch workers of a shape, cancel a pending job),
//! see [`policy`]; and the command line with the worker command it builds, see [`cli`]. The binary, the
//! control loop and the backends come later.

pub mod cli;
pub mod policy;

pub use policy::{
    pack_first_fit_decreasing, plan, record_submit, Action, BreakerState, CircuitBreaker, Config,
    ConfigError, Job, JobState, Observation, Plan, PolicyState, Resources, Shape, ShapePlan,
    StagedBundle, SubmitFailure, TokenBucket, Unschedulable,
};
