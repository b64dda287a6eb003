//! Two managers, one in charge, on the real Slurm: the lease is a file in a local directory
//! (`--lease file:…`, under the dependency cache's NFS-safe lock), the scenario of
//! `testkit::failover` (SIGKILL of the holder mid-burst, SIGSTOP past its lease, a clean stop).

use std::time::Duration;

use testkit::failover::{policy_file, run, Failover};
use testkit::slurm::run as slurm;
use testkit::{cl::*, peers::*, worker::*};

use super::{cancel_all, start_manager, wait_node_idle};

#[test]
fn two_managers_on_a_file_lease_one_launches_and_the_other_takes_over() {
    // Up to three one-CPU jobs at once: the node to themselves.
    wait_node_idle();
    let cl = Cl::new("slurm-lease");
    let tag = unique("clw-slurm-lease");
    let job_name = unique("wl");
    let dir = tempfile::tempdir().unwrap();
    let lease = format!("file:{}", dir.path().join("leases/manager.lease").display());
    let policy = policy_file(dir.path());
    let lease_s = 6;
    let start = |id: &str| {
        let d = dir.path().join(id);
        std::fs::create_dir_all(&d).unwrap();
        start_manager(
            &d,
            &tag,
            &job_name,
            &[
                "--max-workers",
                "4",
                "--metrics-addr",
                "127.0.0.1:0",
                "--config",
                &policy,
                "--lease",
                &lease,
                "--lease-duration-seconds",
                &lease_s.to_string(),
                "--lease-identity",
                id,
            ],
            &["--memory-mb", "512"],
        )
    };
    let stage = |n: usize| {
        (0..n)
            .map(|i| {
                let u = cl.run_bundle(
                    &tag,
                    &["--request-memory", "512m"],
                    &format!("sleep 25; echo lease {i}"),
                );
                wait_for(&peer().client(), &u, T, |s| s == "staged");
                u
            })
            .collect()
    };
    let prefix = format!("root-{job_name}-");
    let jobs = || {
        slurm("squeue", &["-h", "-o", "%i %j"])
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, name)| name.starts_with(&prefix))
            .map(|(id, _)| id.to_string())
            .collect()
    };
    let ready = |u: &str| {
        let b = wait_for(&peer().client(), u, Duration::from_secs(240), is_final);
        assert_eq!(b.state(), Some("ready"), "{b:?}");
    };
    let report = run(&Failover {
        lease_s,
        start: &start,
        stage: &stage,
        jobs: &jobs,
        ready: &ready,
    });
    // Every job ever submitted under this name, in accounting: exactly those launched.
    let all: Vec<String> = slurm(
        "sacct",
        &[
            "-X",
            "-n",
            "-P",
            "--format=JobName",
            "--starttime",
            "now-1hour",
        ],
    )
    .lines()
    .filter(|n| n.starts_with(&prefix))
    .map(str::to_string)
    .collect();
    assert_eq!(all.len(), report.jobs_after_stop, "{all:?} ({report:?})");
    cancel_all(&job_name);
}
