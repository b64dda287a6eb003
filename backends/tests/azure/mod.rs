//! The Azure Batch stand-in (tests/peers/azure-batch.sh, which the official SDK checks in its
//! selftest) as the backend's tests reach it: its environment, its controls, and a backend and a
//! job for it. Its controls are global: the tests that use it take turns ([`exclusive`]) and run
//! in one lane of `scripts/lanes.py`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use backends::azure_batch::client::{Auth, BatchClient};
use backends::{AzureBatchBackend, AzureBatchConfig, JobSpec, Resources};
use serde_json::Value;
use testkit::peers::{bash, exports};

pub fn peer() -> &'static HashMap<String, String> {
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
pub fn exclusive(controls: &str) -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    bash(&["tests/peers/azure-batch.sh", "reset"], peer());
    bash(&["tests/peers/azure-batch.sh", "ctl", controls], peer());
    g
}

pub fn ctl(controls: &str) {
    bash(&["tests/peers/azure-batch.sh", "ctl", controls], peer());
}

/// The Batch requests the stand-in served so far (after the last reset).
pub fn requests() -> Vec<Value> {
    serde_json::from_str(&bash(&["tests/peers/azure-batch.sh", "requests"], peer())).unwrap()
}

pub fn cfg(prefix: &str) -> AzureBatchConfig {
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
        remove_unhealthy_after: None,
    }
}

pub fn backend(prefix: &str, key: &str) -> AzureBatchBackend {
    let p = peer();
    let client = BatchClient::with_default_transport(
        &p["CLW_AZBATCH_URL"],
        Auth::shared_key(&p["CLW_AZBATCH_ACCOUNT"], key),
    )
    .unwrap();
    AzureBatchBackend::new(client, cfg(prefix)).unwrap()
}

pub fn key() -> String {
    peer()["CLW_AZBATCH_KEY"].clone()
}

pub fn spec(worker_id: &str) -> JobSpec {
    JobSpec {
        worker_id: worker_id.into(),
        shape_name: "small".into(),
        resources: Resources::new(1, 0, 64 << 20),
        command: ["sleep", "600"].map(String::from).to_vec(),
        env: Vec::new(),
    }
}
