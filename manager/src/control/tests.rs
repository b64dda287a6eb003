use super::*;
use backends::JobState;
use serde_json::json;

#[test]
fn staged_bundle_requests_with_server_defaults() {
    let b = Bundle {
        uuid: "0x1".into(),
        attributes: json!({"metadata": {"request_cpus": 2, "request_gpus": 1,
            "request_memory": "4g", "request_queue": "gpu"}})
        .as_object()
        .unwrap()
        .clone(),
    };
    let s = staged_bundle(&b);
    assert_eq!(
        (s.request.cpus, s.request.gpus, s.request.memory_bytes),
        (2, 1, 4 << 30)
    );
    assert_eq!(s.request_queue.as_deref(), Some("gpu"));
    let b = Bundle {
        uuid: "0x2".into(),
        attributes: json!({"metadata": {"request_memory": "", "request_queue": ""}})
            .as_object()
            .unwrap()
            .clone(),
    };
    let s = staged_bundle(&b);
    assert_eq!(
        (s.request.cpus, s.request.gpus, s.request.memory_bytes),
        (1, 0, 2 << 30)
    );
    assert_eq!(s.request_queue, None);
}

#[test]
fn free_resources_of_checked_in_workers() {
    let info = json!({"data": [
        {"worker_id": "host-a", "cpus": 4, "gpus": 1, "memory_bytes": 4096,
         "cpus_in_use": 1, "gpus_in_use": 1, "run_uuids": ["0x1"]},
        {"worker_id": "host-b", "cpus": 2, "gpus": 0, "memory_bytes": 2048,
         "cpus_in_use": 0, "gpus_in_use": 0, "run_uuids": []}
    ]});
    let f = free_by_worker(&info);
    assert_eq!(f["host-a"], Resources::new(3, 0, 3072));
    assert_eq!(f["host-b"], Resources::new(2, 0, 2048));
}

#[test]
fn a_staged_bundle_a_worker_already_holds_is_not_counted_again() {
    // The staged list was read before the worker list; 0x1 was handed to host-a in between.
    let info = json!({"data": [
        {"worker_id": "host-a", "cpus": 1, "gpus": 1, "memory_bytes": 4096,
         "cpus_in_use": 1, "gpus_in_use": 1, "run_uuids": ["0x1"]},
        {"worker_id": "host-b", "cpus": 1, "gpus": 0, "memory_bytes": 4096,
         "cpus_in_use": 0, "gpus_in_use": 0, "run_uuids": []}
    ]});
    let seen = WorkersSeen::from_info(&info);
    let mut staged = vec![
        StagedBundle::new("0x1", 1, 1, 1 << 30),
        StagedBundle::new("0x2", 1, 1, 1 << 30),
    ];
    seen.drop_taken(&mut staged);
    let left: Vec<_> = staged.iter().map(|b| b.uuid.as_str()).collect();
    assert_eq!(left, ["0x2"]);
    assert_eq!(seen.free["host-a"].gpus, 0);
}

#[test]
fn free_capacity_is_capped_by_the_runs_a_worker_will_still_take() {
    let info = json!({"data": [
        // --exit-after-num-runs 1, no run yet: one bundle, whatever its free CPUs.
        {"worker_id": "host-a", "cpus": 8, "gpus": 0, "memory_bytes": 8192,
         "cpus_in_use": 0, "exit_after_num_runs": 1, "is_terminating": false},
        // Its one run taken: nothing more.
        {"worker_id": "host-b", "cpus": 8, "gpus": 0, "memory_bytes": 8192,
         "cpus_in_use": 1, "exit_after_num_runs": 0, "is_terminating": false},
        // Terminating: nothing.
        {"worker_id": "host-c", "cpus": 8, "gpus": 0, "memory_bytes": 8192,
         "cpus_in_use": 0, "exit_after_num_runs": 999999999, "is_terminating": true},
        // The default (999999999 runs): its free CPUs.
        {"worker_id": "host-d", "cpus": 8, "gpus": 0, "memory_bytes": 8192,
         "cpus_in_use": 2, "exit_after_num_runs": 999999999, "is_terminating": false}
    ]});
    let f = free_by_worker(&info);
    assert_eq!(f["host-a"].cpus, 1);
    assert_eq!(f["host-b"].cpus, 0);
    assert_eq!(f["host-c"].cpus, 0);
    assert_eq!(f["host-d"], Resources::new(6, 0, 6144));
}

#[test]
fn job_book_tells_failures_from_launches_lost_before_check_in() {
    use crate::policy::Occupancy;
    let job = |id: &str, state| JobStatus {
        id: id.into(),
        worker_id: format!("w{id}"),
        shape_name: "s".into(),
        state,
        detail: None,
    };
    let failed = JobState::Finished { success: false };
    let mut book = JobBook::default();
    let free = HashMap::from([("host-w1".to_string(), Resources::new(1, 0, 1 << 30))]);
    let seen = book.absorb(
        vec![
            job("1", JobState::Running),
            job("2", JobState::Running),
            job("3", JobState::Pending),
        ],
        &free,
    );
    assert!(seen.checked_in);
    let states: Vec<Occupancy> = seen.jobs.iter().map(|j| j.state).collect();
    assert_eq!(
        states,
        [Occupancy::Active, Occupancy::Pending, Occupancy::Pending]
    );
    assert_eq!(seen.jobs[0].free, Some(Resources::new(1, 0, 1 << 30)));
    // Each job's submission time for the policy: when the book first listed it, kept.
    let first = seen.jobs[0].submitted_at;
    assert!(seen.jobs.iter().all(|j| j.submitted_at.is_some()));
    // Checked in again: not a first check-in.
    let again = book.absorb(vec![job("1", JobState::Running)], &free);
    assert!(!again.checked_in);
    assert_eq!(again.jobs[0].submitted_at, first);
    // Missing from one worker list (it lags an assignment): still running, never pending,
    // so never a job to cancel; no free room is known for it.
    let lagging = book.absorb(vec![job("1", JobState::Running)], &HashMap::new());
    assert_eq!(lagging.jobs[0].state, Occupancy::Active);
    assert_eq!(lagging.jobs[0].free, None);
    book.cancelled("3");
    let ended = book.absorb(
        vec![job("1", failed), job("2", failed), job("3", failed)],
        &free,
    );
    assert!(ended.jobs.is_empty());
    // 1 checked in and 3 was cancelled; only 2 was lost before its worker checked in.
    assert_eq!(ended.lost, [("s".to_string(), None)]);
    // 1 had checked in and was not cancelled: interrupted (reclaimed, preempted, deleted).
    assert_eq!(ended.interrupted, [("s".to_string(), None)]);
    assert_eq!(book.failed_jobs, 3);
    // A checked-in worker's job that ended as Slurm preempts or an administrator cancels
    // ("success": no failed launch) is interrupted too; one that its worker left is not.
    let free = HashMap::from([
        ("host-w4".to_string(), Resources::new(1, 0, 1 << 30)),
        ("host-w5".to_string(), Resources::new(1, 0, 1 << 30)),
    ]);
    book.absorb(
        vec![job("4", JobState::Running), job("5", JobState::Running)],
        &free,
    );
    let done = JobState::Finished { success: true };
    let mut preempted = job("4", done);
    preempted.detail = Some("PREEMPTED".into());
    let mut left = job("5", done);
    left.detail = Some("COMPLETED".into());
    let ended = book.absorb(vec![preempted, left], &free);
    assert_eq!(
        ended.interrupted,
        [("s".to_string(), Some("PREEMPTED".to_string()))]
    );
}

#[test]
fn worker_ids_are_random_hex() {
    let (a, b) = (new_worker_id(), new_worker_id());
    assert_eq!(a.len(), 16);
    assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
}

#[test]
fn the_backends_preemption_notice_unless_the_flag_is_given() {
    assert_eq!(backend_preemption_notice(None, Some("aws")), Some("aws"));
    assert_eq!(backend_preemption_notice(Some("none"), Some("aws")), None);
    assert_eq!(backend_preemption_notice(Some("gcp"), Some("aws")), None);
    assert_eq!(backend_preemption_notice(None, None), None);
}

#[test]
fn a_worker_of_a_shape_without_gpus_offers_none() {
    assert!(no_gpus_offered(0, false));
    assert!(!no_gpus_offered(1, false));
    assert!(!no_gpus_offered(0, true));
}
