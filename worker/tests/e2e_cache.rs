//! End to end, the dependency cache: the real CodaLab server, real Docker, our `cl-worker`.
//! Two workers sharing one work dir download a dependency once; the size limit really frees
//! disk and never evicts what a run uses. (Hostile dependencies: tests/hostile.rs.)

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::{cl::*, peers::*, worker::*};
const MIB: u64 = 1024 * 1024;

/// A worker on a work dir and a tag of the test's choosing (`WorkerProc` gives each worker its
/// own), killed when dropped.
struct SharedWorker {
    child: Child,
    id: String,
    log: PathBuf,
    prefix: String,
    /// Remove the worker's containers and networks when dropped.
    cleanup: bool,
}

impl SharedWorker {
    fn start(id: &str, tag: &str, work_dir: &Path, log: &Path, extra: &[&str]) -> Self {
        Self::start_env(id, tag, work_dir, log, extra, &[])
    }

    /// As [`SharedWorker::start`], with `env` added to the worker's environment.
    fn start_env(
        id: &str,
        tag: &str,
        work_dir: &Path,
        log: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let p = peer();
        let prefix = format!("clwc{}", &id[id.len() - 7..]);
        let child = Command::new(env!("CARGO_BIN_EXE_cl-worker"))
            .args(["--server", &p.server_url(), "--ws-server", &p.ws_url()])
            .arg("--work-dir")
            .arg(work_dir)
            .args(["--id", id, "--tag", tag, "--tag-exclusive"])
            .args(["--network-prefix", &prefix, "--verbose"])
            .args(extra)
            .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
            .env("CODALAB_PASSWORD", p.var("CLW_ROOT_PASSWORD"))
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .expect("cl-worker starts");
        SharedWorker {
            child,
            id: id.to_owned(),
            log: log.to_owned(),
            prefix,
            cleanup: true,
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, leaving its containers running (for a successor with the same id).
    fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.cleanup = false;
    }
}

impl Drop for SharedWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.cleanup {
            return;
        }
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "docker ps -aq --filter label=org.codalab.worker-id={id} | xargs -r docker rm -f; \
                 docker network ls -q --filter name={prefix} | xargs -r docker network rm",
                id = self.id,
                prefix = self.prefix
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if std::thread::panicking() {
            eprintln!("----- worker {} log -----\n{}", self.id, self.log_text());
        }
    }
}

/// Waits until the server lists every worker id (they have checked in).
fn wait_registered(ids: &[&str]) {
    let t0 = Instant::now();
    loop {
        let out = Command::new("bash")
            .args([
                "tests/peers/codalab-server.sh",
                "sql",
                "SELECT worker_id FROM worker",
            ])
            .current_dir(repo_root())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if ids.iter().all(|id| text.lines().any(|l| l.trim() == *id)) {
            return;
        }
        assert!(t0.elapsed() < T, "workers {ids:?} never checked in: {text}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `len` pseudo-random (incompressible) bytes.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// Uploads a 20 MiB random file; returns its uuid and sha256.
fn upload_random(cl: &Cl, dir: &Path, name: &str, seed: u64) -> (String, String) {
    let f = dir.join(name);
    fs::write(&f, random_bytes(20 * MIB as usize, seed)).unwrap();
    let uuid = last_uuid(&cl.run(&["upload", f.to_str().unwrap()]));
    (uuid, sha256(&f))
}

/// Bytes allocated on disk under `path` (symlinks not followed).
fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for e in fs::read_dir(path).into_iter().flatten().flatten() {
            total += disk_usage(&e.path());
        }
    }
    total
}

fn stdout_of(cl: &Cl, uuid: &str) -> String {
    String::from_utf8(cl.cat(&format!("{uuid}/stdout")))
        .unwrap()
        .trim()
        .to_owned()
}

/// Waits for the end of a run that must succeed and checks its output.
fn wait_success(
    cl: &Cl,
    uuid: &str,
    expected_stdout: &str,
    logs: &dyn Fn() -> String,
) -> protocol::Bundle {
    let b = wait_for(&peer().client(), uuid, T, is_final);
    assert_eq!(
        b.state(),
        Some("ready"),
        "{uuid} did not succeed: {b:?}\n{}",
        logs()
    );
    assert_eq!(stdout_of(cl, uuid), expected_stdout, "{uuid}\n{}", logs());
    b
}

/// Waits until `cond` holds.
fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn two_workers_sharing_a_work_dir_download_a_dependency_once() {
    let cl = Cl::new("cache-shared");
    let files = tempfile::tempdir().unwrap();
    let (dep, sha) = upload_random(&cl, files.path(), "data.bin", 1);

    let tmp = tempfile::tempdir().unwrap();
    let wd = tmp.path().join("wd");
    let tag = unique("clw-cache-shared");
    let id_a = format!("{tag}-a");
    let id_b = format!("{tag}-b");
    // One CPU each: with four runs staged, the server has to use both workers. A download
    // starts 8 s after it is claimed (a test build's hook), so that the second worker comes to
    // the dependency while the first one holds its download.
    let slow = [("CLW_TEST_DOWNLOAD_DELAY_MS", "8000")];
    let a = SharedWorker::start_env(
        &id_a,
        &tag,
        &wd,
        &tmp.path().join("a.log"),
        &["--cpuset", "0"],
        &slow,
    );
    let b = SharedWorker::start_env(
        &id_b,
        &tag,
        &wd,
        &tmp.path().join("b.log"),
        &["--cpuset", "0"],
        &slow,
    );
    wait_registered(&[&id_a, &id_b]);

    // Four runs submitted at once (one CLI session each), each busy for a few seconds, so that
    // both workers prepare them at the same time.
    let runs: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (tag, dep) = (&tag, &dep);
                s.spawn(move || {
                    Cl::new(&format!("cache-shared-{i}")).run_bundle(
                        tag,
                        &[&format!("dep:{dep}")],
                        "sha256sum dep | cut -d' ' -f1; sleep 4",
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let logs = || format!("--- a ---\n{}\n--- b ---\n{}", a.log_text(), b.log_text());
    let mut remotes = std::collections::HashSet::new();
    for uuid in &runs {
        let bundle = wait_success(&cl, uuid, &sha, &logs);
        remotes.insert(meta_str(&bundle, "remote"));
    }
    assert_eq!(
        remotes,
        [id_a.clone(), id_b.clone()].into_iter().collect(),
        "both workers must have run bundles"
    );

    // Downloaded exactly once: one download attempt in the two workers' logs together.
    let needle = format!("downloading dependency {dep}/");
    let (la, lb) = (a.log_text(), b.log_text());
    let attempts = la.matches(&needle).count() + lb.matches(&needle).count();
    assert_eq!(
        attempts, 1,
        "download attempts:\n--- a ---\n{la}\n--- b ---\n{lb}"
    );
    // The other worker waited for that download (it did not start one of its own).
    let (downloader, other) = if la.contains(&needle) {
        ((&id_a, &la), (&id_b, &lb))
    } else {
        ((&id_b, &lb), (&id_a, &la))
    };
    let waited = format!(
        "dependency {dep}/ is being downloaded by worker {}",
        downloader.0
    );
    assert!(
        other.1.contains(&waited),
        "{} did not wait for {}'s download:\n--- a ---\n{la}\n--- b ---\n{lb}",
        other.0,
        downloader.0
    );
    // One copy on disk, of the uncompressed size.
    let names: Vec<String> = fs::read_dir(wd.join("dependencies"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec![dep.clone()]);
    assert_eq!(
        fs::metadata(wd.join("dependencies").join(&dep))
            .unwrap()
            .len(),
        20 * MIB
    );
    let state: Value =
        serde_json::from_slice(&fs::read(wd.join("dependencies-state.json")).unwrap()).unwrap();
    assert_eq!(state["entries"][0]["size_bytes"], Value::from(20 * MIB));
    assert_eq!(state["entries"][0]["stage"], Value::from("ready"));
}

#[test]
fn size_limit_evicts_unused_dependencies_from_disk_but_never_used_ones() {
    let cl = Cl::new("cache-evict");
    let files = tempfile::tempdir().unwrap();
    let (dep_a, sha_a) = upload_random(&cl, files.path(), "a.bin", 2);
    let (dep_b, sha_b) = upload_random(&cl, files.path(), "b.bin", 3);
    let limit = 30 * MIB;
    let w = WorkerProc::start("cache-evict", &["--max-work-dir-size", "30m"]);
    let deps_dir = w.work_dir.path().join("wd").join("dependencies");
    let path_a = deps_dir.join(&dep_a);
    let path_b = deps_dir.join(&dep_b);
    let client = peer().client();

    // A long run holds A...
    let holder = cl.run_bundle(
        &w.tag,
        &[&format!("a:{dep_a}")],
        "sha256sum a | cut -d' ' -f1; sleep 600",
    );
    wait_for(&client, &holder, T, |s| s == "running" || is_final(s));
    assert!(path_a.exists(), "{}", w.log_text());
    // ...while B is downloaded and used by another run: 40 MiB > 30 MiB, but A stays.
    let user_b = cl.run_bundle(
        &w.tag,
        &[&format!("b:{dep_b}")],
        "sha256sum b | cut -d' ' -f1",
    );
    let t0 = Instant::now();
    loop {
        assert!(
            path_a.exists(),
            "A was evicted while in use\n{}",
            w.log_text()
        );
        let state = client_state(&client, &user_b);
        if state.as_deref().is_some_and(is_final) {
            break;
        }
        assert!(
            t0.elapsed() < T,
            "{user_b} did not finish\n{}",
            w.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let logs = || w.log_text();
    wait_success(&cl, &user_b, &sha_b, &logs);
    // B is no longer used: it is the only entry that can go, and it really leaves the disk.
    wait_until("B's eviction", Duration::from_secs(60), || {
        assert!(
            path_a.exists(),
            "A was evicted while in use\n{}",
            w.log_text()
        );
        !path_b.exists() && disk_usage(&deps_dir) < limit
    });
    assert_eq!(stdout_of(&cl, &holder), sha_a);

    // The holder ends; A (20 MiB) fits the limit and stays cached.
    cl.run(&["kill", &holder]);
    let h = wait_for(&client, &holder, T, is_final);
    assert_final_state_or_server_race(&h, "killed", "");
    std::thread::sleep(Duration::from_secs(6));
    assert!(path_a.exists(), "{}", w.log_text());

    // Using B again evicts A, the least recently used, from the disk.
    let again = cl.run_bundle(
        &w.tag,
        &[&format!("b:{dep_b}")],
        "sha256sum b | cut -d' ' -f1",
    );
    wait_success(&cl, &again, &sha_b, &logs);
    wait_until("A's eviction", Duration::from_secs(60), || {
        !path_a.exists() && disk_usage(&deps_dir) < limit
    });
    assert!(path_b.exists());
    let usage = disk_usage(&deps_dir);
    assert!(
        (20 * MIB..limit).contains(&usage),
        "{usage} bytes in {}",
        deps_dir.display()
    );
    let log = w.log_text();
    assert!(
        log.contains(&format!("evicting dependency {dep_a}/")),
        "{log}"
    );
    assert!(
        log.contains(&format!("evicting dependency {dep_b}/")),
        "{log}"
    );
}

fn client_state(client: &protocol::RestClient, uuid: &str) -> Option<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(client.get_bundle(uuid))
        .ok()
        .and_then(|b| b.state().map(str::to_owned))
}

#[test]
fn restarted_worker_keeps_the_dependency_of_its_resumed_run() {
    let cl = Cl::new("cache-restart");
    let files = tempfile::tempdir().unwrap();
    let (dep_a, sha_a) = upload_random(&cl, files.path(), "a.bin", 4);
    let (dep_b, sha_b) = upload_random(&cl, files.path(), "b.bin", 5);
    let tmp = tempfile::tempdir().unwrap();
    let wd = tmp.path().join("wd");
    let id = unique("clw-cache-restart");
    let flags = ["--max-work-dir-size", "30m"];
    let path_a = wd.join("dependencies").join(&dep_a);
    let path_b = wd.join("dependencies").join(&dep_b);
    let client = peer().client();

    let mut first = SharedWorker::start(&id, &id, &wd, &tmp.path().join("1.log"), &flags);
    let holder = cl.run_bundle(
        &id,
        &[&format!("a:{dep_a}")],
        "sha256sum a | cut -d' ' -f1; sleep 600",
    );
    wait_for(&client, &holder, T, |s| s == "running" || is_final(s));
    first.sigkill();
    // Same id, same work dir: the run is resumed and claims A again.
    let second = SharedWorker::start(&id, &id, &wd, &tmp.path().join("2.log"), &flags);
    let started = Instant::now();
    let logs = || {
        format!(
            "--- 1 ---\n{}\n--- 2 ---\n{}",
            first.log_text(),
            second.log_text()
        )
    };
    wait_until("the resumption", T, || {
        second.log_text().contains("resuming run")
    });
    // B pushes the cache over the limit; A is used by the resumed run, so B goes once unused.
    let user_b = cl.run_bundle(&id, &[&format!("b:{dep_b}")], "sha256sum b | cut -d' ' -f1");
    wait_success(&cl, &user_b, &sha_b, &logs);
    wait_until("B's eviction", Duration::from_secs(60), || {
        assert!(path_a.exists(), "A was evicted while in use\n{}", logs());
        !path_b.exists()
    });
    // Past the restart grace (60 s) and a few maintenance rounds, A is still pinned.
    while started.elapsed() < Duration::from_secs(75) {
        assert!(path_a.exists(), "A was evicted while in use\n{}", logs());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(client_state(&client, &holder).as_deref(), Some("running"));
    let state: Value =
        serde_json::from_slice(&fs::read(wd.join("dependencies-state.json")).unwrap()).unwrap();
    let entry_a = state["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["parent_uuid"] == dep_a.as_str())
        .unwrap_or_else(|| panic!("A is not in {state}"));
    assert_eq!(
        entry_a["dependents"],
        serde_json::json!([{"worker_id": id, "run_uuid": holder}]),
        "{state}"
    );
    assert_eq!(stdout_of(&cl, &holder), sha_a);
    cl.run(&["kill", &holder]);
    wait_for(&client, &holder, T, is_final);
}
