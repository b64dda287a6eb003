use super::*;
use serde_json::json;

fn run(time: f64, memory: u64, disk: u64) -> RunState {
    let bundle: BundleInfo =
        serde_json::from_value(json!({"uuid": "0xa", "command": "true"})).unwrap();
    let resources: RunResources = serde_json::from_value(json!({"cpus": 1, "gpus": 0,
        "docker_image": "img:latest", "time": time, "memory": memory, "disk": disk,
        "network": true}))
    .unwrap();
    RunState::new(bundle, resources, "/w/runs/0xa".into(), 100.0)
}

fn started(s: &mut RunState) {
    step(s, Event::Accepted, 100.0);
    step(
        s,
        Event::ContainerStarted {
            container_id: "c1".into(),
            docker_image: "img@sha256:1".into(),
            cpuset: vec![0],
            gpuset: vec![],
        },
        101.0,
    );
}

fn exited(code: i64) -> Event {
    Event::ContainerExited {
        exitcode: Some(code),
        oom_killed: false,
        failure: None,
    }
}

#[test]
fn happy_path() {
    let mut s = run(0.0, 1 << 30, 0);
    assert_eq!(
        step(&mut s, Event::Accepted, 100.0),
        vec![Effect::Prepare, Effect::CheckinSoon]
    );
    assert_eq!(s.report("w").state, "preparing");
    started(&mut s);
    assert_eq!(s.stage, Stage::Running);
    assert_eq!(s.report("w").state, "running");
    assert_eq!(s.report("w").docker_image.as_deref(), Some("img@sha256:1"));
    assert_eq!(
        step(&mut s, exited(0), 105.0),
        vec![Effect::CleanUp, Effect::CheckinSoon]
    );
    assert_eq!(s.report("w").state, "running");
    assert_eq!(
        step(&mut s, Event::CleanedUp, 105.5),
        vec![Effect::Upload, Effect::CheckinSoon]
    );
    assert_eq!(s.stage, Stage::UploadingResults);
    step(
        &mut s,
        Event::Status("Uploading results: 1k uploaded".into()),
        106.0,
    );
    assert!(s.run_status.starts_with("Uploading results"));
    assert_eq!(
        step(&mut s, Event::UploadFinished(Ok(())), 107.0),
        vec![Effect::CheckinSoon]
    );
    let r = s.report("w");
    assert_eq!(
        (r.state.as_str(), r.exitcode, r.failure_message),
        ("finalizing", Some(0), None)
    );
    assert_eq!(
        step(&mut s, Event::MarkFinalized, 108.0),
        vec![Effect::DeleteLocalData]
    );
    assert!(s.is_done());
    let p = &s.profile;
    assert_eq!(p["RUN_STAGE.PREPARING"].elapsed, 1.0);
    assert_eq!(p["RUN_STAGE.RUNNING"].elapsed, 4.0);
    assert_eq!(p["RUN_STAGE.FINALIZING"].elapsed, 1.0);
}

#[test]
fn report_has_every_field_and_all_profile_stages() {
    let s = run(0.0, 0, 0);
    let v = serde_json::to_value(s.report("w1")).unwrap();
    for k in [
        "uuid",
        "run_status",
        "bundle_start_time",
        "container_time_total",
        "container_time_user",
        "container_time_system",
        "docker_image",
        "state",
        "remote",
        "exitcode",
        "failure_message",
        "bundle_profile_stats",
        "cpu_usage",
        "memory_usage",
        "disk_utilization",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    for k in PROFILE_STAGES {
        assert!(v["bundle_profile_stats"][k]["elapsed"].is_number(), "{k}");
    }
    assert_eq!(v["remote"], "w1");
    assert!(v["disk_utilization"].is_u64());
}

#[test]
fn nonzero_exit_keeps_code() {
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    step(&mut s, exited(3), 102.0);
    step(&mut s, Event::CleanedUp, 102.0);
    step(&mut s, Event::UploadFinished(Ok(())), 103.0);
    assert_eq!(s.exitcode, Some(3));
    assert_eq!(s.failure_message, None);
}

#[test]
fn user_kill_while_running() {
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    assert_eq!(
        step(&mut s, Event::KillRequested("Kill requested".into()), 102.0),
        vec![Effect::KillContainer, Effect::CheckinSoon]
    );
    // The container dies of the kill: SIGKILL is not a memory overrun, the code is dropped.
    step(
        &mut s,
        Event::ContainerExited {
            exitcode: Some(137),
            oom_killed: false,
            failure: None,
        },
        103.0,
    );
    assert_eq!(s.exitcode, None);
    step(&mut s, Event::CleanedUp, 103.0);
    assert_eq!(s.stage, Stage::UploadingResults);
    step(&mut s, Event::UploadFinished(Ok(())), 104.0);
    assert_eq!(s.failure_message.as_deref(), Some("Kill requested"));
    assert_eq!(s.stage, Stage::Finalizing);
}

#[test]
fn kill_while_preparing_skips_upload() {
    let mut s = run(0.0, 0, 0);
    step(&mut s, Event::Accepted, 100.0);
    assert_eq!(
        step(&mut s, Event::KillRequested("Kill requested".into()), 100.5),
        vec![Effect::CancelPrepare, Effect::CheckinSoon]
    );
    // A second kill message does not cancel twice.
    assert!(step(&mut s, Event::KillRequested("Kill requested".into()), 100.6).is_empty());
    step(&mut s, Event::PrepareFailed("cancelled".into()), 101.0);
    assert_eq!(s.stage, Stage::CleaningUp);
    assert_eq!(
        step(&mut s, Event::CleanedUp, 101.0),
        vec![Effect::CheckinSoon]
    );
    assert_eq!(s.stage, Stage::Finalizing);
    assert_eq!(s.failure_message.as_deref(), Some("Kill requested"));
}

#[test]
fn kill_racing_container_start_kills_the_container() {
    let mut s = run(0.0, 0, 0);
    step(&mut s, Event::Accepted, 100.0);
    step(&mut s, Event::KillRequested("Kill requested".into()), 100.5);
    let effects = step(
        &mut s,
        Event::ContainerStarted {
            container_id: "c".into(),
            docker_image: "i".into(),
            cpuset: vec![],
            gpuset: vec![],
        },
        101.0,
    );
    assert!(effects.contains(&Effect::KillContainer));
}

#[test]
fn time_limit_message_exactly() {
    let mut s = run(3.0, 0, 0);
    started(&mut s);
    let st = Stats {
        time_total: 2.0,
        ..Default::default()
    };
    assert!(step(&mut s, Event::Stats(st), 103.0).is_empty());
    let st = Stats {
        time_total: 3.26,
        ..Default::default()
    };
    assert_eq!(
        step(&mut s, Event::Stats(st), 104.3),
        vec![Effect::KillContainer]
    );
    step(&mut s, exited(137), 105.0);
    step(&mut s, Event::CleanedUp, 105.0);
    step(&mut s, Event::UploadFinished(Ok(())), 106.0);
    let fm = s.failure_message.unwrap();
    assert_eq!(
        fm,
        "Time limit exceeded. (Container uptime 3.3s > time limit 3.0s)"
    );
    assert!(!fm.contains("Kill requested"));
    assert_eq!(s.exitcode, None);
}

#[test]
fn oom_from_container_state_not_exit_code() {
    let mut s = run(0.0, 64 << 20, 0);
    started(&mut s);
    step(
        &mut s,
        Event::ContainerExited {
            exitcode: Some(137),
            oom_killed: true,
            failure: None,
        },
        102.0,
    );
    step(&mut s, Event::CleanedUp, 102.0);
    step(&mut s, Event::UploadFinished(Ok(())), 103.0);
    assert_eq!(
        s.failure_message.as_deref(),
        Some("Memory limit 64m exceeded.")
    );

    // A plain exit 137 (e.g. the command killed itself) is not a memory overrun.
    let mut s = run(0.0, 64 << 20, 0);
    started(&mut s);
    step(&mut s, exited(137), 102.0);
    step(&mut s, Event::CleanedUp, 102.0);
    step(&mut s, Event::UploadFinished(Ok(())), 103.0);
    assert_eq!(s.failure_message, None);
    assert_eq!(s.exitcode, Some(137));
}

#[test]
fn disk_limit_message() {
    let mut s = run(0.0, 0, 10 << 20);
    started(&mut s);
    let st = Stats {
        disk_bytes: Some(11 << 20),
        ..Default::default()
    };
    assert_eq!(
        step(&mut s, Event::Stats(st), 103.0),
        vec![Effect::KillContainer]
    );
    assert_eq!(s.kill_message.as_deref(), Some("Disk limit 10mb exceeded."));
    // Later stats do not kill twice.
    assert!(step(&mut s, Event::Stats(st), 104.0).is_empty());
}

#[test]
fn a_tree_that_cannot_be_measured_counts_against_the_disk_limit() {
    let mut s = run(0.0, 0, 10 << 20);
    started(&mut s);
    let st = Stats {
        disk_bytes: Some(1 << 20),
        ..Default::default()
    };
    assert!(step(&mut s, Event::Stats(st), 102.0).is_empty());
    let st = Stats {
        disk_unmeasurable: true,
        ..Default::default()
    };
    assert_eq!(
        step(&mut s, Event::Stats(st), 103.0),
        vec![Effect::KillContainer]
    );
    assert_eq!(s.kill_message.as_deref(), Some("Disk limit 10mb exceeded."));
    // Without a disk limit there is nothing to enforce.
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    assert!(step(&mut s, Event::Stats(st), 103.0).is_empty());
}

#[test]
fn a_bundle_with_too_many_entries_to_measure_fails() {
    let too_many = Stats {
        disk_unmeasurable: true,
        too_many_entries: true,
        ..Default::default()
    };
    let mut s = run(0.0, 0, 10 << 20);
    started(&mut s);
    assert_eq!(
        step(&mut s, Event::Stats(too_many), 103.0),
        vec![Effect::KillContainer]
    );
    assert_eq!(
        s.kill_message.as_deref(),
        Some(
            "Too many files: the bundle holds more than 1000000 entries (or 64 MiB of names), \
             the most a worker measures."
        )
    );
    assert!(s.over_disk_limit());
    // Without a disk limit too.
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    assert_eq!(
        step(&mut s, Event::Stats(too_many), 103.0),
        vec![Effect::KillContainer]
    );
    assert!(s
        .kill_message
        .as_deref()
        .unwrap()
        .starts_with("Too many files"));
}

#[test]
fn a_run_over_its_disk_limit_at_exit_fails_and_uploads_nothing() {
    // `head -c 1000 /dev/zero > f` under a 10-byte limit, gone before the next sample: the
    // measurement taken at the exit catches it.
    let mut s = run(0.0, 0, 10);
    started(&mut s);
    let last = Stats {
        disk_bytes: Some(1000),
        ..Default::default()
    };
    step(&mut s, Event::Stats(last), 102.0);
    step(&mut s, exited(0), 102.1);
    assert_eq!(s.stage, Stage::CleaningUp);
    assert_eq!(
        step(&mut s, Event::CleanedUp, 102.2),
        vec![Effect::CheckinSoon]
    );
    assert_eq!(s.stage, Stage::Finalizing);
    assert_eq!(
        s.failure_message.as_deref(),
        Some("Disk limit 10b exceeded.")
    );
    // Within the limit, the results go up as usual.
    let mut s = run(0.0, 0, 2000);
    started(&mut s);
    step(&mut s, Event::Stats(last), 102.0);
    step(&mut s, exited(0), 102.1);
    assert_eq!(
        step(&mut s, Event::CleanedUp, 102.2),
        vec![Effect::Upload, Effect::CheckinSoon]
    );
}

#[test]
fn prepare_failure_is_reported() {
    let mut s = run(0.0, 0, 0);
    step(&mut s, Event::Accepted, 100.0);
    step(
        &mut s,
        Event::PrepareFailed("Failed to download Docker image: nope".into()),
        101.0,
    );
    step(&mut s, Event::CleanedUp, 101.0);
    assert_eq!(s.stage, Stage::Finalizing);
    assert_eq!(
        s.report("w").failure_message.as_deref(),
        Some("Failed to download Docker image: nope")
    );
}

#[test]
fn upload_failure_is_appended() {
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    let st = Stats {
        disk_bytes: Some(5096),
        ..Default::default()
    };
    step(&mut s, Event::Stats(st), 101.0);
    step(&mut s, exited(0), 102.0);
    step(&mut s, Event::CleanedUp, 102.0);
    // While it uploads, it reports what it holds (the server charges its owner for it).
    assert_eq!(s.report("w").disk_utilization, 5096);
    step(
        &mut s,
        Event::UploadFinished(Err("HTTP 400: quota".into())),
        103.0,
    );
    assert_eq!(
        s.failure_message.as_deref(),
        Some("Error while uploading: HTTP 400: quota")
    );
    // The server refused the results: it reports no disk use, so that the server takes back
    // what it charged.
    assert_eq!(s.report("w").disk_utilization, 0);
}

#[test]
fn restage_paths() {
    // Running: kill the container, skip upload, end staged.
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    assert_eq!(
        step(&mut s, Event::Restage, 102.0),
        vec![Effect::KillContainer]
    );
    step(&mut s, exited(137), 103.0);
    assert_eq!(
        step(&mut s, Event::CleanedUp, 103.0),
        vec![Effect::CheckinSoon]
    );
    assert_eq!(s.stage, Stage::Restaged);
    assert_eq!(s.report("w").state, "staged");
    // Uploading: cancel the upload.
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    step(&mut s, exited(0), 102.0);
    step(&mut s, Event::CleanedUp, 102.0);
    assert_eq!(
        step(&mut s, Event::Restage, 103.0),
        vec![Effect::CancelUpload, Effect::CheckinSoon]
    );
    assert_eq!(s.stage, Stage::Restaged);
    // Finalizing: the run is complete; it waits for mark_finalized instead.
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    step(&mut s, exited(0), 102.0);
    step(&mut s, Event::CleanedUp, 102.0);
    step(&mut s, Event::UploadFinished(Ok(())), 103.0);
    assert!(step(&mut s, Event::Restage, 104.0).is_empty());
    assert_eq!(s.stage, Stage::Finalizing);
}

#[test]
fn stray_events_change_nothing() {
    let mut s = run(0.0, 0, 0);
    let before = s.clone();
    assert!(step(&mut s, Event::MarkFinalized, 100.0).is_empty());
    assert!(step(&mut s, Event::CleanedUp, 100.0).is_empty());
    assert!(step(&mut s, Event::UploadFinished(Ok(())), 100.0).is_empty());
    assert!(step(&mut s, Event::Stats(Stats::default()), 100.0).is_empty());
    assert_eq!(s, before);
}

#[test]
fn state_round_trips_through_json() {
    let mut s = run(5.0, 1, 2);
    started(&mut s);
    let text = serde_json::to_string(&s).unwrap();
    let back: RunState = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
}

#[test]
fn a_write_that_comes_after_the_upload_began_is_uploaded_again() {
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    step(&mut s, exited(0), 102.0);
    assert_eq!(
        step(&mut s, Event::CleanedUp, 102.0),
        vec![Effect::Upload, Effect::CheckinSoon]
    );
    // Two writes during the upload: one more upload once it is over.
    assert!(step(&mut s, Event::Written, 102.5).is_empty());
    assert!(step(&mut s, Event::Written, 102.6).is_empty());
    assert_eq!(
        step(&mut s, Event::UploadFinished(Ok(())), 103.0),
        vec![Effect::Upload]
    );
    assert_eq!(s.report("w").state, "running");
    assert_eq!(
        step(&mut s, Event::UploadFinished(Ok(())), 104.0),
        vec![Effect::CheckinSoon]
    );
    assert_eq!(s.stage, Stage::Finalizing);
    // A write while finalizing (the server takes them until it has finalized the bundle):
    // uploaded again, and mark_finalized waits for that upload before the local copy goes.
    assert_eq!(step(&mut s, Event::Written, 105.0), vec![Effect::Upload]);
    assert!(step(&mut s, Event::MarkFinalized, 105.5).is_empty());
    assert_eq!(s.stage, Stage::Finalizing);
    assert_eq!(
        step(&mut s, Event::UploadFinished(Ok(())), 106.0),
        vec![Effect::DeleteLocalData]
    );
    assert_eq!(s.stage, Stage::Finished);
    // After that, a write changes nothing.
    assert!(step(&mut s, Event::Written, 107.0).is_empty());
}

#[test]
fn late_writes_are_uploaded_again_a_bounded_number_of_times() {
    let mut s = run(0.0, 0, 0);
    started(&mut s);
    step(&mut s, exited(0), 102.0);
    step(&mut s, Event::CleanedUp, 102.0);
    step(&mut s, Event::UploadFinished(Ok(())), 103.0);
    for i in 0..MAX_REUPLOADS {
        assert_eq!(
            step(&mut s, Event::Written, 104.0 + i as f64),
            vec![Effect::Upload],
            "{i}"
        );
        assert!(step(&mut s, Event::UploadFinished(Ok(())), 104.5 + i as f64).is_empty());
    }
    assert!(step(&mut s, Event::Written, 200.0).is_empty());
    assert_eq!(
        step(&mut s, Event::MarkFinalized, 201.0),
        vec![Effect::DeleteLocalData]
    );
}
