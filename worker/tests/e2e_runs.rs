//! End to end, real CodaLab server and real Docker: CPU pinning, limits, isolation, restart
//! resume and termination.

use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{cl::*, peers::*, worker::*};

#[test]
fn cpuset_runs_wait_and_are_pinned() {
    let cl = Cl::new("cpuset");
    let w = WorkerProc::start("cpuset", &["--cpuset", "0"]);
    // (`%` would be taken for a bundle reference by `cl run`; uptime is the host's clock.)
    let cmd = "grep Cpus_allowed_list /proc/self/status | cut -f2; cut -d' ' -f1 /proc/uptime; \
               sleep 3; cut -d' ' -f1 /proc/uptime";
    let a = cl.run_bundle(&w.tag, &["--request-cpus", "1"], cmd);
    let b = cl.run_bundle(&w.tag, &["--request-cpus", "1"], cmd);
    assert_took_turns(&cl, &[&a, &b], "0", "one CPU", || w.log_text());
}

#[test]
fn memory_limit_is_enforced_with_codalabs_message() {
    let cl = Cl::new("mem");
    let w = WorkerProc::start("mem", &[]);
    let cases = [
        // The run itself is OOM-killed.
        (
            "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x}",
            "",
        ),
        // A process of the run is OOM-killed and the run goes on to exit 0: the engine still
        // says the run hit its limit, as CodaLab reports it.
        (
            "( x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x} ); echo survived",
            "survived\n",
        ),
    ];
    for (cmd, stdout) in cases {
        let uuid = cl.run_bundle(&w.tag, &["--request-memory", "64m"], cmd);
        let b = wait_for(&peer().client(), &uuid, T, is_final);
        assert_final_state_or_server_race(&b, "failed", &w.log_text());
        assert_eq!(
            meta_str(&b, "failure_message"),
            "Memory limit 64m exceeded.",
            "{cmd}"
        );
        assert_eq!(cl.stdout(&uuid), stdout, "{cmd}");
    }
}

#[test]
fn disk_limit_is_enforced_with_codalabs_message() {
    let cl = Cl::new("disk");
    let w = WorkerProc::start("disk", &[]);
    let uuid = cl.run_bundle(
        &w.tag,
        &["--request-disk", "10m"],
        "head -c 30000000 /dev/zero > big; sleep 60",
    );
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    assert_eq!(meta_str(&b, "failure_message"), "Disk limit 10mb exceeded.");
}

#[test]
fn fork_bomb_is_contained_and_the_worker_stays_healthy() {
    let cl = Cl::new("bomb");
    let w = WorkerProc::start("bomb", &["--pids-limit", "200"]);
    let client = peer().client();
    let bomb = cl.run_bundle(
        &w.tag,
        &["--request-time", "8s", "--request-memory", "512m"],
        "b() { b | b & }; b; sleep 30",
    );
    let b = wait_for(&client, &bomb, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    let fm = meta_str(&b, "failure_message");
    assert!(
        fm.contains("Time limit exceeded") || fm.contains("Memory limit"),
        "{fm}"
    );
    // The container never had more processes than its limit, and the worker goes on.
    let ok = cl.run_bundle(&w.tag, &[], "echo still fine");
    let b = wait_for(&client, &ok, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&ok), "still fine\n");
}

fn container_ip(name: &str, network: &str) -> String {
    let out = Command::new("docker")
        .args([
            "inspect",
            "-f",
            &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
            name,
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn runs_cannot_reach_each_other() {
    let cl = Cl::new("isolation");
    let w = WorkerProc::start("isolation", &[]);
    let client = peer().client();
    let server = cl.run_bundle(
        &w.tag,
        &[],
        "while true; do echo hello | busybox nc -l -p 8000; done",
    );
    let probe = cl.run_bundle(&w.tag, &[], "sleep 120");
    wait_for(&client, &server, T, |s| s == "running" || is_final(s));
    wait_for(&client, &probe, T, |s| s == "running" || is_final(s));
    let ext = format!("{}_ext", w.network_prefix());
    let ip = container_ip(&format!("codalab_run_{server}"), &ext);
    assert!(!ip.is_empty(), "no IP on {ext}");
    // From another run: refused or timed out.
    let from_run = Command::new("docker")
        .args([
            "exec",
            &format!("codalab_run_{probe}"),
            "busybox",
            "nc",
            "-w",
            "3",
            &ip,
            "8000",
        ])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&from_run.stdout).contains("hello"),
        "a run reached another run"
    );
    // The listener itself works: the host reaches it.
    let t0 = Instant::now();
    let mut got = String::new();
    while t0.elapsed() < Duration::from_secs(20) && !got.contains("hello") {
        if let Ok(mut s) = std::net::TcpStream::connect_timeout(
            &format!("{ip}:8000").parse().unwrap(),
            Duration::from_secs(2),
        ) {
            use std::io::Read;
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = s.read_to_string(&mut got);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        got.contains("hello"),
        "listener not reachable from the host"
    );
    cl.run(&["kill", &server, &probe]);
    wait_for(&client, &server, T, is_final);
    wait_for(&client, &probe, T, is_final);
}

/// Between two runs the worker's `_ext` network is replaced by one that lets containers reach
/// one another (as an older worker sharing the engine and the prefix makes it). The check
/// before each run sees it, and the next run starts on an isolated `_ext` again.
#[test]
fn a_network_replaced_between_runs_is_isolated_again_before_the_next() {
    let cl = Cl::new("net-replaced");
    // Networks of its own (it replaces one): the shared ones serve the other lanes' workers,
    // which re-create a removed one at once.
    let prefix = unique("clw_netrep").replace('-', "_");
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            for n in ["ext", "int"] {
                let _ = Command::new("docker")
                    .args(["network", "rm", &format!("{}_{n}", self.0)])
                    .output();
            }
        }
    }
    let _gone = Gone(prefix.clone());
    let w = WorkerProc::start("net-replaced", &["--network-prefix", &prefix]);
    let client = peer().client();
    let first = cl.run_bundle(&w.tag, &[], "echo one");
    let b = wait_for(&client, &first, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let ext = format!("{}_ext", w.network_prefix());
    let docker = |args: &[&str]| Command::new("docker").args(args).output().unwrap();
    // The first run's container leaves the network beside its upload: retried until it has.
    let t0 = Instant::now();
    while !docker(&["network", "rm", &ext]).status.success() {
        assert!(t0.elapsed() < T, "{ext} never became free");
        std::thread::sleep(Duration::from_millis(500));
    }
    let made = docker(&["network", "create", &ext]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // Every network of the name (two workers' checks at once can make the name twice for a
    // moment, and `docker network inspect NAME` then answers nothing): all must say the same.
    let icc = || {
        let ids = docker(&[
            "network",
            "ls",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("name=^{ext}$"),
        ]);
        let mut values: Vec<String> = String::from_utf8_lossy(&ids.stdout)
            .split_whitespace()
            .map(|id| {
                let out = docker(&[
                    "network",
                    "inspect",
                    "-f",
                    "{{index .Options \"com.docker.network.bridge.enable_icc\"}}",
                    id,
                ]);
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            })
            .collect();
        values.dedup();
        values.join(",")
    };
    assert_ne!(
        icc(),
        "false",
        "the replacement lets containers reach one another"
    );
    let second = cl.run_bundle(&w.tag, &[], "echo two");
    let b = wait_for(&client, &second, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&second), "two\n");
    assert_eq!(
        icc(),
        "false",
        "the run started on a network without isolation"
    );
}

#[test]
fn sigkilled_worker_resumes_its_run() {
    let cl = Cl::new("resume");
    let w = WorkerProc::start("resume", &[]);
    let (id, tag) = (w.id.clone(), w.tag.clone());
    let client = peer().client();
    // Long enough to be seen running (reported at the next regular checkin) and killed mid-run.
    let uuid = cl.run_bundle(&tag, &[], "echo before; sleep 20; echo after");
    let b = wait_for(&client, &uuid, T, |s| s == "running" || is_final(s));
    assert_eq!(b.state(), Some("running"), "{b:?}");
    w.signal("KILL");
    let work_dir = w.into_work_dir();
    std::thread::sleep(Duration::from_secs(2));
    let w2 = WorkerProc::start_as(&id, &tag, work_dir, &[]);
    let b = wait_for(&client, &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w2.log_text());
    assert_eq!(cl.stdout(&uuid), "before\nafter\n");
    assert!(w2.log_text().contains("resuming run"), "{}", w2.log_text());
}

#[test]
fn pass_down_termination_restages_at_once() {
    let cl = Cl::new("passdown");
    let mut w = WorkerProc::start("passdown", &["--pass-down-termination"]);
    let client = peer().client();
    let uuid = cl.run_bundle(&w.tag, &[], "sleep 20; echo finished");
    wait_for(&client, &uuid, T, |s| s == "running" || is_final(s));
    let t0 = Instant::now();
    w.signal("TERM");
    let b = wait_for(&client, &uuid, Duration::from_secs(20), |s| s == "staged");
    assert_eq!(b.state(), Some("staged"));
    assert!(t0.elapsed() < Duration::from_secs(20));
    let status = w.wait_exit(Duration::from_secs(30)).expect("worker exits");
    assert!(status.success(), "{status:?}\n{}", w.log_text());
    // Its container is gone; another worker on the same queue finishes the run.
    let leftover = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("name=codalab_run_{uuid}")])
        .output()
        .unwrap();
    assert!(leftover.stdout.is_empty(), "container left behind");
    let w2 = WorkerProc::start_as(
        &unique("clw-passdown2"),
        &w.tag,
        tempfile::tempdir().unwrap(),
        &[],
    );
    let b = wait_for(&client, &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w2.log_text());
    assert_eq!(cl.stdout(&uuid), "finished\n");
}

#[test]
fn exit_when_idle_and_after_num_runs() {
    let mut idle = WorkerProc::start("idle", &["--exit-when-idle", "--idle-seconds", "2"]);
    let st = idle
        .wait_exit(Duration::from_secs(60))
        .expect("idle worker exits");
    assert!(st.success(), "{}", idle.log_text());

    let cl = Cl::new("numruns");
    let mut w = WorkerProc::start("numruns", &["--exit-after-num-runs", "1"]);
    let uuid = cl.run_bundle(&w.tag, &[], "echo one");
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"));
    let st = w
        .wait_exit(Duration::from_secs(60))
        .expect("worker exits after its run");
    assert!(st.success(), "{}", w.log_text());
}

#[test]
fn image_size_limit_and_image_cache_eviction() {
    let cl = Cl::new("images");
    let client = peer().client();
    // --max-image-size: the test image (about 16 MB) is over 1 MB.
    let w = WorkerProc::start("imgsize", &["--max-image-size", "1m"]);
    let uuid = cl.run_bundle(&w.tag, &[], "echo never");
    let b = wait_for(&client, &uuid, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    let fm = meta_str(&b, "failure_message");
    assert!(
        fm.starts_with("Failed to download Docker image: The size of codalab/default-cpu:latest: ")
            && fm.ends_with(" exceeds the maximum image size allowed 1m."),
        "{fm}"
    );
    // An image that is not here is judged before the pull, by its registry's word (a private
    // registry, the CNCF Distribution one): refused, it is never pulled; within the limit, it
    // is pulled and runs.
    let registry = testkit::peers::start("registry.sh")["CLW_REGISTRY"].clone();
    let remote = format!("{registry}/clw-size:{}", unique("t"));
    use testkit::images::{docker, present};
    docker(&["tag", "cl-worker-test/base:latest", &remote]);
    docker(&["push", "-q", &remote]);
    docker(&["rmi", &remote]);
    let uuid = cl.run_bundle(&w.tag, &["--request-docker-image", &remote], "echo never");
    let b = wait_for(&client, &uuid, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    let fm = meta_str(&b, "failure_message");
    assert!(
        fm.starts_with(&format!(
            "Failed to download Docker image: The size of {remote}: "
        )) && fm.ends_with(" exceeds the maximum image size allowed 1m."),
        "{fm}\n{}",
        w.log_text()
    );
    assert!(!present(&remote), "a refused image was pulled");
    assert!(
        !w.log_text().contains("checked after the pull"),
        "{}",
        w.log_text()
    );
    drop(w);
    let w = WorkerProc::start("imgsize-ok", &["--max-image-size", "1g"]);
    let uuid = cl.run_bundle(&w.tag, &["--request-docker-image", &remote], "echo pulled");
    let b = wait_for(&client, &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(cl.stdout(&uuid), "pulled\n");
    drop(w);
    let _ = Command::new("docker").args(["rmi", &remote]).output();

    // --max-image-cache-size: an image used by a finished run goes once the cache is over.
    let tag = format!("clw-cache-test:{}", unique("t"));
    let st = Command::new("docker")
        .args(["tag", "cl-worker-test/base:latest", &tag])
        .status()
        .unwrap();
    assert!(st.success());
    let w = WorkerProc::start("imgcache", &["--max-image-cache-size", "1k"]);
    let uuid = cl.run_bundle(&w.tag, &["--request-docker-image", &tag], "echo cached");
    let b = wait_for(&client, &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let t0 = Instant::now();
    let mut gone = false;
    while t0.elapsed() < Duration::from_secs(30) && !gone {
        gone = !Command::new("docker")
            .args(["image", "inspect", &tag])
            .output()
            .unwrap()
            .status
            .success();
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(gone, "{tag} was not evicted\n{}", w.log_text());
    // Other names of the same image are untouched.
    assert!(Command::new("docker")
        .args(["image", "inspect", "codalab/default-cpu:latest"])
        .output()
        .unwrap()
        .status
        .success());
}

const FAKE_GPUS: [&str; 2] = [
    "GPU-11111111-1111-1111-1111-111111111111",
    "GPU-22222222-2222-2222-2222-222222222222",
];

/// A machine with two GPUs, as far as `nvidia-smi` on PATH tells.
fn fake_nvidia_smi() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("nvidia-smi");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '0, {}, 16384\\n1, {}, 16384\\n'\n",
            FAKE_GPUS[0], FAKE_GPUS[1]
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap()
    );
    (dir, path)
}

/// The worker reports the GPUs it found, and a GPU run's container asks Docker for exactly its
/// GPUs by UUID; the engine's NVIDIA device driver (tests/peers/fake-gpu.sh) starts it with
/// those GPUs and the run finishes.
#[test]
fn gpu_runs_get_device_requests_by_uuid() {
    let fake = testkit::peers::start("fake-gpu.sh");
    use bollard::query_parameters::EventsOptionsBuilder;
    use futures::StreamExt;
    use std::collections::HashMap;

    let (_fake, path) = fake_nvidia_smi();
    let id = unique("clw-gpu");
    let w = WorkerProc::start_env(
        &id,
        &id,
        tempfile::tempdir().unwrap(),
        &[],
        &[("PATH", path)],
    );
    let t0 = Instant::now();
    let mut gpus = String::new();
    while t0.elapsed() < Duration::from_secs(30) && !gpus.ends_with("\t2") {
        let out = Command::new("bash")
            .arg(repo_root().join("tests/peers/codalab-server.sh"))
            .args([
                "sql",
                &format!("SELECT worker_id, gpus FROM worker WHERE worker_id='{id}'"),
            ])
            .output()
            .unwrap();
        gpus = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        gpus.ends_with(&format!("{id}\t2")),
        "server saw: {gpus:?}\n{}",
        w.log_text()
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = Cl::new("gpu");
    let mut seen: Vec<(i64, Vec<String>, Vec<String>)> = Vec::new();
    let mut uuids = Vec::new();
    rt.block_on(async {
        let docker = bollard::Docker::connect_with_local_defaults()
            .unwrap()
            .negotiate_version()
            .await
            .unwrap();
        let filters = HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            ("event".to_string(), vec!["create".to_string()]),
            (
                "label".to_string(),
                vec![format!("org.codalab.worker-id={id}")],
            ),
        ]);
        // `since` replays events from before the subscription is up (the container may be
        // created before the stream's first poll).
        let since = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 1)
        .to_string();
        let mut events = docker.events(Some(
            EventsOptionsBuilder::default()
                .filters(&filters)
                .since(&since)
                .build(),
        ));
        for n in [1, 2] {
            // The worker removes the container right after its start fails; if it is gone
            // before it could be read, submit another run (under a loaded suite that race is
            // often lost several times in a row).
            for _attempt in 0..15 {
                let uuid = cl.run_bundle(
                    &id,
                    &["--request-gpus", &n.to_string()],
                    "echo $NVIDIA_VISIBLE_DEVICES",
                );
                uuids.push(uuid);
                let ev = tokio::time::timeout(Duration::from_secs(120), events.next())
                    .await
                    .expect("container created")
                    .unwrap()
                    .unwrap();
                let cid = ev.actor.and_then(|a| a.id).unwrap();
                if let Ok(info) = docker
                    .inspect_container(
                        &cid,
                        None::<bollard::query_parameters::InspectContainerOptions>,
                    )
                    .await
                {
                    let hc = info.host_config.unwrap_or_default();
                    let ids = hc
                        .device_requests
                        .unwrap_or_default()
                        .into_iter()
                        .flat_map(|d| d.device_ids.unwrap_or_default())
                        .collect();
                    let env = info.config.and_then(|c| c.env).unwrap_or_default();
                    seen.push((n, ids, env));
                    break;
                }
            }
        }
    });
    drop(rt);
    for uuid in &uuids {
        let b = wait_for(&peer().client(), uuid, T, is_final);
        assert_final_state(&b, "ready", "");
        // Read once the run is over: the hook runs when the container starts.
        let hook_log = std::fs::read_to_string(&fake["CLW_FAKE_GPU_HOOK_LOG"]).unwrap_or_default();
        // The run saw the GPUs it was given, and the engine handed them to the NVIDIA hook.
        let visible = cl.stdout(uuid).trim().to_owned();
        assert!(
            !visible.is_empty()
                && visible.split(',').all(|g| FAKE_GPUS.contains(&g))
                && hook_log.contains(&format!("NVIDIA_VISIBLE_DEVICES={visible}\n")),
            "{visible:?}\n{hook_log}"
        );
    }
    for (n, ids, env) in &seen {
        assert_eq!(ids.len(), *n as usize, "{seen:?}");
        for g in ids {
            assert!(FAKE_GPUS.contains(&g.as_str()), "{g}");
        }
        let mut sorted = ids.clone();
        sorted.dedup();
        assert_eq!(&sorted, ids, "a GPU twice: {ids:?}");
        assert!(
            env.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", ids.join(","))),
            "{env:?}"
        );
    }
    assert_eq!(seen.len(), 2, "{}", w.log_text());
}

/// A worker with no `nvidia-smi` of its own (a worker in a container) finds the machine's GPUs
/// through the Docker engine, as Python does: `nvidia-smi` in the discovery image with a device
/// request for every GPU (the fake-GPU engine of tests/peers/fake-gpu.sh); the log says which way
/// they were found; its own NVIDIA_VISIBLE_DEVICES (a device plugin's) restricts them; a GPU run
/// then gets a found GPU and finishes.
#[test]
fn a_worker_without_nvidia_smi_finds_the_gpus_through_the_docker_engine() {
    let fake = testkit::peers::start("fake-gpu.sh");
    let image = fake["CLW_FAKE_GPU_IMAGE"].clone();
    // A worker asking the engine with `image`, and `env`; returns it once it has checked in
    // with `gpus` GPUs.
    let start = |name: &str, image: &str, env: &[(&str, &str)], gpus: &str| {
        let id = unique(name);
        let mut env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
        env.push(("CL_WORKER_GPU_DISCOVERY_IMAGE", image.to_string()));
        let w = WorkerProc::start_env(&id, &id, tempfile::tempdir().unwrap(), &[], &env);
        testkit::wait_until(Duration::from_secs(60), "the worker's check-in", || {
            let out = Command::new("bash")
                .arg(repo_root().join("tests/peers/codalab-server.sh"))
                .args([
                    "sql",
                    &format!("SELECT gpus FROM worker WHERE worker_id='{id}'"),
                ])
                .output()
                .unwrap();
            // A header line, then the value.
            String::from_utf8_lossy(&out.stdout).lines().last() == Some(gpus)
        });
        (w, id)
    };
    let cl = Cl::new("gpu-engine");
    // A GPU run on worker `id`: the GPUs it saw.
    let gpu_run = |id: &str| {
        let uuid = cl.run_bundle(id, &["--request-gpus", "1"], "echo $NVIDIA_VISIBLE_DEVICES");
        let b = wait_for(&peer().client(), &uuid, T, is_final);
        assert_final_state(&b, "ready", "");
        cl.stdout(&uuid).trim().to_owned()
    };

    // Every GPU of the machine.
    let (w, id) = start("clw-gpu-engine", &image, &[], "2");
    let log = w.log_text();
    assert!(
        log.contains(&format!(
            "GPUs: 2 found by the Docker engine (nvidia-smi in {image}, with a device request \
             for all GPUs)"
        )),
        "{log}"
    );
    for g in FAKE_GPUS {
        assert!(log.contains(g), "{log}");
    }
    let visible = gpu_run(&id);
    assert!(FAKE_GPUS.contains(&visible.as_str()), "{visible:?}");
    drop(w);

    // A worker given one GPU of the two (its NVIDIA_VISIBLE_DEVICES) takes only that one.
    let (w, id) = start(
        "clw-gpu-engine-one",
        &image,
        &[("NVIDIA_VISIBLE_DEVICES", "1")],
        "1",
    );
    assert_eq!(gpu_run(&id), FAKE_GPUS[1], "{}", w.log_text());
    drop(w);

    // No GPU driver to ask (here: an image that cannot be had): no GPUs, and the log says why.
    let (w, _) = start(
        "clw-gpu-engine-none",
        "127.0.0.1:9/no-such-image:1",
        &[],
        "0",
    );
    let log = w.log_text();
    assert!(
        log.contains(
            "GPUs: none (no nvidia-smi on this machine; the Docker engine: cannot get the image \
             127.0.0.1:9/no-such-image:1"
        ),
        "{log}"
    );
}

/// Workers that share a network prefix (the default one, several workers on a host) and start
/// at once can each make a network of the same name: Docker checks for the name, then creates,
/// and both pass. While a container uses each, neither can be removed and the name is
/// ambiguous to every call that names it. Runs still start (on the lowest id of each name),
/// with and without a network.
#[test]
fn networks_made_twice_under_one_name_do_not_stop_runs() {
    let cl = Cl::new("net-twice");
    // Networks of its own: the test makes their names ambiguous for a while.
    let prefix = unique("clw_twice").replace('-', "_");
    let w = WorkerProc::start("net-twice", &["--network-prefix", &prefix]);
    let client = peer().client();
    let first = cl.run_bundle(&w.tag, &[], "echo one");
    let b = wait_for(&client, &first, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());

    let guard = Duplicates::new(&prefix);
    let ids = |name: &str| -> Vec<String> {
        let out = Command::new("docker")
            .args(["network", "ls", "-q", "--no-trunc", "--filter"])
            .arg(format!("name=^{name}$"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    // Two of each name, and a container on each (as other workers' runs would be): neither can
    // be removed. Through the API: the CLI asks the engine to refuse a taken name, and names
    // networks by name where a container joins them.
    let mut held: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    for (suffix, internal) in [("_general", true), ("_ext", false), ("_int", true)] {
        let name = format!("{prefix}{suffix}");
        let original = ids(&name);
        assert_eq!(original.len(), 1, "{name}: {original:?}");
        // As a second worker's create reaches the engine in the same instant.
        docker_api(
            "networks/create",
            serde_json::json!({
                "Name": name, "CheckDuplicate": false, "Internal": internal,
                "Options": {"com.docker.network.bridge.enable_icc": "false"},
            }),
        );
        let both = ids(&name);
        assert_eq!(
            both.len(),
            2,
            "this engine keeps one network a name: the race cannot be staged ({both:?})"
        );
        for (k, id) in both.into_iter().enumerate() {
            held[k].push(id);
        }
    }
    for (k, ids) in held.iter().enumerate() {
        let holder = format!("{prefix}-holder{k}");
        docker_api(
            &format!("containers/create?name={holder}"),
            serde_json::json!({
                "Image": "codalab/default-cpu", "Cmd": ["sleep", "600"],
                "HostConfig": {"NetworkMode": ids[0]},
                "NetworkingConfig": {"EndpointsConfig": {ids[0].as_str(): {"NetworkID": ids[0]}}},
            }),
        );
        for id in &ids[1..] {
            docker_api(
                &format!("networks/{id}/connect"),
                serde_json::json!({"Container": holder, "EndpointConfig": {"NetworkID": id}}),
            );
        }
        docker_api(&format!("containers/{holder}/start"), serde_json::json!({}));
    }

    let no_network = cl.run_bundle(&w.tag, &[], "echo two");
    let network = cl.run_bundle(&w.tag, &["--request-network"], "echo three");
    for (uuid, out) in [(&no_network, "two\n"), (&network, "three\n")] {
        let b = wait_for(&client, uuid, T, is_final);
        assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
        assert_eq!(cl.stdout(uuid), out);
    }
    drop(guard);
}

/// A POST to the Docker engine's API (as old as the engine speaks: 1.41 lets a network's name
/// be taken twice); panics unless it succeeds.
fn docker_api(path: &str, body: serde_json::Value) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--fail-with-body",
            "--unix-socket",
            "/var/run/docker.sock",
            "-XPOST",
        ])
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
        ])
        .arg(format!("http://localhost/v1.41/{path}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "POST {path} {body}: {out:?}");
}

/// Removes the holders of `Duplicates` and every network of the worker's names when dropped.
struct Duplicates(String);

impl Duplicates {
    fn new(prefix: &str) -> Self {
        Duplicates(prefix.to_owned())
    }
}

impl Drop for Duplicates {
    fn drop(&mut self) {
        let p = &self.0;
        let _ = Command::new("docker")
            .args(["rm", "-f", &format!("{p}-holder0"), &format!("{p}-holder1")])
            .output();
        for suffix in ["_general", "_ext", "_int"] {
            let out = Command::new("docker")
                .args([
                    "network",
                    "ls",
                    "-q",
                    "--filter",
                    &format!("name=^{p}{suffix}$"),
                ])
                .output()
                .unwrap();
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new("docker").args(["network", "rm", id]).output();
            }
        }
    }
}
