//! Check-ins: when the next one is due (never two at once) and what it reports.

use std::path::Path;
use std::time::{Duration, Instant};

use protocol::CheckinRequest;

use super::{Msg, Worker};
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
    /// websocket nudge; after a backoff following failures; else `--checkin-frequency-seconds`
    /// after the last one ended (the nudge covers messages in between, as with the Python
    /// worker).
    pub(super) fn next_checkin_at(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let (Some(start), Some(end)) = (self.last_checkin_start, self.last_checkin_end) else {
            return Some(now);
        };
        if self.checkin_failures > 0 {
            // Back off: 1, 2, 4 … 16 s (runs must be reported at least every 60 s).
            let delay = Duration::from_secs(1 << self.checkin_failures.min(5).saturating_sub(1));
            return Some(tokio::time::Instant::from_std(start) + delay);
        }
        if self.report_wanted || self.nudged {
            return Some(now);
        }
        Some(tokio::time::Instant::from_std(end) + self.cfg.checkin_frequency)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_disk_is_a_number() {
        assert!(free_disk_bytes(Path::new("/")) > 0);
        assert_eq!(free_disk_bytes(Path::new("/nonexistent/x")), 0);
    }
}
