//! What the binaries write to their logs: plain text when stderr is a file (no ANSI escape
//! codes in log files or collectors), colours only on a terminal, and JSON lines with
//! `--log-format json` carrying the same fields as the text lines.

use std::process::{Command, Stdio};
use std::time::Duration;

fn manager_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cl-worker-manager")
}

/// The manager against an unreachable server for a few seconds (it logs its start and its
/// login retries), stopped with SIGTERM; its stderr as written to `stderr`.
fn run_briefly(stderr: Stdio, extra_env: &[(&str, &str)]) -> std::process::Child {
    run_briefly_with(stderr, extra_env, &[])
}

/// As [`run_briefly`], with global flags before the backend.
fn run_briefly_with(
    stderr: Stdio,
    extra_env: &[(&str, &str)],
    flags: &[&str],
) -> std::process::Child {
    run_backend_briefly(stderr, extra_env, flags, &["local"])
}

/// As [`run_briefly_with`], with the backend and its arguments.
fn run_backend_briefly(
    stderr: Stdio,
    extra_env: &[(&str, &str)],
    flags: &[&str],
    backend: &[&str],
) -> std::process::Child {
    Command::new(manager_bin())
        .args(["--server", "http://127.0.0.1:9", "--sleep-time", "1"])
        .args(flags)
        .args(backend)
        .env("CODALAB_USERNAME", "u")
        .env("CODALAB_PASSWORD", "p")
        .env_remove("NO_COLOR")
        .env_remove("CL_WORKER_MANAGER_PASSWORD_SECRET_ARN")
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

#[test]
fn json_log_lines_parse_and_carry_the_fields_of_the_text_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log_of = |format: &str| -> String {
        let path = dir.path().join(format!("manager-{format}.log"));
        let file = std::fs::File::create(&path).unwrap();
        stop(run_briefly_with(
            file.into(),
            &[],
            &["--log-format", format],
        ));
        std::fs::read_to_string(&path).unwrap()
    };
    let json = log_of("json");
    let text = log_of("text");
    assert!(!json.contains('\u{1b}'), "{json:?}");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let login = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.contains("login failed"))
        })
        .unwrap_or_else(|| panic!("no login failure in {json}"));
    // The fields of a text line: time, level, message.
    assert_eq!(login["level"], "WARN", "{login}");
    let ts = login["timestamp"].as_str().unwrap();
    assert!(
        ts.len() >= 20 && ts.contains('T') && ts.ends_with('Z'),
        "{ts}"
    );
    let text_line = text.lines().find(|l| l.contains("login failed")).unwrap();
    assert!(text_line.contains(" WARN "), "{text_line}");
    assert!(
        text_line.contains(
            login["message"]
                .as_str()
                .unwrap()
                .split(',')
                .next()
                .unwrap()
        ),
        "{text_line} vs {login}"
    );
    // The environment variable sets it too.
    let path = dir.path().join("manager-env.log");
    let file = std::fs::File::create(&path).unwrap();
    stop(run_briefly(
        file.into(),
        &[("CL_WORKER_MANAGER_LOG_FORMAT", "json")],
    ));
    let env_log = std::fs::read_to_string(&path).unwrap();
    assert!(env_log.lines().count() > 0, "{env_log}");
    for l in env_log.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
    }
}

/// The plaintext opt-in of AWS Batch warns at start-up and its log never holds the password
/// (the job definition it would register does, by the operator's explicit choice; no AWS endpoint
/// answers here, so nothing is registered).
#[test]
fn the_plaintext_password_opt_in_warns_without_logging_the_password() {
    const PASSWORD: &str = "opt-in-password-3317";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manager.log");
    let file = std::fs::File::create(&path).unwrap();
    let child = run_backend_briefly(
        file.into(),
        &[
            ("CODALAB_PASSWORD", PASSWORD),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", "us-east-1"),
        ],
        &[],
        &[
            "aws-batch",
            "--job-queue",
            "q",
            "--allow-plaintext-password",
        ],
    );
    stop(child);
    let log = std::fs::read_to_string(&path).unwrap();
    assert!(
        log.contains(
            "--allow-plaintext-password: the CodaLab password goes into the job definition's \
             plain environment"
        ),
        "{log}"
    );
    assert!(!log.contains(PASSWORD), "the password is in the log: {log}");
}
