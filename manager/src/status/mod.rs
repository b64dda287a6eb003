//! What an operator sees of a running manager: one [`Status`] model, served as JSON at
//! `/status`, as an HTML page at `/` ([`crate::page`]) and printed as a table by
//! `cl-worker-manager status` ([`render_table`]). The control loop fills it every tick with the
//! help of a [`Journal`] (recent decisions, the last hour of samples, workers lost before
//! check-in); rendering and the exit code are pure functions of it.
//!
//! `journal.rs` keeps what lasts between ticks, `table.rs` prints the model, `fetch.rs` reads it
//! from a running manager.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::policy::{BreakerState, Plan, PolicyState, Resources, Shape};

mod bundles;
mod fetch;
mod journal;
mod table;

pub use bundles::{bounded, short_uuid, since_text, BUNDLES_MAX};
pub use fetch::{fetch, parse_answer, status_target, FetchError};
pub use journal::{Decision, Journal, Sample, DECISIONS_MAX, HISTORY_MAX, HISTORY_SECS};
pub use table::{bytes, clock, duration, render_table, shape_size};

/// The manager as `/status` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub backend: String,
    pub server: String,
    /// Unix time of the last tick (`None` before the first).
    pub updated_at: Option<f64>,
    pub shapes: Vec<Shape>,
    pub min_workers: usize,
    pub max_workers: usize,
    /// What a bounded backend (the `local` machine) can hold at once.
    pub capacity: Option<Resources>,
    /// The backend's pool (`azure-batch --pool-id`), when it reports one.
    pub pool: Option<serde_json::Value>,
    /// The last plan: staged bundles per shape, unschedulable ones with their reasons, actions.
    pub plan: Option<Plan>,
    /// Worker jobs per shape and state.
    pub workers: Vec<WorkerCount>,
    pub breaker: BreakerStatus,
    pub health: Health,
    /// Recent decisions, oldest first.
    pub decisions: Vec<Decision>,
    /// One sample per tick over the last hour, oldest first.
    pub history: Vec<Sample>,
    /// Why each staged bundle is not running yet, as the last plan explained it (the first
    /// [`BUNDLES_MAX`]; with several tiers, every tier's, naming the tier).
    #[serde(default)]
    pub bundles: Vec<crate::policy::BundleWait>,
    /// Staged bundles left out of `bundles`: past the first [`BUNDLES_MAX`], or counted by the
    /// server but not read at the last tick.
    #[serde(default)]
    pub bundles_unlisted: u64,
    /// With several tiers (`[[tier]]` in `--config`): each one. The rest of the status is then
    /// the first tier's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierStatus>,
    /// With `--lease`: who holds it, since when, and whether this manager is in charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<crate::lease::LeaseStatus>,
}

/// One tier of a manager that drives several.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TierStatus {
    pub name: String,
    pub backend: String,
    /// Its own cap.
    pub max_workers: usize,
    pub pending: u32,
    pub running: u32,
    /// Staged bundles routed to it at the last tick.
    pub routed: usize,
    /// Why it launches nothing now (`breaker open`, `jobs unknown`, `budget spent`), if so.
    pub held: Option<String>,
    pub overflow_after_secs: Option<f64>,
    /// `YYYY-MM` of `month_cost`.
    pub month: String,
    pub month_cost: f64,
    pub budget: Option<f64>,
    /// Since the cost file was made.
    pub total_cost: f64,
}

/// Worker jobs of one shape.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCount {
    pub shape: String,
    /// Submitted, or started but not checked in yet.
    pub pending: u32,
    /// Checked in with the server.
    pub running: u32,
    /// Jobs that ended unsuccessfully before their worker checked in, since the manager started.
    pub lost_before_checkin: u64,
}

/// The submit circuit breaker and the back-off after failed launches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BreakerStatus {
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Failed launches in a row (refused submits and workers lost before check-in).
    pub consecutive_failures: u32,
    /// Seconds until an open breaker lets a probe launch through.
    pub open_for_secs: Option<f64>,
    /// Seconds until the back-off allows the next launch (0: none).
    pub backoff_secs: f64,
}

/// Whether the last tick could read the server and the backend.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Why the staged bundles could not be read (then nothing was launched or cancelled).
    pub server_error: Option<String>,
    /// Why the backend's jobs could not be listed.
    pub backend_error: Option<String>,
    /// Why the backend's pool could not be read.
    pub pool_error: Option<String>,
}

impl Health {
    pub fn ok(&self) -> bool {
        self.server_error.is_none() && self.backend_error.is_none() && self.pool_error.is_none()
    }
}

impl BreakerStatus {
    /// The breaker and back-off of the policy state at `now`.
    pub fn of(state: &PolicyState, now: f64) -> Self {
        let (name, open_for) = match state.breaker.state {
            BreakerState::Closed => ("closed", None),
            BreakerState::Open { until } => ("open", Some((until - now).max(0.0))),
            BreakerState::HalfOpen { .. } => ("half_open", None),
        };
        BreakerStatus {
            state: name.into(),
            consecutive_failures: state.failures(),
            open_for_secs: open_for,
            backoff_secs: state.backoff_until().map_or(0.0, |t| (t - now).max(0.0)),
        }
    }
}

/// `cl-worker-manager status` exit codes: small numbers for the manager's health as it
/// answered, BSD's `sysexits.h` values for why there is no answer to judge; never 2, which is a
/// usage error (clap's, as for every command line mistake).
pub mod exit {
    /// The manager answered and is healthy.
    pub const HEALTHY: u8 = 0;
    /// The submit circuit breaker is open or half-open: launches are failing.
    pub const BREAKER_OPEN: u8 = 3;
    /// The last tick could not read the server, the backend's jobs or its pool.
    pub const DEGRADED: u8 = 4;
    /// `EX_DATAERR`: the answer was not a manager's status (or the URL is not usable).
    pub const INVALID: u8 = 65;
    /// `EX_UNAVAILABLE`: the manager could not be reached.
    pub const UNREACHABLE: u8 = 69;
    /// `EX_OSERR`: the command itself could not start (no runtime for its request).
    pub const CANNOT_START: u8 = 71;

    /// The codes as `--help` lists them.
    pub const HELP: &str = "Exit status: 0 healthy; 3 the submit circuit breaker is open or \
        half-open; 4 the last tick could not read the server, the backend's jobs or its pool; \
        65 the answer is not a manager's status (EX_DATAERR); 69 the manager cannot be reached \
        (EX_UNAVAILABLE); 71 the command could not start (EX_OSERR); 2 a usage error.";
}

impl Status {
    /// Staged bundles the manager considers (unschedulable ones included).
    pub fn staged(&self) -> usize {
        self.plan.as_ref().map_or(0, |p| p.staged_total() as usize)
    }

    /// What the staged count is made of: the unschedulable ones and, when the first bundles
    /// already decided the tick, how many were counted but not read.
    pub fn staged_note(&self) -> String {
        let Some(p) = &self.plan else {
            return "0 unschedulable".into();
        };
        let mut note = format!("{} unschedulable", p.unschedulable.len());
        if p.staged_unread > 0 {
            let _ = write!(
                note,
                "; {} not read this tick: the first {} decided it",
                p.staged_unread,
                p.staged_total() - p.staged_unread
            );
        }
        note
    }

    /// The exit code of `cl-worker-manager status` for this answer.
    pub fn exit_code(&self) -> u8 {
        if self.breaker.state != "closed" && !self.breaker.state.is_empty() {
            exit::BREAKER_OPEN
        } else if !self.health.ok() || self.lease.as_ref().is_some_and(|l| l.error.is_some()) {
            // A lease that cannot be read or renewed: no manager may be in charge.
            exit::DEGRADED
        } else {
            exit::HEALTHY
        }
    }

    /// One line for the breaker and the back-off.
    pub fn breaker_line(&self) -> String {
        let b = &self.breaker;
        let mut s = match (b.state.as_str(), b.open_for_secs) {
            ("open", Some(t)) => format!("OPEN (probe launch in {})", duration(t)),
            ("open", None) => "OPEN".to_string(),
            ("half_open", _) => "HALF-OPEN (one probe launch allowed)".to_string(),
            ("", _) => "unknown".to_string(),
            (other, _) => other.to_string(),
        };
        let _ = write!(s, ", {} failed launches in a row", b.consecutive_failures);
        if b.backoff_secs > 0.0 {
            let _ = write!(s, ", back-off {} left", duration(b.backoff_secs));
        } else {
            s.push_str(", no back-off");
        }
        s
    }

    /// One line for the server's and the backend's health.
    /// Who holds the lease and since when, and what this manager is (`--lease`); `None`
    /// without one.
    pub fn lease_line(&self) -> Option<String> {
        let l = self.lease.as_ref()?;
        let role = if l.leader {
            "this manager is in charge"
        } else {
            "this manager is a standby"
        };
        let holder = match (l.holder.as_str(), l.since) {
            ("", _) => "held by nobody".to_string(),
            (h, Some(t)) => format!("held by {h} since {}", table::clock(t)),
            (h, None) => format!("held by {h}"),
        };
        let mut s = format!(
            "{holder}: {role} ({}, {}; {})",
            l.me,
            l.lease,
            duration(l.duration_s)
        );
        if let Some(e) = &l.error {
            s.push_str(&format!("; {e}"));
        }
        Some(s)
    }

    pub fn health_line(&self) -> String {
        let h = &self.health;
        let part = |name: &str, e: &Option<String>| match e {
            None => format!("{name} ok"),
            Some(e) => format!("{name} ERROR: {e}"),
        };
        let mut parts = vec![
            part("server", &h.server_error),
            part("backend", &h.backend_error),
        ];
        if h.pool_error.is_some() || self.pool.is_some() {
            parts.push(part("pool", &h.pool_error));
        }
        parts.join("; ")
    }

    /// The pool's nodes as one line, when the backend reports a pool.
    pub fn pool_line(&self) -> Option<String> {
        let p = self.pool.as_ref()?;
        let n = |k: &str| p.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        Some(format!(
            "pool {} ({}, {}): {} dedicated + {} low-priority nodes, target {} + {}",
            p.get("id").and_then(|v| v.as_str()).unwrap_or("?"),
            p.get("state").and_then(|v| v.as_str()).unwrap_or("?"),
            p.get("allocation_state")
                .and_then(|v| v.as_str())
                .unwrap_or("?"),
            n("current_dedicated_nodes"),
            n("current_low_priority_nodes"),
            n("target_dedicated_nodes"),
            n("target_low_priority_nodes"),
        ))
    }

    /// What is wrong with the pool, a line each: the service's resize errors, the nodes that
    /// take no work, the removals asked for at the last tick, why the nodes could not be
    /// listed or removed.
    pub fn pool_problems(&self) -> Vec<String> {
        let Some(p) = self.pool.as_ref() else {
            return Vec::new();
        };
        let list = |k: &str| {
            p.get(k)
                .and_then(|v| v.as_array())
                .cloned()
                .unwrap_or_default()
        };
        let text = |v: &serde_json::Value, k: &str| {
            v.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let node = |n: &serde_json::Value| {
            let mut s = format!(
                "node {} {} for {} s",
                text(n, "id"),
                text(n, "state"),
                n.get("for_seconds").and_then(|v| v.as_u64()).unwrap_or(0)
            );
            if let Some(e) = n.get("error").and_then(|v| v.as_str()) {
                s.push_str(&format!(" ({e})"));
            }
            s
        };
        let mut out: Vec<String> = list("resize_errors")
            .iter()
            .map(|e| format!("resize error {}: {}", text(e, "code"), text(e, "message")))
            .collect();
        out.extend(list("unhealthy_nodes").iter().map(node));
        out.extend(
            list("removed_nodes")
                .iter()
                .map(|n| format!("removing {}", node(n))),
        );
        if let Some(e) = p.get("repair_error").and_then(|v| v.as_str()) {
            out.push(format!("nodes: {e}"));
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests;
