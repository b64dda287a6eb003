//! The credentials scan: the test users' CodaLab passwords must not be readable where they do
//! not belong: any process's argv, a job definition, pod or task body, or a log of ours.

use std::path::Path;

use crate::peers::peer;

/// The passwords of the test users (root and the non-root test user).
pub fn passwords() -> Vec<String> {
    let p = peer();
    vec![p.var("CLW_ROOT_PASSWORD"), p.var("CLW_TEST_PASSWORD")]
}

/// Fails the test if `text` (described by `what`) holds a test password.
pub fn assert_absent(what: &str, text: &str) {
    for pw in passwords() {
        if let Some(at) = text.find(&pw) {
            let from = text[..at]
                .char_indices()
                .rev()
                .nth(80)
                .map_or(0, |(i, _)| i);
            panic!("a test password appears in {what}: …{}…", &text[from..at]);
        }
    }
}

/// Every process's argv right now: (pid, argv joined by spaces).
pub fn cmdlines() -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(raw) = std::fs::read(entry.path().join("cmdline")) {
            let argv = String::from_utf8_lossy(&raw).replace('\0', " ");
            out.push((pid, argv));
        }
    }
    out
}

/// No process on the machine has a test password in its argv; returns how many were read.
pub fn assert_no_argv_holds_a_password() -> usize {
    let all = cmdlines();
    for (pid, argv) in &all {
        assert_absent(&format!("the argv of process {pid}"), argv);
    }
    all.len()
}

/// No file under `dir` (recursively) holds a test password; returns how many were read.
pub fn assert_no_file_holds_a_password(dir: &Path) -> usize {
    let files = crate::files_under(dir);
    for path in &files {
        if let Ok(bytes) = std::fs::read(path) {
            assert_absent(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            );
        }
    }
    files.len()
}
