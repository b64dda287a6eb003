use super::model::{ExecutionInfo, FailureInfo};
use super::*;
use crate::Resources;

pub(crate) fn cfg() -> AzureBatchConfig {
    AzureBatchConfig {
        job_id: "codalab-job".into(),
        task_prefix: "cl_worker_".into(),
        image: "codalab/worker:1.7.5".into(),
        user: "root".into(),
        log_container_url: "https://logs.blob.core.windows.net/worker-logs?sv=1&sig=SECRET".into(),
        log_identity: None,
        work_dir_prefix: Some("/mnt/work".into()),
        bundle_mount: None,
        password_file: Some("/mnt/work/.worker-password".into()),
        plaintext_credentials: None,
        pool_id: None,
        remove_unhealthy_after: None,
    }
}

fn spec() -> JobSpec {
    JobSpec {
        worker_id: "0123456789abcdef0123456789abcdef".into(),
        shape_name: "gpu small".into(),
        resources: Resources::new(2, 1, 4096 << 20),
        command: [
            "cl-worker",
            "--server",
            "https://w.example.org",
            "--tag",
            "it's; $(rm -rf /)",
        ]
        .map(String::from)
        .to_vec(),
        env: vec![
            ("CODALAB_SENTRY_ENVIRONMENT".into(), "prod".into()),
            ("CODALAB_PASSWORD".into(), "leaked?".into()),
        ],
    }
}

#[test]
fn a_task_runs_the_quoted_worker_command_with_host_mounts_and_no_secrets() {
    let t = cfg().task(&spec());
    assert_eq!(t.id, "cl_worker_0123456789abcdef0123456789abcdef");
    assert_eq!(t.display_name.as_deref(), Some("cl-worker gpu small"));
    // One shell word after -c; the hostile tag survives as one argument.
    let words = shlex::split(&t.command_line).unwrap();
    assert_eq!(words[..2], ["/bin/sh", "-c"]);
    assert_eq!(words.len(), 3, "{words:?}");
    let inner = shlex::split(&words[2]).unwrap();
    assert_eq!(
        inner,
        [
            "exec",
            "cl-worker",
            "--server",
            "https://w.example.org",
            "--tag",
            "it's; $(rm -rf /)",
            "--password-file",
            "/mnt/work/.worker-password"
        ]
    );
    assert_eq!(
        t.container_settings.container_run_options,
        "--cpus 2 --memory 4096m --user root -v /var/run/docker.sock:/var/run/docker.sock \
         -v /mnt/work:/mnt/work -v /mnt/work/.worker-password:/mnt/work/.worker-password:ro"
    );
    assert_eq!(t.constraints.max_task_retry_count, 0);
    assert_eq!(
        t.environment_settings,
        [EnvironmentSetting {
            name: "CODALAB_SENTRY_ENVIRONMENT".into(),
            value: "prod".into()
        }]
    );
    let out = &t.output_files[0];
    assert_eq!(out.file_pattern, "$AZ_BATCH_TASK_DIR/std*.txt");
    assert_eq!(out.destination.container.path, t.id);
    assert_eq!(out.upload_options.upload_condition, "taskcompletion");
    let body = String::from_utf8(client::sdk_json(&t)).unwrap();
    assert!(!body.contains("leaked?"), "{body}");
    assert!(!body.contains("identityReference"), "{body}");
}

#[test]
fn plaintext_credentials_only_on_request_and_paths_are_quoted() {
    let mut c = cfg();
    c.password_file = None;
    assert!(c.validate().is_err(), "no way for workers to log in");
    c.plaintext_credentials = Some(("codalab".into(), "pw".into()));
    c.validate().unwrap();
    c.work_dir_prefix = Some("/mnt/my work".into());
    c.log_identity = Some("/subscriptions/s/rg/identity".into());
    let t = c.task(&spec());
    assert!(!t.command_line.contains("--password-file"));
    let names: Vec<_> = t
        .environment_settings
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "CODALAB_SENTRY_ENVIRONMENT",
            "CODALAB_USERNAME",
            "CODALAB_PASSWORD"
        ]
    );
    assert!(t
        .container_settings
        .container_run_options
        .ends_with("-v '/mnt/my work:/mnt/my work'"));
    assert_eq!(
        t.output_files[0].destination.container.identity_reference,
        Some(IdentityReference {
            resource_id: "/subscriptions/s/rg/identity".into()
        })
    );
}

#[test]
fn settings_the_service_would_refuse_are_refused_early() {
    let mut c = cfg();
    c.job_id = "bad job".into();
    assert!(c.validate().is_err());
    let mut c = cfg();
    c.task_prefix = "x".repeat(33);
    assert!(c.validate().is_err());
    c.task_prefix = "x".repeat(32);
    c.validate().unwrap();
    let mut c = cfg();
    c.log_container_url = "worker-logs".into();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("--log-container-url"), "{e}");
    c.log_container_url = "ftp://x?sig=SECRET".into();
    let e = c.validate().unwrap_err().to_string();
    assert!(!e.contains("SECRET"), "the SAS is not shown: {e}");
}

fn task(id: &str, state: TaskState, info: Option<ExecutionInfo>) -> Task {
    Task {
        id: id.into(),
        display_name: Some("cl-worker default".into()),
        state,
        execution_info: info,
    }
}

#[test]
fn task_states_map_to_job_states() {
    let c = cfg();
    let s = |t: &Task| c.status_of(t).unwrap();
    assert_eq!(
        s(&task("cl_worker_a", TaskState::Active, None)).state,
        JobState::Pending
    );
    assert_eq!(
        s(&task("cl_worker_a", TaskState::Preparing, None)).state,
        JobState::Pending
    );
    assert_eq!(
        s(&task("cl_worker_a", TaskState::Other, None)).state,
        JobState::Pending
    );
    let r = s(&task("cl_worker_a", TaskState::Running, None));
    assert_eq!(
        (r.state, r.worker_id.as_str(), r.shape_name.as_str()),
        (JobState::Running, "a", "default")
    );
    assert!(c
        .status_of(&task("other_a", TaskState::Running, None))
        .is_none());
    let ok = s(&task(
        "cl_worker_a",
        TaskState::Completed,
        Some(ExecutionInfo {
            exit_code: Some(0),
            result: Some("success".into()),
            failure_info: None,
        }),
    ));
    assert_eq!(
        (ok.state, ok.detail),
        (JobState::Finished { success: true }, None)
    );
    let failed = s(&task(
        "cl_worker_a",
        TaskState::Completed,
        Some(ExecutionInfo {
            exit_code: Some(3),
            result: Some("failure".into()),
            failure_info: Some(FailureInfo {
                code: Some("FailureExitCode".into()),
                message: Some("The task exited with an exit code representing a failure".into()),
                ..Default::default()
            }),
        }),
    ));
    assert_eq!(failed.state, JobState::Finished { success: false });
    assert_eq!(
        failed.detail.as_deref(),
        Some("FailureExitCode: The task exited with an exit code representing a failure (exit code 3)")
    );
    // Terminated while queued: no exit code, a failure.
    let ended = s(&task(
        "cl_worker_a",
        TaskState::Completed,
        Some(ExecutionInfo {
            failure_info: Some(FailureInfo {
                code: Some("TaskEnded".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    ));
    assert_eq!(
        (ended.state, ended.detail.as_deref()),
        (JobState::Finished { success: false }, Some("TaskEnded"))
    );
}

#[test]
fn the_listing_asks_only_for_this_managers_tasks_and_the_fields_used() {
    let q = cfg().list_query();
    assert_eq!(q.filter.as_deref(), Some("startswith(id,'cl_worker_')"));
    assert_eq!(q.select, ["id", "displayName", "state", "executionInfo"]);
    assert_eq!(q.max_results, Some(1000));
}

#[test]
fn recorded_task_lists_parse_as_the_sdk_parses_them() {
    let raw = include_str!("../../../tests/peers/azure/fixtures/tasks-list.json");
    let page: model::TaskPage = serde_json::from_str(raw).unwrap();
    let states: Vec<_> = page.value.iter().map(|t| t.state.clone()).collect();
    assert!(states.contains(&TaskState::Active) && states.contains(&TaskState::Completed));
    assert!(page.next_link.is_none());
    let raw = include_str!("../../../tests/peers/azure/fixtures/tasks-list-page1.json");
    let page: model::TaskPage = serde_json::from_str(raw).unwrap();
    assert!(page.next_link.is_some());
}

/// The work dir's parent is on the node at the same path whatever the flags (`/tmp` without a
/// prefix, as CodaLab's manager uses), and the bundle store with a shared file system is a host
/// path too (CodaLab's manager names a Docker volume there by mistake).
#[test]
fn the_work_dir_and_the_bundle_store_are_host_paths_whatever_the_flags() {
    let mut c = cfg();
    c.work_dir_prefix = None;
    c.password_file = Some("/etc/codalab/password".into());
    c.bundle_mount = Some("/mnt/codalab/bundles".into());
    assert_eq!(
        c.task(&spec()).container_settings.container_run_options,
        "--cpus 2 --memory 4096m --user root -v /var/run/docker.sock:/var/run/docker.sock \
         -v /tmp:/tmp -v /mnt/codalab/bundles:/mnt/codalab/bundles \
         -v /etc/codalab/password:/etc/codalab/password:ro"
    );
}

/// Every worker of a pool shares one work dir, so the pool's nodes share one dependency cache.
#[test]
fn the_workers_of_a_pool_share_one_work_dir() {
    assert_eq!(
        args::shared_work_dir(Some("/mnt/work/"), "gpu pool"),
        "/mnt/work/cl_worker_gpu_pool_work_dir"
    );
    assert_eq!(
        args::shared_work_dir(None, "codalab-job"),
        "/tmp/cl_worker_codalab-job_work_dir"
    );
}

/// `--account-key-file` is held to the password file's rule: mode 600 (no group or other bit),
/// refused with the `chmod 600` hint, and no message shows the key.
#[test]
fn the_account_key_file_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("batch-key");
    let key = "c2VjcmV0IGFjY291bnQga2V5";
    std::fs::write(&path, format!("{key}\n")).unwrap();
    let chmod = |mode: u32| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    for mode in [0o600, 0o400] {
        chmod(mode);
        let secret = args::read_account_key_file(&path).unwrap();
        assert_eq!(
            secret.secret(),
            key,
            "{mode:o}: the key, without its newline"
        );
    }
    for mode in [0o640, 0o604, 0o644, 0o660, 0o620, 0o602] {
        chmod(mode);
        let e = args::read_account_key_file(&path).unwrap_err().to_string();
        let shown = path.display();
        assert_eq!(
            e,
            format!(
                "--account-key-file {shown} is readable by group or others (mode {mode:o}); run \
                 `chmod 600 {shown}`"
            )
        );
        assert!(!e.contains(key));
    }
    chmod(0o600);
    std::fs::write(&path, " \n").unwrap();
    let e = args::read_account_key_file(&path).unwrap_err().to_string();
    assert!(e.contains("is empty"), "{e}");
    let e = args::read_account_key_file(&d.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("--account-key-file "), "{e}");
    assert!(e.contains("missing"), "{e}");
}

/// The flag goes through that check: a group-readable key file stops the manager before any
/// request, and a private one gives SharedKey authentication.
#[test]
fn the_account_key_flag_reads_the_file_with_its_mode_checked() {
    use clap::Parser;
    use std::os::unix::fs::PermissionsExt;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AzureBatchArgs,
    }
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("batch-key");
    std::fs::write(&path, "a2V5\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cli = Cli::try_parse_from([
        "azure-batch",
        "--account-name",
        "codalab",
        "--account-key-file",
        path.to_str().unwrap(),
        "--service-url",
        "https://codalab.westus2.batch.azure.com",
        "--log-container-url",
        "https://logs.blob.core.windows.net/worker-logs",
        "--job-id",
        "codalab-workers",
    ])
    .unwrap();
    let e = cli.args.account_key().unwrap_err().to_string();
    assert!(e.contains("chmod 600"), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = cli.args.account_key().unwrap().expect("a key");
    assert_eq!(key.secret(), "a2V5");
}
