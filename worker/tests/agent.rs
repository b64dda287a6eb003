//! The worker loop on the in-memory runtime and a server stand-in: no Docker, no CodaLab server.

mod standin;

use std::time::{Duration, Instant};

use codalab_worker::agent::ExitReason;
use codalab_worker::runtime::fake::{Call, Exit, FakeRuntime};
use serde_json::json;
use standin::{
    assert_never_overlapping, config, first_report, run_message, spawn_worker, stopped, tar_names,
    until, until_called, Server,
};

const UUID: &str = "0x0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkins_never_overlap_and_finalizing_is_reported_at_once() {
    // Checkins are long-polled for 400 ms and due every 30 s: a report within a few seconds of
    // the run's end can only be the immediate one.
    let server = Server::start(Duration::from_millis(400)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("cadence", &dir.path().join("wd"), Duration::from_secs(30));
    let rt = FakeRuntime::new();
    server.send(run_message(UUID, "echo hi"));
    let worker = spawn_worker(&server, cfg, rt.clone()).await;

    until_called(&rt, Call::Start(UUID.into())).await;
    assert_eq!(server.started(), vec![UUID.to_string()]);
    let spec = rt.runs()[0].spec.clone().unwrap();
    assert_eq!(spec.image, "codalab/default-cpu:latest");
    assert_eq!(spec.command, "echo hi");
    assert_eq!(spec.cpuset, vec![0]);
    assert!(!spec.network);
    assert_eq!(spec.worker_id, "cadence");
    std::fs::write(spec.bundle_path.join("stdout"), "hi\n").unwrap();

    let ended = Instant::now();
    assert!(rt.exit(UUID, Exit::Code(0)));
    let reason = stopped(worker).await;
    assert_eq!(reason, ExitReason::NumRuns);

    let checkins = server.checkins();
    assert_never_overlapping(&checkins);
    let (finalizing, report) = first_report(&checkins, UUID, "finalizing");
    assert!(
        finalizing.start.duration_since(ended) < Duration::from_secs(5),
        "finalizing reported {:?} after the run ended",
        finalizing.start.duration_since(ended)
    );
    assert_eq!(report["exitcode"], 0);
    assert_eq!(report["failure_message"], json!(null));
    let uploads = server.uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].0, UUID);
    assert!(tar_names(&uploads[0].1).contains(&"stdout".into()));
    assert!(rt.runs().is_empty(), "the run's container was not removed");
    assert!(rt.pinned_images().is_empty(), "the image is still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regular_checkins_follow_the_frequency_one_at_a_time() {
    let server = Server::start(Duration::from_millis(700)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("regular", &dir.path().join("wd"), Duration::from_secs(1));
    let rt = FakeRuntime::new();
    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    until("five checkins", || server.checkins().len() >= 5).await;
    worker.abort();
    let checkins = server.checkins();
    assert_never_overlapping(&checkins);
    for pair in checkins.windows(2) {
        // The next is due a second after the previous answer.
        let gap = pair[1].start.duration_since(pair[0].end);
        assert!(
            gap >= Duration::from_millis(900) && gap < Duration::from_secs(3),
            "{gap:?} between checkins"
        );
    }
    assert_eq!(checkins[0].body["hostname"], "standin-host");
    assert_eq!(checkins[0].body["cpus"], 1);
    assert_eq!(checkins[0].body["runs"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_message_kills_the_run_and_it_ends_killed() {
    let server = Server::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("killer", &dir.path().join("wd"), Duration::from_secs(1));
    let rt = FakeRuntime::new();
    server.send(run_message(UUID, "sleep 1000"));
    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    until_called(&rt, Call::Start(UUID.into())).await;
    server.send(json!({"type": "kill", "uuid": UUID, "kill_message": "Stopped by the test."}));
    until_called(&rt, Call::Kill(UUID.into())).await;
    let reason = stopped(worker).await;
    assert_eq!(reason, ExitReason::NumRuns);
    let checkins = server.checkins();
    assert_never_overlapping(&checkins);
    let (_, report) = first_report(&checkins, UUID, "finalizing");
    assert_eq!(report["failure_message"], "Stopped by the test.");
    // Killed by the worker: the code of the SIGKILL is not reported.
    assert_eq!(report["exitcode"], json!(null));
    assert_eq!(server.uploads().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_image_fails_the_run_with_the_runtime_text() {
    let server = Server::start(Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config("noimage", &dir.path().join("wd"), Duration::from_secs(1));
    let rt = FakeRuntime::new();
    rt.fail_image(
        "codalab/default-cpu:latest",
        codalab_worker::runtime::RuntimeError::NotFound("manifest unknown".into()),
    );
    server.send(run_message(UUID, "true"));
    let worker = spawn_worker(&server, cfg, rt.clone()).await;
    let reason = stopped(worker).await;
    assert_eq!(reason, ExitReason::NumRuns);
    let (_, report) = first_report(&server.checkins(), UUID, "finalizing");
    assert_eq!(
        report["failure_message"],
        "Failed to download Docker image: manifest unknown"
    );
    assert!(!rt.calls().contains(&Call::Start(UUID.into())));
}
