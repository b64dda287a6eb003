//! What the status keeps between ticks: recent decisions, the last hour of samples, workers
//! lost before check-in.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::WorkerCount;
use crate::policy::{Plan, Shape};

/// Samples older than this are dropped from the history.
pub const HISTORY_SECS: f64 = 3600.0;
/// At most this many samples (one per tick; `--sleep-time 1` for an hour).
pub const HISTORY_MAX: usize = 3600;
/// Decisions kept.
pub const DECISIONS_MAX: usize = 50;

/// One decision of the loop and its reason, as logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub at: f64,
    pub text: String,
}

/// The numbers of one tick, for the chart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub at: f64,
    pub staged: usize,
    pub pending: u32,
    pub running: u32,
    /// Workers launched in this tick.
    pub launches: u32,
}

/// What the status keeps between ticks: recent decisions, the last hour of samples and the
/// workers lost before check-in per shape. Bounded in both time and count.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    decisions: VecDeque<Decision>,
    history: VecDeque<Sample>,
    lost: BTreeMap<String, u64>,
}

impl Journal {
    /// Records a decision; the oldest is dropped past [`DECISIONS_MAX`].
    pub fn note(&mut self, at: f64, text: impl Into<String>) {
        if self.decisions.len() == DECISIONS_MAX {
            self.decisions.pop_front();
        }
        self.decisions.push_back(Decision {
            at,
            text: text.into(),
        });
    }

    /// Records a tick's sample; samples older than [`HISTORY_SECS`] before it, and the oldest
    /// past [`HISTORY_MAX`], are dropped.
    pub fn sample(&mut self, s: Sample) {
        while self
            .history
            .front()
            .is_some_and(|f| f.at < s.at - HISTORY_SECS)
            || self.history.len() >= HISTORY_MAX
        {
            self.history.pop_front();
        }
        self.history.push_back(s);
    }

    /// A worker job of `shape` was lost before its worker checked in.
    pub fn lost(&mut self, shape: &str) {
        *self.lost.entry(shape.to_owned()).or_default() += 1;
    }

    pub fn decisions(&self) -> Vec<Decision> {
        self.decisions.iter().cloned().collect()
    }

    pub fn history(&self) -> Vec<Sample> {
        self.history.iter().copied().collect()
    }

    /// Worker jobs per shape from the last plan, with the losses of every shape seen.
    pub fn workers(&self, shapes: &[Shape], plan: Option<&Plan>) -> Vec<WorkerCount> {
        let mut names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
        for n in self.lost.keys() {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
            .into_iter()
            .map(|shape| {
                let p = plan.and_then(|p| p.shape(&shape));
                WorkerCount {
                    pending: p.map_or(0, |p| p.pending),
                    running: p.map_or(0, |p| p.active),
                    lost_before_checkin: self.lost.get(&shape).copied().unwrap_or(0),
                    shape,
                }
            })
            .collect()
    }
}
