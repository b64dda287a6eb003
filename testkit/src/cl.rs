//! The `cl` CLI of the test peer, and what the tests read of its bundles.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use protocol::{Bundle, RestClient};

use crate::peers::peer;

/// A `cl` CLI session of the root user (or of another user, [`Cl::as_user`]) with its own state
/// file and worksheet session.
pub struct Cl {
    state_dir: tempfile::TempDir,
    session: String,
    user: Option<crate::peers::User>,
}

impl Cl {
    pub fn new(name: &str) -> Self {
        Self::session(name, None)
    }

    /// A session of `user` (e.g. one made by [`crate::peers::add_user`]).
    pub fn as_user(name: &str, user: &crate::peers::User) -> Self {
        Self::session(name, Some(user.clone()))
    }

    fn session(name: &str, user: Option<crate::peers::User>) -> Self {
        let cl = Cl {
            state_dir: tempfile::tempdir().unwrap(),
            session: format!("clw-{name}-{}", std::process::id()),
            user,
        };
        cl.run(&["work"]);
        cl
    }

    /// `cl ARGS` as a command. CodaLab's own CLI, run by the peer's `cl-fork` service when it is
    /// up (tests/peers/cl-fork.py: the same entry point, forked from a process that has already
    /// imported it, which saves about three CPU seconds a call), else the `cl` program.
    pub fn command(&self, args: &[&str]) -> Command {
        let p = peer();
        let fork = p
            .env
            .get("CLW_CL_FORK")
            .filter(|sock| std::path::Path::new(sock.as_str()).exists());
        let mut c = match fork {
            Some(sock) => {
                let mut c = Command::new("python3");
                c.arg(crate::peers::repo_root().join("tests/peers/cl-fork.py"))
                    .args(["client", sock.as_str()]);
                c
            }
            None => Command::new("cl"),
        };
        c.args(args)
            .env_clear()
            .envs(&p.env)
            .env(
                "CODALAB_USERNAME",
                self.user
                    .as_ref()
                    .map_or_else(|| p.var("CLW_ROOT_USER"), |u| u.name.clone()),
            )
            .env(
                "CODALAB_PASSWORD",
                self.user
                    .as_ref()
                    .map_or_else(|| p.var("CLW_ROOT_PASSWORD"), |u| u.password.clone()),
            )
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

    /// `cl upload` of a text file `name` (written in `dir`); returns the new bundle's uuid.
    pub fn upload_text(&self, dir: &std::path::Path, name: &str, contents: &str) -> String {
        let f = dir.join(name);
        std::fs::write(&f, contents).unwrap();
        last_uuid(&self.run(&["upload", f.to_str().unwrap()]))
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

/// `n` run bundles with the command and metadata of `template` (a run `cl run` made), created
/// in one `POST /bundles?detached=1` as the CLI creates one: many staged bundles in seconds.
pub fn create_runs_like(client: &RestClient, template: &Bundle, n: usize) -> Vec<String> {
    // What `cl run` sets; the rest (created, data_size, …) is the server's.
    let mut metadata = template
        .attributes
        .get("metadata")
        .and_then(serde_json::Value::as_object)
        .cloned()
        .unwrap_or_default();
    metadata.retain(|k, _| {
        k.starts_with("request_")
            || [
                "name",
                "description",
                "tags",
                "exclude_patterns",
                "allow_failed_dependencies",
                "store",
            ]
            .contains(&k.as_str())
    });
    let command = template.attributes.get("command").cloned();
    let one = serde_json::json!({"type": "bundles", "attributes": {
        "bundle_type": "run", "command": command, "metadata": metadata,
        "dependencies": []}});
    let body = serde_json::json!({ "data": vec![one; n] });
    let doc = rest_json(client, reqwest::Method::POST, &[("detached", "1")], &body);
    let ids: Vec<String> = doc["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ids.len(), n, "POST /bundles answered {doc}");
    ids
}

/// Deletes bundles (`DELETE /bundles?force=1`), 200 at a time.
pub fn delete_bundles(client: &RestClient, uuids: &[String]) {
    for chunk in uuids.chunks(200) {
        let data: Vec<_> = chunk
            .iter()
            .map(|u| serde_json::json!({"type": "bundles", "id": u}))
            .collect();
        rest_json(
            client,
            reqwest::Method::DELETE,
            &[("force", "1")],
            &serde_json::json!({ "data": data }),
        );
    }
}

fn rest_json(
    client: &RestClient,
    method: reqwest::Method,
    query: &[(&str, &str)],
    body: &serde_json::Value,
) -> serde_json::Value {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let what = format!("{method} /bundles");
        let resp = client
            .request(method, "/bundles")
            .await
            .unwrap()
            .query(query)
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "{what}: {status}: {text}");
        serde_json::from_str(&text).unwrap_or_default()
    })
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

/// The GPUs that the worker running `uuid` offered the server (its `worker` row), read while
/// the worker holds the run (its `worker_run` row lasts from the hand-over to the run's end;
/// the run must last a few seconds). Read straight from the database, so that no state that
/// lasts only between two polls is needed.
pub fn gpus_offered_for(uuid: &str) -> u32 {
    let t0 = Instant::now();
    loop {
        let rows = crate::peers::sql(&format!(
            "SELECT w.gpus FROM worker w JOIN worker_run r ON r.worker_id = w.worker_id \
             AND r.user_id = w.user_id WHERE r.run_uuid = '{uuid}'"
        ));
        let gpus: Vec<u32> = rows.lines().filter_map(|l| l.trim().parse().ok()).collect();
        match gpus[..] {
            [g] => return g,
            [] => {}
            _ => panic!("more than one worker holds {uuid}: {rows:?}"),
        }
        let state = crate::peers::sql(&format!("SELECT state FROM bundle WHERE uuid = '{uuid}'"));
        assert!(
            !is_final(state.trim()),
            "{uuid} ended ({}) before a worker was seen holding it",
            state.trim()
        );
        assert!(t0.elapsed() < T, "no worker took {uuid} in {T:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn is_final(state: &str) -> bool {
    matches!(state, "ready" | "failed" | "killed" | "worker_offline")
}

/// The final state the worker's report calls for, exactly; for a run the worker failed, the
/// server's finalization race is accepted as [`assert_final_state_or_server_race`] says.
pub fn assert_final_state(b: &Bundle, expected: &str, log: &str) {
    if expected != "ready" {
        return assert_final_state_or_server_race(b, expected, log);
    }
    assert_eq!(b.state(), Some(expected), "{b:?}\n{log}");
}

/// For a run the worker failed, stopped or killed: the expected state, or `ready` with the
/// worker's failure message stored. There, and only there, the server's finalization race has
/// been seen (docs/compatibility.md, "A server-side race worth knowing"): under load the server
/// occasionally finalizes such a run as `ready` although it stored the failure message the
/// worker sent with `finalizing` (a kill, a time, disk or memory limit, the engine lost, and once
/// a dependency mount the worker refused in preparation). That case is accepted, loudly, only
/// with that message stored, so the worker's part is still checked.
pub fn assert_final_state_or_server_race(b: &Bundle, expected: &str, log: &str) {
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

/// For runs that print one line and then the machine's uptime before and after a sleep: waits
/// until each ends `ready`, checks its first line, and asserts that no two of them ran at the
/// same time (`what` says what they would have shared).
pub fn assert_took_turns(
    cl: &Cl,
    uuids: &[&str],
    first_line: &str,
    what: &str,
    log: impl Fn() -> String,
) {
    let client = peer().client();
    let mut spans = Vec::new();
    for uuid in uuids {
        let bundle = wait_for(&client, uuid, T, is_final);
        assert_final_state(&bundle, "ready", &log());
        let out = cl.stdout(uuid);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], first_line, "{out}");
        spans.push((
            lines[1].parse::<f64>().unwrap(),
            lines[2].parse::<f64>().unwrap(),
        ));
    }
    spans.sort_by(|x, y| x.0.total_cmp(&y.0));
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "the runs overlapped on {what}: {spans:?}"
        );
    }
}
