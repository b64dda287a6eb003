//! Several backends in one manager ("tiers", in priority order): on-premises first, the cloud
//! when bundles have waited too long, with the cost in sight. `config.rs` reads and checks the
//! `[[tier]]` sections of `--config`; `run.rs` is the loop over every tier (one read of the
//! staged bundles, the routing of [`crate::policy::route`], each tier's own policy on its
//! share); `cost.rs` the worker-seconds and cost per tier and shape, kept across restarts;
//! `start.rs` the start-up (`cl-worker-manager --config FILE` without a backend subcommand).

pub mod config;
pub mod cost;
pub mod run;
pub mod start;
