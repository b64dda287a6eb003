//! End to end, several backends in one manager: the real CodaLab server, a real single-node
//! Slurm 22.05 (tests/peers/slurm.sh) as the first tier with a cap of one worker, and moto's
//! AWS Batch in docker mode (tests/peers/moto.sh: it runs the worker image) as the second.
//! `cl-worker-manager --config tiers.toml` with no backend subcommand.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use testkit::manager::{metric_sum, ManagerProc};
use testkit::moto::{active_jobs, env as moto, queue, DockerMode};
use testkit::slurm::{env as slurm_env, run as slurm};
use testkit::{cl::*, peers::*, worker::*};

/// Slurm jobs of this test not yet ended.
fn slurm_jobs(job_name: &str) -> usize {
    slurm("squeue", &["-h", "-o", "%j"])
        .lines()
        .filter(|n| n.starts_with(&format!("root-{job_name}-")))
        .count()
}

fn cancel_slurm(job_name: &str) {
    let names: Vec<String> = slurm("squeue", &["-h", "-t", "all", "-o", "%j"])
        .lines()
        .filter(|n| n.starts_with(&format!("root-{job_name}-")))
        .map(str::to_string)
        .collect();
    if !names.is_empty() {
        let _ = std::process::Command::new("scancel")
            .args(["--user", "root", "--jobname", &names.join(",")])
            .envs(slurm_env())
            .status();
    }
}

/// One manager with the two tiers; returns it, the queue, the Slurm job name and its
/// directories (kept alive by the caller).
struct Run {
    m: ManagerProc,
    q: String,
    job_name: String,
    tag: String,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn start(overflow: f64, cloud_extra: &str) -> Run {
    let image = testkit::images::worker_image();
    let q = unique("qtier").replace('-', "");
    let secret = queue(&q)["CLW_MOTO_SECRET_ARN"].clone();
    let p = peer();
    let tag = unique("clw-tiers");
    let job_name = unique("tiers");
    let dir = tempfile::tempdir().unwrap();
    // A host path that moto's job containers mount at the same path (their runs use it too).
    let prefix = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[[tier]]
name = "campus"
backend = "slurm-batch"
max-workers = 1
overflow-after = {overflow}
[tier.flags]
partition = "debug"
job-name = "{job_name}"
slurm-work-dir = "{scratch}"

[[tier]]
name = "cloud"
backend = "aws-batch"
max-workers = 2
{cloud_extra}
[tier.flags]
job-queue = "{q}"
job-definition-name = "clw-{q}"
worker-image = "{image}"
password-secret-arn = "{secret}"
"#,
        scratch = dir.path().join("scratch").display(),
    );
    let config_path = dir.path().join("tiers.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut env: HashMap<String, String> = slurm_env().clone();
    env.extend(moto().clone());
    env.insert("CODALAB_USERNAME".into(), p.var("CLW_ROOT_USER"));
    env.insert("CODALAB_PASSWORD".into(), p.var("CLW_ROOT_PASSWORD"));
    env.insert("CODALAB_HOME".into(), dir.path().display().to_string());
    // The Slurm job runs `cl-worker` from the submitting environment's PATH; moto's containers
    // from the image's.
    let bin_dir = worker_bin().parent().unwrap().to_path_buf();
    env.insert(
        "PATH".into(),
        format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
    );
    let args: Vec<String> = [
        "--server",
        &p.server_url(),
        "--min-workers",
        "0",
        "--max-workers",
        "3",
        "--sleep-time",
        "2",
        "--min-seconds-between-workers",
        "0",
        "--worker-tag",
        &tag,
        "--worker-tag-exclusive",
        "--worker-idle-seconds",
        "5",
        "--worker-work-dir-prefix",
        &prefix.path().display().to_string(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--config",
        &config_path.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    let m = ManagerProc::spawn(dir.path(), &args, &env);
    Run {
        m,
        q,
        job_name,
        tag,
        _dirs: (dir, prefix),
    }
}

/// The bundles' states, read once.
fn states(uuids: &[String]) -> Vec<Option<String>> {
    let client = peer().client();
    uuids
        .iter()
        .map(|u| {
            wait_for(&client, u, Duration::from_secs(5), |_| true)
                .state()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn the_cluster_first_then_the_cloud_after_overflow_both_caps_held_all_ready() {
    let _docker = DockerMode::on();
    let overflow = 25.0;
    let cl = Cl::new("tiers");
    let p = peer();
    let Run {
        mut m,
        q,
        job_name,
        tag,
        _dirs,
    } = start(overflow, "price-per-hour = 36.0");
    let uuids: Vec<String> = (0..6)
        .map(|i| {
            cl.run_bundle(
                &tag,
                &["--request-memory", "1g"],
                &format!("echo tier {i}; sleep 20"),
            )
        })
        .collect();
    for u in &uuids {
        wait_for(&p.client(), u, T, |s| s == "staged");
    }
    let t0 = Instant::now();
    // Until overflow-after: the cluster's one worker only; nothing in the cloud.
    let mut slurm_seen = false;
    while t0.elapsed() < Duration::from_secs_f64(overflow - 5.0) {
        let (s, c) = (slurm_jobs(&job_name), active_jobs(&q).unwrap().len());
        assert!(s <= 1, "the cluster's cap of 1: {s}\n{}", m.log_text());
        assert_eq!(c, 0, "a cloud job before overflow-after\n{}", m.log_text());
        slurm_seen |= s == 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(slurm_seen, "no Slurm job at once\n{}", m.log_text());
    // Then the cloud takes what waited; the caps hold until every bundle is ready.
    let mut cloud_seen = 0;
    loop {
        let (s, c) = (slurm_jobs(&job_name), active_jobs(&q).unwrap().len());
        assert!(
            s <= 1 && c <= 2 && s + c <= 3,
            "caps: {s} + {c}\n{}",
            m.log_text()
        );
        cloud_seen = cloud_seen.max(c);
        let states = states(&uuids);
        if states.iter().all(|s| s.as_deref() == Some("ready")) {
            break;
        }
        assert!(
            t0.elapsed() < T * 2,
            "not all ready: {states:?}\n{}",
            m.log_text()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        cloud_seen >= 1,
        "the cloud never launched\n{}",
        m.log_text()
    );
    for (i, u) in uuids.iter().enumerate() {
        assert_eq!(cl.stdout(u), format!("tier {i}\n"));
    }
    // Costs: the cloud's running seconds at 36/h, in /metrics with the tier label.
    let metrics = m.get("/metrics");
    assert!(
        metric_sum(&metrics, "cl_worker_manager_cost_total") > 0.0,
        "{metrics}"
    );
    assert!(metrics.contains("tier=\"campus\""), "{metrics}");
    let status = m.get("/status");
    assert!(status.contains("\"tiers\""), "{status}");
    m.terminate();
    cancel_slurm(&job_name);
}

/// Restarts slurmctld when dropped.
struct ControllerDown;

impl ControllerDown {
    fn now() -> Self {
        bash(&["tests/peers/slurm.sh", "stop-controller"], slurm_env());
        ControllerDown
    }
}

impl Drop for ControllerDown {
    fn drop(&mut self) {
        bash(&["tests/peers/slurm.sh", "start-controller"], slurm_env());
    }
}

#[test]
fn with_slurm_down_the_cloud_takes_over_at_once_until_its_budget_is_spent() {
    let _docker = DockerMode::on();
    let cl = Cl::new("tiers-down");
    let p = peer();
    // 3600 an hour, a budget of 10: ten seconds of one cloud worker.
    let Run {
        mut m,
        q,
        job_name,
        tag,
        _dirs,
    } = start(600.0, "price-per-hour = 3600.0\nbudget = 10.0");
    assert!(
        m.wait_log("tier cloud: launching", Duration::from_secs(60)),
        "{}",
        m.log_text()
    );
    let down = ControllerDown::now();
    assert!(
        m.wait_log("tier campus: launches nothing", Duration::from_secs(30)),
        "{}",
        m.log_text()
    );
    // Staged now: the cluster cannot be asked, so the cloud launches at once (no 600 s wait).
    let t0 = Instant::now();
    let first = cl.run_bundle(&tag, &["--request-memory", "1g"], "echo cloud; sleep 15");
    let b = wait_for(&p.client(), &first, T, |s| s == "ready" || is_final(s));
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", m.log_text());
    assert_eq!(cl.stdout(&first), "cloud\n");
    assert!(
        t0.elapsed() < Duration::from_secs(300),
        "took {:?}",
        t0.elapsed()
    );
    // Its worker ran well past ten seconds: the budget is spent, and a new bundle launches no
    // cloud worker (nor a Slurm one: the cluster is still down).
    assert!(
        m.wait_log("its budget of 10.00", Duration::from_secs(60)),
        "{}",
        m.log_text()
    );
    // Once its idle worker has exited, nothing serves the queue.
    let t1 = Instant::now();
    while !active_jobs(&q).unwrap().is_empty() {
        assert!(
            t1.elapsed() < Duration::from_secs(90),
            "the cloud worker did not exit when idle\n{}",
            m.log_text()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let launched = m.launches();
    let second = cl.run_bundle(&tag, &["--request-memory", "1g"], "echo never");
    wait_for(&p.client(), &second, T, |s| s == "staged");
    // Ticks that saw it staged, each of which could have launched.
    m.wait_ticks(3);
    assert_eq!(m.launches(), launched, "{}", m.log_text());
    // One cloud job in all: the one before the budget was spent.
    let jobs = testkit::moto::boto(&format!(
        "print(json.dumps([j['jobId'] for s in ['SUBMITTED','PENDING','RUNNABLE','STARTING','RUNNING','SUCCEEDED','FAILED'] for j in b.list_jobs(jobQueue='{q}', jobStatus=s)['jobSummaryList']]))"
    ));
    assert_eq!(jobs.as_array().map_or(0, Vec::len), 1, "{jobs}");
    let status = m.get("/status");
    assert!(status.contains("budget spent"), "{status}");
    drop(down);
    m.terminate();
    cancel_slurm(&job_name);
    let _ = cl.command(&["kill", &second]).output();
}
