//! Shared harness of the end-to-end tests: the real CodaLab server (started through
//! `tests/peers/codalab-server.sh`), the local test image, `cl` CLI calls, and `cl-worker`
//! processes.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use protocol::{Bundle, ClientConfig, Credentials, RestClient};

/// The `cl-worker` binary: Cargo's own path when this harness is compiled into the worker's
/// tests, else the workspace's debug build (built by `cargo test --workspace`).
pub fn worker_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_cl-worker") {
        Some(p) => PathBuf::from(p),
        None => repo_root().join("target/debug/cl-worker"),
    }
}

pub fn repo_root() -> PathBuf {
    let mut dir = Path::new(env!("CARGO_MANIFEST_DIR")).to_owned();
    while !dir.join("Cargo.lock").exists() && dir.pop() {}
    dir
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

/// A `cl` CLI session of the root user with its own state file and worksheet session.
pub struct Cl {
    state_dir: tempfile::TempDir,
    session: String,
}

impl Cl {
    pub fn new(name: &str) -> Self {
        let cl = Cl {
            state_dir: tempfile::tempdir().unwrap(),
            session: format!("clw-{name}-{}", std::process::id()),
        };
        cl.run(&["work"]);
        cl
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let p = peer();
        let mut c = Command::new("cl");
        c.args(args)
            .env_clear()
            .envs(&p.env)
            .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
            .env("CODALAB_PASSWORD", p.var("CLW_ROOT_PASSWORD"))
            .env("CODALAB_STATE", self.state_dir.path().join("state.json"))
            .env("CODALAB_SESSION", &self.session)
            .stdin(Stdio::null());
        c
    }

    /// Runs `cl ARGS`, returns stdout; panics with the output on failure.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.command(args).output().expect("cl runs");
        assert!(
            out.status.success(),
            "cl {:?} failed: {}\n{}",
            args,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `cl cat <uuid>/stdout` as text.
    pub fn stdout(&self, uuid: &str) -> String {
        String::from_utf8(self.cat(&format!("{uuid}/stdout"))).unwrap()
    }

    /// Raw bytes of `cl cat TARGET`.
    pub fn cat(&self, target: &str) -> Vec<u8> {
        let out = self.command(&["cat", target]).output().expect("cl runs");
        assert!(
            out.status.success(),
            "cl cat {target} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// `cl run` on the worker queue `tag`; returns the new bundle's uuid.
    pub fn run_bundle(&self, tag: &str, extra: &[&str], command: &str) -> String {
        let mut args = vec!["run", "--request-queue", tag];
        args.extend_from_slice(extra);
        args.push(command);
        last_uuid(&self.run(&args))
    }
}

/// The last `0x…` token of CLI output.
pub fn last_uuid(out: &str) -> String {
    out.split_whitespace()
        .rev()
        .find(|t| t.starts_with("0x"))
        .unwrap_or_else(|| panic!("no uuid in {out:?}"))
        .to_owned()
}

/// A `cl-worker` process, killed when dropped.
pub struct WorkerProc {
    pub child: Child,
    pub id: String,
    pub tag: String,
    pub log: PathBuf,
    pub work_dir: tempfile::TempDir,
    prefix: String,
}

pub const TEST_NETWORK_PREFIX: &str = "clw_test_network";

pub fn unique(name: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 1_000_000_000;
    format!("{name}-{n}")
}

impl WorkerProc {
    /// Starts a worker for the root user with a tag of its own (`--tag-exclusive`), so that
    /// tests running at the same time never take each other's bundles.
    pub fn start(name: &str, extra: &[&str]) -> Self {
        let id = unique(&format!("clw-{name}"));
        Self::start_as(&id, &id.clone(), tempfile::tempdir().unwrap(), extra)
    }

    /// A worker with a given id, tag and work dir (e.g. a restart of an earlier worker).
    pub fn start_as(id: &str, tag: &str, work_dir: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_env(id, tag, work_dir, extra, &[])
    }

    /// As [`WorkerProc::start_as`], with extra environment variables.
    pub fn start_env(
        id: &str,
        tag: &str,
        work_dir: tempfile::TempDir,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        let p = peer();
        let id = id.to_owned();
        let tag = tag.to_owned();
        let n = std::fs::read_dir(work_dir.path()).map_or(0, |d| d.count());
        let log = work_dir.path().join(format!("worker-{n}.log"));
        // One set of networks for all test workers, as workers on one machine share the default
        // prefix: Docker has address pools for only about 30 networks.
        let prefix = TEST_NETWORK_PREFIX.to_string();
        let mut args: Vec<String> = vec![
            "--server".into(),
            p.server_url(),
            "--ws-server".into(),
            p.ws_url(),
            "--work-dir".into(),
            work_dir.path().join("wd").display().to_string(),
            "--id".into(),
            id.clone(),
            "--tag".into(),
            tag.clone(),
            "--tag-exclusive".into(),
            "--network-prefix".into(),
            prefix.clone(),
            "--verbose".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = Command::new(worker_bin())
            .args(&args)
            .env("CODALAB_USERNAME", p.var("CLW_ROOT_USER"))
            .env("CODALAB_PASSWORD", p.var("CLW_ROOT_PASSWORD"))
            .env_remove("RUST_LOG")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("cl-worker starts");
        WorkerProc {
            child,
            id,
            tag,
            log,
            work_dir,
            prefix,
        }
    }

    /// Stops the process without cleaning up, and hands back its work dir.
    pub fn into_work_dir(mut self) -> tempfile::TempDir {
        let _ = self.child.wait();
        let dir = tempfile::tempdir().unwrap();
        let work_dir = std::mem::replace(&mut self.work_dir, dir);
        self.id = "no-such-worker".into();
        work_dir
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn network_prefix(&self) -> &str {
        &self.prefix
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Best effort: containers of this worker (the networks are shared).
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "docker ps -aq --filter label=org.codalab.worker-id={id} | xargs -r docker rm -f",
                id = self.id,
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if std::thread::panicking() {
            let mut err = std::io::stderr();
            let _ = writeln!(
                err,
                "----- worker {} log -----\n{}",
                self.id,
                self.log_text()
            );
        }
    }
}

/// Polls the bundle until `done(state)` holds; panics after `timeout`.
pub fn wait_for(
    client: &RestClient,
    uuid: &str,
    timeout: Duration,
    done: impl Fn(&str) -> bool,
) -> Bundle {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < timeout {
        match rt.block_on(client.get_bundle(uuid)) {
            Ok(b) => {
                if b.state().is_some_and(&done) {
                    return b;
                }
                last = Some(b);
            }
            Err(e) => eprintln!("get_bundle {uuid}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("bundle {uuid} did not reach the expected state in {timeout:?}; last: {last:?}");
}

/// How long a test waits for a bundle.
pub const T: Duration = Duration::from_secs(180);

/// A metadata field of a bundle as a string ("" when missing).
pub fn meta_str(b: &Bundle, key: &str) -> String {
    b.metadata(key)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

pub fn is_final(state: &str) -> bool {
    matches!(state, "ready" | "failed" | "killed" | "worker_offline")
}

/// The final state the worker's report calls for. The server occasionally finalizes such a run
/// as `ready` although it stored the failure message the worker sent (docs/compatibility.md,
/// "A server-side race worth knowing"); that case is accepted, loudly, only with the message
/// stored, so the worker's part is still checked.
pub fn assert_final_state(b: &Bundle, expected: &str, log: &str) {
    if b.state() == Some(expected) {
        return;
    }
    assert!(
        b.state() == Some("ready") && !meta_str(b, "failure_message").is_empty(),
        "expected {expected}: {b:?}\n{log}"
    );
    eprintln!(
        "SERVER RACE: {} ended ready with failure_message {:?} stored (expected {expected})",
        b.uuid,
        meta_str(b, "failure_message")
    );
}
