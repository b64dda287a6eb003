//! The credentials scan, after the whole suite (scripts/test.sh runs it last, on its own): the
//! test users' CodaLab passwords appear in no process's argv (every process started during the
//! suite, from the kernel's audit records, and every one alive at its end), no job definition or job moto
//! holds, no batch script slurmctld holds, no pod the Kubernetes stand-in was asked to create,
//! no request the Azure Batch stand-in received (its journal), and no log of ours that the tests kept
//! (`target/test-logs/`: every `cl-worker` and `cl-worker-manager` the harness started, and the
//! logs of the workers the local and Slurm backends launched).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use testkit::{kept_logs_dir, moto, peers::bash, secrets, slurm};

/// The kernel's record of every process started since scripts/test.sh began the suite
/// (tests/peers/exec-audit.sh). Without it the scan would see only the processes alive now,
/// which proves nothing about the suite: the scan fails, in CI and locally alike.
fn exec_audit_log() -> PathBuf {
    let log = std::env::var("CLW_EXEC_AUDIT_LOG")
        .ok()
        .map(PathBuf::from)
        .filter(|p| p.exists());
    log.expect(
        "CLW_EXEC_AUDIT_LOG is not set or missing: the credentials scan needs the record of \
         every process of the suite (run it with scripts/test.sh, which starts \
         tests/peers/exec-audit.sh)",
    )
}

/// A process that lived a moment is in the record, whole argv: the live scan alone (all the
/// scan had before) never sees it.
#[test]
fn a_process_that_has_exited_is_in_the_record_with_its_argv() {
    let log = exec_audit_log();
    let marker = testkit::worker::unique("clw-short-lived");
    let st = std::process::Command::new("/bin/true")
        .args([marker.as_str(), "with a space"])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(!secrets::cmdlines().iter().any(|(_, a)| a.contains(&marker)));
    let want = format!("/bin/true {marker} with a space");
    testkit::wait_until(Duration::from_secs(10), "the exec in the record", || {
        secrets::exec_audit_texts(&log)
            .iter()
            .any(|t| secrets::audited_execs(t).contains(&want))
    });
}

#[test]
fn after_the_whole_suite_no_password_in_argv_job_bodies_or_logs() {
    let argv = secrets::assert_no_argv_holds_a_password();
    let execs = secrets::assert_no_exec_held_a_password(&exec_audit_log());
    assert!(
        execs > 1000,
        "only {execs} execs recorded: was the suite recorded?"
    );

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
    // Not a fault (nothing to lose): its line in the same report, each leak failing above.
    testkit::report(
        "fault-report.txt",
        &format!(
        "SCAN credentials after the suite: {execs} processes started during the suite and {argv} alive at its end (argvs), \
         moto's definitions and jobs, {} Slurm batch \
         scripts, {pods} recorded Kubernetes requests (Secrets aside), the Azure stand-in's {} requests and \
         {logs} kept logs of ours: no test password anywhere",
        scripts.len(),
        azure_requests
        ),
    );
}
