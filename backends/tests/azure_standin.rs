//! The `azure-batch` backend against the Azure Batch stand-in: throttling, a wrong key, a
//! missing job, one listing per tick (its conformance run is in `conformance.rs`). The stand-in's
//! controls are global, so the tests take turns.

// Each test runs on its own runtime and thread; the lock only makes the tests take turns.
#![allow(clippy::await_holding_lock)]

mod azure;

use std::time::{Duration, Instant};

use azure::*;
use backends::azure_batch::client::{Auth, BatchClient};
use backends::{Backend, PoolSource};

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
    let pool = b.pool_source().unwrap();
    let calls = || async {
        let before = requests().len();
        let listed = b.list().await.unwrap();
        assert_eq!(listed.len(), 20);
        assert!(listed
            .iter()
            .all(|j| j.state == backends::JobState::Pending));
        assert!(pool.pool().await.is_ok());
        requests()[before..]
            .iter()
            .map(|r| {
                format!(
                    "{} {}",
                    r["method"].as_str().unwrap(),
                    r["path"].as_str().unwrap()
                )
            })
            .collect::<Vec<String>>()
    };
    let (tasks, pool_path) = (
        format!("GET /jobs/{}/tasks", peer()["CLW_AZBATCH_JOB"]),
        format!("GET /pools/{}", peer()["CLW_AZBATCH_POOL"]),
    );
    // The pool's broken nodes are listed at the first reading, then at most every 30 s.
    assert_eq!(
        calls().await,
        [
            tasks.clone(),
            pool_path.clone(),
            format!("{pool_path}/nodes")
        ],
        "the first tick with 20 tasks: one listing page, the pool and its broken nodes"
    );
    assert_eq!(
        calls().await,
        [tasks, pool_path],
        "a tick with 20 tasks: one listing page and the pool"
    );
}
