//! The peers of the end-to-end tests, started (idempotently) by the scripts in `tests/peers/`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use protocol::{ClientConfig, Credentials, RestClient};

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit lives in the repository")
        .to_path_buf()
}

/// Runs `bash args…` in the repository with `env`; its stdout. A failure means the peer is
/// unavailable, which fails the test (CI never skips).
pub fn bash(args: &[&str], env: &HashMap<String, String>) -> String {
    let out = Command::new("bash")
        .args(args)
        .envs(env)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "PEER UNAVAILABLE: bash {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One query against the CodaLab server's database; its rows, tab-separated, one per line.
pub fn sql(query: &str) -> String {
    bash(
        &["tests/peers/codalab-server.sh", "sql", query],
        &HashMap::new(),
    )
}

/// The variables of `export K=V` lines (a peer script's `env`).
pub fn exports(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), unquote(v)))
        .collect()
}

/// A value as the shell reads it: quotes removed; outside single quotes, `\x` is `x` (what
/// `printf %q` writes for `?`, `&`, spaces).
fn unquote(v: &str) -> String {
    if let Some(inner) = v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        return inner.to_string();
    }
    let v = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(v);
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// Starts the peer of `tests/peers/<script>` and returns its environment (`<script> env`).
pub fn start(script: &str) -> HashMap<String, String> {
    let none = HashMap::new();
    let path = format!("tests/peers/{script}");
    bash(&[&path, "start"], &none);
    exports(&bash(&[&path, "env"], &none))
}

/// The running test peer: its environment (`codalab-server.sh env`).
pub struct Peer {
    pub env: HashMap<String, String>,
}

static PEER: OnceLock<Peer> = OnceLock::new();

fn run_script(args: &[&str]) -> String {
    let out = Command::new("bash")
        .args(args)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    if !out.status.success() {
        panic!(
            "PEER UNAVAILABLE: `bash {}` failed ({}).\nstdout:\n{}\nstderr:\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts (or reuses) the real CodaLab server and builds the test image, once per test binary.
pub fn peer() -> &'static Peer {
    PEER.get_or_init(|| {
        run_script(&["tests/peers/test-image.sh"]);
        run_script(&["tests/peers/codalab-server.sh", "start"]);
        let text = run_script(&[
            "-c",
            "eval \"$(tests/peers/codalab-server.sh env)\" && env -0",
        ]);
        let env = text
            .split('\0')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Peer { env }
    })
}

impl Peer {
    pub fn var(&self, k: &str) -> String {
        self.env
            .get(k)
            .cloned()
            .unwrap_or_else(|| panic!("{k} missing from codalab-server.sh env"))
    }

    pub fn server_url(&self) -> String {
        self.var("CLW_SERVER_URL")
    }

    pub fn ws_url(&self) -> String {
        self.var("CLW_WS_URL")
    }

    pub fn root_credentials(&self) -> Credentials {
        Credentials {
            username: self.var("CLW_ROOT_USER"),
            password: self.var("CLW_ROOT_PASSWORD"),
        }
    }

    pub fn client(&self) -> RestClient {
        RestClient::new(
            ClientConfig::new(self.server_url()),
            self.root_credentials(),
        )
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_read_unquoted() {
        let env = exports("export A=1\nexport B='x y'\nexport C=\"z\"\necho hi\n");
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "x y");
        assert_eq!(env["C"], "z");
        assert_eq!(env.len(), 3);
    }

    #[test]
    fn bash_runs_in_the_repository() {
        let out = bash(&["-c", "test -d tests/peers && echo ok"], &HashMap::new());
        assert_eq!(out, "ok\n");
    }
}

/// The start of the password of every user made by [`add_user`] (the credentials scan looks for
/// it).
pub const USER_PASSWORD_PREFIX: &str = "clw-user-pw-";

/// A verified non-root user of the CodaLab peer.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub password: String,
}

/// A new non-root user of the peer (`codalab-server.sh add-user`, the password on stdin), for a
/// test whose bundles, manager and workers must be its own: the server runs a user's bundles on
/// that user's workers (or on the root user's, all of which serve tags of their own in the
/// tests), and a manager without `--worker-tag` sees only its user's staged bundles (`.mine`).
pub fn add_user(prefix: &str) -> User {
    use std::io::Write;
    let _ = peer();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("{prefix}{}x{:x}", std::process::id(), nanos % (1 << 40));
    let password = format!(
        "{USER_PASSWORD_PREFIX}{:x}",
        nanos.wrapping_mul(2654435761) % (1 << 60)
    );
    let mut child = Command::new("bash")
        .arg(repo_root().join("tests/peers/codalab-server.sh"))
        .args(["add-user", &name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "add-user {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    User { name, password }
}
