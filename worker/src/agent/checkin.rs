//! Check-ins: when the next one is due (never two at once) and what it reports.

use std::path::Path;
use std::time::{Duration, Instant};

use protocol::CheckinRequest;

use super::{Msg, Worker};

/// The soonest a checkin follows the start of one that brought a message: the server hands out
/// one message per checkin, and each checkin it answers without one waits up to 5 s on the
/// server, so the follow-up never spins (this bounds a server that answers at once with a
/// message every time).
pub(super) const MESSAGE_FOLLOW_UP: Duration = Duration::from_millis(250);
use crate::run::state::Stage;
use crate::runtime::BundleRuntime;

impl<R: BundleRuntime> Worker<R> {
    pub(super) fn may_check_in(&self) -> bool {
        !self.checkin_in_flight && !self.holding_for_late_upload()
    }

    /// A run reported `finalizing` is uploading again for a write the server accepted late: the
    /// server must not reach the worker with its `mark_finalized` before that upload is over (it
    /// makes the bundle final right after, and then refuses the upload), and it reaches the
    /// worker only through a checkin. So none starts meanwhile, for at most 30 s after the last
    /// one (the server counts a worker silent for a minute as gone).
    fn holding_for_late_upload(&self) -> bool {
        self.runs
            .values()
            .any(|r| r.state.stage == Stage::Finalizing && r.state.uploading)
            && self
                .last_checkin_end
                .is_some_and(|end| end.elapsed() < Duration::from_secs(30))
    }

    /// When the next checkin is due: at once after a state change the server can see or a
    /// websocket nudge, and soon after one that brought a message (the server may hold more:
    /// it hands out one per checkin); after a backoff following failures; else
    /// `--checkin-frequency-seconds` after the last one ended (the nudge covers messages in
    /// between).
    pub(super) fn next_checkin_at(&self) -> Option<tokio::time::Instant> {
        let now = Instant::now();
        let at = next_checkin(
            &CheckinClock {
                last: self.last_checkin_start.zip(self.last_checkin_end),
                failures: self.checkin_failures,
                at_once: self.report_wanted || self.nudged,
                messages_pending: self.messages_pending,
                frequency: self.cfg.checkin_frequency,
            },
            now,
        );
        Some(tokio::time::Instant::now() + at.saturating_duration_since(now))
    }

    pub(super) fn start_checkin(&mut self) {
        self.report_wanted = false;
        self.nudged = false;
        self.checkin_in_flight = true;
        self.last_checkin_start = Some(Instant::now());
        for run in self.runs.values_mut() {
            run.reported = Some(run.state.stage.server_state());
        }
        let body = self.checkin_body();
        let reported: Vec<String> = self
            .runs
            .values()
            .filter(|r| r.state.stage == Stage::Restaged)
            .map(|r| r.state.uuid().to_owned())
            .collect();
        tracing::debug!("checkin: {} runs", body.runs.len());
        let client = self.client.clone();
        let tx = self.tx.clone();
        let id = self.cfg.worker_id.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let result = client.checkin(&id, &body).await;
            metrics.checkin_duration.observe(t0.elapsed().as_secs_f64());
            let _ = tx.send(Msg::CheckinDone { result, reported });
        });
    }

    fn checkin_body(&self) -> CheckinRequest {
        let cfg = &self.cfg;
        // A runtime that knows the free resources of where runs go (a Kubernetes node)
        // reports those instead of the machine's.
        let (cpus, gpus, memory_bytes) = match self.runtime.capacity() {
            Some(c) => (
                u64::from(c.cpus),
                u64::from(c.gpus),
                c.memory_bytes.min(cfg.memory_bytes),
            ),
            None => (
                cfg.cpuset.len() as u64,
                cfg.gpuset.len() as u64,
                cfg.memory_bytes,
            ),
        };
        CheckinRequest {
            tag: cfg.tag.clone(),
            group_name: cfg.group.clone(),
            cpus,
            gpus,
            memory_bytes,
            free_disk_bytes: free_disk_bytes(&cfg.work_dir),
            dependencies: if cfg.shared_file_system {
                Vec::new()
            } else {
                self.deps.keys()
            },
            hostname: cfg.hostname.clone(),
            runs: self
                .runs
                .values()
                .filter(|r| !r.state.is_done())
                .map(|r| r.state.report(&cfg.worker_id))
                .collect(),
            shared_file_system: cfg.shared_file_system,
            tag_exclusive: cfg.tag_exclusive,
            exit_after_num_runs: (cfg.exit_after_num_runs - self.num_runs).max(0),
            is_terminating: self.terminating || self.draining,
            preemptible: cfg.preemptible,
        }
    }
}

/// Free bytes available to this user on the work dir's file system (0 if unknown: the server
/// cannot handle null).
pub fn free_disk_bytes(path: &Path) -> u64 {
    nix::sys::statvfs::statvfs(path)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

/// What decides when the next checkin goes.
pub(super) struct CheckinClock {
    /// The last checkin's start and end.
    pub last: Option<(Instant, Instant)>,
    /// Checkins failed in a row.
    pub failures: u32,
    /// A state change the server can see, or a websocket nudge.
    pub at_once: bool,
    /// The last checkin brought a message.
    pub messages_pending: bool,
    /// `--checkin-frequency-seconds`.
    pub frequency: Duration,
}

/// When the next checkin is due (pure): see [`Worker::next_checkin_at`].
pub(super) fn next_checkin(c: &CheckinClock, now: Instant) -> Instant {
    let Some((start, end)) = c.last else {
        return now;
    };
    if c.failures > 0 {
        // Back off: 1, 2, 4 … 16 s (runs must be reported at least every 60 s).
        return start + Duration::from_secs(1 << c.failures.min(5).saturating_sub(1));
    }
    if c.at_once {
        return now;
    }
    if c.messages_pending {
        return (start + MESSAGE_FOLLOW_UP).max(now);
    }
    end + c.frequency
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_disk_is_a_number() {
        assert!(free_disk_bytes(Path::new("/")) > 0);
        assert_eq!(free_disk_bytes(Path::new("/nonexistent/x")), 0);
    }

    #[test]
    fn a_checkin_that_brought_a_message_is_followed_soon_never_in_a_spin() {
        let t0 = Instant::now();
        let clock = |messages_pending, at_once, failures| CheckinClock {
            last: Some((t0, t0 + Duration::from_millis(20))),
            failures,
            at_once,
            messages_pending,
            frequency: Duration::from_secs(5),
        };
        let now = t0 + Duration::from_millis(30);
        // A message: the next one 250 ms after the last one's start, not 5 s after its end.
        assert_eq!(
            next_checkin(&clock(true, false, 0), now),
            t0 + MESSAGE_FOLLOW_UP
        );
        // Later than that: at once.
        let late = t0 + Duration::from_secs(1);
        assert_eq!(next_checkin(&clock(true, false, 0), late), late);
        // No message: the checkin frequency after the end.
        assert_eq!(
            next_checkin(&clock(false, false, 0), now),
            t0 + Duration::from_millis(20) + Duration::from_secs(5)
        );
        // A state change goes at once; failures back off, messages or not.
        assert_eq!(next_checkin(&clock(true, true, 0), now), now);
        assert_eq!(
            next_checkin(&clock(true, false, 3), now),
            t0 + Duration::from_secs(4)
        );
        // The first checkin goes at once.
        let first = CheckinClock {
            last: None,
            ..clock(false, false, 0)
        };
        assert_eq!(next_checkin(&first, now), now);
    }
}
