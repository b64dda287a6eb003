//! Launch limits carried from tick to tick: the token bucket, the circuit breaker, the back-off
//! state, and what the control loop records into them.

use super::*;
use serde::{Deserialize, Serialize};

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
