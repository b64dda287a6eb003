//! `cl-worker-manager` processes of the end-to-end tests, and what the tests read from them (the
//! log, the metrics endpoint).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `cl-worker-manager`, killed when dropped (its log is printed if a test failed).
pub struct ManagerProc {
    pub child: Child,
    /// Its command line (after the program's name), as the test ran it.
    pub args: Vec<String>,
    pub log: PathBuf,
    /// Its stdout (plans, dry-run scripts).
    pub out: PathBuf,
    /// Its working directory (where local and Slurm workers write their logs).
    dir: PathBuf,
    n: u128,
}

impl ManagerProc {
    /// Starts the manager with `args`, CodaLab credentials from the environment of `env`
    /// (`CODALAB_USERNAME`/`CODALAB_PASSWORD` included there), logging into `dir`.
    pub fn spawn(dir: &Path, args: &[String], env: &HashMap<String, String>) -> Self {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let log = dir.join(format!("manager-{n}.log"));
        let out = dir.join(format!("manager-{n}.out"));
        let child = Command::new(crate::binary("cl-worker-manager"))
            .args(args)
            .envs(env)
            .env_remove("RUST_LOG")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        ManagerProc {
            child,
            args: args.to_vec(),
            log,
            out,
            dir: dir.to_owned(),
            n,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_log(&self, what: &str, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self.log_text().contains(what) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// Workers launched so far.
    pub fn launches(&self) -> usize {
        self.log_text().matches("launched worker").count()
    }

    /// Job ids of "launched worker … as job N (shape S)" lines, with their shapes.
    pub fn launched(&self) -> Vec<(String, String)> {
        self.log_text()
            .lines()
            .filter_map(|l| {
                let rest = l.split(" as job ").nth(1)?;
                let (id, shape) = rest.split_once(" (shape ")?;
                Some((id.to_string(), shape.trim_end_matches(')').to_string()))
            })
            .collect()
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.child.wait().unwrap()
    }

    /// The address of `--metrics-addr 127.0.0.1:0`, from the log.
    pub fn metrics_addr(&self) -> String {
        assert!(
            self.wait_log("serving /metrics", Duration::from_secs(30)),
            "{}",
            self.log_text()
        );
        self.log_text()
            .split("serving /metrics and /status on http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
            .to_string()
    }

    /// `GET path` on the metrics server; the body of a 200 answer.
    pub fn get(&self, path: &str) -> String {
        http_get(&self.metrics_addr(), path)
    }

    /// The ticks the manager has run (`cl_worker_manager_ticks_total`; with tiers, every tier
    /// counts each tick: the largest of them).
    pub fn ticks(&self) -> u64 {
        let name = "cl_worker_manager_ticks_total";
        self.get("/metrics")
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .fold(0.0, f64::max) as u64
    }

    /// Waits until the manager has run `n` more ticks than now: a test that asserts that
    /// nothing happened must first show that ticks, each of which could have acted, ran.
    pub fn wait_ticks(&self, n: u64) {
        let t0 = self.ticks();
        crate::wait_until(
            std::time::Duration::from_secs(120),
            &format!("{n} more ticks of the manager"),
            || self.ticks() >= t0 + n,
        );
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        crate::keep_logs_under(&self.dir, &format!("manager-{}", self.n));
        if std::thread::panicking() {
            eprintln!("----- manager log -----\n{}", self.log_text());
        }
    }
}

/// A plain HTTP GET on loopback (reqwest); returns the body of a 200 answer.
pub fn http_get(addr: &str, path: &str) -> String {
    common::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let answer = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"));
        let code = answer.status();
        let body = answer.text().await.unwrap();
        assert_eq!(code, reqwest::StatusCode::OK, "GET {path}: {body}");
        body
    })
}

/// The value of one series (`name{labels}` as printed) in a `/metrics` text; 0 when absent.
pub fn metric(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// The sum of every series of metric `name` (all its label sets) in a `/metrics` text.
pub fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The global flags the local and Slurm suites share: fast ticks, no round spacing, workers on
/// the tag-exclusive queue `tag` that exit after 5 idle seconds, run from `worker_bin` with
/// their work dirs under `prefix`.
pub fn worker_globals(server: &str, tag: &str, worker_bin: &Path, prefix: &Path) -> Vec<String> {
    [
        "--server",
        server,
        "--min-workers",
        "0",
        "--sleep-time",
        "2",
        "--min-seconds-between-workers",
        "0",
        "--worker-tag",
        tag,
        "--worker-tag-exclusive",
        "--worker-idle-seconds",
        "5",
        "--worker-executable",
        &worker_bin.display().to_string(),
        "--worker-work-dir-prefix",
        &prefix.display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// The CUDA image a GPU bundle asks for (tests/peers/fake-gpu.sh: the test image with a fake
/// `nvidia-smi` that lists only the GPUs the engine gave the container, as its hook saw them in
/// the device request; never what the container's environment says).
pub const CUDA_IMAGE: &str = "nvidia/cuda:12.2.0-base-ubuntu22.04";

/// The fake GPUs of tests/peers/fake-gpu.sh.
pub const FAKE_GPUS: [&str; 2] = [
    "GPU-11111111-1111-1111-1111-111111111111",
    "GPU-22222222-2222-2222-2222-222222222222",
];

/// CodaLab's documented `cl-worker-manager` commands (docs/Worker-Managers.md), end to end: a CPU
/// bundle and a GPU bundle of `cl`'s user, staged before the manager starts, as a CodaLab user
/// would submit them (the GPU one: `cl run --request-docker-image <a CUDA image>
/// --request-gpus 1 nvidia-smi`); returns their uuids.
pub fn stage_cpu_and_gpu(cl: &crate::cl::Cl) -> (String, String) {
    use crate::cl::{last_uuid, wait_for};
    crate::peers::start("fake-gpu.sh");
    let cpu = last_uuid(&cl.run(&["run", "--request-memory", "500m", "echo cpu-ran"]));
    let gpu = last_uuid(&cl.run(&[
        "run",
        "--request-docker-image",
        CUDA_IMAGE,
        "--request-gpus",
        "1",
        "--request-memory",
        "500m",
        "nvidia-smi",
    ]));
    let client = crate::peers::peer().client();
    for uuid in [&cpu, &gpu] {
        wait_for(&client, uuid, Duration::from_secs(120), |s| s == "staged");
    }
    (cpu, gpu)
}

/// The GPUs named in `nvidia-smi`'s output.
fn gpus_listed(out: &str) -> Vec<String> {
    out.split(|c: char| c.is_whitespace() || c == ',' || c == '|' || c == '(' || c == ')')
        .filter(|t| t.starts_with("GPU-"))
        .map(str::to_string)
        .collect()
}

/// Both bundles of [`stage_cpu_and_gpu`] reach `ready` on workers that `m` launched; the GPU
/// run's `nvidia-smi` lists exactly one fake GPU, and the engine received a device request for
/// exactly that GPU (the hook's log, since the bundles were staged). The command line and the
/// GPU go to `target/documented-commands.txt`. Returns that GPU.
pub fn assert_cpu_and_gpu_ready(
    cl: &crate::cl::Cl,
    m: &ManagerProc,
    cpu: &str,
    gpu: &str,
) -> String {
    use crate::cl::{assert_final_state, is_final, meta_str, wait_for};
    let client = crate::peers::peer().client();
    for uuid in [cpu, gpu] {
        let b = wait_for(&client, uuid, Duration::from_secs(300), is_final);
        assert_final_state(&b, "ready", &m.log_text());
        // Taken by a worker this manager launched (its id is in the launch line).
        let remote = meta_str(&b, "remote");
        let worker_id = remote.rsplit('-').next().unwrap_or_default();
        assert!(
            !worker_id.is_empty() && m.log_text().contains(worker_id),
            "{uuid} ran on {remote:?}, not a worker of this manager:\n{}",
            m.log_text()
        );
    }
    assert_eq!(cl.stdout(cpu), "cpu-ran\n");
    let out = cl.stdout(gpu);
    let listed = gpus_listed(&out);
    assert!(
        listed.len() == 1 && FAKE_GPUS.contains(&listed[0].as_str()),
        "the GPU run's nvidia-smi listed {listed:?}: {out:?}"
    );
    // The engine's view: a device request for exactly that GPU reached the hook.
    let fake = crate::peers::start("fake-gpu.sh");
    let hook = std::fs::read_to_string(&fake["CLW_FAKE_GPU_HOOK_LOG"]).unwrap_or_default();
    let line = format!(" NVIDIA_VISIBLE_DEVICES={}", listed[0]);
    assert!(
        hook.lines().any(|l| l.ends_with(&line)),
        "no device request for {} in the hook's log:\n{hook}",
        listed[0]
    );
    // The command line as it ran, its secrets (the documented `--account-key`,
    // `--auth-token`) shown as `***`.
    let shown: Vec<&str> = m
        .args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let secret =
                i > 0 && ["--account-key", "--auth-token"].contains(&m.args[i - 1].as_str());
            if secret {
                "***"
            } else {
                a.as_str()
            }
        })
        .collect();
    crate::report(
        "documented-commands.txt",
        &format!(
            "DOCUMENTED cl-worker-manager {}: the GPU run was given {} (the engine's device \
             request, as the hook saw it)",
            shown.join(" "),
            listed[0]
        ),
    );
    listed[0].clone()
}

/// The server and the times a test cannot wait for, for a documented command that leaves them
/// at CodaLab's defaults (`--sleep-time 5 --min-seconds-between-workers 60`, workers idle for
/// ten minutes).
pub fn shortened_times(server: &str) -> Vec<String> {
    [
        "--server",
        server,
        "--sleep-time",
        "2",
        "--min-seconds-between-workers",
        "1",
        "--worker-idle-seconds",
        "5",
    ]
    .map(String::from)
    .to_vec()
}

/// `--cpus --gpus --memory-mb` of the VM in the documented azure-batch and kubernetes commands:
/// one GPU.
pub fn documented_vm() -> Vec<String> {
    ["--cpus", "1", "--gpus", "1", "--memory-mb", "2048"]
        .map(String::from)
        .to_vec()
}

/// The global flags of CodaLab's documented azure-batch and kubernetes commands, with the times
/// a test cannot wait for shortened (`--min-seconds-between-workers 300 --sleep-time 120`).
pub fn documented_globals(server: &str) -> Vec<String> {
    [
        "--server",
        server,
        "--min-workers",
        "0",
        "--max-workers",
        "8",
        "--min-seconds-between-workers",
        "1",
        "--sleep-time",
        "2",
        "--worker-pass-down-termination",
        "--worker-exit-on-exception",
        "--worker-exit-after-num-runs",
        "1",
    ]
    .map(String::from)
    .to_vec()
}

/// The environment of a manager acting for `user`, whose default worker image
/// (`codalab/worker:$CODALAB_VERSION`) is the GPU-host one ([`crate::images::gpu_host_worker_image`]).
pub fn documented_env(user: &crate::peers::User) -> HashMap<String, String> {
    HashMap::from([
        ("CODALAB_USERNAME".to_string(), user.name.clone()),
        ("CODALAB_PASSWORD".to_string(), user.password.clone()),
        (
            "CODALAB_VERSION".to_string(),
            crate::images::GPU_HOST_VERSION.to_string(),
        ),
    ])
}

/// Starts the manager and expects it to refuse at once, saying `text`.
pub fn assert_refused(dir: &Path, args: &[String], env: &HashMap<String, String>, text: &str) {
    let mut m = ManagerProc::spawn(dir, args, env);
    let status = m.child.wait().unwrap();
    assert!(!status.success(), "{}", m.log_text());
    assert!(m.log_text().contains(text), "{}", m.log_text());
}
