//! The conformance suite against the real backends: local processes, a real single-node Slurm
//! (tests/peers/slurm.sh), AWS Batch on moto (tests/peers/moto.sh), Kubernetes on the
//! stand-in (tests/peers/k8s.sh) and Azure Batch on its stand-in (tests/peers/azure-batch.sh). The Slurm and moto cases
//! are end-to-end tests: run them under the machine-wide lock, one at a time.

// The Azure case holds the stand-in's lock across awaits: it only makes tests take turns.
#![allow(clippy::await_holding_lock)]

mod azure;

use std::collections::HashMap;
use std::time::Duration;

use backends::conformance::{self, Case};
use backends::SlurmConfig;
use backends::{
    AwsBatchBackend, AwsBatchConfig, Backend, JobSpec, KubernetesBackend, KubernetesConfig,
    LocalBackend, PoolSource, Resources, SlurmBackend,
};
use serde_json::Value;

fn hex_id() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:016x}", n as u64 ^ u64::from(std::process::id()))
}

/// A job that runs until it is cancelled; the backends' own flags land in `$@`.
fn spec(worker_id: String) -> JobSpec {
    JobSpec {
        worker_id,
        shape_name: "small".into(),
        resources: Resources::new(1, 0, 64 << 20),
        command: ["bash", "-c", "sleep 600", "conformance"]
            .map(String::from)
            .to_vec(),
        env: Vec::new(),
    }
}

/// The peer's environment, for the backend's commands and SDK (single-threaded tests).
fn use_env(env: &HashMap<String, String>) {
    for (k, v) in env {
        std::env::set_var(k, v);
    }
}

#[tokio::test]
async fn local_backend_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let mut refused = spec("../escape".into());
    refused.command.clear();
    let case = Case {
        job: spec(hex_id()),
        refused: Some(refused),
        unknown_id: "nobody-1".into(),
        timeout: Duration::from_secs(20),
        poll: Duration::from_millis(200),
    };
    let prefix = dir.path().to_path_buf();
    conformance::run(
        async || {
            LocalBackend::new(&prefix)
                .unwrap()
                .with_grace(Duration::from_secs(2))
        },
        &case,
    )
    .await;
}

#[tokio::test]
async fn slurm_backend_conforms() {
    use_env(&testkit::peers::start("slurm.sh"));
    let dir = tempfile::tempdir().unwrap();
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .unwrap()
        .name;
    let cfg = SlurmConfig {
        partition: "debug".into(),
        job_name: "clw-conformance".into(),
        user: user.clone(),
        nodelist: None,
        exclude: None,
        gpu_type: None,
        constraint: None,
        time: "0-0:10".into(),
        account: None,
        work_dir: dir.path().to_path_buf(),
        signal_secs: 0,
        dry_run: false,
        engine: Default::default(),
    };
    let case = Case {
        job: spec(format!("{}{}", cfg.job_prefix(), hex_id())),
        refused: Some(spec(format!("{}bad id", cfg.job_prefix()))),
        unknown_id: "999999999".into(),
        timeout: Duration::from_secs(60),
        poll: Duration::from_millis(500),
    };
    conformance::run(async || SlurmBackend::new(cfg.clone()).unwrap(), &case).await;
}

#[tokio::test]
async fn aws_batch_backend_conforms() {
    let moto = testkit::peers::start("moto.sh");
    let queue = testkit::peers::exports(&testkit::peers::bash(
        &["tests/peers/moto.sh", "setup-batch", "clw-conformance"],
        &moto,
    ));
    use_env(&moto);
    let region = moto["AWS_DEFAULT_REGION"].clone();
    let cfg = AwsBatchConfig {
        job_queue: queue["CLW_MOTO_JOB_QUEUE"].clone(),
        job_definition_name: "clw-conformance".into(),
        image: "cl-worker-test/base:latest".into(),
        user: "root".into(),
        cpus: 1,
        gpus: 0,
        memory_mb: 256,
        job_filter: None,
        work_dir_prefix: None,
        bundle_mount: None,
        username: "codalab".into(),
        password_secret_arn: Some(queue["CLW_MOTO_SECRET_ARN"].clone()),
        plaintext_password: None,
        execution_role_arn: None,
        job_role_arn: None,
    };
    let mut job = spec(hex_id());
    job.command = ["sleep", "600"].map(String::from).to_vec();
    let case = Case {
        job,
        refused: None,
        unknown_id: "00000000-0000-0000-0000-000000000000".into(),
        timeout: Duration::from_secs(120),
        poll: Duration::from_secs(1),
    };
    conformance::run(
        async || AwsBatchBackend::new(cfg.clone(), &region).await.unwrap(),
        &case,
    )
    .await;
    // A queue that does not exist: AWS keeps refusing, so the error is permanent.
    let mut missing = cfg.clone();
    missing.job_queue = "clw-no-such-queue".into();
    let backend = AwsBatchBackend::new(missing, &region).await.unwrap();
    let e = backend.submit(&spec(hex_id())).await.unwrap_err();
    assert!(!e.is_retryable(), "{e}");
}

#[tokio::test]
async fn kubernetes_backend_conforms() {
    use backends::kubernetes::{BundleRuntime, Credentials, Deadlines};
    let env = testkit::peers::start("k8s.sh");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = KubernetesConfig {
        namespace: "codalab".into(),
        manager_name: format!("conformance-{}", hex_id()),
        image: "cl-worker-test/base:latest".into(),
        image_pull_policy: None,
        bundle_runtime: BundleRuntime::Docker,
        docker_socket: "/var/run/docker.sock".into(),
        work_dir: std::env::temp_dir()
            .join("clw-k8s-conformance")
            .display()
            .to_string(),
        nfs_volume_name: None,
        // The job's command is the whole container command here (no --password-file added).
        credentials: Credentials::Plaintext {
            username: "codalab".into(),
            password: "unused".into(),
        },
        service_account: None,
        image_pull_secrets: Vec::new(),
        priority_class: None,
        node_selector: Default::default(),
        tolerations: Vec::new(),
        one_worker_per_node: false,
        deadlines: Deadlines {
            unschedulable: Duration::from_secs(900),
            start_failure: Duration::from_secs(300),
            node_lost: Duration::from_secs(300),
        },
    };
    let url: http::Uri = env["CLW_K8S_URL"].parse().unwrap();
    let client = || {
        let mut c = kube::Config::new(url.clone());
        c.default_retry = false;
        kube::Client::try_from(c).unwrap()
    };
    let mut refused = spec("Not A DNS Label".into());
    refused.shape_name = "small".into();
    let case = Case {
        job: spec(hex_id()),
        refused: Some(refused),
        unknown_id: "cl-worker-0000000000000000".into(),
        timeout: Duration::from_secs(60),
        poll: Duration::from_millis(500),
    };
    conformance::run(
        async || KubernetesBackend::new(cfg.clone(), client()),
        &case,
    )
    .await;
}

#[tokio::test]
async fn azure_batch_backend_conforms() {
    // Held: no node, so tasks stay active (pending) until terminated.
    let _g = azure::exclusive(r#"{"hold": true}"#);
    let case = Case {
        job: azure::spec("0123456789abcdef"),
        refused: Some(azure::spec("bad id!")),
        unknown_id: "cl_conf_ffffffffffffffff".into(),
        timeout: Duration::from_secs(30),
        poll: Duration::from_millis(300),
    };
    conformance::run(async || azure::backend("cl_conf_", &azure::key()), &case).await;
    // Reported once, then deleted: the job does not fill up with completed tasks.
    let b = azure::backend("cl_conf_", &azure::key());
    let _ = b.list().await.unwrap();
    let state: Value = serde_json::from_str(&testkit::peers::bash(
        &["tests/peers/azure-batch.sh", "state"],
        azure::peer(),
    ))
    .unwrap();
    assert_eq!(state["tasks"].as_array().map_or(0, Vec::len), 0, "{state}");
    // The pool is reported.
    let pool = b.pool_source().unwrap().pool().await.unwrap();
    assert_eq!(pool.id, azure::peer()["CLW_AZBATCH_POOL"]);
    assert_eq!(pool.current_dedicated_nodes, 0, "held: no node yet");
}
