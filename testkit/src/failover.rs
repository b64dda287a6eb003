//! Two managers, one in charge (`--lease`): the failover scenario the Slurm and Kubernetes
//! end-to-end tests run against their backend.
//!
//! 1. `a` takes the lease; `b` starts as a standby and says who holds it.
//! 2. Three bundles are staged; `a` launches the first worker (one launch every 5 s: the burst
//!    spans several ticks) and is killed (SIGKILL) mid-burst. `b` takes over within two lease
//!    periods, counts `a`'s job in its first plan (adopted from the backend's listing) and
//!    launches the rest: every bundle ends ready, no job was launched twice, at most one per
//!    bundle, and the backend holds no job that neither launched.
//! 3. `c` starts as a standby; `b` is stopped (SIGSTOP) past its lease. `c` takes over within two
//!    lease periods and launches the worker of a fourth bundle. `b` is continued (SIGCONT): it
//!    launches nothing more, says it is no longer in charge, and its status names `c`.
//! 4. `c` stops (SIGTERM) and hands the lease back: `b` takes it at its next look.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::manager::ManagerProc;
use crate::wait_until;

/// What a backend's test gives the scenario.
pub struct Failover<'a> {
    /// The lease's duration (`--lease-duration-seconds`, given by `start`).
    pub lease_s: u64,
    /// Starts a manager with `--lease-identity <id>` and the test's `--lease`, the policy file
    /// of [`policy_file`] and `--metrics-addr`.
    pub start: &'a dyn Fn(&str) -> ManagerProc,
    /// Stages `n` bundles that each need a worker of their own for a while; their uuids.
    pub stage: &'a dyn Fn(usize) -> Vec<String>,
    /// The backend's live jobs of this test (job ids as the managers log them).
    pub jobs: &'a dyn Fn() -> Vec<String>,
}

/// Stages `n` bundles of `cl` in queue `tag` that each run for 25 s with `memory`, waiting
/// until the server has staged each.
pub fn stage_sleepers(cl: &crate::cl::Cl, tag: &str, memory: &str, n: usize) -> Vec<String> {
    use crate::cl::{wait_for, T};
    (0..n)
        .map(|i| {
            let u = cl.run_bundle(
                tag,
                &["--request-memory", memory],
                &format!("sleep 25; echo lease {i}"),
            );
            wait_for(&crate::peers::peer().client(), &u, T, |s| s == "staged");
            u
        })
        .collect()
}

/// Waits until a bundle has ended, and asserts that it is ready.
fn assert_ready(uuid: &str) {
    use crate::cl::{is_final, wait_for};
    let client = crate::peers::peer().client();
    let b = wait_for(&client, uuid, Duration::from_secs(240), is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}");
}

/// What the closing note reports.
#[derive(Debug)]
pub struct Report {
    /// SIGKILL of the holder → `b` in charge.
    pub takeover_after_kill: Duration,
    /// SIGSTOP of the holder → `c` in charge.
    pub takeover_after_stop: Duration,
    /// The jobs launched for the three bundles of the burst (3, or fewer where a worker took
    /// two of them), and after the fourth bundle.
    pub jobs_after_burst: usize,
    pub jobs_after_stop: usize,
    /// Every job id the three managers logged launching, read once the scenario has ended
    /// (each once: asserted).
    pub launched: BTreeSet<String>,
}

/// A `--config` file that launches one worker at a time, one every 5 s.
pub fn policy_file(dir: &std::path::Path) -> String {
    let path = dir.join("failover-policy.toml");
    std::fs::write(
        &path,
        "[policy]\nlaunch_burst = 1\nlaunch_rate_per_sec = 0.2\n",
    )
    .unwrap();
    path.display().to_string()
}

fn lease_of(m: &ManagerProc) -> Value {
    let s: Value = serde_json::from_str(&m.get("/status")).unwrap_or(Value::Null);
    s["lease"].clone()
}

fn signal(m: &ManagerProc, sig: &str) {
    let pid = m.child.id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

fn wait_in_charge(m: &ManagerProc, what: &str, timeout: Duration) -> Duration {
    let t0 = Instant::now();
    assert!(
        m.wait_log(what, timeout),
        "no {what:?} within {timeout:?}\n{}",
        m.log_text()
    );
    t0.elapsed()
}

/// Job ids launched by the managers, from their logs.
fn launched(ms: &[&ManagerProc]) -> Vec<String> {
    ms.iter()
        .flat_map(|m| m.launched().into_iter().map(|(id, _)| id))
        .collect()
}

pub fn run(f: &Failover) -> Report {
    let period = Duration::from_secs(f.lease_s);
    let a = (f.start)("a");
    wait_in_charge(&a, "acquired; this manager is in charge", period * 2);
    let b = (f.start)("b");
    wait_until(period * 2, "b a standby that names a", || {
        let l = lease_of(&b);
        l["holder"] == "a" && l["leader"] == false && l["me"] == "b"
    });
    let metrics = b.get("/metrics");
    assert!(metrics.contains("cl_worker_manager_leader 0"), "{metrics}");

    // The burst: `a` launches the first worker and is killed.
    let uuids = (f.stage)(3);
    wait_until(Duration::from_secs(60), "a's first launch", || {
        a.launches() >= 1
    });
    let mut a = a;
    a.child.kill().unwrap();
    let killed = Instant::now();
    a.child.wait().unwrap();
    wait_in_charge(
        &b,
        "taken over from \"a\"",
        period * 2 + Duration::from_secs(2),
    );
    let takeover_after_kill = killed.elapsed();
    assert!(
        takeover_after_kill <= period * 2,
        "b took over {takeover_after_kill:?} after a's death: more than two lease periods"
    );
    // `b` adopts `a`'s job from the backend's listing before it plans: its first plan counts
    // it (a worker that had not taken every bundle yet is pending or active there).
    wait_until(Duration::from_secs(30), "b's first plan", || {
        first_plan_after(&b.log_text(), "taken over").is_some()
    });
    let first = first_plan_after(&b.log_text(), "taken over").unwrap();
    assert!(
        !first.contains(" 0 pending, 0 active"),
        "b planned without a's job: {first}\n{}",
        b.log_text()
    );
    // Every bundle runs; the backend then holds only jobs that `a` or `b` launched, each once,
    // and no more than one per bundle (a worker may take two of them: then fewer are wanted).
    for u in &uuids {
        assert_ready(u);
    }
    let ids = launched(&[&a, &b]);
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a job launched twice: {ids:?}");
    assert!(
        (1..=3).contains(&ids.len()),
        "{} jobs for 3 bundles: {ids:?}\n{}",
        ids.len(),
        b.log_text()
    );
    let live: BTreeSet<String> = (f.jobs)().into_iter().collect();
    assert!(
        live.iter().all(|j| unique.contains(j)),
        "the backend holds a job no manager launched (an orphan): {live:?} vs {ids:?}"
    );
    let jobs_after_burst = ids.len();
    // The workers exit once idle: the next bundle needs a worker of its own.
    wait_until(Duration::from_secs(120), "every worker job ended", || {
        (f.jobs)().is_empty()
    });

    // A stopped holder: `c` takes over; `b`, continued, launches nothing more.
    let c = (f.start)("c");
    wait_until(period * 2, "c a standby that names b", || {
        lease_of(&c)["holder"] == "b"
    });
    signal(&b, "-STOP");
    let stopped = Instant::now();
    wait_in_charge(
        &c,
        "taken over from \"b\"",
        period * 2 + Duration::from_secs(2),
    );
    let takeover_after_stop = stopped.elapsed();
    assert!(takeover_after_stop <= period * 2, "{takeover_after_stop:?}");
    let b_launches = b.launches();
    let fourth = (f.stage)(1);
    wait_until(
        Duration::from_secs(60),
        "c launches the fourth worker",
        || c.launches() >= 1,
    );
    let jobs_after_stop = launched(&[&a, &b, &c]).len();
    assert_eq!(c.launches(), 1, "{}", c.log_text());
    signal(&b, "-CONT");
    wait_in_charge(&b, "no longer in charge", period);
    c.wait_ticks(3);
    assert_eq!(
        b.launches(),
        b_launches,
        "b launched after SIGCONT\n{}",
        b.log_text()
    );
    let l = lease_of(&b);
    assert_eq!(
        (l["holder"].as_str(), l["leader"].as_bool()),
        (Some("c"), Some(false)),
        "{l}"
    );
    assert_eq!(jobs_after_stop, jobs_after_burst + 1, "{}", c.log_text());
    assert_ready(&fourth[0]);

    // A clean stop hands the lease back: `b` takes it at its next look.
    let mut c = c;
    assert!(c.terminate().success(), "{}", c.log_text());
    assert!(c.log_text().contains("handed back"), "{}", c.log_text());
    wait_in_charge(
        &b,
        "acquired; this manager is in charge",
        Duration::from_secs(5),
    );
    let all = launched(&[&a, &b, &c]);
    let launched: BTreeSet<String> = all.iter().cloned().collect();
    assert_eq!(launched.len(), all.len(), "a job launched twice: {all:?}");
    let report = Report {
        takeover_after_kill,
        takeover_after_stop,
        jobs_after_burst,
        jobs_after_stop,
        launched,
    };
    eprintln!("failover: {report:?}");
    report
}

/// The first plan line (`shape …: N staged, …`) logged after the line holding `marker`.
fn first_plan_after(log: &str, marker: &str) -> Option<String> {
    log.lines()
        .skip_while(|l| !l.contains(marker))
        .find(|l| l.contains(" staged, ") && l.contains(" active"))
        .map(str::to_owned)
}
