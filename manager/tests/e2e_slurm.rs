//! End to end: the real CodaLab server, a real single-node Slurm 22.05 (tests/peers/slurm.sh),
//! real Docker, and `cl-worker-manager slurm-batch` submitting real `cl-worker` jobs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::manager::{metric_sum, worker_globals, ManagerProc};
use testkit::slurm::{env as slurm_env, run as slurm};
use testkit::{cl::*, peers::*, worker::*};

/// Two managers on one file lease.
#[path = "e2e_slurm/lease.rs"]
mod lease;

/// The job's end state in accounting (which lags squeue by a moment).
fn job_state(id: &str) -> String {
    let t0 = Instant::now();
    loop {
        let s = slurm("sacct", &["-X", "-n", "-P", "--format=State", "-j", id])
            .trim()
            .to_string();
        if !(s.is_empty() || s == "RUNNING" || s == "PENDING" || s == "COMPLETING")
            || t0.elapsed() > Duration::from_secs(15)
        {
            return s;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `cl-worker-manager [global] slurm-batch --partition debug [slurm]`, serving the worker queue
/// `tag`, jobs named `root-<job_name>-…`.
fn start_manager(
    dir: &Path,
    tag: &str,
    job_name: &str,
    global: &[&str],
    slurm_args: &[&str],
) -> ManagerProc {
    let p = peer();
    let mut args = worker_globals(&p.server_url(), tag, &worker_bin(), dir);
    args.extend(global.iter().map(|s| s.to_string()));
    // `--partition` in slurm_args replaces debug.
    let partition = slurm_args
        .windows(2)
        .find(|w| w[0] == "--partition")
        .map_or("debug", |w| w[1]);
    args.extend(
        [
            "slurm-batch",
            "--partition",
            partition,
            "--job-name",
            job_name,
            "--slurm-work-dir",
        ]
        .map(String::from),
    );
    args.push(dir.join("scratch").display().to_string());
    let mut rest = slurm_args.iter();
    while let Some(a) = rest.next() {
        if *a == "--partition" {
            rest.next();
        } else {
            args.push(a.to_string());
        }
    }
    let mut env = slurm_env().clone();
    env.insert("CODALAB_USERNAME".into(), p.var("CLW_ROOT_USER"));
    env.insert("CODALAB_PASSWORD".into(), p.var("CLW_ROOT_PASSWORD"));
    ManagerProc::spawn(dir, &args, &env)
}

/// Cancels every job whose name starts with `root-<job_name>-`.
fn cancel_all(job_name: &str) {
    // One scancel per name: `--jobname` takes a single name (a comma-joined list matches no
    // job, and a worker job left running kept the node from the later tests).
    for name in slurm("squeue", &["-h", "-t", "all", "-o", "%j"])
        .lines()
        .filter(|n| n.starts_with(&format!("root-{job_name}-")))
    {
        let _ = Command::new("scancel")
            .args(["--user", "root", "--jobname", name])
            .envs(slurm_env())
            .status();
    }
}

fn stage(cl: &Cl, tag: &str, extra: &[&str], cmd: &str) -> String {
    let uuid = cl.run_bundle(tag, extra, cmd);
    wait_for(&peer().client(), &uuid, T, |s| s == "staged");
    uuid
}

#[test]
fn three_staged_bundles_run_as_slurm_jobs_that_complete_then_zero() {
    // Three jobs at once need the node to themselves: a job left pending is cancelled.
    wait_node_idle();
    let cl = Cl::new("slurm-3");
    let tag = unique("clw-slurm");
    let job_name = unique("w3");
    let uuids: Vec<String> = (0..3)
        .map(|i| {
            stage(
                &cl,
                &tag,
                &["--request-memory", "1g"],
                &format!("echo slurm {i}"),
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut m = start_manager(
        dir.path(),
        &tag,
        &job_name,
        &["--max-workers", "3", "--metrics-addr", "127.0.0.1:0"],
        &["--memory-mb", "1024"],
    );
    // One tick submits a job per bundle.
    assert!(
        m.wait_log("launching 3 of 3 wanted", Duration::from_secs(30)),
        "{}",
        m.log_text()
    );
    assert!(m.wait_log("as job", Duration::from_secs(10)));
    std::thread::sleep(Duration::from_secs(1));
    let jobs = m.launched();
    assert_eq!(jobs.len(), 3, "{}", m.log_text());
    let client = peer().client();
    for uuid in &uuids {
        let b = wait_for(&client, uuid, T, is_final);
        assert_eq!(b.state(), Some("ready"), "{b:?}");
    }
    let mut outs: Vec<String> = uuids.iter().map(|u| cl.stdout(u)).collect();
    outs.sort();
    assert_eq!(outs, ["slurm 0\n", "slurm 1\n", "slurm 2\n"]);
    // Idle workers exit, their jobs end COMPLETED and the manager counts zero.
    for (id, _) in &jobs {
        assert!(
            m.wait_log(
                &format!("job {id} (worker host-root-{job_name}-"),
                Duration::from_secs(90)
            ),
            "job {id} never ended\n{}",
            m.log_text()
        );
        assert_eq!(job_state(id), "COMPLETED");
    }
    std::thread::sleep(Duration::from_secs(3));
    let status: serde_json::Value = serde_json::from_str(&m.get("/status")).unwrap();
    assert_eq!(status["plan"]["total_jobs"], 0, "{status}");
    let metrics = m.get("/metrics");
    for line in [
        "cl_worker_manager_workers{shape=\"default\",state=\"active\"} 0",
        "cl_worker_manager_workers{shape=\"default\",state=\"pending\"} 0",
        "cl_worker_manager_launches_total{shape=\"default\"} 3",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(m.terminate().success());
    // The script holds no password, only the path of the mode-600 file.
    let pw = peer().var("CLW_ROOT_PASSWORD");
    let script_dir = dir.path().join("scratch");
    for entry in walk(&script_dir) {
        if entry.extension().is_some_and(|e| e == "slurm") {
            let text = std::fs::read_to_string(&entry).unwrap();
            assert!(!text.contains("CODALAB_PASSWORD"), "{text}");
            // (The test password may be a word of the work dir's fixed name.)
            let other = text.replace("-codalab-SlurmBatchWorkerManager-scratch", "");
            assert!(!other.contains(&pw), "{}", entry.display());
            assert!(text.contains("--password-file"), "{text}");
        }
    }
    let pw_file = script_dir.join(".worker-password");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&pw_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_gpu_bundle_gets_a_gres_job_and_a_cpu_shape_none() {
    let cl = Cl::new("slurm-gpu");
    let tag = unique("clw-slurm-gpu");
    let job_name = unique("wg");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("shapes.toml");
    std::fs::write(
        &config,
        "[[shape]]\nname = \"gpu\"\ncpus = 1\ngpus = 1\nmemory_mb = 1024\n",
    )
    .unwrap();
    let gpu = stage(
        &cl,
        &tag,
        &["--request-gpus", "1", "--request-memory", "1g"],
        "echo gpu",
    );
    let cpu = stage(&cl, &tag, &["--request-memory", "1g"], "echo cpu");
    let mut m = start_manager(
        dir.path(),
        &tag,
        &job_name,
        &["--max-workers", "2", "--config", config.to_str().unwrap()],
        &["--memory-mb", "1024"],
    );
    let t0 = Instant::now();
    while m.launched().len() < 2 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let jobs = m.launched();
    assert_eq!(jobs.len(), 2, "{}", m.log_text());
    for (id, shape) in &jobs {
        let show = slurm("scontrol", &["show", "job", id]);
        if shape == "gpu" {
            assert!(show.contains("TresPerNode=gres:gpu:1"), "{show}");
        } else {
            assert_eq!(shape, "default");
            assert!(!show.contains("gres:gpu"), "{show}");
        }
    }
    assert!(m.terminate().success());
    cancel_all(&job_name);
    for uuid in [&gpu, &cpu] {
        let _ = cl.command(&["rm", "--force", uuid]).output();
    }
}

#[test]
fn scancel_of_a_running_worker_restages_its_bundle_for_another_worker() {
    let cl = Cl::new("slurm-scancel");
    let tag = unique("clw-slurm-cancel");
    let job_name = unique("wc");
    let uuid = stage(
        &cl,
        &tag,
        &["--request-memory", "1g"],
        "sleep 15; echo done",
    );
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(
        dir.path(),
        &tag,
        &job_name,
        &["--max-workers", "1"],
        &["--memory-mb", "1024"],
    );
    let client = peer().client();
    wait_for(&client, &uuid, T, |s| s == "running");
    let first = m.launched();
    assert_eq!(first.len(), 1, "{}", m.log_text());
    let job = &first[0].0;
    slurm("scancel", &[job]);
    // The manager notices at its next tick (every 2 s) and frees the slot.
    assert!(
        m.wait_log(&format!("job {job} (worker"), Duration::from_secs(45)),
        "{}",
        m.log_text()
    );
    // The worker handed the run back; a new worker (the slot is free again) finishes it.
    let b = wait_for(&client, &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", m.log_text());
    assert_eq!(cl.stdout(&uuid), "done\n");
    let all = m.launched();
    assert_eq!(all.len(), 2, "{}", m.log_text());
    assert!(
        job_state(job).starts_with("CANCELLED"),
        "{}",
        job_state(job)
    );
    drop(m);
    cancel_all(&job_name);
}

/// Submits a job named like the manager's (as a restarted manager would find it).
fn sbatch_like_manager(job_name: &str, dir: &Path, extra: &[&str], wrap: &str) -> String {
    let name = format!("root-{job_name}-{}", unique("x").replace('-', ""));
    let out = dir.join("%j.out").display().to_string();
    let mut args = vec![
        "--parsable",
        "--job-name",
        &name,
        "--comment",
        "clwm:default",
        "--output",
        &out,
        "--mem",
        "256M",
    ];
    args.extend_from_slice(extra);
    args.extend(["--wrap", wrap]);
    slurm("sbatch", &args).trim().to_string()
}

fn wait_job_state(id: &str, want: &str, timeout: Duration) {
    let t0 = Instant::now();
    loop {
        let s = slurm("squeue", &["-h", "-t", "all", "-j", id, "-o", "%T"]);
        if s.trim() == want {
            return;
        }
        assert!(t0.elapsed() < timeout, "job {id} is {s:?}, not {want}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn wait_node_idle() {
    let t0 = Instant::now();
    loop {
        let s = slurm("sinfo", &["-h", "-p", "debug", "-o", "%t"]);
        if s.trim() == "idle" {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "node is {s:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn jobs_in_end_states_do_not_count_toward_max_workers_and_dry_run_submits_nothing() {
    let job_name = unique("we");
    let dir = tempfile::tempdir().unwrap();
    wait_node_idle();
    // NODE_FAIL: the node goes down under a running job.
    let a = sbatch_like_manager(&job_name, dir.path(), &[], "sleep 300");
    wait_job_state(&a, "RUNNING", Duration::from_secs(30));
    let node = slurm_env()["CLW_SLURM_NODE"].clone();
    slurm(
        "scontrol",
        &[
            "update",
            &format!("nodename={node}"),
            "state=down",
            "reason=clw-test",
        ],
    );
    wait_job_state(&a, "NODE_FAIL", Duration::from_secs(30));
    wait_node_idle();
    // PREEMPTED: an exclusive job in the higher-tier partition takes the node.
    let b = sbatch_like_manager(&job_name, dir.path(), &[], "sleep 300");
    wait_job_state(&b, "RUNNING", Duration::from_secs(30));
    take_the_node_for(1);
    wait_job_state(&b, "PREEMPTED", Duration::from_secs(30));
    // FAILED too (a failure, counted by --exit-after-num-failed).
    let c = sbatch_like_manager(&job_name, dir.path(), &[], "exit 3");
    wait_job_state(&c, "FAILED", Duration::from_secs(30));

    // One staged bundle, --max-workers 1: the three ended jobs leave room for a launch.
    let cl = Cl::new("slurm-ended");
    let tag = unique("clw-slurm-ended");
    let uuid = stage(&cl, &tag, &["--request-memory", "1g"], "echo x");
    let mut m = start_manager(
        dir.path(),
        &tag,
        &job_name,
        &["--max-workers", "1", "--metrics-addr", "127.0.0.1:0"],
        &["--memory-mb", "1024", "--dry-run"],
    );
    assert!(
        m.wait_log("launching 1 of 1 wanted", Duration::from_secs(30)),
        "{}",
        m.log_text()
    );
    // A few more ticks: the dry-run job counts as pending, so nothing is printed twice.
    m.wait_ticks(2);
    assert!(m.terminate().success());
    let log = m.log_text();
    for id in [&a, &b, &c] {
        assert!(
            log.contains(&format!("job {id} (worker")),
            "{id} not reported ended\n{log}"
        );
    }
    assert!(
        log.contains("1 workers needed, 0 pending, 0 active"),
        "{log}"
    );
    let out = std::fs::read_to_string(&m.out).unwrap();
    assert_eq!(
        out.matches("# --dry-run: the script of worker").count(),
        1,
        "{out}"
    );
    let script: String = out
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("# --dry-run"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        script.starts_with("#!/usr/bin/env bash\n#SBATCH"),
        "{script}"
    );
    assert!(script.contains("#SBATCH --partition=debug\n"), "{script}");
    let check = Command::new("bash")
        .args(["-n", "-c", &script])
        .status()
        .unwrap();
    assert!(check.success(), "{script}");
    // Nothing was submitted: no new job of this name prefix, no script file.
    let names = slurm("squeue", &["-h", "-t", "all", "-o", "%j"]);
    assert_eq!(
        names
            .lines()
            .filter(|n| n.starts_with(&format!("root-{job_name}-")))
            .count(),
        3,
        "{names}"
    );
    assert!(!walk(&dir.path().join("scratch"))
        .iter()
        .any(|p| p.extension().is_some_and(|e| e == "slurm")));
    cl.run(&["rm", &uuid]);
}

#[test]
fn a_podman_worker_job_runs_the_bundle_in_its_own_podman_service() {
    // Image storage for the jobs' Podman services, with the test image loaded (no registry).
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("podman");
    let env = HashMap::from([("CLW_PODMAN_BASE".to_string(), storage.display().to_string())]);
    bash(&["tests/peers/test-image.sh"], &HashMap::new());
    bash(&["tests/peers/podman.sh", "install"], &env);
    bash(
        &[
            "tests/peers/podman.sh",
            "load",
            "codalab/default-cpu:latest",
            "codalab/default-gpu:latest",
        ],
        &env,
    );
    let cl = Cl::new("slurm-podman");
    let tag = unique("clw-slurm-podman");
    let job_name = unique("wp");
    let uuid = stage(
        &cl,
        &tag,
        &["--request-memory", "300m"],
        "echo hello; sleep 15",
    );
    let storage_s = storage.display().to_string();
    let conf = storage.join("etc/containers.conf").display().to_string();
    let m = start_manager(
        dir.path(),
        &tag,
        &job_name,
        &["--max-workers", "1"],
        &[
            "--memory-mb",
            "1024",
            "--container-engine",
            "podman",
            "--podman-storage-dir",
            &storage_s,
            "--podman-storage-driver",
            "vfs",
            "--podman-containers-conf",
            &conf,
        ],
    );
    let client = peer().client();
    wait_for(&client, &uuid, T, |s| s == "running" || is_final(s));
    // The run's container is in the job's Podman service, not in the Docker engine.
    let sock = walk(&dir.path().join("scratch"))
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == "podman.sock"))
        .unwrap_or_else(|| panic!("no podman.sock in the job dir\n{}", m.log_text()));
    let listed =
        testkit::podman::containers_labelled(&sock, &format!("org.codalab.bundle-uuid={uuid}"));
    assert_eq!(listed.len(), 1, "{listed:?}");
    let docker = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=org.codalab.bundle-uuid={uuid}"),
        ])
        .output()
        .unwrap();
    assert!(docker.stdout.is_empty(), "the Docker engine has the run");
    let b = wait_for(&client, &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", m.log_text());
    assert_eq!(cl.stdout(&uuid), "hello\n");
    // The idle worker exits, its job completes and takes its Podman service along.
    let (job, _) = m.launched().into_iter().next().unwrap();
    assert!(
        m.wait_log(&format!("job {job} (worker"), Duration::from_secs(90)),
        "{}",
        m.log_text()
    );
    assert_eq!(job_state(&job), "COMPLETED");
    let service = Command::new("pgrep")
        .args([
            "-f",
            &format!("system service --time=0 unix://{}", sock.display()),
        ])
        .output()
        .unwrap();
    assert!(
        service.stdout.is_empty(),
        "the job's Podman service outlived it"
    );
    let out = walk(&dir.path().join("scratch"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "out"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .unwrap_or_default();
    assert!(out.contains("Podman service podman version"), "{out}");
}

/// CodaLab's documented Slurm command with a shared cache (docs/Worker-Managers.md, "Setting a
/// shared cache": `cl-worker-manager --worker-work-dir-prefix /juice slurm-batch …`), as
/// written (`--cpus 4 --gpus 1 --memory-mb 16000`, which the test node is declared to fit) with
/// CodaLab's defaults (`--min-workers 1`, no tag, `cl-worker` from the PATH, the credentials
/// file written into the shared scratch dir); changed only in the endpoints (the server, the
/// shared directory, the partition) and the times a test cannot wait for. The node is a GPU node as far as its own processes tell (its `nvidia-smi`, the fake one
/// of tests/peers/fake-gpu.sh, on the jobs' PATH; Slurm's gres gives each job one GPU). A CPU
/// bundle and a GPU bundle reach `ready` on worker jobs of this manager, the GPU run with the
/// GPU of its job; both workers share the one work dir.
#[test]
fn the_documented_command_takes_a_cpu_and_a_gpu_bundle_to_ready() {
    let fake = testkit::peers::start("fake-gpu.sh");
    wait_node_idle();
    let user = testkit::peers::add_user("clwdocslurm");
    let cl = Cl::as_user("slurm-doc", &user);
    let (cpu, gpu) = testkit::manager::stage_cpu_and_gpu(&cl);
    let p = peer();
    let dir = tempfile::tempdir().unwrap();
    let shared = tempfile::tempdir().unwrap();
    let mut args = testkit::manager::shortened_times(&p.server_url());
    args.extend(
        [
            "--worker-work-dir-prefix",
            &shared.path().display().to_string(),
            "slurm-batch",
            "--cpus",
            "4",
            "--gpus",
            "1",
            "--memory-mb",
            "16000",
            "--partition",
            &slurm_env()["CLW_SLURM_PARTITION"],
        ]
        .map(String::from),
    );
    let mut env = slurm_env().clone();
    env.insert("CODALAB_USERNAME".into(), user.name.clone());
    env.insert("CODALAB_PASSWORD".into(), user.password.clone());
    // `cl-worker` and the node's nvidia-smi on the PATH the jobs inherit.
    env.insert(
        "PATH".into(),
        format!(
            "{}:{}:{}",
            fake["CLW_FAKE_GPU_BIN"],
            worker_bin().parent().unwrap().display(),
            std::env::var("PATH").unwrap()
        ),
    );
    let mut m = ManagerProc::spawn(dir.path(), &args, &env);
    testkit::manager::assert_cpu_and_gpu_ready(&cl, &m, &cpu, &gpu);
    // The documented shared cache: one work dir for every worker of the user.
    let work_dirs: Vec<PathBuf> = std::fs::read_dir(shared.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(work_dirs.len(), 1, "{work_dirs:?}");
    assert!(
        work_dirs[0].join("workdir").is_dir(),
        "{:?}",
        testkit::files_under(shared.path())
    );
    assert!(m.terminate().success());
    cancel_all("codalab-slurm-worker");
    // The idle worker of --min-workers 1 must be gone before the next test counts the node's
    // free CPUs.
    wait_node_idle();
}

/// A worker job reclaimed by Slurm mid-run (`reclaim`, given its job id): the worker gets
/// SIGTERM and hands the run back (the manager passes `--pass-down-termination`), and the
/// bundle is run again from the start by a worker of a later job (or of the same job,
/// requeued) to `ready` (testkit::reclaim). Returns the manager's launches.
fn reclaimed_mid_run_ends_ready(
    what: &str,
    slurm_args: &[&str],
    reclaim: impl FnOnce(&str),
) -> (Vec<(String, String)>, f64) {
    wait_node_idle();
    let cl = Cl::new(what);
    let tag = unique("clw-slurm-reclaim");
    let job_name = unique("wr");
    let _cancel = CancelAll(job_name.clone());
    let uuid = stage(
        &cl,
        &tag,
        &["--request-memory", "1g"],
        testkit::reclaim::BUNDLE,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--memory-mb", "1024"];
    args.extend_from_slice(slurm_args);
    let mut m = start_manager(
        dir.path(),
        &tag,
        &job_name,
        &["--max-workers", "1", "--metrics-addr", "127.0.0.1:0"],
        &args,
    );
    wait_for(&peer().client(), &uuid, T, |s| s == "running");
    let job = m.launched()[0].0.clone();
    let t0 = Instant::now();
    reclaim(&job);
    // Slurm's KillWait (30 s) bounds the hand-back.
    testkit::reclaim::assert_handed_back_then_ready(
        &cl,
        &uuid,
        t0,
        Duration::from_secs(25),
        &format!("Slurm {what}"),
        || m.log_text(),
    );
    let launched = m.launched();
    let interrupted = metric_sum(
        &m.get("/metrics"),
        "cl_worker_manager_workers_interrupted_total",
    );
    assert!(m.terminate().success());
    (launched, interrupted)
}

/// Cancels the jobs of a job name when dropped (also when the test failed).
struct CancelAll(String);

impl Drop for CancelAll {
    fn drop(&mut self) {
        cancel_all(&self.0);
    }
}

#[test]
fn a_requeued_worker_job_hands_its_run_back_and_the_bundle_ends_ready() {
    let (launched, _) = reclaimed_mid_run_ends_ready("requeue", &[], |job| {
        slurm("scontrol", &["requeue", job]);
    });
    assert!(!launched.is_empty());
}

#[test]
fn a_worker_preempted_by_a_higher_tier_partition_hands_its_run_back() {
    let (launched, interrupted) = reclaimed_mid_run_ends_ready(
        "preemption",
        &["--partition", "spot", "--signal-seconds", "60"],
        // The spot partition's jobs get SIGTERM and its GraceTime (10 s) before they are
        // killed.
        |_| take_the_node_for(5),
    );
    // The preempted job ended (Slurm 22.05 records a preemption with a grace time as TIMEOUT);
    // a second job ran the bundle again.
    assert_eq!(launched.len(), 2, "{launched:?}");
    let state = job_state(&launched[0].0);
    assert!(state == "PREEMPTED" || state == "TIMEOUT", "{state}");
    assert_eq!(
        interrupted, 1.0,
        "cl_worker_manager_workers_interrupted_total"
    );
}

/// Submits an exclusive job of the higher-tier partition (`urgent`) that holds the node for
/// `secs` seconds: it preempts the jobs there.
fn take_the_node_for(secs: u32) {
    slurm(
        "sbatch",
        &[
            "-p",
            "urgent",
            "--exclusive",
            "--mem",
            "256M",
            "--output",
            "/dev/null",
            "--wrap",
            &format!("sleep {secs}"),
        ],
    );
}
