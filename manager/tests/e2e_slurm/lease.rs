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
    // Every job ever submitted under this name, in accounting.
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
    // None twice (each worker id once), and at least those the scenario counted. More can
    // follow its last count: a worker that exits idle before the server hands it the fourth
    // bundle is replaced by the holder (seen once: three jobs for that bundle, all from `c`).
    let unique: std::collections::BTreeSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a job twice: {all:?}");
    assert!(all.len() >= report.jobs_after_stop, "{all:?} ({report:?})");
    cancel_all(&job_name);
}
