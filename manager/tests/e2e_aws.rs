//! End to end: the real CodaLab server, moto's AWS Batch (tests/peers/moto.sh: jobs held
//! RUNNING without containers, or, for the full loop, run as containers of the worker image on
//! the machine's Docker engine) and `cl-worker-manager aws-batch` on the AWS SDK for Rust.

use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::manager::{metric, metric_sum, ManagerProc};
use testkit::moto::{boto, env as moto, queue, DockerMode};
use testkit::{cl::*, peers::*, worker::*};

/// `cl-worker-manager … aws-batch` on queue `queue` (definition `clw-<queue>`), serving the
/// worker queue `tag`.
fn start_manager(dir: &std::path::Path, tag: &str, queue: &str, extra: &[&str]) -> ManagerProc {
    start_manager_with(
        dir,
        tag,
        queue,
        "/var/lib/cl-workers",
        "cl-worker-test/base:latest",
        &[],
        extra,
    )
}

/// As [`start_manager`], with the workers' work-dir prefix and image, and extra global flags.
fn start_manager_with(
    dir: &std::path::Path,
    tag: &str,
    queue: &str,
    prefix: &str,
    image: &str,
    globals: &[&str],
    extra: &[&str],
) -> ManagerProc {
    let p = peer();
    let mut args: Vec<String> = [
        "--server",
        &p.server_url(),
        "--min-workers",
        "0",
        "--sleep-time",
        "2",
        "--min-seconds-between-workers",
        "0",
        "--worker-tag",
        tag,
        "--worker-tag-exclusive",
        "--worker-work-dir-prefix",
        prefix,
        "--metrics-addr",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(globals.iter().map(|s| s.to_string()));
    args.extend(
        [
            "aws-batch",
            "--job-queue",
            queue,
            "--job-definition-name",
            &format!("clw-{queue}"),
            "--worker-image",
            image,
        ]
        .map(String::from),
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut env = moto().clone();
    env.insert("CODALAB_USERNAME".into(), p.var("CLW_ROOT_USER"));
    env.insert("CODALAB_PASSWORD".into(), p.var("CLW_ROOT_PASSWORD"));
    ManagerProc::spawn(dir, &args, &env)
}

fn stage(cl: &Cl, tag: &str) -> String {
    let uuid = cl.run_bundle(tag, &["--request-memory", "1g"], "echo aws");
    wait_for(&peer().client(), &uuid, T, |s| s == "staged");
    uuid
}

#[test]
fn five_bundles_five_jobs_by_arn_with_secrets_then_adopted_then_terminated() {
    let q = unique("q5").replace('-', "");
    let env = queue(&q);
    let secret = env["CLW_MOTO_SECRET_ARN"].clone();
    let cl = Cl::new("aws-5");
    let tag = unique("clw-aws");
    let uuids: Vec<String> = (0..5).map(|_| stage(&cl, &tag)).collect();
    let dir = tempfile::tempdir().unwrap();
    let exec_role = "arn:aws:iam::123456789012:role/clw-worker-execution";
    let mut m = start_manager(
        dir.path(),
        &tag,
        &q,
        &[
            "--password-secret-arn",
            &secret,
            "--execution-role-arn",
            exec_role,
        ],
    );
    assert!(
        m.wait_log("launching 5 of 5 wanted", Duration::from_secs(30)),
        "{}",
        m.log_text()
    );
    let t0 = Instant::now();
    while m.launches() < 5 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(m.launches(), 5, "{}", m.log_text());

    // The definition: secrets, mounts, resources; no password in plain environment.
    let defs = boto(&format!(
        "print(json.dumps(b.describe_job_definitions(jobDefinitionName='clw-{q}', status='ACTIVE')['jobDefinitions'], default=str))"
    ));
    let defs = defs.as_array().unwrap();
    assert_eq!(defs.len(), 1, "{defs:?}");
    let def = &defs[0];
    let def_arn = def["jobDefinitionArn"].as_str().unwrap();
    let cp = &def["containerProperties"];
    assert_eq!(
        cp["secrets"],
        serde_json::json!([{"name": "CODALAB_PASSWORD", "valueFrom": secret}])
    );
    assert_eq!(cp["image"], "cl-worker-test/base:latest");
    assert_eq!(cp["executionRoleArn"], exec_role);
    let mounts: Vec<&str> = cp["mountPoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["/var/run/docker.sock", "/var/lib/cl-workers"]);
    let mut res: Vec<String> = cp["resourceRequirements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}={}",
                r["type"].as_str().unwrap(),
                r["value"].as_str().unwrap()
            )
        })
        .collect();
    res.sort();
    assert_eq!(res, ["MEMORY=2048", "VCPU=1"]);
    let env_names: Vec<&str> = cp["environment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env_names, ["CODALAB_USERNAME"]);

    // The jobs: submitted by that ARN, tagged, with the worker command; no password anywhere.
    let jobs = boto(&format!(
        "ids = [j['jobId'] for s in ['SUBMITTED','PENDING','RUNNABLE','STARTING','RUNNING'] for j in b.list_jobs(jobQueue='{q}', jobStatus=s)['jobSummaryList']]\n\
         print(json.dumps(b.describe_jobs(jobs=ids)['jobs'] if ids else [], default=str))"
    ));
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), 5);
    let password = peer().var("CLW_ROOT_PASSWORD");
    for j in jobs {
        assert_eq!(j["jobDefinition"], def_arn, "{j}");
        assert!(
            j["jobName"]
                .as_str()
                .unwrap()
                .starts_with(&format!("clw-{q}-")),
            "{j}"
        );
        assert_eq!(
            j["tags"]["codalab-worker-manager"],
            format!("clw-{q}"),
            "{j}"
        );
        assert_eq!(j["tags"]["codalab-worker-shape"], "default", "{j}");
        let cmd: Vec<&str> = j["container"]["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(&cmd[..3], ["cl-worker", "--server", &peer().server_url()]);
        assert!(
            cmd.windows(2)
                .any(|w| w[0] == "--id" && w[1].starts_with("host-")),
            "{cmd:?}"
        );
        assert!(!cmd.iter().any(|a| a.contains("password")), "{cmd:?}");
        assert!(cmd.contains(&"--pass-down-termination"), "{cmd:?}");
        // A reclaimed spot worker hands its runs back by default, as CodaLab's job command's
        // spot-interruption watcher makes it.
        assert!(
            cmd.windows(2).any(|w| w == ["--preemption-notice", "aws"]),
            "{cmd:?}"
        );
        for e in j["container"]["environment"].as_array().unwrap() {
            assert_ne!(e["name"], "CODALAB_PASSWORD", "{j}");
        }
    }
    assert!(!m
        .log_text()
        .contains(&format!("CODALAB_PASSWORD={password}")));

    // Killed and restarted, the manager adopts the five jobs and submits none.
    let _ = m.child.kill();
    let _ = m.child.wait();
    let m2 = start_manager(
        dir.path(),
        &tag,
        &q,
        &[
            "--password-secret-arn",
            &secret,
            "--execution-role-arn",
            exec_role,
        ],
    );
    assert!(
        m2.wait_log("5 workers needed, 5 pending", Duration::from_secs(30)),
        "{}",
        m2.log_text()
    );
    m2.wait_ticks(2);
    assert_eq!(m2.launches(), 0, "{}", m2.log_text());
    assert!(
        m2.log_text().contains("reusing job definition"),
        "{}",
        m2.log_text()
    );

    // The bundles go away: the jobs nobody needs are terminated.
    for u in &uuids {
        cl.run(&["rm", "--force", u]);
    }
    let t0 = Instant::now();
    while m2.log_text().matches("cancelled job").count() < 5
        && t0.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        m2.log_text().matches("cancelled job").count(),
        5,
        "{}",
        m2.log_text()
    );
    let ended = boto(&format!(
        "print(json.dumps([(j['status'], j.get('statusReason', '')) for j in b.list_jobs(jobQueue='{q}', jobStatus='FAILED')['jobSummaryList']]))"
    ));
    let ended = ended.as_array().unwrap();
    assert_eq!(ended.len(), 5, "{ended:?}");
    for e in ended {
        assert!(
            e[1].as_str().unwrap().contains("no staged bundle needs"),
            "{e}"
        );
    }
    let metrics = m2.get("/metrics");
    assert!(
        metrics.contains("cl_worker_manager_cancels_total 5"),
        "{metrics}"
    );
}

#[test]
fn a_missing_queue_launches_nothing_and_recovers_once_it_exists() {
    let q = unique("qm").replace('-', "");
    let secret = queue("clw-secret-holder")["CLW_MOTO_SECRET_ARN"].clone();
    let cl = Cl::new("aws-missing");
    let tag = unique("clw-aws-missing");
    let uuid = stage(&cl, &tag);
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(dir.path(), &tag, &q, &["--password-secret-arn", &secret]);
    // Several ticks against a queue that does not exist: every listing fails, nothing is
    // submitted, the errors are counted.
    m.wait_ticks(3);
    let log = m.log_text();
    assert!(
        log.contains(&format!("Job queue {q} does not exist")),
        "{log}"
    );
    assert_eq!(m.launches(), 0, "{log}");
    assert!(!log.contains("cannot launch"), "{log}");
    let metrics = m.get("/metrics");
    let errors = metric(
        &metrics,
        "cl_worker_manager_observation_errors_total{source=\"backend_list\"}",
    );
    assert!(errors >= 2, "{metrics}");
    // The queue appears: the next tick launches exactly the one worker needed.
    queue(&q);
    assert!(
        m.wait_log("launched worker", Duration::from_secs(20)),
        "{}",
        m.log_text()
    );
    m.wait_ticks(2);
    assert_eq!(m.launches(), 1, "{}", m.log_text());
    drop(m);
    cl.run(&["rm", "--force", &uuid]);
}

#[test]
fn a_failing_submit_backs_off_shows_in_metrics_and_recovers() {
    let q = unique("qf").replace('-', "");
    let env = queue(&q);
    let secret = env["CLW_MOTO_SECRET_ARN"].clone();
    let cl = Cl::new("aws-fail");
    let tag = unique("clw-aws-fail");
    let uuid = stage(&cl, &tag);
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(dir.path(), &tag, &q, &["--password-secret-arn", &secret]);
    assert!(
        m.wait_log("launched worker", Duration::from_secs(30)),
        "{}",
        m.log_text()
    );
    // Everything in AWS is wiped behind the manager's back, then the queue comes back (but
    // not the job definition the manager registered): its worker job is gone, the next
    // submission is refused.
    bash(&["tests/peers/moto.sh", "reset"], moto());
    queue(&q);
    assert!(
        m.wait_log("cannot launch a worker", Duration::from_secs(30)),
        "{}",
        m.log_text()
    );
    // Back-off (5 s after the first failure), then the definition is registered again and the
    // submission goes through: one failure, no storm.
    let t0 = Instant::now();
    while m.launches() < 2 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(300));
    }
    let log = m.log_text();
    assert_eq!(m.launches(), 2, "{log}");
    assert_eq!(log.matches("cannot launch a worker").count(), 1, "{log}");
    assert!(log.contains("Job definition"), "{log}");
    // Registered at start-up, and once more after it disappeared.
    assert_eq!(log.matches("registered job definition").count(), 2, "{log}");
    let metrics = m.get("/metrics");
    for line in [
        "cl_worker_manager_submit_failures_total{shape=\"default\"} 1",
        "cl_worker_manager_launches_total{shape=\"default\"} 2",
        // The wiped job never had a worker check in: a lost launch, counted until one does.
        "cl_worker_manager_workers_lost_before_checkin_total 1",
        "cl_worker_manager_consecutive_submit_failures 1",
        "cl_worker_manager_circuit_breaker_state 0",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    drop(m);
    cl.run(&["rm", "--force", &uuid]);
}

/// A manager on a queue of its own with moto in docker mode (it runs the worker image, built
/// from docker/Dockerfile, on the fake GPU machine of tests/peers/fake-gpu.sh), and one staged bundle running `command` for it.
struct DockerLoop {
    q: String,
    cl: Cl,
    uuid: String,
    m: ManagerProc,
    _docker: DockerMode,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn docker_loop(what: &str, command: &str, globals: &[&str]) -> DockerLoop {
    // The worker image of a site whose machines have GPUs (the fake ones): a worker of a shape
    // without GPUs must offer none of them.
    let image = testkit::images::gpu_host_worker_image();
    let q = unique(&format!("q{what}")).replace('-', "");
    let secret = queue(&q)["CLW_MOTO_SECRET_ARN"].clone();
    let docker = DockerMode::on();
    let cl = Cl::new(what);
    let tag = unique(&format!("clw-{what}"));
    let uuid = cl.run_bundle(&tag, &["--request-memory", "1g"], command);
    wait_for(&peer().client(), &uuid, T, |s| s == "staged");
    // The work-dir prefix is a host path the job mounts at the same path, so that the run
    // containers the worker starts through the host's Docker socket see the same files.
    let prefix = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut g = vec!["--worker-idle-seconds", "5"];
    g.extend_from_slice(globals);
    // The password reaches the worker as on AWS: the definition's `secrets`, which moto's
    // docker mode (the peer's launcher) resolves into the container's environment.
    let m = start_manager_with(
        dir.path(),
        &tag,
        &q,
        &prefix.path().display().to_string(),
        image,
        &g,
        &["--password-secret-arn", &secret],
    );
    DockerLoop {
        q,
        cl,
        uuid,
        m,
        _docker: docker,
        _dirs: (prefix, dir),
    }
}

#[test]
fn full_loop_moto_runs_the_worker_image_which_finishes_the_bundle() {
    // Bound whole: the mode guard and the directories live until the test ends.
    let l = docker_loop("aws-loop", "sleep 6; echo full-loop", &[]);
    let (q, cl, uuid, m) = (&l.q, &l.cl, &l.uuid, &l.m);
    assert!(
        m.wait_log("launched worker", Duration::from_secs(30)),
        "{}",
        m.log_text()
    );
    // A worker of the default shape (`--gpus 0`) on a GPU machine offers no GPU.
    assert_eq!(testkit::cl::gpus_offered_for(uuid), 0, "{}", m.log_text());
    // moto runs the worker image; the worker checks in, runs the bundle in Docker, uploads it.
    let b = wait_for(&peer().client(), uuid, T, is_final);
    let jobs = || {
        boto(&format!(
            "print(json.dumps([(j['jobName'], j['status']) for s in ['SUBMITTED','PENDING','RUNNABLE','STARTING','RUNNING','SUCCEEDED','FAILED'] for j in b.list_jobs(jobQueue='{q}', jobStatus=s)['jobSummaryList']]))"
        ))
    };
    assert_eq!(
        b.state(),
        Some("ready"),
        "{b:?}\njobs: {}\n{}",
        jobs(),
        m.log_text()
    );
    assert_eq!(cl.stdout(uuid), "full-loop\n");
    // The run was taken by the worker the manager launched (its id is in the job's command).
    let remote = meta_str(&b, "remote");
    let launched = m.log_text();
    assert!(
        !remote.is_empty() && launched.contains(&remote),
        "remote {remote:?} is not a launched worker: {launched}"
    );
    // The idle worker exits 0, moto marks its job SUCCEEDED, and the manager counts it ended.
    let t0 = Instant::now();
    let mut last = Value::Null;
    while t0.elapsed() < Duration::from_secs(90) {
        last = jobs();
        let all = last.as_array().unwrap();
        if !all.is_empty() && all.iter().all(|j| j[1] == "SUCCEEDED") {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let all = last.as_array().unwrap();
    assert_eq!(all.len(), 1, "one worker job: {last}\n{}", m.log_text());
    assert_eq!(all[0][1], "SUCCEEDED", "{last}\n{}", m.log_text());
    let t0 = Instant::now();
    loop {
        let metrics = m.get("/metrics");
        if metric_sum(&metrics, "cl_worker_manager_workers") == 0.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the manager still counts workers: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(m.launches(), 1, "{}", m.log_text());
}

/// A spot reclaim as AWS Batch shows it: the job running the worker is terminated mid-run
/// (moto's docker mode stops its container as ECS does: SIGTERM, SIGKILL after 30 s). The
/// worker hands its run back, the job ends FAILED, and a worker of a new job runs the bundle
/// again to `ready`.
#[test]
fn a_worker_job_terminated_mid_run_hands_its_run_back_and_a_new_job_finishes_it() {
    let l = docker_loop(
        "aws-reclaim",
        testkit::reclaim::BUNDLE,
        &["--max-workers", "1"],
    );
    let (cl, uuid, m) = (&l.cl, &l.uuid, &l.m);
    wait_for(&peer().client(), uuid, T, |s| s == "running");
    let first = m.launched();
    assert_eq!(first.len(), 1, "{}", m.log_text());
    let job = first[0].0.clone();
    let t0 = Instant::now();
    boto(&format!(
        "b.terminate_job(jobId='{job}', reason='Host EC2 (instance i-0abc) terminated.'); print(0)"
    ));
    testkit::reclaim::assert_handed_back_then_ready(
        cl,
        uuid,
        t0,
        Duration::from_secs(25),
        "AWS Batch job terminated",
        || m.log_text(),
    );
    let status = boto(&format!(
        "print(json.dumps(b.describe_jobs(jobs=['{job}'])['jobs'][0]['status']))"
    ));
    assert_eq!(status, "FAILED", "{}", m.log_text());
    assert_eq!(m.launches(), 2, "{}", m.log_text());
    testkit::reclaim::assert_one_interrupted(m);
}

#[test]
fn workers_that_die_before_checking_in_back_off_instead_of_relaunching_every_tick() {
    // moto really starts the job's container, but this image has no cl-worker: every job fails
    // at once, although every submission is accepted.
    let q = unique("qcrash").replace('-', "");
    let secret = queue(&q)["CLW_MOTO_SECRET_ARN"].clone();
    let _docker = DockerMode::on();
    let cl = Cl::new("aws-crash");
    let tag = unique("clw-aws-crash");
    let uuid = stage(&cl, &tag);
    let dir = tempfile::tempdir().unwrap();
    let m = start_manager(dir.path(), &tag, &q, &["--password-secret-arn", &secret]);
    // 30 s of 2 s ticks: one launch per tick would be 15; the back-off (5 s, 10 s, 20 s after
    // each loss) allows 3 or 4.
    std::thread::sleep(Duration::from_secs(30));
    // The ticks ran (each could have launched; 15 at 2 s, fewer on a loaded machine).
    assert!(m.ticks() >= 8, "{} ticks\n{}", m.ticks(), m.log_text());
    let log = m.log_text();
    let launches = m.launches();
    assert!((2..=4).contains(&launches), "{launches} launches\n{log}");
    assert!(
        log.contains("unsuccessfully before its worker checked in"),
        "{log}"
    );
    assert!(log.contains("lost before check-in"), "{log}");
    let metrics = m.get("/metrics");
    let lost = metric(
        &metrics,
        "cl_worker_manager_workers_lost_before_checkin_total",
    );
    assert!(lost >= 2, "{metrics}");
    drop(m);
    cl.run(&["rm", "--force", &uuid]);
}

/// CodaLab's documented AWS Batch command ("pass in the name of the job queue for
/// `--job-queue`"), as written, with CodaLab's defaults (`--min-workers 1`, no tag, the
/// `codalab-worker` definition, workers in `/tmp`), changed only in the server's address, the
/// times a test cannot wait for (`--sleep-time`, `--min-seconds-between-workers`,
/// `--worker-idle-seconds`) and the registry's image tag (`CODALAB_VERSION`), plus the one
/// credentials flag our security model adds (`--password-secret-arn`, without which it refuses,
/// naming that flag). A CPU bundle and a GPU bundle (the fake GPU machine of
/// tests/peers/fake-gpu.sh, found by the worker container through the Docker engine) reach
/// `ready` on the workers moto runs.
#[test]
fn the_documented_command_takes_a_cpu_and_a_gpu_bundle_to_ready() {
    testkit::images::gpu_host_worker_image();
    let user = testkit::peers::add_user("clwdocaws");
    let q = unique("qdoc").replace('-', "");
    // A queue whose compute environment also launches GPU instances.
    let secret = testkit::moto::queue_of(&q, &user.password, "optimal,g4dn.xlarge")
        ["CLW_MOTO_SECRET_ARN"]
        .clone();
    let p = peer();
    let mut env = moto().clone();
    env.extend(testkit::manager::documented_env(&user));
    let documented = |extra: &[&str]| -> Vec<String> {
        let mut a = testkit::manager::shortened_times(&p.server_url());
        a.extend(["aws-batch", "--job-queue", &q].map(String::from));
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };

    // As written, without a credentials flag: refused at once, naming the flag to add.
    let dir = tempfile::tempdir().unwrap();
    testkit::manager::assert_refused(
        dir.path(),
        &documented(&[]),
        &env,
        "aws-batch needs --password-secret-arn",
    );

    let cl = Cl::as_user("aws-doc", &user);
    let (cpu, gpu) = testkit::manager::stage_cpu_and_gpu(&cl);
    let _docker = DockerMode::on();
    let dir = tempfile::tempdir().unwrap();
    let mut m = ManagerProc::spawn(
        dir.path(),
        &documented(&["--password-secret-arn", &secret]),
        &env,
    );
    let given = testkit::manager::assert_cpu_and_gpu_ready(&cl, &m, &cpu, &gpu);
    // The GPU bundle got a job with a GPU resource requirement (shape `gpu`: the queue launches
    // GPU instances and no shape has GPUs), and its worker used the GPU that job was given
    // (moto gives the last free one, as ECS gives a container its GPUs by
    // NVIDIA_VISIBLE_DEVICES), not the host's first; the `--min-workers 1` worker of shape
    // default (no GPU) offered none, so it could not take the GPU bundle.
    assert_eq!(given, testkit::manager::FAKE_GPUS[1], "{}", m.log_text());
    let b = wait_for(&peer().client(), &gpu, T, is_final);
    let remote = meta_str(&b, "remote");
    let worker = remote.rsplit('-').next().unwrap_or_default();
    assert!(
        m.log_text()
            .lines()
            .any(|l| l.contains(worker) && l.contains("(shape gpu)")),
        "the GPU run's worker {remote} was not launched with shape gpu:\n{}",
        m.log_text()
    );
    // moto shows the job's shape tag (it does not show its resource requirements; their GPU
    // is what made moto give the job a GPU: the run's GPU above).
    let gpu_jobs = testkit::moto::boto(&format!(
        "print(json.dumps([j['jobName'] for s in ['SUBMITTED','PENDING','RUNNABLE','STARTING','RUNNING','SUCCEEDED','FAILED'] for j in b.list_jobs(jobQueue='{q}', jobStatus=s)['jobSummaryList'] if b.describe_jobs(jobs=[j['jobId']])['jobs'][0].get('tags', {{}}).get('codalab-worker-shape') == 'gpu']))"
    ));
    assert_eq!(
        gpu_jobs.as_array().map(Vec::len),
        Some(1),
        "{gpu_jobs}\n{}",
        m.log_text()
    );
    m.terminate();
    // The idle worker kept by --min-workers 1 goes with its job.
    let _ = testkit::moto::try_boto(&format!(
        "[b.terminate_job(jobId=j['jobId'], reason='test over') for s in ['SUBMITTED','PENDING','RUNNABLE','STARTING','RUNNING'] for j in b.list_jobs(jobQueue='{q}', jobStatus=s)['jobSummaryList']]; print('[]')"
    ));
}
