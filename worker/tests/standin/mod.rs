//! A CodaLab server stand-in for the worker loop, in-process: it answers login, checkin
//! (long-polled: held while there is nothing to say), `start_bundle` and the contents upload
//! with the real server's wire format, and records every checkin with its start and end. Runs
//! it sees reported as `finalizing` get a `mark_finalized`, as from the real server.

#![allow(dead_code)] // each test file uses its own part

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use codalab_worker::agent::{AgentConfig, ExitReason};
use codalab_worker::config::{Config, DependencyConfig};
use codalab_worker::runtime::fake::{Call, FakeRuntime};
use protocol::{ClientConfig, Credentials, RestClient};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// One checkin as the stand-in saw it.
#[derive(Debug, Clone)]
pub struct Checkin {
    pub start: Instant,
    /// When the answer left (after the long-poll hold).
    pub end: Instant,
    pub body: Value,
    pub answer: Vec<Value>,
}

impl Checkin {
    /// The report of run `uuid` in this checkin.
    pub fn run(&self, uuid: &str) -> Option<&Value> {
        self.body["runs"]
            .as_array()?
            .iter()
            .find(|r| r["uuid"] == uuid)
    }
}

#[derive(Default)]
struct Shared {
    checkins: Vec<Checkin>,
    queued: VecDeque<Value>,
    finalized: BTreeSet<String>,
    started: Vec<String>,
    uploads: Vec<(String, Vec<u8>)>,
}

#[derive(Clone)]
pub struct Server {
    pub mock: Arc<MockServer>,
    shared: Arc<Mutex<Shared>>,
}

struct CheckinResponder {
    shared: Arc<Mutex<Shared>>,
    hold: Duration,
}

impl Respond for CheckinResponder {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let start = Instant::now();
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let mut s = self.shared.lock().unwrap();
        let mut answer: Vec<Value> = s.queued.drain(..).collect();
        for run in body["runs"].as_array().into_iter().flatten() {
            let uuid = run["uuid"].as_str().unwrap_or_default().to_owned();
            if run["state"] == "finalizing" && s.finalized.insert(uuid.clone()) {
                answer.push(json!({"type": "mark_finalized", "uuid": uuid}));
            }
        }
        let hold = if answer.is_empty() {
            self.hold
        } else {
            Duration::ZERO
        };
        s.checkins.push(Checkin {
            start,
            end: start + hold,
            body,
            answer: answer.clone(),
        });
        ResponseTemplate::new(200)
            .set_body_json(Value::Array(answer))
            .set_delay(hold)
    }
}

struct Recorder<F>(F);

impl<F: Fn(&Request) -> ResponseTemplate + Send + Sync + 'static> Respond for Recorder<F> {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        (self.0)(req)
    }
}

impl Server {
    /// A stand-in that holds a checkin with nothing to say for `hold`.
    pub async fn start(hold: Duration) -> Server {
        let mock = MockServer::start().await;
        let shared = Arc::new(Mutex::new(Shared::default()));
        Mock::given(method("POST"))
            .and(path("/rest/oauth2/token"))
            .respond_with(ResponseTemplate::new(200).set_body_json(
                json!({"access_token": "t", "token_type": "Bearer", "expires_in": 3600}),
            ))
            .mount(&mock)
            .await;
        Mock::given(method("POST"))
            .and(path_regex("^/rest/workers/[^/]+/checkin$"))
            .respond_with(CheckinResponder {
                shared: shared.clone(),
                hold,
            })
            .mount(&mock)
            .await;
        let s = shared.clone();
        Mock::given(method("POST"))
            .and(path_regex("^/rest/workers/[^/]+/start_bundle/[^/]+$"))
            .respond_with(Recorder(move |req: &Request| {
                let uuid = req.url.path().rsplit('/').next().unwrap_or_default();
                s.lock().unwrap().started.push(uuid.to_owned());
                ResponseTemplate::new(200).set_body_json(json!(true))
            }))
            .mount(&mock)
            .await;
        let s = shared.clone();
        Mock::given(method("PUT"))
            .and(path_regex("^/rest/bundles/[^/]+/contents/blob/$"))
            .respond_with(Recorder(move |req: &Request| {
                let uuid = req.url.path().split('/').nth(3).unwrap_or_default();
                s.lock()
                    .unwrap()
                    .uploads
                    .push((uuid.to_owned(), req.body.clone()));
                ResponseTemplate::new(200).set_body_json(json!({"data": []}))
            }))
            .mount(&mock)
            .await;
        Server {
            mock: Arc::new(mock),
            shared,
        }
    }

    /// The next checkin answers with `message`.
    pub fn send(&self, message: Value) {
        self.shared.lock().unwrap().queued.push_back(message);
    }

    pub fn checkins(&self) -> Vec<Checkin> {
        self.shared.lock().unwrap().checkins.clone()
    }

    pub fn started(&self) -> Vec<String> {
        self.shared.lock().unwrap().started.clone()
    }

    pub fn uploads(&self) -> Vec<(String, Vec<u8>)> {
        self.shared.lock().unwrap().uploads.clone()
    }

    pub async fn client(&self) -> RestClient {
        let client = RestClient::new(
            ClientConfig::new(self.mock.uri()),
            Credentials {
                username: "u".into(),
                password: "p".into(),
            },
        )
        .unwrap();
        client.login().await.unwrap();
        client
    }
}

/// A `run` message as the server sends it.
pub fn run_message(uuid: &str, command: &str) -> Value {
    json!({
        "type": "run",
        "bundle": {
            "uuid": uuid,
            "bundle_type": "run",
            "command": command,
            "dependencies": [],
            "location": null,
            "metadata": {"name": "test-run", "exclude_patterns": []},
            "state": "starting",
            "owner_id": "0",
        },
        "resources": {
            "cpus": 1, "gpus": 0, "docker_image": "", "time": 0, "memory": 0, "disk": 0,
            "network": false, "tag": null, "request_queue": null,
        },
    })
}

/// A worker's settings for tests: one CPU, no GPU, no websocket.
pub fn config(worker_id: &str, work_dir: &Path, checkin_every: Duration) -> Config {
    Config {
        server: String::new(),
        password_file: None,
        agent: AgentConfig {
            worker_id: worker_id.into(),
            work_dir: codalab_worker::prepare_work_dir(work_dir).unwrap(),
            cpuset: vec![0],
            gpuset: vec![],
            memory_bytes: 1 << 30,
            tag: None,
            group: None,
            tag_exclusive: false,
            shared_file_system: false,
            exit_when_idle: false,
            idle_seconds: 0,
            checkin_frequency: checkin_every,
            exit_after_num_runs: 1,
            pass_down_termination: false,
            preemption_notice: None,
            preemptible: false,
            shm_size_bytes: 1 << 30,
            pids_limit: 0,
            run_as_user: None,
            hostname: "standin-host".into(),
            ws_url: None,
            prefetch: Default::default(),
        },
        dependencies: DependencyConfig {
            max_retries: 1,
            max_work_dir_bytes: 1 << 30,
            cache_dir: None,
        },
        delete_work_dir_on_exit: false,
        metrics_addr: None,
    }
}

/// Starts the worker library on the fake runtime.
pub async fn spawn_worker(
    server: &Server,
    config: Config,
    runtime: FakeRuntime,
) -> tokio::task::JoinHandle<ExitReason> {
    let client = server.client().await;
    tokio::spawn(async move {
        codalab_worker::run_with(config, client, runtime, CancellationToken::new())
            .await
            .unwrap()
    })
}

/// Waits (up to 20 s) for the worker to stop; why it stopped.
pub async fn stopped(worker: tokio::task::JoinHandle<ExitReason>) -> ExitReason {
    tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("the worker did not stop")
        .unwrap()
}

/// The first report of run `uuid` in state `state`, with the checkin that carried it.
pub fn first_report<'a>(checkins: &'a [Checkin], uuid: &str, state: &str) -> (&'a Checkin, Value) {
    checkins
        .iter()
        .find_map(|c| {
            c.run(uuid)
                .filter(|r| r["state"] == state)
                .map(|r| (c, r.clone()))
        })
        .unwrap_or_else(|| panic!("run {uuid} was never reported {state}"))
}

/// Waits (up to 20 s) until `cond` holds.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the fake runtime saw `call`.
pub async fn until_called(rt: &FakeRuntime, call: Call) {
    until(&format!("{call:?}"), || rt.calls().contains(&call)).await;
}

/// No two checkins overlapped: each started after the previous one's answer left.
pub fn assert_never_overlapping(checkins: &[Checkin]) {
    for pair in checkins.windows(2) {
        assert!(
            pair[1].start >= pair[0].end,
            "a checkin started {:?} before the previous one ended",
            pair[0].end - pair[1].start
        );
    }
}

/// The file names in a tar.gz.
pub fn tar_names(gz: &[u8]) -> Vec<PathBuf> {
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    a.entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().into_owned())
        .collect()
}
