//! What works with CodaLab's Python worker and must work with this one, end to end against the
//! real CodaLab server and Docker: a preempted run resumed from its checkpoint by a second
//! worker sharing the work dir, dependencies mounted at absolute paths, a user's disk quota and
//! two GPU runs at once on one worker.

use std::process::Command;
use std::time::Duration;

use testkit::{cl::*, peers::*, worker::*};

/// Two `--preemptible` workers sharing one work dir: the first, and the run's container, are
/// killed once it runs; the server stages the run again (it was on a preemptible worker) and
/// the second worker takes it. The rerun finds the first attempt's `checkpoint1`, as with
/// CodaLab's worker, and the bundle ends holding both checkpoints. Before, the second attempt
/// started from an empty directory.
#[test]
fn a_preempted_run_resumes_from_its_checkpoint_on_a_second_worker_sharing_the_work_dir() {
    let cl = Cl::new("parity-preempt");
    let client = peer().client();
    let w1 = WorkerProc::start("parity-preempt", &["--preemptible"]);
    let run = cl.run_bundle(
        &w1.tag,
        &[],
        "if mkdir checkpoint1; then sleep 600; else mkdir checkpoint2; fi",
    );
    wait_for(&client, &run, T, |s| s == "running" || is_final(s));
    let first = w1
        .work_dir
        .path()
        .join("wd/runs")
        .join(codalab_worker::agent::run_dir_name(&run, &w1.id));
    testkit::wait_until(T, "the first attempt made checkpoint1", || {
        first.join("checkpoint1").is_dir()
    });
    // The machine goes: the worker and the run's container with it.
    w1.signal("KILL");
    for c in testkit::reclaim::containers_of(&run) {
        let st = Command::new("docker")
            .args(["rm", "-f", &c])
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
    }
    let tag = w1.tag.clone();
    let work_dir = w1.into_work_dir();
    let w2 = WorkerProc::start_as(
        &unique("clw-parity-preempt-2"),
        &tag,
        work_dir,
        &["--preemptible"],
    );
    // Staged again once the first worker is offline (60 s), then run by the second.
    let b = wait_for(&client, &run, Duration::from_secs(300), is_final);
    assert_final_state(&b, "ready", &w2.log_text());
    let listing = cl.run(&["cat", &run]);
    assert!(
        listing.contains("checkpoint1") && listing.contains("checkpoint2"),
        "{listing}\n{}",
        w2.log_text()
    );
}

/// `cl run /data/a:<dir1> /data/b:<dir3> 'cat /data/b/f1'`: CodaLab mounts a dependency at an
/// absolute path there, in the container. Here it is a read-only mount at that path; nothing is
/// made or removed on the host; a path the engine or the run's own mounts hold is refused with
/// a clear text. Before, such a run failed ("bad child path").
fn a_dependency_at_an_absolute_path_is_mounted_there(rt: testkit::hostile::Rt, name: &str) {
    let cl = Cl::new(name);
    let files = tempfile::tempdir().unwrap();
    let one = cl.upload_text(files.path(), "f0", "zero\n");
    let d3 = files.path().join("d3");
    std::fs::create_dir(&d3).unwrap();
    std::fs::write(d3.join("f1"), "one\n").unwrap();
    let three = testkit::hostile::upload_dir(&cl, &d3);
    let w = testkit::hostile::worker(rt, name, &[]);
    // A top directory no host has.
    let top = format!("/{}", unique("clw-abs"));
    let run = cl.run_bundle(
        &w.tag,
        &[&format!("{top}/bar:{one}"), &format!("{top}/bar2:{three}")],
        &format!(
            "cat {top}/bar2/f1 {top}/bar; (echo x > {top}/bar2/new) 2>/dev/null && echo writable \
             || echo read-only; ls -A"
        ),
    );
    let b = wait_for(&peer().client(), &run, T, is_final);
    assert_final_state(&b, "ready", &w.log_text());
    let out = cl.stdout(&run);
    let lines: Vec<&str> = out.lines().collect();
    // The dependencies where asked, read-only; nothing of them in the bundle dir.
    assert_eq!(lines[..3], ["one", "zero", "read-only"], "{out}");
    assert!(!out.contains("bar"), "{out}");
    assert!(
        !std::path::Path::new(&top).exists(),
        "{top} made on the host"
    );
    for (path, why) in [
        ("/proc/x", "the container's engine holds that path"),
        ("/a/../b", "the path must be normal"),
    ] {
        let run = cl.run_bundle(&w.tag, &[&format!("{path}:{one}")], "echo never");
        let b = wait_for(&peer().client(), &run, T, is_final);
        assert_final_state(&b, "failed", &w.log_text());
        let msg = meta_str(&b, "failure_message");
        assert!(msg.contains(why), "{path}: {msg}");
    }
}

#[test]
fn a_dependency_at_an_absolute_path_is_mounted_there_docker() {
    a_dependency_at_an_absolute_path_is_mounted_there(testkit::hostile::Rt::Docker, "parity-abs");
}

#[test]
fn a_dependency_at_an_absolute_path_is_mounted_there_podman() {
    a_dependency_at_an_absolute_path_is_mounted_there(
        testkit::hostile::Rt::Podman,
        "parity-abs-podman",
    );
}

#[test]
fn a_dependency_at_an_absolute_path_is_mounted_there_kubernetes() {
    a_dependency_at_an_absolute_path_is_mounted_there(
        testkit::hostile::Rt::Kubernetes,
        "parity-abs-k8s",
    );
}

/// A user whose disk quota is 10 bytes runs `head -c 1000 /dev/zero > test.txt` with no
/// `--request-disk`. This server has no `max_request_disk`, so the run's disk limit is
/// `min(quota left − 1, 0)` = 0, no limit: the run ends, the worker reports its 5,096 bytes (the
/// server adds each report to its owner's `disk_used`), the server kills it for the quota and
/// refuses its upload. The run ends `failed`, and the owner's `disk_used` is 0 again: a run whose
/// results the server did not take reports no disk use. Before, the user stayed charged 5,096
/// bytes for nothing stored (the worker kept reporting them).
#[test]
fn a_run_past_its_owners_disk_quota_leaves_nothing_charged() {
    let user = add_user("quota");
    let root = Cl::new("parity-quota-root");
    root.run(&["uedit", &user.name, "--disk-quota", "10"]);
    let cl = Cl::as_user("parity-quota", &user);
    let w = WorkerProc::start("parity-quota", &[]);
    let run = cl.run_bundle(&w.tag, &[], "head -c 1000 /dev/zero > test.txt");
    let b = wait_for(&peer().client(), &run, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    let used = || {
        root.run(&["uinfo", &user.name, "-f", "disk_used"])
            .trim()
            .to_string()
    };
    // The last report (no disk use) may come a checkin after the state the server shows.
    testkit::wait_until(Duration::from_secs(30), "disk_used back to 0", || {
        used() == "0"
    });
    // The bundle's own `data_size` is not asserted: the server's upload handler measures the
    // refused contents into it before its quota check fails the bundle, and check-ins of a
    // failed bundle leave it as it is. What the owner is charged is what matters, above.
}

/// CodaLab's GPU command (`cl run --request-docker-image <a CUDA image> --request-gpus 1
/// nvidia-smi`) twice at once on one worker of a machine with two GPUs (tests/peers/fake-gpu.sh:
/// the node's `nvidia-smi` on the worker's PATH; in the CUDA image, one that lists only what the
/// engine's device request gave the container). The two runs run at the same time;
/// each lists exactly one GPU, not the same one, and the engine received a device request for
/// each of them (the hook's log).
#[test]
fn two_gpu_runs_at_once_each_get_a_gpu_of_their_own() {
    let fake = start("fake-gpu.sh");
    let path = format!(
        "{}:{}",
        fake["CLW_FAKE_GPU_BIN"],
        std::env::var("PATH").unwrap()
    );
    let id = unique("clw-parity-gpus");
    let w = WorkerProc::start_env(
        &id,
        &id,
        tempfile::tempdir().unwrap(),
        &[],
        &[("PATH", path)],
    );
    let cl = Cl::new("parity-gpus");
    let client = peer().client();
    let runs: Vec<String> = (0..2)
        .map(|_| {
            cl.run_bundle(
                &w.tag,
                &[
                    "--request-docker-image",
                    testkit::manager::CUDA_IMAGE,
                    "--request-gpus",
                    "1",
                    "--request-memory",
                    "500m",
                ],
                "nvidia-smi -L; cut -d' ' -f1 /proc/uptime; sleep 8; cut -d' ' -f1 /proc/uptime",
            )
        })
        .collect();
    let mut given = Vec::new();
    let mut spans = Vec::new();
    for r in &runs {
        let b = wait_for(&client, r, T, is_final);
        assert_final_state(&b, "ready", &w.log_text());
        let out = cl.stdout(r);
        let listed: Vec<&str> = testkit::manager::FAKE_GPUS
            .into_iter()
            .filter(|g| out.contains(g))
            .collect();
        assert_eq!(listed.len(), 1, "{r} listed {out:?}");
        given.push(listed[0]);
        let times: Vec<f64> = out.lines().filter_map(|l| l.parse().ok()).collect();
        assert_eq!(times.len(), 2, "{out:?}");
        spans.push((times[0], times[1]));
    }
    assert!(
        spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1,
        "the two runs did not run at the same time: {spans:?}"
    );
    assert_ne!(given[0], given[1], "both runs were given {}", given[0]);
    let hook = std::fs::read_to_string(&fake["CLW_FAKE_GPU_HOOK_LOG"]).unwrap_or_default();
    for g in &given {
        assert!(
            hook.lines()
                .any(|l| l.ends_with(&format!(" NVIDIA_VISIBLE_DEVICES={g}"))),
            "no device request for {g} in the hook's log:\n{hook}"
        );
    }
}
