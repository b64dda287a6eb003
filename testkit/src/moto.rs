//! moto's AWS Batch (`tests/peers/moto.sh`) for the manager's end-to-end tests.

use std::collections::HashMap;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::peers::{bash, exports, peer};

/// moto's environment (`moto.sh env`), started once per test binary.
pub fn env() -> &'static HashMap<String, String> {
    static ENV: OnceLock<HashMap<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        bash(&["tests/peers/moto.sh", "start"], &HashMap::new());
        exports(&bash(&["tests/peers/moto.sh", "env"], &HashMap::new()))
    })
}

/// A job queue named `name` (and the password secret, its value passed in the environment);
/// returns setup-batch's exports.
pub fn queue(name: &str) -> HashMap<String, String> {
    let mut e = env().clone();
    e.insert(
        "CLW_MOTO_CODALAB_PASSWORD".into(),
        peer().var("CLW_ROOT_PASSWORD"),
    );
    exports(&bash(&["tests/peers/moto.sh", "setup-batch", name], &e))
}

/// A job queue named `name` whose password secret (named `<name>-password`) holds `password`
/// (another user's, e.g. [`crate::peers::add_user`]'s); returns setup-batch's exports.
pub fn queue_for(name: &str, password: &str) -> HashMap<String, String> {
    queue_of(name, password, "optimal")
}

/// As [`queue_for`], its managed compute environment launching `instance_types`
/// (comma-separated, e.g. `optimal,g4dn.xlarge` for one that also launches GPU instances).
pub fn queue_of(name: &str, password: &str, instance_types: &str) -> HashMap<String, String> {
    let mut e = env().clone();
    e.insert("CLW_MOTO_INSTANCE_TYPES".into(), instance_types.to_string());
    e.insert("CLW_MOTO_CODALAB_PASSWORD".into(), password.to_string());
    e.insert("CLW_MOTO_SECRET_NAME".into(), format!("{name}-password"));
    exports(&bash(&["tests/peers/moto.sh", "setup-batch", name], &e))
}

/// boto3 against moto: runs `code` with `b` = the Batch client; returns its printed JSON.
pub fn boto(code: &str) -> Value {
    try_boto(code).unwrap_or_else(|e| panic!("{e}"))
}

/// As [`boto`]; boto3's error (e.g. moto is down) as `Err`.
pub fn try_boto(code: &str) -> Result<Value, String> {
    let script = format!("import boto3, json\nb = boto3.client('batch')\n{code}\n");
    let out = Command::new(&env()["CLW_MOTO_PYTHON"])
        .args(["-c", &script])
        .envs(env())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// The active jobs (SUBMITTED … RUNNING) of queue `q`: their ids, from one listing of every
/// status (a listing per status can see a job twice as it moves from one to the next).
pub fn active_jobs(q: &str) -> Result<Vec<String>, String> {
    let v = try_boto(&format!(
        "print(json.dumps(sorted({{j['jobId'] for j in b.list_jobs(jobQueue='{q}', filters=[{{'name': 'JOB_NAME', 'values': ['*']}}])['jobSummaryList'] if j['status'] in ('SUBMITTED','PENDING','RUNNABLE','STARTING','RUNNING')}})))"
    ))?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j.as_str().map(str::to_string))
        .collect())
}

/// Every job definition and every job of every queue moto holds, as JSON text.
pub fn everything() -> String {
    boto(
        "defs = [d for p in b.get_paginator('describe_job_definitions').paginate() for d in p['jobDefinitions']]\n\
         qs = [q['jobQueueName'] for q in b.describe_job_queues()['jobQueues']]\n\
         ids = [j['jobId'] for q in qs for s in ['SUBMITTED','PENDING','RUNNABLE','STARTING','RUNNING','SUCCEEDED','FAILED'] for j in b.list_jobs(jobQueue=q, jobStatus=s)['jobSummaryList']]\n\
         jobs = [j for i in range(0, len(ids), 100) for j in b.describe_jobs(jobs=ids[i:i+100])['jobs']]\n\
         print(json.dumps({'definitions': defs, 'jobs': jobs}, default=str))",
    )
    .to_string()
}

/// moto runs submitted jobs as containers (its docker mode) while this lives, then holds them
/// again.
pub struct DockerMode;

impl DockerMode {
    pub fn on() -> Self {
        bash(&["tests/peers/moto.sh", "mode", "docker"], env());
        DockerMode
    }
}

impl Drop for DockerMode {
    fn drop(&mut self) {
        bash(&["tests/peers/moto.sh", "mode", "hold"], env());
    }
}
