//! A server that sends garbage: the worker logs it, skips it and keeps checking in. The real
//! server cannot be made to send a malformed message, so this one is a scripted HTTP peer.

use std::time::Duration;

use serde_json::json;
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_logged_and_skipped() {
    let server = MockServer::start().await;
    testkit::stub::token_endpoint(&server).await;
    Mock::given(method("POST"))
        .and(path_regex("^/rest/workers/[^/]+/checkin$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            {"type": "run", "bundle": 42, "resources": "lots"},
            {"type": "self_destruct", "uuid": "0x1"},
            "not even an object",
            null
        ])))
        .up_to_n_times(1)
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex("^/rest/workers/[^/]+/checkin$"))
        .respond_with(ResponseTemplate::new(200).set_body_string("this is not json"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path_regex("^/rest/workers/[^/]+/checkin$"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([null])))
        .mount(&server)
        .await;

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cl-worker"))
        .args([
            "--server",
            &server.uri(),
            "--id",
            "malformed-test",
            "--verbose",
        ])
        .args([
            "--network-prefix",
            "clwt_malformed",
            "--checkin-frequency-seconds",
            "1",
        ])
        .arg("--work-dir")
        .arg(dir.path().join("wd"))
        .env("CODALAB_USERNAME", "u")
        .env("CODALAB_PASSWORD", "p")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut checkins = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        checkins = server
            .received_requests()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.url.path().ends_with("/checkin"))
            .count();
        if checkins >= 4 {
            break;
        }
    }
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg("docker network ls -q --filter name=clwt_malformed | xargs -r docker network rm")
        .output();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(alive, "worker died:\n{text}");
    assert!(checkins >= 4, "only {checkins} checkins:\n{text}");
    assert_eq!(
        text.matches("skipping malformed server message").count(),
        3,
        "{text}"
    );
    assert!(text.contains("not JSON"), "{text}");
    // Every checkin carried the full body.
    let reqs = server.received_requests().await.unwrap();
    let body: serde_json::Value = reqs
        .iter()
        .find(|r| r.url.path().ends_with("/checkin"))
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .unwrap();
    for k in [
        "cpus",
        "gpus",
        "memory_bytes",
        "free_disk_bytes",
        "dependencies",
        "runs",
        "exit_after_num_runs",
        "is_terminating",
        "preemptible",
        "tag_exclusive",
        "shared_file_system",
        "hostname",
        "tag",
        "group_name",
    ] {
        assert!(body.get(k).is_some(), "checkin lacks {k}: {body}");
    }
    assert!(body["free_disk_bytes"].is_u64());
}
