//! The credentials scan, after the whole suite (scripts/test.sh runs it last, on its own): the
//! test users' CodaLab passwords appear in no process's argv, no job definition or job moto
//! holds, no batch script slurmctld holds, no pod the Kubernetes stand-in was asked to create,
//! no request the Azure Batch stand-in received (its journal), and no log of ours that the tests kept
//! (`target/test-logs/`: every `cl-worker` and `cl-worker-manager` the harness started, and the
//! logs of the workers the local and Slurm backends launched).

use std::collections::HashMap;

use testkit::{kept_logs_dir, moto, peers::bash, secrets, slurm};

#[test]
fn after_the_whole_suite_no_password_in_argv_job_bodies_or_logs() {
    let argv = secrets::assert_no_argv_holds_a_password();

    secrets::assert_absent("moto's job definitions and jobs", &moto::everything());

    let scripts = slurm::batch_scripts();
    for (id, script) in &scripts {
        secrets::assert_absent(&format!("the batch script of Slurm job {id}"), script);
    }

    // Every object the stand-in was asked to create or change, but the Secrets (which hold the
    // password by design).
    let objects = std::path::Path::new(&testkit::k8s::k8s()["CLW_K8S_STATE"]).join("objects");
    let mut pods = 0;
    for e in std::fs::read_dir(&objects).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.contains("-Secret-") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            secrets::assert_absent(&format!("the Kubernetes request {name}"), &text);
            pods += 1;
        }
    }

    // The stand-in's journal: every request since it was installed (the tests reset its
    // request log, not the journal).
    let journal = bash(&["tests/peers/azure-batch.sh", "journal"], &HashMap::new());
    secrets::assert_absent("the requests the Azure Batch stand-in received", &journal);
    let azure_requests = journal.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(
        azure_requests > 0,
        "the Azure Batch stand-in's journal is empty: run this after the suite"
    );

    let logs = secrets::assert_no_file_holds_a_password(&kept_logs_dir());
    assert!(
        logs > 0,
        "no log was kept in {}: run this after the suite",
        kept_logs_dir().display()
    );
    testkit::fault_report(
        "credentials scan after the suite",
        &format!(
        "{argv} process argvs, moto's definitions and jobs, {} Slurm batch \
         scripts, {pods} recorded Kubernetes requests (Secrets aside), the Azure stand-in's {} requests and \
         {logs} kept logs of ours: no test password anywhere",
        scripts.len(),
        azure_requests
        ),
    );
}
