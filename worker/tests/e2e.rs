//! End to end: the real CodaLab 1.7.5 server, real Docker, our `cl-worker`.
//! The server is installed and started by `tests/peers/codalab-server.sh` (never skipped).

use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::{cl::*, peers::*, worker::*};

#[test]
fn echo_hello_reaches_ready() {
    let cl = Cl::new("hello");
    let w = WorkerProc::start("hello", &[]);
    let uuid = cl.run_bundle(&w.tag, &[], "echo hello");
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(b.metadata("exitcode"), Some(&Value::from(0)));
    assert_eq!(cl.cat(&format!("{uuid}/stdout")), b"hello\n");
    assert_eq!(cl.cat(&format!("{uuid}/stderr")), b"");
    // The run was reported with the worker's id and the image digest.
    assert_eq!(meta_str(&b, "remote"), w.id);
    assert!(!meta_str(&b, "docker_image").is_empty(), "{b:?}");
}

#[test]
fn nonzero_exit_fails_with_its_code() {
    let cl = Cl::new("exit3");
    let w = WorkerProc::start("exit3", &[]);
    let uuid = cl.run_bundle(&w.tag, &[], "echo oops >&2; exit 3");
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_final_state(&b, "failed", &w.log_text());
    assert_eq!(b.metadata("exitcode"), Some(&Value::from(3)));
    assert_eq!(cl.cat(&format!("{uuid}/stderr")), b"oops\n");
}

#[test]
fn dependencies_are_mounted_and_readable() {
    let cl = Cl::new("deps");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.txt");
    std::fs::write(&file, "contents of the file dependency\n").unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/inner.txt"), "inner\n").unwrap();
    let file_uuid = last_uuid(&cl.run(&["upload", file.to_str().unwrap()]));
    let tree_uuid = last_uuid(&cl.run(&["upload", tree.to_str().unwrap()]));
    let w = WorkerProc::start("deps", &[]);
    let uuid = cl.run_bundle(
        &w.tag,
        &[&format!("d:{file_uuid}"), &format!("t:{tree_uuid}")],
        "cat d; cat t/sub/inner.txt; echo > d 2>/dev/null || echo read-only",
    );
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    assert_eq!(
        String::from_utf8(cl.cat(&format!("{uuid}/stdout"))).unwrap(),
        "contents of the file dependency\ninner\nread-only\n"
    );
}

#[test]
fn kill_ends_killed_and_time_limit_ends_failed() {
    let cl = Cl::new("kill");
    let w = WorkerProc::start("kill", &[]);
    let client = peer().client();
    let sleeper = cl.run_bundle(&w.tag, &[], "sleep 600");
    let limited = cl.run_bundle(&w.tag, &["--request-time", "3s"], "sleep 600");
    wait_for(&client, &sleeper, T, |s| s == "running" || is_final(s));
    cl.run(&["kill", &sleeper]);
    let b = wait_for(&client, &sleeper, T, is_final);
    assert_final_state_or_server_race(&b, "killed", &w.log_text());
    assert!(
        meta_str(&b, "failure_message").contains("Kill requested"),
        "{b:?}"
    );

    let b = wait_for(&client, &limited, T, is_final);
    assert_final_state_or_server_race(&b, "failed", &w.log_text());
    let msg = meta_str(&b, "failure_message");
    assert!(
        msg.starts_with("Time limit exceeded. (Container uptime ")
            && msg.ends_with(" > time limit 3.0s)"),
        "{msg}"
    );
    assert!(!msg.contains("Kill requested"));
}

#[test]
fn large_output_uploads_intact() {
    let cl = Cl::new("big");
    let w = WorkerProc::start("big", &[]);
    let uuid = cl.run_bundle(
        &w.tag,
        &[],
        "mkdir -p out/nested && head -c 50000000 /dev/urandom > out/big && \
         echo small > out/nested/s && sha256sum out/big | cut -d' ' -f1 > big.sha256",
    );
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let expected = String::from_utf8(cl.cat(&format!("{uuid}/big.sha256"))).unwrap();
    let big = cl.cat(&format!("{uuid}/out/big"));
    assert_eq!(big.len(), 50_000_000);
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&big)?;
            c.wait_with_output()
        })
        .unwrap();
    let actual = String::from_utf8(out.stdout).unwrap();
    assert_eq!(actual.split_whitespace().next(), Some(expected.trim()));
    assert_eq!(cl.cat(&format!("{uuid}/out/nested/s")), b"small\n");
}

/// A worker that fails at start-up (here: an unreadable state file, after it made its Docker
/// networks) leaves none of them behind.
#[test]
fn a_worker_that_fails_at_start_up_leaves_no_networks() {
    let p = peer();
    let id = unique("clw-startfail");
    let prefix = format!("clwsf{}", &id[id.len() - 7..]);
    let dir = tempfile::tempdir().unwrap();
    let wd = dir.path().join("wd");
    std::fs::create_dir_all(&wd).unwrap();
    std::fs::write(codalab_worker::persist::state_path(&wd, &id), "{ not json").unwrap();
    let networks = || {
        let out = std::process::Command::new("docker")
            .args(["network", "ls", "--format", "{{.Name}}", "--filter"])
            .arg(format!("name={prefix}"))
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let out = std::process::Command::new(worker_bin())
        .args(["--server", &p.server_url(), "--ws-server", &p.ws_url()])
        .arg("--work-dir")
        .arg(&wd)
        .args(["--id", &id, "--network-prefix", &prefix])
        .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
        .env("CODALAB_PASSWORD", p.var("CLW_ROOT_PASSWORD"))
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let left = networks();
    // Clean up whatever the worker left, then judge.
    for n in left.lines() {
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", n])
            .output();
    }
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("move the file aside"),
        "the error names the state file: {stderr}"
    );
    assert!(
        stderr.contains(&format!("created Docker network {prefix}_general")),
        "the worker made its networks before failing: {stderr}"
    );
    assert_eq!(left, "", "networks left behind:\n{stderr}");
}

/// `--shared-file-system` on a machine where the server's bundle store is not mounted (here a
/// mount namespace with an empty file system over it): the worker never makes the run's
/// directory itself (the server would never see it); it waits for the server's, then fails the
/// run with CodaLab's text.
#[test]
fn shared_file_system_without_the_store_fails_with_codalabs_text() {
    let p = peer();
    let store =
        std::path::PathBuf::from(p.var("CLW_CODALAB_DIR")).join("home/partitions/default/bundles");
    assert!(store.is_dir(), "{}", store.display());
    let id = unique("clw-sharedfs-missing");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("worker.log");
    let mut child = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t tmpfs none \"$0\" && exec \"$@\"")
        .arg(&store)
        .arg(worker_bin())
        .args(["--server", &p.server_url(), "--ws-server", &p.ws_url()])
        .arg("--work-dir")
        .arg(dir.path().join("wd"))
        .args([
            "--id",
            &id,
            "--tag",
            &id,
            "--tag-exclusive",
            "--shared-file-system",
        ])
        .args(["--network-prefix", TEST_NETWORK_PREFIX])
        .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
        .env("CODALAB_PASSWORD", p.var("CLW_ROOT_PASSWORD"))
        .env("CLW_SHARED_BUNDLE_DIR_WAIT_TRIES", "5")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let cl = Cl::new("sharedfs-missing");
    let uuid = cl.run_bundle(&id, &[], "echo never");
    let b = wait_for(&p.client(), &uuid, T, is_final);
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_final_state(&b, "failed", &log);
    assert_eq!(
        meta_str(&b, "failure_message"),
        "Bundle directory cannot be found on the shared filesystem. Please ensure the shared \
         filesystem between the server and your worker is mounted properly or contact your \
         administrators.",
        "{log}"
    );
    assert!(
        log.contains("to be created by the server (4 tries left)"),
        "the worker waited for the server's directory: {log}"
    );
}

#[test]
fn bad_credentials_exit_1_quickly() {
    let p = peer();
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cl-worker"))
        .args(["--server", &p.server_url(), "--work-dir"])
        .arg(dir.path().join("wd"))
        .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
        .env("CODALAB_PASSWORD", "definitely-wrong")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was refused"), "{err}");
    assert!(!err.contains("definitely-wrong"), "password leaked: {err}");
}

#[test]
fn password_file_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "codalab\ncodalab\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cl-worker"))
        .args(["--server", "http://127.0.0.1:9", "--password-file"])
        .arg(&pw)
        .arg("--work-dir")
        .arg(dir.path().join("wd"))
        .env_remove("CODALAB_USERNAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));
}

#[test]
fn unreachable_server_is_retried_without_busy_loop() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cl-worker"))
        .args(["--server", "http://127.0.0.1:9", "--work-dir"])
        .arg(dir.path().join("wd"))
        .env("CODALAB_USERNAME", "u")
        .env("CODALAB_PASSWORD", "p")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(alive, "the worker gave up: {text}");
    let retries = text.matches("retrying").count();
    // Backoff: a handful of attempts in 8 s, not thousands.
    assert!((2..=12).contains(&retries), "{retries} retries:\n{text}");
    assert!(text.contains("cannot reach the CodaLab server"), "{text}");
}

#[test]
fn staged_search_pages_past_the_servers_cap_of_ten() {
    let cl = Cl::new("search");
    let queue = unique("clw-search");
    let mut made: Vec<String> = (0..11)
        .map(|_| cl.run_bundle(&queue, &[], "true"))
        .collect();
    let client = peer().client();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let keywords = vec!["state=staged".to_string(), format!("request_queue={queue}")];
    // Staging takes a bundle-manager pass.
    let mut found = Vec::new();
    for _ in 0..40 {
        found = rt.block_on(client.search_bundles(&keywords, 4)).unwrap();
        if found.len() == made.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut ids: Vec<String> = found.iter().map(|b| b.uuid.clone()).collect();
    ids.sort();
    made.sort();
    // Clean up whatever is still staged; a bundle the server has already ended needs nothing.
    let states: Vec<(String, String, String)> = made
        .iter()
        .map(|u| {
            let b = rt.block_on(client.get_bundle(u)).unwrap();
            let state = b.state().unwrap_or_default().to_owned();
            (u.clone(), state, meta_str(&b, "failure_message"))
        })
        .collect();
    let live: Vec<&str> = states
        .iter()
        .filter(|(_, s, _)| !is_final(s))
        .map(|(u, _, _)| u.as_str())
        .collect();
    if !live.is_empty() {
        // Best effort: this test is about the search, and a bundle may end between the look
        // and the kill (the CLI also retries a kill whose answer it lost, and the retry fails).
        let mut kill = vec!["kill"];
        kill.extend(live);
        let out = cl.command(&kill).output().expect("cl runs");
        if !out.status.success() {
            eprintln!(
                "cleanup: cl kill failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert_eq!(ids, made, "states of the staged bundles: {states:?}");
}

/// Lists the tree in the current directory: each file's mode, size and SHA-256, each
/// directory's mode, each link's target (never followed), sorted.
const TREE_LISTING: &str =
    "{ find . -type f -printf 'f %m %s %p\\n'; find . -type d -printf 'd %m %p\\n'; \
     find . -type l -printf 'l %l %p\\n'; find . -type f -exec sha256sum {} +; } | LC_ALL=C sort\n";

/// A results tree with every kind of entry (random and compressible files of a few MB, an empty
/// file, an empty directory, an executable, a private file, absolute, relative and dangling
/// links, a name with a space and a non-ASCII letter) is stored by the server exactly as the
/// run left it: the run lists its tree on stdout, and the same listing of what `cl download`
/// brings back from the server must be equal, byte for byte.
#[test]
fn results_reach_the_server_exactly_as_the_run_left_them() {
    let cl = Cl::new("tree");
    let dir = tempfile::tempdir().unwrap();
    // The listing goes in as a dependency: `cl run` reads `%…%` in a command as a bundle (and
    // takes only ASCII: the name's `ü` is made by printf).
    let listing = cl.upload_text(dir.path(), "listing.sh", TREE_LISTING);
    let w = WorkerProc::start("tree", &[]);
    let uuid = cl.run_bundle(
        &w.tag,
        &[&format!("listing.sh:{listing}")],
        "mkdir -p t/a/b t/empty-dir && head -c 3000000 /dev/urandom > t/a/random && \
         yes codalab | head -c 4000000 > t/a/b/text && : > t/empty && \
         printf '#!/bin/sh\\necho hi\\n' > t/run.sh && chmod 755 t/run.sh && \
         chmod 600 t/a/random && ln -s /etc/passwd t/absolute && ln -s missing t/dangling && \
         ln -s a/random t/relative && echo x > \"t/with space $(printf '\\303\\274')\" && cd t && sh ../listing.sh",
    );
    let b = wait_for(&peer().client(), &uuid, T, is_final);
    assert_eq!(b.state(), Some("ready"), "{b:?}\n{}", w.log_text());
    let in_run = String::from_utf8(cl.cat(&format!("{uuid}/stdout"))).unwrap();
    assert!(in_run.contains("l /etc/passwd ./absolute"), "{in_run}");
    assert!(in_run.contains("f 755 18 ./run.sh"), "{in_run}");
    let out = dir.path().join("t");
    cl.run(&[
        "download",
        &format!("{uuid}/t"),
        "-o",
        out.to_str().unwrap(),
    ]);
    let stored = std::process::Command::new("sh")
        .args(["-c", TREE_LISTING])
        .current_dir(&out)
        .output()
        .unwrap();
    assert!(stored.status.success(), "{stored:?}");
    assert_eq!(String::from_utf8(stored.stdout).unwrap(), in_run);
}
