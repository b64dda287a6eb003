//! The lease's state machine, pure: what to write after each read, when this manager may act,
//! when to look again. No clock of its own: `now` is a monotonic reading in seconds (the I/O
//! loop's `Instant`s since its start), `wall` the Unix time written into the record for people
//! to read. Decisions use only `now`, so two hosts whose wall clocks disagree by any amount
//! never act at once:
//!
//! - a holder acts only until `renew_deadline` (⅔ of the lease) after the *start* of its last
//!   successful write;
//! - a standby takes the lease over only after it has seen the same record, unchanged, for the
//!   whole lease duration *on its own clock*, counted from a read that came after that write;
//!   and its takeover is a compare-and-swap on the version it saw, which fails if the holder
//!   renewed meanwhile.
//!
//! So the holder stops acting at least ⅓ of the lease before anyone else may start, whatever
//! the wall clocks say; only a difference in the *rate* of the two monotonic clocks (parts per
//! million) eats into that margin.

use serde::{Deserialize, Serialize};

/// What is stored where the lease lives (the fields of a Kubernetes `Lease`'s spec).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Who holds it; empty once released.
    pub holder: String,
    /// Seconds after its last renewal that the holder gives others before they may take it.
    pub duration_s: f64,
    /// Unix time the holder took it (for people; never used to decide).
    pub acquired_at: f64,
    /// Unix time of its last renewal (for people; never used to decide).
    pub renewed_at: f64,
    /// How many times it changed hands.
    pub transitions: u32,
}

/// One read of the lease: the record and its version (`None`: there is none yet).
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub record: Option<Record>,
    pub version: Option<String>,
}

/// A compare-and-swap write: create where there is none, or replace the version read.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Create(Record),
    Replace { record: Record, version: String },
}

impl Write {
    pub fn record(&self) -> &Record {
        match self {
            Write::Create(r) | Write::Replace { record: r, .. } => r,
        }
    }
}

/// The lease's periods, from its duration (Kubernetes' leader election's proportions: a 15 s
/// lease, acting until 10 s after a renewal, renewing every 5 s, retrying every 2 s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub duration: f64,
    /// A holder acts until this long after the start of its last successful renewal.
    pub renew_deadline: f64,
    /// A holder renews this long after its last successful renewal.
    pub renew_every: f64,
    /// A failed renewal is tried again, and a standby looks, this often.
    pub retry: f64,
}

impl Timing {
    pub fn of(duration: f64) -> Self {
        Timing {
            duration,
            renew_deadline: duration * 2.0 / 3.0,
            renew_every: duration / 3.0,
            retry: (duration / 7.5).clamp(0.05, 2.0),
        }
    }
}

/// What changed at one step, for the log and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// This manager took the lease (from `previous`, empty if it was free).
    Acquired { previous: String },
    /// This manager stopped acting: someone else holds the lease, or it could not renew in
    /// time.
    Lost { why: String },
}

/// One manager's view of the lease.
#[derive(Debug, Clone)]
pub struct Elector {
    pub me: String,
    pub timing: Timing,
    /// The other holder's record last seen, its version, and since when (monotonic) it has
    /// been seen unchanged.
    seen: Option<(Option<String>, String, f64, f64)>,
    /// Monotonic time until which this manager may act (`None`: standby).
    acting_until: Option<f64>,
    /// Monotonic start of the last successful renewal.
    renewed: Option<f64>,
    /// A write or read failed at that monotonic time: try again after `retry`.
    failed_at: Option<f64>,
    /// The record last read or written.
    pub last: Option<Record>,
}

impl Elector {
    pub fn new(me: impl Into<String>, timing: Timing) -> Self {
        Elector {
            me: me.into(),
            timing,
            seen: None,
            acting_until: None,
            renewed: None,
            failed_at: None,
            last: None,
        }
    }

    /// Whether this manager may launch or cancel at `now`.
    pub fn may_act(&self, now: f64) -> bool {
        self.acting_until.is_some_and(|t| now < t)
    }

    /// The monotonic time until which it may act, if it holds the lease.
    pub fn acting_until(&self) -> Option<f64> {
        self.acting_until
    }

    /// Steps down when the deadline has passed without a renewal.
    pub fn tick(&mut self, now: f64) -> Option<Transition> {
        match self.acting_until {
            Some(t) if now >= t => {
                self.acting_until = None;
                Some(Transition::Lost {
                    why: format!(
                        "could not renew the lease within {:.0} s",
                        self.timing.renew_deadline
                    ),
                })
            }
            _ => None,
        }
    }

    /// After a read at `now`: what to write, if anything, and whether this manager lost the
    /// lease by it.
    pub fn on_read(
        &mut self,
        read: &Read,
        now: f64,
        wall: f64,
    ) -> (Option<Write>, Option<Transition>) {
        self.failed_at = None;
        self.last = read.record.clone();
        let Some(r) = &read.record else {
            self.seen = None;
            let lost = self.step_down("the lease is gone");
            let record = Record {
                holder: self.me.clone(),
                duration_s: self.timing.duration,
                acquired_at: wall,
                renewed_at: wall,
                transitions: 0,
            };
            return (Some(Write::Create(record)), lost);
        };
        let version = read.version.clone().unwrap_or_default();
        if r.holder == self.me {
            self.seen = None;
            // Ours: renewed when due (a first read after a restart with the same id renews
            // at once).
            let due = self
                .renewed
                .is_none_or(|t| now - t >= self.timing.renew_every);
            let write = due.then(|| Write::Replace {
                record: Record {
                    renewed_at: wall,
                    duration_s: self.timing.duration,
                    ..r.clone()
                },
                version,
            });
            return (write, None);
        }
        let lost = self.step_down(&format!("{:?} holds the lease", r.holder));
        let key = (read.version.clone(), r.holder.clone(), r.renewed_at);
        let since = match &self.seen {
            Some((v, h, at, since)) if (v, h, *at) == (&key.0, &key.1, key.2) => *since,
            _ => {
                self.seen = Some((key.0, key.1, key.2, now));
                now
            }
        };
        let expired = r.holder.is_empty() || now - since >= r.duration_s;
        let write = expired.then(|| Write::Replace {
            record: Record {
                holder: self.me.clone(),
                duration_s: self.timing.duration,
                acquired_at: wall,
                renewed_at: wall,
                transitions: r.transitions + u32::from(!r.holder.is_empty()),
            },
            version,
        });
        (write, lost)
    }

    fn step_down(&mut self, why: &str) -> Option<Transition> {
        self.renewed = None;
        self.acting_until.take().map(|_| Transition::Lost {
            why: why.to_owned(),
        })
    }

    /// The outcome of `write`, which started at monotonic `started`: `Ok` if it was stored.
    pub fn on_write(&mut self, write: &Write, stored: bool, started: f64) -> Option<Transition> {
        if !stored {
            self.failed_at = Some(started);
            return None;
        }
        let record = write.record();
        self.last = Some(record.clone());
        if record.holder != self.me {
            return None;
        }
        let was_acting = self.acting_until.is_some();
        self.renewed = Some(started);
        self.acting_until = Some(started + self.timing.renew_deadline);
        let previous = match (write, self.seen.take()) {
            (Write::Replace { .. }, Some((_, holder, _, _))) => holder,
            _ => String::new(),
        };
        (!was_acting).then_some(Transition::Acquired { previous })
    }

    /// A read or a write could not be made at `now`.
    pub fn on_error(&mut self, now: f64) {
        self.failed_at = Some(now);
    }

    /// When to read again (monotonic).
    pub fn next_round(&self, now: f64) -> f64 {
        if let Some(t) = self.failed_at {
            return (t + self.timing.retry).max(now);
        }
        match self.renewed {
            Some(t) if self.acting_until.is_some() => (t + self.timing.renew_every).max(now),
            _ => now + self.timing.retry,
        }
    }

    /// The write that hands the lease back on shutdown (holder empty: a standby takes it at
    /// its next look), if this manager holds it in `read`.
    pub fn release(&mut self, read: &Read, wall: f64) -> Option<Write> {
        let r = read.record.as_ref().filter(|r| r.holder == self.me)?;
        self.acting_until = None;
        Some(Write::Replace {
            record: Record {
                holder: String::new(),
                renewed_at: wall,
                ..r.clone()
            },
            version: read.version.clone().unwrap_or_default(),
        })
    }
}
