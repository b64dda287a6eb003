//! `cl-worker` processes of the end-to-end tests.

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::peers::peer;

/// The `cl-worker` binary Cargo built for the running test.
pub fn worker_bin() -> PathBuf {
    crate::binary("cl-worker")
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
        // prefix: Docker has address pools for only about 30 networks. A test that changes the
        // networks under its worker names a prefix of its own in `extra`.
        let own = extra
            .iter()
            .position(|a| *a == "--network-prefix")
            .and_then(|i| extra.get(i + 1));
        let prefix = own.map_or(TEST_NETWORK_PREFIX, |p| *p).to_string();
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
            "--verbose".into(),
        ];
        if own.is_none() {
            args.extend(["--network-prefix".into(), prefix.clone()]);
        }
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

    /// The address of a worker started with `--metrics-addr 127.0.0.1:0`, from its log.
    pub fn metrics_addr(&self) -> String {
        let prefix = "serving /metrics on http://";
        crate::wait_until(Duration::from_secs(30), "the metrics address", || {
            self.log_text().contains(prefix)
        });
        self.log_text()
            .split(prefix)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
            .to_string()
    }

    /// Stops the process without cleaning up, and hands back its work dir.
    pub fn into_work_dir(mut self) -> tempfile::TempDir {
        let _ = self.child.wait();
        self.keep_log();
        let dir = tempfile::tempdir().unwrap();
        let work_dir = std::mem::replace(&mut self.work_dir, dir);
        self.id = "no-such-worker".into();
        work_dir
    }

    /// Keeps the log for the credentials scan ([`crate::keep_log`]).
    fn keep_log(&self) {
        let name = self.log.file_name().unwrap().to_string_lossy().into_owned();
        crate::keep_log(&self.log, &format!("{}/{name}", self.id));
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
        self.keep_log();
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
