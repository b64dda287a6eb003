//! The credentials scan: the test users' CodaLab passwords must not be readable where they do
//! not belong: any process's argv, a job definition, pod or task body, or a log of ours.

use std::path::Path;

use crate::peers::peer;

/// The passwords of the test users (root and the non-root test user), and the start of every
/// password of the users made for one test ([`crate::peers::add_user`]).
pub fn passwords() -> Vec<String> {
    let p = peer();
    vec![
        p.var("CLW_ROOT_PASSWORD"),
        p.var("CLW_TEST_PASSWORD"),
        crate::peers::USER_PASSWORD_PREFIX.to_string(),
    ]
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

/// The argv of every `execve` in the kernel's audit records (`tests/peers/exec-audit.sh`): one
/// string per call, its arguments joined by spaces. An argument the audit log writes in hex
/// (one with a space, a quote or a byte outside printable ASCII) is decoded.
pub fn audited_execs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("type=EXECVE ") else {
            continue;
        };
        let mut args = Vec::new();
        for field in rest.split(' ') {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            // a0, a1, …, and a long argument's pieces a3[0], a3[1], …
            let is_arg = key.strip_prefix('a').is_some_and(|n| {
                let n = n.split('[').next().unwrap_or("");
                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
            });
            if !is_arg {
                continue;
            }
            let arg = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                Some(quoted) => quoted.to_owned(),
                None => decode_hex(value).unwrap_or_else(|| value.to_owned()),
            };
            if key.contains('[') && !key.ends_with("[0]") {
                if let Some(last) = args.last_mut() {
                    let last: &mut String = last;
                    last.push_str(&arg);
                    continue;
                }
            }
            args.push(arg);
        }
        out.push(args.join(" "));
    }
    out
}

fn decode_hex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The audit log files of `tests/peers/exec-audit.sh` (the current one and rotated ones).
pub fn exec_audit_texts(log: &Path) -> Vec<String> {
    let mut texts = Vec::new();
    if let (Some(dir), Some(name)) = (log.parent(), log.file_name()) {
        let name = name.to_string_lossy().into_owned();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n == name || n.starts_with(&format!("{name}.")) {
                    texts.push(
                        String::from_utf8_lossy(&std::fs::read(e.path()).unwrap_or_default())
                            .into_owned(),
                    );
                }
            }
        }
    }
    texts
}

/// No process started while the exec audit recorded (the whole suite, with scripts/test.sh)
/// had a test password in its argv; returns how many execs were read.
pub fn assert_no_exec_held_a_password(log: &Path) -> usize {
    let mut n = 0;
    for text in exec_audit_texts(log) {
        for argv in audited_execs(&text) {
            assert_absent("the argv of a process started during the suite", &argv);
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_records_give_whole_argvs() {
        let log = "type=SYSCALL msg=audit(1.0:7): arch=c000003e syscall=59 success=yes\n\
                   type=EXECVE msg=audit(1.0:7): argc=2 a0=\"/bin/echo\" a1=\"plain\"\n\
                   type=EXECVE msg=audit(1.0:8): argc=3 a0=\"sh\" a1=\"-c\" a2=6563686F2068692027746865726527\n\
                   type=EXECVE msg=audit(1.0:9): argc=2 a0=\"x\" a1_len=6 a1[0]=\"abc\" a1[1]=\"def\"\n";
        assert_eq!(
            audited_execs(log),
            ["/bin/echo plain", "sh -c echo hi 'there'", "x abcdef"]
        );
    }
}
