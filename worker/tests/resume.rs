//! A worker restarted on the state file of the previous version takes its run back: the
//! fixture `fixtures/worker-state-v1.json` was written by that version's `persist::Writer`
//! (work dir `/tmp/cl-worker-fixture-work`), for a run whose container was running.

mod standin;

use std::time::Duration;

use codalab_worker::agent::ExitReason;
use codalab_worker::persist;
use codalab_worker::runtime::fake::{Call, Exit, FakeRuntime};
use standin::{
    assert_never_overlapping, config, first_report, spawn_worker, stopped, tar_names, until, Server,
};

const UUID: &str = "0x5a1e5a1e5a1e5a1e5a1e5a1e5a1e5a1e";
const FIXTURE: &str = include_str!("fixtures/worker-state-v1.json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_of_the_previous_version_is_resumed_and_its_run_finished() {
    let server = Server::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        "fixture-worker",
        &dir.path().join("wd"),
        Duration::from_secs(1),
    );
    let work_dir = cfg.agent.work_dir.clone();
    // The file as that version wrote it, moved to this test's work dir.
    let text = FIXTURE.replace("/tmp/cl-worker-fixture-work", work_dir.to_str().unwrap());
    let state_path = persist::state_path(&work_dir, "fixture-worker");
    std::fs::write(&state_path, &text).unwrap();
    let bundle = work_dir.join("runs").join(UUID);
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("stdout"), "resumed\n").unwrap();
    // Its container is still there, and a stray one of this worker that no run owns.
    let rt = FakeRuntime::new();
    rt.adopt("fixture-worker", UUID, "c0ffee5a1e");
    rt.adopt("fixture-worker", "0xdead", "stray");
    rt.adopt("another-worker", "0xbeef", "theirs");

    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    until("the run reported running", || {
        server
            .checkins()
            .iter()
            .any(|c| c.run(UUID).is_some_and(|r| r["state"] == "running"))
    })
    .await;
    assert!(rt.calls().contains(&Call::ListOwn("fixture-worker".into())));
    assert!(rt.calls().contains(&Call::Remove("0xdead".into())));
    assert!(!rt.calls().contains(&Call::Remove("0xbeef".into())));
    assert!(
        !rt.calls().contains(&Call::Start(UUID.into())),
        "resumed, not restarted"
    );
    let (_, running) = first_report(&server.checkins(), UUID, "running");
    assert_eq!(
        running["docker_image"],
        "codalab/default-cpu@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    );
    assert_eq!(running["bundle_start_time"], 1_780_000_000.0);
    // The resumed run holds its image again.
    assert_eq!(
        rt.pinned_images().get("codalab/default-cpu:latest"),
        Some(&1)
    );

    assert!(rt.exit(UUID, Exit::Code(0)));
    // `num_runs` (1) came back from the file: with `--exit-after-num-runs 1` the worker stops
    // once the resumed run is finalized.
    let reason = stopped(worker).await;
    assert_eq!(reason, ExitReason::NumRuns);
    let checkins = server.checkins();
    assert_never_overlapping(&checkins);
    let (_, finalizing) = first_report(&checkins, UUID, "finalizing");
    assert_eq!(finalizing["exitcode"], 0);
    let uploads = server.uploads();
    assert_eq!(uploads.len(), 1);
    assert!(tar_names(&uploads[0].1).contains(&"stdout".into()));
    assert!(rt.calls().contains(&Call::Remove(UUID.into())));
    assert!(rt.pinned_images().is_empty());
    // The state file no longer holds the run, in the same format.
    let saved = persist::load(&state_path).unwrap().unwrap();
    assert_eq!(saved.worker_id, "fixture-worker");
    assert_eq!(saved.num_runs, 1);
    assert!(saved.runs.is_empty());
}

#[test]
fn the_fixture_reads_back_to_the_same_bytes() {
    // Field names, order and number formats are those of the previous version.
    let saved: persist::Saved = serde_json::from_str(FIXTURE).unwrap();
    assert_eq!(serde_json::to_string(&saved).unwrap(), FIXTURE.trim_end());
}
