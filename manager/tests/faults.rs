//! The fault suite, manager side: the backend's control plane restarted in the middle of a
//! tick, with the real CodaLab server. Real Slurm 22.05's `slurmctld` is stopped at the moment
//! the manager submits a job and comes back from its saved state; moto (AWS Batch) is restarted
//! while the manager ticks every second. Each test states what was lost — nothing: no duplicate
//! job, no orphan (a job the manager does not know it launched), never more jobs than
//! `--max-workers`. The worker's faults are in `worker/tests/faults.rs`.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::manager::{worker_globals, ManagerProc};
use testkit::{cl::*, moto, peers::*, secrets, slurm, wait_until, worker::*};

/// Samples `count()` every `every` until stopped; returns the largest value seen.
struct Watch {
    stop: Arc<AtomicBool>,
    most: Arc<Mutex<usize>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(every: Duration, count: impl Fn() -> Option<usize> + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(Mutex::new(0));
        let (s, m) = (stop.clone(), most.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(n) = count() {
                    let mut most = m.lock().unwrap();
                    *most = (*most).max(n);
                }
                std::thread::sleep(every);
            }
        });
        Watch {
            stop,
            most,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
        let most = *self.most.lock().unwrap();
        most
    }
}

/// The job ids the manager logged as launched; fails on a repeated id.
fn launched_ids(m: &ManagerProc) -> BTreeSet<String> {
    let ids: Vec<String> = m.launched().into_iter().map(|(id, _)| id).collect();
    let set: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(set.len(), ids.len(), "a job id logged twice: {ids:?}");
    set
}

/// Slurm jobs of `root-<job_name>-…` in `states` (squeue's `-t`): (id, state).
fn slurm_jobs(job_name: &str, states: &str) -> Result<Vec<(String, String)>, String> {
    let out = slurm::try_run("squeue", &["-h", "-t", states, "-o", "%i %j %T"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (id, name, state) = (f.next()?, f.next()?, f.next()?);
            name.starts_with(&format!("root-{job_name}-"))
                .then(|| (id.to_string(), state.to_string()))
        })
        .collect())
}

/// `slurmctld` goes down the moment the manager calls `sbatch` (a shim on its PATH stops the
/// controller, then runs the real `sbatch`) and comes back 5 s later from its saved state.
#[test]
fn slurmctld_restarted_mid_submit() {
    const MAX: usize = 2;
    let env = slurm::env();
    let cl = Cl::new("fault-slurm");
    let tag = unique("clw-fault-slurm");
    let job_name = unique("fs");
    let uuids: Vec<String> = (0..4)
        .map(|i| {
            let u = cl.run_bundle(
                &tag,
                &["--request-memory", "1g"],
                &format!("sleep 3; echo slurm fault {i}"),
            );
            wait_for(&peer().client(), &u, T, |s| s == "staged");
            u
        })
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let shims = dir.path().join("shims");
    std::fs::create_dir_all(&shims).unwrap();
    let trigger = dir.path().join("restart-controller");
    std::fs::write(&trigger, "").unwrap();
    let real_sbatch = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v sbatch"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let script = repo_root().join("tests/peers/slurm.sh");
    let shim = shims.join("sbatch");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\n\
             if [ -e '{t}' ]; then\n\
               rm -f '{t}'\n\
               bash '{s}' stop-controller >/dev/null 2>&1\n\
               (sleep 5; bash '{s}' start-controller) </dev/null >/dev/null 2>&1 &\n\
             fi\n\
             exec {real} \"$@\"\n",
            t = trigger.display(),
            s = script.display(),
            real = real_sbatch.trim(),
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x", shim.to_str().unwrap()])
        .status()
        .unwrap();

    let watch = {
        let job_name = job_name.clone();
        Watch::start(Duration::from_millis(300), move || {
            slurm_jobs(&job_name, "PD,CF,R,CG").ok().map(|j| j.len())
        })
    };
    let p = peer();
    let mut args = worker_globals(&p.server_url(), &tag, &worker_bin(), dir.path());
    args.extend(
        [
            "--max-workers",
            &MAX.to_string(),
            "slurm-batch",
            "--partition",
            "debug",
            "--job-name",
            &job_name,
            "--memory-mb",
            "1024",
            "--slurm-work-dir",
            &dir.path().join("scratch").display().to_string(),
        ]
        .map(String::from),
    );
    let mut menv = env.clone();
    menv.insert("CODALAB_USERNAME".into(), p.var("CLW_ROOT_USER"));
    menv.insert("CODALAB_PASSWORD".into(), p.var("CLW_ROOT_PASSWORD"));
    menv.insert(
        "PATH".into(),
        format!("{}:{}", shims.display(), std::env::var("PATH").unwrap()),
    );
    let mut m = ManagerProc::spawn(dir.path(), &args, &menv);

    let t0 = Instant::now();
    let client = peer().client();
    // What the restart cost: bundles that did not end ready (counted, reported, then failed).
    let mut lost = Vec::new();
    for u in &uuids {
        let b = wait_for(&client, u, Duration::from_secs(300), is_final);
        if b.state() != Some("ready") {
            lost.push(format!("{u} ended {:?}", b.state()));
        }
    }
    let all_ready = t0.elapsed();
    assert!(!trigger.exists(), "the controller was never restarted");
    let argv_read = secrets::assert_no_argv_holds_a_password();
    assert!(m.terminate().success(), "{}", m.log_text());
    let most = watch.finish();

    let launched = launched_ids(&m);
    let in_slurm: BTreeSet<String> = slurm_jobs(&job_name, "all")
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(
        most <= MAX,
        "{most} jobs at once with --max-workers {MAX}\n{}",
        m.log_text()
    );
    assert_eq!(
        in_slurm,
        launched,
        "Slurm's jobs and the manager's launches differ (orphan or duplicate)\n{}",
        m.log_text()
    );
    slurm::run(
        "scancel",
        &["--user", "root", "--name", &format!("root-{job_name}")],
    );
    // Workers killed with their jobs cannot remove their Docker networks; left behind, they
    // would use up the engine's address pools for the tests that follow.
    wait_until(Duration::from_secs(60), "the jobs ended", || {
        slurm_jobs(&job_name, "PENDING,RUNNING,COMPLETING").is_ok_and(|j| j.is_empty())
    });
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "docker network ls -q --filter name=cl_worker_root-{job_name}- | \
             xargs -r docker network rm"
        ))
        .output();
    testkit::fault_report(
        "slurmctld restarted mid-submit",
        &format!(
            "{} bundles ready {:.0} s after the manager started; {} jobs launched, each known to \
             Slurm and to the manager; at most {most} at once (max {MAX}); {argv_read} argvs \
             read without a password",
            uuids.len(),
            all_ready.as_secs_f64(),
            launched.len()
        ),
        &lost,
    );
}

/// moto is restarted while the manager ticks every second (moto keeps no state across a
/// restart: the queue is created again, as the cloud's infrastructure would still be there,
/// and the jobs it forgot are jobs the manager must see vanish). Moto holds its jobs RUNNING
/// without containers, so every job it lists is one the manager submitted.
#[test]
fn moto_restarted_mid_tick() {
    const MAX: usize = 2;
    // What moto holds from the suite so far, before the restart forgets it.
    secrets::assert_absent("moto's job definitions and jobs", &moto::everything());
    let q = unique("clw-fault-aws");
    let secret = moto::queue(&q)["CLW_MOTO_SECRET_ARN"].clone();
    let cl = Cl::new("fault-aws");
    let tag = unique("clw-fault-aws");
    let uuids: Vec<String> = (0..3)
        .map(|_| {
            let u = cl.run_bundle(&tag, &["--request-memory", "1g"], "echo aws");
            wait_for(&peer().client(), &u, T, |s| s == "staged");
            u
        })
        .collect();
    let p = peer();
    let args: Vec<String> = [
        "--server",
        &p.server_url(),
        "--min-workers",
        "0",
        "--max-workers",
        &MAX.to_string(),
        "--sleep-time",
        "1",
        "--min-seconds-between-workers",
        "0",
        "--worker-tag",
        &tag,
        "--worker-tag-exclusive",
        "aws-batch",
        "--job-queue",
        &q,
        "--job-definition-name",
        &format!("clw-{q}"),
        "--worker-image",
        "cl-worker-test/base:latest",
        "--password-secret-arn",
        &secret,
    ]
    .map(String::from)
    .to_vec();
    let mut env = moto::env().clone();
    env.insert("CODALAB_USERNAME".into(), p.var("CLW_ROOT_USER"));
    env.insert("CODALAB_PASSWORD".into(), p.var("CLW_ROOT_PASSWORD"));
    let dir = tempfile::tempdir().unwrap();
    let mut m = ManagerProc::spawn(dir.path(), &args, &env);
    wait_until(Duration::from_secs(60), "two launches", || {
        m.launches() >= MAX
    });

    let watch = {
        let q = q.clone();
        Watch::start(Duration::from_millis(200), move || {
            moto::active_jobs(&q).ok().map(|j| j.len())
        })
    };
    let before = launched_ids(&m);
    let t_restart = Instant::now();
    bash(&["tests/peers/moto.sh", "restart"], &HashMap::new());
    moto::queue(&q);
    let back = t_restart.elapsed();
    // The manager sees its jobs vanish and launches again, within the limit. Its submits
    // before the queue is back are refused, so its back-off (up to `backoff_max_secs`) can
    // take a few minutes on a loaded machine: a liveness bound, not a timing.
    wait_until(
        Duration::from_secs(330),
        "launches after the restart",
        || moto::active_jobs(&q).is_ok_and(|j| j.len() == MAX),
    );
    let recovered = t_restart.elapsed();
    // The manager's calls failed while moto was down: the restart did hit its ticks.
    let during = m.log_text().matches(" WARN ").count();
    std::thread::sleep(Duration::from_secs(5));
    let active: BTreeSet<String> = moto::active_jobs(&q).unwrap().into_iter().collect();
    let most = watch.finish();
    let argv_read = secrets::assert_no_argv_holds_a_password();
    assert!(m.terminate().success(), "{}", m.log_text());
    let launched = launched_ids(&m);
    let log = m.log_text();
    // What the restart cost: workers the manager did not bring back.
    let lost: Vec<String> = (active.len() < MAX)
        .then(|| format!("{} of {MAX} workers not running again", MAX - active.len()))
        .into_iter()
        .collect();
    if !lost.is_empty() {
        eprintln!("{log}");
    }

    assert!(during > 0, "no call failed during the restart\n{log}");
    assert!(
        most <= MAX,
        "{most} jobs at once with --max-workers {MAX}\n{log}"
    );
    assert!(
        active.is_subset(&launched) && active.is_disjoint(&before),
        "moto's jobs after the restart {active:?} are not the manager's new launches \
         ({launched:?}, before the restart {before:?})\n{log}"
    );
    assert!(
        log.contains("lost before check-in") || log.contains("vanished"),
        "the manager never noticed its jobs were gone\n{log}"
    );
    secrets::assert_absent("moto's job definitions and jobs", &moto::everything());
    for u in &uuids {
        cl.run(&["rm", "--force", u]);
    }
    testkit::fault_report(
        "moto restarted mid-tick",
        &format!(
            "moto back in {:.1} s ({during} failed calls logged until the recovery); {MAX} jobs running \
             again {:.1} s after the restart began; {} launches in all, never more than {most} \
             at once (max {MAX}), every job moto lists launched by the manager; {argv_read} \
             argvs read without a password",
            back.as_secs_f64(),
            recovered.as_secs_f64(),
            launched.len()
        ),
        &lost,
    );
}
