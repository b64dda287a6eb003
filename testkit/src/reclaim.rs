//! What every backend's reclaim test checks once it has reclaimed the worker running a bundle
//! (issue: reclaimed capacity): the run is handed back long before it could have finished,
//! then run again from the start by another worker to `ready`, with one result and no
//! container of either attempt left behind.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::cl::{is_final, wait_for, Cl, T};
use crate::manager::{metric_sum, ManagerProc};
use crate::peers::peer;

/// The command of a reclaim test's bundle: its output tells a rerun from the start ("start",
/// then "done" 30 s later) from a continued or duplicated run.
pub const BUNDLE: &str = "echo start; sleep 30; echo done";

/// The containers of bundle `uuid` on this machine's Docker engine (any attempt's), by the
/// worker's label.
pub fn containers_of(uuid: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-a", "-q", "--filter"])
        .arg(format!("label=org.codalab.bundle-uuid={uuid}"))
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// After a reclaim at `t0` of the worker running `uuid` (a [`BUNDLE`]): handed back within
/// `hand_back` (staged again, or already taken by another worker; never finished by the
/// reclaimed one), then `ready` with the rerun's output alone and no container left. Both
/// times go to the fault report (`reclaim, <what>: …`). `log` gives the manager's log for
/// failure messages.
pub fn assert_handed_back_then_ready(
    cl: &Cl,
    uuid: &str,
    t0: Instant,
    hand_back: Duration,
    what: &str,
    log: impl Fn() -> String,
) {
    let client = peer().client();
    let b = wait_for(&client, uuid, hand_back + Duration::from_secs(30), |s| {
        s != "running"
    });
    let handed_back = t0.elapsed();
    let s = b.state().unwrap_or_default().to_string();
    assert!(
        ["staged", "starting", "preparing"].contains(&s.as_str()),
        "after the reclaim ({what}): {b:?}\n{}",
        log()
    );
    assert!(
        handed_back < hand_back,
        "handed back after {handed_back:?} ({what})\n{}",
        log()
    );
    let b = wait_for(&client, uuid, T * 2, is_final);
    let took = t0.elapsed();
    // What the reclaim cost: the run's end or its one result (the rerun's).
    let mut lost = Vec::new();
    if b.state() != Some("ready") {
        lost.push(format!("the run ended {:?}", b.state()));
    }
    let out = cl
        .command(&["cat", &format!("{uuid}/stdout")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if out != "start\ndone\n" {
        lost.push(format!("its output is {out:?}, not the rerun's alone"));
    }
    if !lost.is_empty() {
        eprintln!("{what}: {b:?}\n{}", log());
    }
    crate::fault_report(
        &format!("reclaim, {what}"),
        &format!(
            "handed back after {:.1} s, reclaim-to-ready {:.1} s (the rerun's 30 s included)",
            handed_back.as_secs_f64(),
            took.as_secs_f64()
        ),
        &lost,
    );
    let t1 = Instant::now();
    while !containers_of(uuid).is_empty() {
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "{what}: containers left: {:?}",
            containers_of(uuid)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The manager counted exactly one interrupted worker
/// (`cl_worker_manager_workers_interrupted_total`): the reclaimed one.
pub fn assert_one_interrupted(m: &ManagerProc) {
    assert_eq!(
        metric_sum(
            &m.get("/metrics"),
            "cl_worker_manager_workers_interrupted_total"
        ),
        1.0,
        "{}",
        m.log_text()
    );
}
