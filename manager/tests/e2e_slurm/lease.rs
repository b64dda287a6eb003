//! Two managers, one in charge, on the real Slurm: the lease is a file in a local directory
//! (`--lease file:…`, under the dependency cache's NFS-safe lock), the scenario of
//! `testkit::failover` (SIGKILL of the holder mid-burst, SIGSTOP past its lease, a clean stop).

use testkit::failover::{policy_file, run, stage_sleepers, Failover};
use testkit::slurm::run as slurm;
use testkit::{cl::*, worker::*};

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
    let stage = |n: usize| stage_sleepers(&cl, &tag, "512m", n);
    let prefix = format!("root-{job_name}-");
    let jobs = || {
        slurm("squeue", &["-h", "-o", "%i %j"])
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, name)| name.starts_with(&prefix))
            .map(|(id, _)| id.to_string())
            .collect()
    };
    let report = run(&Failover {
        lease_s,
        start: &start,
        stage: &stage,
        jobs: &jobs,
    });
    // Every job ever submitted under this name, in accounting: exactly those the managers
    // logged launching (no job of a launch the logs missed, none of another launcher).
    let all: std::collections::BTreeSet<String> = slurm(
        "sacct",
        &[
            "-X",
            "-n",
            "-P",
            "--format=JobID,JobName",
            "--starttime",
            "now-1hour",
        ],
    )
    .lines()
    .filter_map(|l| l.split_once('|'))
    .filter(|(_, name)| name.starts_with(&prefix))
    .map(|(id, _)| id.to_string())
    .collect();
    assert_eq!(
        all, report.launched,
        "accounting vs the managers' logs ({report:?})"
    );
    cancel_all(&job_name);
}
