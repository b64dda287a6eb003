//! A run's exit as Docker announces it. The engine stamps a container's `die` event, with its
//! exit code, as soon as the process is gone; it answers the container's wait and inspections
//! only after it has torn down the container's network endpoints and unmounted it, about 50 ms
//! later on a bridge network (measured on Docker 20.10+: inspection blocked 47–63 ms after
//! `die`, 7–10 ms with no network). The worker's wait listens for both and takes the first;
//! what the event said answers the inspection that follows, so the upload of a finished run
//! starts while the engine is still tearing down its container. An OOM kill is the daemon's
//! to tell: a run that had one (an `oom` event: a process of it was killed, even if the run
//! went on and exited 0) or that ends with a SIGKILL's code is inspected as before.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::runtime::RunStatus;

/// The runs' start times (as the worker saw their start return) and exits (as their `die`
/// events told them), by container id.
#[derive(Default)]
pub struct Exits {
    runs: Mutex<HashMap<String, Seen>>,
}

#[derive(Clone, Default)]
struct Seen {
    name: String,
    started_at: f64,
    exited: Option<(i64, f64)>,
    oom: bool,
}

/// A SIGKILL's exit code: the kernel's OOM killer also ends a run with it, and only the
/// daemon's inspection tells whether it did.
const KILLED: i64 = 137;

impl Exits {
    /// The container `id` (named `name`) started at `at` (Unix seconds).
    pub fn started(&self, id: &str, name: &str, at: f64) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.insert(
            id.to_owned(),
            Seen {
                name: name.to_owned(),
                started_at: at,
                ..Seen::default()
            },
        );
    }

    /// The container's `die` event: its exit code and time (Unix seconds).
    pub fn died(&self, id: &str, code: i64, at: f64) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = runs.get_mut(id) {
            seen.exited = Some((code, at));
        }
    }

    /// The container's `oom` event: the kernel killed a process of it.
    pub fn oom(&self, id: &str) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = runs.get_mut(id) {
            seen.oom = true;
        }
    }

    /// The start time of a container this worker started, if it did (since its own start).
    pub fn started_at(&self, id: &str) -> Option<f64> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.get(id).map(|s| s.started_at)
    }

    /// The run's end as its `die` event told it, when that says all an inspection would: the
    /// worker started it, no `oom` event came, and the code is not a SIGKILL's (which may be an
    /// OOM kill).
    pub fn status(&self, id: &str) -> Option<RunStatus> {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let seen = runs.get(id).filter(|s| !s.oom)?;
        let (code, finished_at) = seen.exited?;
        let started_at = seen.started_at;
        (code != KILLED).then_some(RunStatus {
            running: false,
            exit_code: Some(code),
            oom_killed: false,
            started_at: Some(started_at),
            finished_at: Some(finished_at.max(started_at)),
            failure: None,
        })
    }

    /// The container named `name` is removed.
    pub fn forget(&self, name: &str) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.retain(|_, s| s.name != name);
    }
}

/// The exit code and time (Unix seconds) of a `die` event.
pub fn die_of(ev: &bollard::models::EventMessage) -> Option<(i64, f64)> {
    if ev.action.as_deref() != Some("die") {
        return None;
    }
    let code = ev
        .actor
        .as_ref()?
        .attributes
        .as_ref()?
        .get("exitCode")?
        .parse()
        .ok()?;
    let at = ev
        .time_nano
        .map(|n| (n / 1_000_000_000) as f64 + (n % 1_000_000_000) as f64 / 1e9)
        .or(ev.time.map(|s| s as f64))?;
    Some((code, at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{EventActor, EventMessage};

    fn die(code: &str) -> EventMessage {
        EventMessage {
            action: Some("die".into()),
            actor: Some(EventActor {
                id: Some("c1".into()),
                attributes: Some(HashMap::from([("exitCode".into(), code.into())])),
            }),
            time: Some(1_700_000_010),
            time_nano: Some(1_700_000_010_250_000_000),
            ..Default::default()
        }
    }

    #[test]
    fn a_die_event_gives_the_code_and_its_time() {
        assert_eq!(die_of(&die("3")), Some((3, 1_700_000_010.25)));
        let mut other = die("0");
        other.action = Some("stop".into());
        assert_eq!(die_of(&other), None);
        assert_eq!(die_of(&die("x")), None);
    }

    #[test]
    fn the_event_answers_for_a_run_started_here_and_not_killed() {
        let e = Exits::default();
        e.died("c0", 0, 5.0); // never started here: ignored
        assert_eq!(e.status("c0"), None);
        e.started("c1", "codalab_run_a", 100.0);
        assert_eq!(e.status("c1"), None, "still running");
        e.died("c1", 2, 103.5);
        assert_eq!(
            e.status("c1"),
            Some(RunStatus {
                running: false,
                exit_code: Some(2),
                oom_killed: false,
                started_at: Some(100.0),
                finished_at: Some(103.5),
                failure: None,
            })
        );
        e.started("c2", "codalab_run_b", 100.0);
        e.died("c2", KILLED, 101.0);
        assert_eq!(
            e.status("c2"),
            None,
            "a SIGKILL may be OOM: the daemon says"
        );
        e.started("c3", "codalab_run_c", 100.0);
        e.oom("c3");
        e.died("c3", 0, 102.0);
        assert_eq!(
            e.status("c3"),
            None,
            "a process was OOM-killed: the daemon says"
        );
        e.forget("codalab_run_a");
        assert_eq!(e.status("c1"), None);
        assert_eq!(e.started_at("c2"), Some(100.0));
    }
}
