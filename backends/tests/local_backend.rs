//! Tests of the `local` backend with small shell scripts as workers.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use backends::local::{process_start_time, JOBS_FILE, LOG_FILE};
use backends::{Backend, JobSpec, JobState, JobStatus, LocalBackend, Resources};

fn spec(worker_id: &str, script: &str) -> JobSpec {
    JobSpec {
        worker_id: worker_id.to_string(),
        shape_name: "small".to_string(),
        resources: Resources::new(1, 0, 1 << 30),
        command: vec!["sh".into(), "-c".into(), script.into(), "sh".into()],
        env: vec![("CL_TEST_VAR".into(), "visible".into())],
    }
}

fn state_of(statuses: &[JobStatus], id: &str) -> Option<JobState> {
    statuses.iter().find(|s| s.id == id).map(|s| s.state)
}

/// Lists until job `id` is reported finished; returns that state.
async fn wait_finished(backend: &LocalBackend, id: &str) -> JobState {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let statuses = backend.list().await.unwrap();
        match state_of(&statuses, id) {
            Some(state @ JobState::Finished { .. }) => return state,
            Some(JobState::Running | JobState::Pending) => {}
            None => panic!("job {id} vanished before being reported finished"),
        }
        assert!(Instant::now() < deadline, "job {id} did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn assert_gone(backend: &LocalBackend, id: &str) {
    let statuses = backend.list().await.unwrap();
    assert_eq!(state_of(&statuses, id), None, "{statuses:?}");
}

#[tokio::test]
async fn cancel_stops_a_running_job_which_is_reported_finished_once() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::new(dir.path()).unwrap();
    assert_eq!(backend.name(), "local");
    let id = backend.submit(&spec("w1", "sleep 30")).await.unwrap();

    let statuses = backend.list().await.unwrap();
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].worker_id, "w1");
    assert_eq!(statuses[0].shape_name, "small");
    assert_eq!(statuses[0].state, JobState::Running);

    backend.cancel(&id).await.unwrap();
    assert_eq!(
        wait_finished(&backend, &id).await,
        JobState::Finished { success: false }
    );
    assert_gone(&backend, &id).await;
    // Cancelling a job that is gone is not an error.
    backend.cancel(&id).await.unwrap();
}

#[tokio::test]
async fn cancel_escalates_to_sigkill_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::new(dir.path())
        .unwrap()
        .with_grace(Duration::from_millis(300));
    let script = "trap '' TERM; while true; do sleep 0.1; done";
    let id = backend.submit(&spec("stubborn", script)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    backend.cancel(&id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let statuses = backend.list().await.unwrap();
    assert_eq!(state_of(&statuses, &id), Some(JobState::Running));
    assert_eq!(
        wait_finished(&backend, &id).await,
        JobState::Finished { success: false }
    );
    assert_gone(&backend, &id).await;
}

#[tokio::test]
async fn jobs_that_exit_by_themselves_are_finished_with_their_status() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::new(dir.path()).unwrap();
    let ok = backend
        .submit(&spec("ok", "echo hello; echo oops >&2"))
        .await
        .unwrap();
    let bad = backend.submit(&spec("bad", "exit 3")).await.unwrap();
    // Each finished job is reported by exactly one `list`, possibly the same one for both.
    let mut reports = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while reports.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "jobs did not finish: {reports:?}"
        );
        for status in backend.list().await.unwrap() {
            if matches!(status.state, JobState::Finished { .. }) {
                reports.push((status.id, status.state));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reports.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        reports,
        vec![
            (bad.clone(), JobState::Finished { success: false }),
            (ok.clone(), JobState::Finished { success: true }),
        ]
    );
    assert_gone(&backend, &ok).await;
    assert_gone(&backend, &bad).await;
    let log = std::fs::read_to_string(backend.work_dir("ok").join(LOG_FILE)).unwrap();
    assert_eq!(log, "hello\noops\n");
}

#[tokio::test]
async fn a_restarted_manager_adopts_running_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let first = LocalBackend::new(dir.path()).unwrap();
    let id = first.submit(&spec("adopted", "sleep 30")).await.unwrap();

    let second = LocalBackend::new(dir.path()).unwrap();
    let statuses = second.list().await.unwrap();
    assert_eq!(state_of(&statuses, &id), Some(JobState::Running));
    // The adopted worker is not launched twice.
    let err = second.submit(&spec("adopted", "true")).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");

    second.cancel(&id).await.unwrap();
    // Not our child: the exit status is unknown, hence success=false.
    assert_eq!(
        wait_finished(&second, &id).await,
        JobState::Finished { success: false }
    );
    assert_gone(&second, &id).await;
    // The first instance reaps its child and no longer lists the job.
    assert_gone(&first, &id).await;
}

#[tokio::test]
async fn the_password_file_path_is_passed_but_never_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let password_file = secrets.path().join("password");
    std::fs::write(&password_file, "user\nsecret-pw\n").unwrap();
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let backend = LocalBackend::new(dir.path()).unwrap();
    let mut job = spec("pw", r#"printf '%s\n' "$@" > args.txt; env > env.txt"#);
    // As the manager's worker command names it.
    job.command.extend([
        "--password-file".into(),
        password_file.display().to_string(),
    ]);
    let id = backend.submit(&job).await.unwrap();
    assert_eq!(
        wait_finished(&backend, &id).await,
        JobState::Finished { success: true }
    );

    let work_dir = backend.work_dir("pw");
    let args = std::fs::read_to_string(work_dir.join("args.txt")).unwrap();
    // The command's password file, then the worker's share of the machine the backend adds.
    assert!(
        args.starts_with(&format!(
            "--password-file\n{}\n--cpuset\n",
            password_file.display()
        )) && args.contains("\n--gpuset\nNONE\n--max-memory\n"),
        "{args}"
    );
    let env = std::fs::read_to_string(work_dir.join("env.txt")).unwrap();
    assert!(env.contains("CL_TEST_VAR=visible"), "{env}");
    for file in [&args, &env] {
        assert!(!file.contains("secret-pw"));
    }
    let records = std::fs::read_to_string(dir.path().join(JOBS_FILE)).unwrap();
    assert!(!records.contains("secret-pw"));
}

#[tokio::test]
async fn a_password_file_readable_by_others_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "user\nsecret-pw\n").unwrap();
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let backend = LocalBackend::new(dir.path().join("jobs")).unwrap();
    let mut job = spec("pw", "true");
    job.command.extend([
        "--password-file".into(),
        password_file.display().to_string(),
    ]);
    let err = backend.submit(&job).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn invalid_specs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::new(dir.path()).unwrap();
    for worker_id in ["", "..", "a/b", ".hidden"] {
        let err = backend.submit(&spec(worker_id, "true")).await.unwrap_err();
        assert!(!err.is_retryable(), "{worker_id:?}");
    }
    let mut job = spec("empty", "true");
    job.command.clear();
    assert!(backend.submit(&job).await.is_err());
    let mut job = spec("missing", "true");
    job.command = vec!["/nonexistent/cl-worker".into()];
    let err = backend.submit(&job).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(backend.list().await.unwrap().is_empty());
}

fn write_record(prefix: &Path, id: &str, pid: u32, proc_start_time: u64) {
    let records = serde_json::json!({
        "jobs": [{
            "id": id,
            "worker_id": "w",
            "shape_name": "small",
            "pid": pid,
            "started_at_unix": 0,
            "proc_start_time": proc_start_time,
        }]
    });
    std::fs::write(prefix.join(JOBS_FILE), records.to_string()).unwrap();
}

#[tokio::test]
async fn a_reused_pid_is_not_mistaken_for_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    // A live process (this test) whose start time matches is adopted as running ...
    let pid = std::process::id();
    let start = process_start_time(pid).unwrap();
    write_record(dir.path(), "w-live", pid, start);
    let backend = LocalBackend::new(dir.path()).unwrap();
    let statuses = backend.list().await.unwrap();
    assert_eq!(state_of(&statuses, "w-live"), Some(JobState::Running));

    // ... but with another start time the pid belongs to another process: the job is over.
    write_record(dir.path(), "w-reused", pid, start + 1);
    let statuses = backend.list().await.unwrap();
    assert_eq!(
        state_of(&statuses, "w-reused"),
        Some(JobState::Finished { success: false })
    );
    assert_gone(&backend, "w-reused").await;
}

#[tokio::test]
async fn workers_get_distinct_cores_and_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::new(dir.path()).unwrap().with_gpus(2);
    let cpus = backends::capacity().unwrap().cpus;
    let mut seen = Vec::new();
    for name in ["a", "b"] {
        let mut job = spec(name, r#"printf '%s\n' "$@" > args.txt; sleep 30"#);
        job.resources.gpus = 1;
        let id = backend.submit(&job).await.unwrap();
        let args_path = backend.work_dir(name).join("args.txt");
        let mut args = String::new();
        for _ in 0..100 {
            args = std::fs::read_to_string(&args_path).unwrap_or_default();
            if args.contains("--max-memory") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let lines: Vec<&str> = args.lines().collect();
        let value = |flag: &str| {
            let i = lines.iter().position(|l| *l == flag).expect(flag);
            lines[i + 1].to_string()
        };
        seen.push((value("--cpuset"), value("--gpuset"), id));
    }
    assert_ne!(seen[0].1, seen[1].1, "{seen:?}");
    if cpus >= 2 {
        assert_ne!(seen[0].0, seen[1].0, "{seen:?}");
    }
    // A third one-GPU worker does not fit on two GPUs.
    let mut job = spec("c", "sleep 30");
    job.resources.gpus = 1;
    let e = backend.submit(&job).await.unwrap_err();
    assert!(e.to_string().contains("GPUs"), "{e}");
    for (_, _, id) in &seen {
        backend.cancel(id).await.unwrap();
    }
}
