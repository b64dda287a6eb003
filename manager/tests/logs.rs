//! What the binaries write to their logs: plain text when stderr is a file (no ANSI escape
//! codes in log files or collectors), colours only on a terminal.

use std::process::{Command, Stdio};
use std::time::Duration;

fn manager_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cl-worker-manager")
}

/// The manager against an unreachable server for a few seconds (it logs its start and its
/// login retries), stopped with SIGTERM; its stderr as written to `stderr`.
fn run_briefly(stderr: Stdio, extra_env: &[(&str, &str)]) -> std::process::Child {
    Command::new(manager_bin())
        .args([
            "--server",
            "http://127.0.0.1:9",
            "--sleep-time",
            "1",
            "local",
        ])
        .env("CODALAB_USERNAME", "u")
        .env("CODALAB_PASSWORD", "p")
        .env_remove("NO_COLOR")
        .envs(extra_env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

fn stop(mut child: std::process::Child) {
    std::thread::sleep(Duration::from_secs(3));
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[test]
fn a_log_written_to_a_file_has_no_escape_codes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manager.log");
    let file = std::fs::File::create(&path).unwrap();
    stop(run_briefly(file.into(), &[]));
    let log = std::fs::read_to_string(&path).unwrap();
    assert!(log.contains("login failed"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a log file: {log:?}"
    );
}

#[test]
fn a_terminal_gets_colours_unless_no_color() {
    // util-linux's `script` gives the manager a pseudo-terminal as stderr.
    if Command::new("script").arg("--version").output().is_err() {
        panic!("`script` (util-linux) is needed for this test");
    }
    let run = |no_color: bool| -> String {
        let cmd = format!(
            "{}timeout -s TERM 3 {} --server http://127.0.0.1:9 --sleep-time 1 local",
            if no_color { "NO_COLOR=1 " } else { "" },
            manager_bin()
        );
        let out = Command::new("script")
            .args(["-qefc", &cmd, "/dev/null"])
            .env("CODALAB_USERNAME", "u")
            .env("CODALAB_PASSWORD", "p")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tty = run(false);
    assert!(tty.contains("login failed"), "{tty}");
    assert!(tty.contains('\u{1b}'), "no colours on a terminal: {tty:?}");
    let plain = run(true);
    assert!(plain.contains("login failed"), "{plain}");
    assert!(
        !plain.contains('\u{1b}'),
        "colours despite NO_COLOR: {plain:?}"
    );
}
