//! The `azure-batch` backend against the Azure Batch stand-in (tests/peers/azure-batch.sh, which
//! the official SDK checks in its selftest): the conformance suite, throttling, a wrong key and a
//! missing job. The stand-in's controls are global, so the tests take turns.

// Each test runs on its own runtime and thread; the lock only makes the tests take turns.
#![allow(clippy::await_holding_lock)]

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use backends::azure_batch::client::{Auth, BatchClient};
use backends::conformance::{self, Case};
use backends::{AzureBatchBackend, AzureBatchConfig, Backend, JobSpec};
use serde_json::Value;
use testkit::peers::{bash, exports};

fn peer() -> &'static HashMap<String, String> {
    static ENV: OnceLock<HashMap<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        bash(&["tests/peers/azure-batch.sh", "start"], &HashMap::new());
        exports(&bash(
            &["tests/peers/azure-batch.sh", "env"],
            &HashMap::new(),
        ))
    })
}

/// One test at a time, on a reset stand-in with `controls`.
fn exclusive(controls: &str) -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    bash(&["tests/peers/azure-batch.sh", "reset"], peer());
    bash(&["tests/peers/azure-batch.sh", "ctl", controls], peer());
    g
}

fn ctl(controls: &str) {
    bash(&["tests/peers/azure-batch.sh", "ctl", controls], peer());
}

/// The Batch requests the stand-in served so far (after the last reset).
fn requests() -> Vec<Value> {
    serde_json::from_str(&bash(&["tests/peers/azure-batch.sh", "requests"], peer())).unwrap()
}

fn cfg(prefix: &str) -> AzureBatchConfig {
    let p = peer();
    AzureBatchConfig {
        job_id: p["CLW_AZBATCH_JOB"].clone(),
        task_prefix: prefix.into(),
        image: "cl-worker-test/base:latest".into(),
        user: "root".into(),
        log_container_url: p["CLW_AZBATCH_CONTAINER_URL"].clone(),
        log_identity: None,
        work_dir_prefix: None,
        bundle_mount: None,
        password_file: Some("/nonexistent/.worker-password".into()),
        plaintext_credentials: None,
        pool_id: Some(p["CLW_AZBATCH_POOL"].clone()),
    }
}

fn backend(prefix: &str, key: &str) -> AzureBatchBackend {
    let p = peer();
    let client = BatchClient::with_default_transport(
        &p["CLW_AZBATCH_URL"],
        Auth::shared_key(&p["CLW_AZBATCH_ACCOUNT"], key),
    )
    .unwrap();
    AzureBatchBackend::new(client, cfg(prefix)).unwrap()
}

fn key() -> String {
    peer()["CLW_AZBATCH_KEY"].clone()
}

fn spec(worker_id: &str) -> JobSpec {
    JobSpec {
        worker_id: worker_id.into(),
        shape_name: "small".into(),
        cpus: 1,
        gpus: 0,
        memory_bytes: 64 << 20,
        command: ["sleep", "600"].map(String::from).to_vec(),
        env: Vec::new(),
        password_file: None,
    }
}

#[tokio::test]
async fn azure_batch_backend_conforms() {
    // Held: no node, so tasks stay active (pending) until terminated.
    let _g = exclusive(r#"{"hold": true}"#);
    let case = Case {
        job: spec("0123456789abcdef"),
        refused: Some(spec("bad id!")),
        unknown_id: "cl_conf_ffffffffffffffff".into(),
        timeout: Duration::from_secs(30),
        poll: Duration::from_millis(300),
    };
    conformance::run(async || backend("cl_conf_", &key()), &case).await;
    // Reported once, then deleted: the job does not fill up with completed tasks.
    let b = backend("cl_conf_", &key());
    let _ = b.list().await.unwrap();
    let state: Value =
        serde_json::from_str(&bash(&["tests/peers/azure-batch.sh", "state"], peer())).unwrap();
    assert_eq!(state["tasks"].as_array().map_or(0, Vec::len), 0, "{state}");
    // The pool is reported.
    let pool = b.pool().await.unwrap().unwrap();
    assert_eq!(pool.id, peer()["CLW_AZBATCH_POOL"]);
    assert_eq!(pool.current_dedicated_nodes, 0, "held: no node yet");
}

#[tokio::test]
async fn throttling_is_retried_after_the_services_retry_after() {
    let _g = exclusive("{}");
    let b = backend("cl_thr_", &key());
    for (status, retry_after) in [(429, 1), (503, 1)] {
        ctl(&format!(
            r#"{{"throttle": {{"count": 2, "status": {status}, "retry_after": {retry_after}}}}}"#
        ));
        let before = requests().len();
        let t0 = Instant::now();
        let listed = b.list().await;
        let took = t0.elapsed();
        assert!(listed.is_ok(), "{status}: {listed:?}");
        assert!(
            took >= Duration::from_secs(2),
            "{status}: two throttled answers with Retry-After: 1 s, retried after {took:?}"
        );
        let sent = requests().len() - before;
        assert_eq!(sent, 3, "{status}: two throttled tries and one answered");
    }
}

#[tokio::test]
async fn a_wrong_key_is_a_clear_permanent_error_without_a_storm() {
    let _g = exclusive("{}");
    // A valid base64 key that is not the account's.
    let b = backend("cl_key_", "d3Jvbmcga2V5IGZvciB0aGUgdGVzdCBhY2NvdW50IQ==");
    let before = requests().len();
    let e = b.list().await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("AuthenticationFailed") && msg.contains("account key"),
        "{msg}"
    );
    let e = b.submit(&spec("0123456789abcdef")).await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
    assert_eq!(
        requests().len() - before,
        2,
        "one request per call, no retries"
    );
    assert!(!msg.contains(&key()), "{msg}");
    // A key that is not base64 is refused before any request.
    let p = peer();
    let bad = BatchClient::with_default_transport(
        &p["CLW_AZBATCH_URL"],
        Auth::shared_key(&p["CLW_AZBATCH_ACCOUNT"], "not base64 !"),
    );
    assert!(bad.unwrap_err().to_string().contains("not base64"));
}

#[tokio::test]
async fn a_missing_job_fails_the_listing_and_the_preflight() {
    let _g = exclusive(r#"{"job_missing": true}"#);
    let b = backend("cl_job_", &key());
    let e = b.list().await.unwrap_err();
    assert!(e.to_string().contains("JobNotFound"), "{e}");
    assert!(!e.is_retryable());
    let e = b.check_job().await.unwrap_err();
    assert!(e.to_string().contains("JobNotFound"), "{e}");
    ctl(r#"{"job_missing": false}"#);
    b.list().await.unwrap();
    b.check_job().await.unwrap();
}

#[tokio::test]
async fn twenty_tasks_cost_one_listing_request_per_tick() {
    let _g = exclusive(r#"{"hold": true}"#);
    let b = backend("cl_many_", &key());
    for i in 0..20 {
        b.submit(&spec(&format!("{i:016x}"))).await.unwrap();
    }
    let before = requests().len();
    let listed = b.list().await.unwrap();
    assert_eq!(listed.len(), 20);
    assert!(listed
        .iter()
        .all(|j| j.state == backends::JobState::Pending));
    assert!(b.pool().await.unwrap().is_ok());
    let sent: Vec<Value> = requests()[before..].to_vec();
    let calls: Vec<String> = sent
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["method"].as_str().unwrap(),
                r["path"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            format!("GET /jobs/{}/tasks", peer()["CLW_AZBATCH_JOB"]),
            format!("GET /pools/{}", peer()["CLW_AZBATCH_POOL"]),
        ],
        "a tick with 20 tasks: one listing page and the pool"
    );
}
