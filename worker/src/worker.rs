//! The worker's event loop: checkins, server messages, and the I/O tasks that carry out the run
//! state machine's effects. One task owns all state; everything else reports back through a
//! channel, so there are no locks around run state and no polling loops.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use protocol::{
    BundleInfo, CheckinRequest, MalformedMessage, RestClient, RunResources, ServerMessage,
    DEFAULT_KILL_MESSAGE,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::archive::{self, ChannelWriter, Excludes};
use crate::deps::{DepKey, Dependencies};
use crate::format::size_str;
use crate::persist;
use crate::resources::{Allocator, Assignment, Grant};
use crate::run_state::{now_unix, step, Effect, Event, RunState, Stage, Stats};
use crate::runtime::{normalize_image, BundleRuntime, Mount, RunSpec, Sample};

/// The worker loop's settings, from the command line.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub worker_id: String,
    pub work_dir: PathBuf,
    pub cpuset: Vec<usize>,
    pub gpuset: Vec<String>,
    pub memory_bytes: u64,
    pub tag: Option<String>,
    pub group: Option<String>,
    pub tag_exclusive: bool,
    pub shared_file_system: bool,
    pub exit_when_idle: bool,
    pub idle_seconds: u64,
    pub checkin_frequency: Duration,
    pub exit_after_num_runs: i64,
    pub pass_down_termination: bool,
    pub preemptible: bool,
    pub shm_size_bytes: u64,
    pub pids_limit: i64,
    pub hostname: String,
    pub ws_url: Option<String>,
}

impl AgentConfig {
    pub fn runs_dir(&self) -> PathBuf {
        self.work_dir.join("runs")
    }
}

/// Why the worker stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    Idle,
    NumRuns,
    Signal,
}

enum Msg {
    Run(String, Event),
    Started {
        bundle: Box<BundleInfo>,
        resources: Box<RunResources>,
        accepted: Result<bool, protocol::Error>,
        refuse: bool,
    },
    CheckinDone {
        result: Result<Vec<Result<ServerMessage, MalformedMessage>>, protocol::Error>,
        reported: Vec<String>,
    },
    Nudge,
}

struct Run {
    state: RunState,
    prepare: Option<CancellationToken>,
    upload: Option<CancellationToken>,
    monitor: Option<tokio::task::AbortHandle>,
    /// The server state this run had in the last checkin body sent.
    reported: Option<&'static str>,
}

pub struct Worker<R: BundleRuntime> {
    cfg: Arc<AgentConfig>,
    client: RestClient,
    runtime: R,
    deps: Arc<Dependencies>,
    resources: CpuGpuPool,
    state_file: persist::Writer,
    runs: BTreeMap<String, Run>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    /// Runs accepted so far (start_bundle true), for --exit-after-num-runs.
    num_runs: i64,
    /// `run` messages whose start_bundle call is in flight.
    starting: HashSet<String>,
    /// A run's server-visible state changed since it was last reported.
    report_wanted: bool,
    /// The websocket said the server has a message for us.
    nudged: bool,
    /// A checkin is under way (and long-polling: the server can reach the worker now). Never
    /// more than one: the server applies a checkin's run reports when it receives it, and under
    /// load it may receive two overlapping checkins in either order; an older report applied
    /// last would move a bundle back (e.g. from `ready` to `finalizing`).
    checkin_in_flight: bool,
    last_checkin_start: Option<Instant>,
    last_checkin_end: Option<Instant>,
    last_checkin_ok: bool,
    checkin_failures: u32,
    last_busy: Instant,
    terminating: bool,
    restaging: bool,
    shutdown: CancellationToken,
}

impl<R: BundleRuntime> Worker<R> {
    pub fn new(
        cfg: AgentConfig,
        client: RestClient,
        runtime: R,
        deps: Arc<Dependencies>,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let resources = CpuGpuPool::new(Allocator::new(cfg.cpuset.clone(), cfg.gpuset.clone()));
        let state_file = persist::Writer::spawn(persist::state_path(&cfg.work_dir, &cfg.worker_id));
        Worker {
            cfg: Arc::new(cfg),
            client,
            runtime,
            deps,
            resources,
            state_file,
            runs: BTreeMap::new(),
            tx,
            rx,
            num_runs: 0,
            starting: HashSet::new(),
            report_wanted: false,
            nudged: false,
            checkin_in_flight: false,
            last_checkin_start: None,
            last_checkin_end: None,
            last_checkin_ok: false,
            checkin_failures: 0,
            last_busy: Instant::now(),
            terminating: false,
            restaging: false,
            shutdown,
        }
    }

    /// Runs until a signal, idleness or the run limit ends the worker.
    pub async fn run(mut self) -> ExitReason {
        let reason = self.run_loop().await;
        self.persist();
        self.state_file.close().await;
        reason
    }

    async fn run_loop(&mut self) -> ExitReason {
        if let Some(url) = self.cfg.ws_url.clone() {
            let tx = self.tx.clone();
            let id = self.cfg.worker_id.clone();
            let stop = self.shutdown.clone();
            tokio::spawn(crate::ws::listen(url, id, tx_nudge(tx), stop));
        }
        let mut signals = Signals::new();
        let mut termination_deadline: Option<tokio::time::Instant> = None;
        loop {
            if let Some(reason) = self.exit_reason() {
                tracing::info!("worker exiting: {reason:?}");
                self.shutdown.cancel();
                return reason;
            }
            if let Some(d) = termination_deadline {
                if tokio::time::Instant::now() >= d {
                    tracing::warn!("gave up waiting for runs to be handed back; exiting");
                    self.shutdown.cancel();
                    return ExitReason::Signal;
                }
            }
            let next_checkin = self.next_checkin_at();
            tokio::select! {
                Some(msg) = self.rx.recv() => self.handle(msg),
                _ = sleep_until(next_checkin), if self.may_check_in() => self.start_checkin(),
                sig = signals.recv() => {
                    tracing::info!("received {sig}");
                    if self.terminating {
                        tracing::warn!("second signal: exiting now");
                        self.shutdown.cancel();
                        return ExitReason::Signal;
                    }
                    self.terminating = true;
                    self.report_wanted = true;
                    if self.cfg.pass_down_termination {
                        self.restage_all();
                        termination_deadline =
                            Some(tokio::time::Instant::now() + Duration::from_secs(120));
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1)), if termination_deadline.is_some() => {}
            }
        }
    }

    fn exit_reason(&self) -> Option<ExitReason> {
        let active = !self.runs.is_empty() || !self.starting.is_empty();
        if self.terminating {
            if !self.cfg.pass_down_termination {
                // Runs keep going in their containers, as the Python worker does.
                return Some(ExitReason::Signal);
            }
            if !active && !self.checkin_in_flight && self.last_checkin_ok {
                return Some(ExitReason::Signal);
            }
            return None;
        }
        if active {
            return None;
        }
        if self.num_runs >= self.cfg.exit_after_num_runs {
            return Some(ExitReason::NumRuns);
        }
        if self.cfg.exit_when_idle
            && self.last_checkin_ok
            && !self.checkin_in_flight
            && self.last_busy.elapsed() >= Duration::from_secs(self.cfg.idle_seconds)
            && self.last_checkin_start.is_some()
        {
            return Some(ExitReason::Idle);
        }
        None
    }

    fn may_check_in(&self) -> bool {
        !self.checkin_in_flight
    }

    /// When the next checkin is due: at once after a state change the server can see or a
    /// websocket nudge; after a backoff following failures; else `--checkin-frequency-seconds`
    /// after the last one ended (the nudge covers messages in between, as with the Python
    /// worker).
    fn next_checkin_at(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let (Some(start), Some(end)) = (self.last_checkin_start, self.last_checkin_end) else {
            return Some(now);
        };
        if self.checkin_failures > 0 {
            // Back off: 1, 2, 4 … 16 s (runs must be reported at least every 60 s).
            let delay = Duration::from_secs(1 << self.checkin_failures.min(5).saturating_sub(1));
            return Some(tokio::time::Instant::from_std(start) + delay);
        }
        if self.report_wanted || self.nudged {
            return Some(now);
        }
        Some(tokio::time::Instant::from_std(end) + self.cfg.checkin_frequency)
    }

    fn start_checkin(&mut self) {
        self.report_wanted = false;
        self.nudged = false;
        self.checkin_in_flight = true;
        self.last_checkin_start = Some(Instant::now());
        for run in self.runs.values_mut() {
            run.reported = Some(run.state.stage.server_state());
        }
        let body = self.checkin_body();
        let reported: Vec<String> = self
            .runs
            .values()
            .filter(|r| r.state.stage == Stage::Restaged)
            .map(|r| r.state.uuid().to_owned())
            .collect();
        tracing::debug!("checkin: {} runs", body.runs.len());
        let client = self.client.clone();
        let tx = self.tx.clone();
        let id = self.cfg.worker_id.clone();
        tokio::spawn(async move {
            let result = client.checkin(&id, &body).await;
            let _ = tx.send(Msg::CheckinDone { result, reported });
        });
    }

    fn checkin_body(&self) -> CheckinRequest {
        let cfg = &self.cfg;
        CheckinRequest {
            tag: cfg.tag.clone(),
            group_name: cfg.group.clone(),
            cpus: cfg.cpuset.len() as u64,
            gpus: cfg.gpuset.len() as u64,
            memory_bytes: cfg.memory_bytes,
            free_disk_bytes: free_disk_bytes(&cfg.work_dir),
            dependencies: if cfg.shared_file_system {
                Vec::new()
            } else {
                self.deps.keys()
            },
            hostname: cfg.hostname.clone(),
            runs: self
                .runs
                .values()
                .filter(|r| !r.state.is_done())
                .map(|r| r.state.report(&cfg.worker_id))
                .collect(),
            shared_file_system: cfg.shared_file_system,
            tag_exclusive: cfg.tag_exclusive,
            exit_after_num_runs: (cfg.exit_after_num_runs - self.num_runs).max(0),
            is_terminating: self.terminating,
            preemptible: cfg.preemptible,
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Run(uuid, event) => self.apply(&uuid, event),
            Msg::Nudge => {
                tracing::debug!("nudged by the server");
                // A checkin under way is listening and gets the message; otherwise check in.
                if !self.checkin_in_flight {
                    self.nudged = true;
                }
            }
            Msg::CheckinDone { result, reported } => {
                self.checkin_in_flight = false;
                self.last_checkin_end = Some(Instant::now());
                tracing::debug!(
                    "checkin done: {} messages",
                    result.as_ref().map_or(0, Vec::len)
                );
                match result {
                    Ok(messages) => {
                        if self.checkin_failures > 0 {
                            tracing::info!("checkin succeeded again");
                        }
                        self.checkin_failures = 0;
                        self.last_checkin_ok = true;
                        // Restaged runs were reported as staged: the server has them back.
                        for uuid in reported {
                            if let Some(r) = self.runs.get(&uuid) {
                                if r.state.stage == Stage::Restaged {
                                    self.runs.remove(&uuid);
                                    self.persist();
                                }
                            }
                        }
                        for m in messages {
                            match m {
                                Ok(m) => self.on_message(m),
                                Err(bad) => tracing::warn!(
                                    "skipping malformed server message ({}): {}",
                                    bad.error,
                                    truncate_json(&bad.raw)
                                ),
                            }
                        }
                    }
                    Err(e) => {
                        self.last_checkin_ok = false;
                        self.checkin_failures += 1;
                        if matches!(e, protocol::Error::Auth { .. }) {
                            tracing::error!("checkin failed: {e}");
                        } else {
                            tracing::warn!(
                                "checkin failed (attempt {}), retrying: {e}",
                                self.checkin_failures
                            );
                        }
                    }
                }
                if !self.runs.is_empty() || !self.starting.is_empty() {
                    self.last_busy = Instant::now();
                }
            }
            Msg::Started {
                bundle,
                resources,
                accepted,
                refuse,
            } => {
                let uuid = bundle.uuid.clone();
                self.starting.remove(&uuid);
                match accepted {
                    Ok(true) => {
                        self.num_runs += 1;
                        self.last_busy = Instant::now();
                        let path = self.bundle_path(&bundle);
                        let mut state = RunState::new(*bundle, *resources, path, now_unix());
                        self.runs.insert(
                            uuid.clone(),
                            Run {
                                state: state.clone(),
                                prepare: None,
                                upload: None,
                                monitor: None,
                                // start_bundle already made it `preparing` on the server.
                                reported: Some(Stage::Preparing.server_state()),
                            },
                        );
                        if refuse || self.terminating {
                            // Hand it straight back rather than leave it stuck in `starting`.
                            tracing::info!(
                                "handing run {uuid} back to the server (not taking runs)"
                            );
                            state.hand_back(now_unix());
                            if let Some(r) = self.runs.get_mut(&uuid) {
                                r.state = state;
                            }
                            self.report_wanted = true;
                        } else {
                            tracing::info!("starting run {uuid}");
                            self.apply(&uuid, Event::Accepted);
                        }
                        self.persist();
                    }
                    Ok(false) => tracing::info!("server did not let this worker start {uuid}"),
                    Err(e) => tracing::warn!("start_bundle for {uuid} failed, not running it: {e}"),
                }
            }
        }
    }

    fn bundle_path(&self, bundle: &BundleInfo) -> PathBuf {
        match (&bundle.location, self.cfg.shared_file_system) {
            (Some(loc), true) => PathBuf::from(loc),
            _ => self.cfg.runs_dir().join(&bundle.uuid),
        }
    }

    fn on_message(&mut self, m: ServerMessage) {
        match m {
            ServerMessage::Run { bundle, resources } => {
                let uuid = bundle.uuid.clone();
                if self.runs.contains_key(&uuid) || self.starting.contains(&uuid) {
                    tracing::warn!("ignoring duplicate run message for {uuid}");
                    return;
                }
                let refuse = self.terminating
                    || self.num_runs + self.starting.len() as i64 >= self.cfg.exit_after_num_runs;
                self.starting.insert(uuid.clone());
                let client = self.client.clone();
                let tx = self.tx.clone();
                let id = self.cfg.worker_id.clone();
                let host = self.cfg.hostname.clone();
                tokio::spawn(async move {
                    let accepted = client
                        .start_bundle(&id, &uuid, &host, now_unix() as i64)
                        .await;
                    let _ = tx.send(Msg::Started {
                        bundle: Box::new(bundle),
                        resources: Box::new(resources),
                        accepted,
                        refuse,
                    });
                });
            }
            ServerMessage::Kill { uuid, kill_message } => {
                if self.runs.contains_key(&uuid) {
                    let msg = kill_message.unwrap_or_else(|| DEFAULT_KILL_MESSAGE.to_owned());
                    tracing::info!("kill of {uuid}: {msg}");
                    self.apply(&uuid, Event::KillRequested(msg));
                } else {
                    tracing::debug!("kill for unknown run {uuid} ignored");
                }
            }
            ServerMessage::MarkFinalized { uuid } => self.apply(&uuid, Event::MarkFinalized),
            m @ (ServerMessage::Read { .. }
            | ServerMessage::Netcat { .. }
            | ServerMessage::Write { .. }) => {
                let target = self.runs.get(m.uuid()).map(|r| crate::read::Target {
                    uuid: r.state.uuid().to_owned(),
                    bundle_path: r.state.bundle_path.clone(),
                    dependency_paths: r
                        .state
                        .bundle
                        .dependencies
                        .iter()
                        .map(|d| d.child_path.clone())
                        .collect(),
                    container_id: r.state.container_id.clone(),
                });
                crate::read::spawn(
                    self.client.clone(),
                    self.runtime.clone(),
                    self.cfg.worker_id.clone(),
                    target,
                    m,
                );
            }
        }
    }

    fn restage_all(&mut self) {
        self.restaging = true;
        let uuids: Vec<String> = self.runs.keys().cloned().collect();
        for uuid in uuids {
            self.apply(&uuid, Event::Restage);
        }
    }

    /// Runs the state machine for one run and carries out its effects.
    fn apply(&mut self, uuid: &str, event: Event) {
        let Some(run) = self.runs.get_mut(uuid) else {
            return;
        };
        let before = run.state.stage;
        let effects = step(&mut run.state, event, now_unix());
        let changed = run.state.stage != before;
        if changed {
            tracing::info!(
                "run {uuid}: {before:?} -> {:?} ({})",
                run.state.stage,
                run.state.run_status
            );
        }
        for effect in effects {
            self.execute(uuid, effect);
        }
        if changed {
            self.persist();
        }
    }

    /// Saves the runs (in the background; the latest snapshot wins).
    fn persist(&self) {
        self.state_file.save(&persist::Saved {
            version: persist::VERSION,
            worker_id: self.cfg.worker_id.clone(),
            num_runs: self.num_runs,
            runs: self
                .runs
                .values()
                .filter(|r| !r.state.is_done())
                .map(|r| r.state.clone())
                .collect(),
        });
    }

    /// Takes back the runs of an earlier process with this worker id: containers still there
    /// are watched again, interrupted steps are redone. Containers of this worker id that belong
    /// to no run are removed.
    pub async fn resume(&mut self, saved: Option<persist::Saved>) {
        let mut keep = HashSet::new();
        if let Some(saved) = saved {
            self.num_runs = saved.num_runs;
            for state in saved.runs {
                let uuid = state.uuid().to_owned();
                let mut effects = Vec::new();
                match state.stage {
                    Stage::Finished => continue,
                    Stage::Preparing => effects.push(Effect::Prepare),
                    Stage::Running => {
                        keep.insert(uuid.clone());
                        self.runtime
                            .pin_image(&normalize_image(&default_image(&state.resources)));
                        self.resources.restore(
                            &uuid,
                            Assignment {
                                cpus: state.cpuset.clone(),
                                gpus: state.gpuset.clone(),
                            },
                        );
                        effects.push(Effect::Monitor);
                    }
                    Stage::CleaningUp => effects.push(Effect::CleanUp),
                    Stage::UploadingResults => effects.push(Effect::Upload),
                    Stage::Finalizing | Stage::Restaged => {}
                }
                tracing::info!("resuming run {uuid} in stage {:?}", state.stage);
                if state.stage == Stage::Running && !self.cfg.shared_file_system {
                    // Its container still reads its dependencies: mark them in use again.
                    for d in &state.bundle.dependencies {
                        let deps = self.deps.clone();
                        let key = (d.parent_uuid.clone(), d.parent_path.clone());
                        let run = uuid.clone();
                        tokio::spawn(async move {
                            let _ = deps.acquire(&run, &key, |_| {}).await;
                        });
                    }
                }
                self.runs.insert(
                    uuid.clone(),
                    Run {
                        state,
                        prepare: None,
                        upload: None,
                        monitor: None,
                        reported: None,
                    },
                );
                self.last_busy = Instant::now();
                for e in effects {
                    self.execute(&uuid, e);
                }
            }
            self.report_wanted = !self.runs.is_empty();
        }
        match self.runtime.list_own(&self.cfg.worker_id).await {
            Ok(list) => {
                for own in list {
                    if keep.contains(&own.uuid) {
                        continue;
                    }
                    tracing::warn!(
                        "removing container of run {}, which this worker no longer runs",
                        own.uuid
                    );
                    if let Err(e) = self.runtime.remove(&own.uuid).await {
                        tracing::warn!("cannot remove container {}: {e}", own.id);
                    }
                }
            }
            Err(e) => tracing::warn!("cannot list this worker's containers: {e}"),
        }
        self.persist();
    }

    fn execute(&mut self, uuid: &str, effect: Effect) {
        let Some(run) = self.runs.get_mut(uuid) else {
            return;
        };
        let tx = self.tx.clone();
        let send = {
            let uuid = uuid.to_owned();
            move |e: Event| {
                let _ = tx.send(Msg::Run(uuid.clone(), e));
            }
        };
        match effect {
            Effect::CheckinSoon => {
                // A run that finished (`finalizing`) or was handed back (`staged`) is reported at
                // once: the server acts on it. `running` waits for the next regular checkin, so
                // that a short run's `finalizing` is not held behind a long-poll.
                let state = run.state.stage.server_state();
                if run.reported != Some(state) && matches!(state, "finalizing" | "staged") {
                    self.report_wanted = true;
                }
            }
            Effect::Prepare => {
                let cancel = CancellationToken::new();
                run.prepare = Some(cancel.clone());
                let ctx = PrepareCtx {
                    cfg: self.cfg.clone(),
                    runtime: self.runtime.clone(),
                    deps: self.deps.clone(),
                    pool: self.resources.clone(),
                    bundle: run.state.bundle.clone(),
                    resources: run.state.resources.clone(),
                    bundle_path: run.state.bundle_path.clone(),
                };
                tokio::spawn(async move {
                    let event = tokio::select! {
                        _ = cancel.cancelled() => Event::PrepareFailed("Preparation stopped.".into()),
                        e = ctx.run(&send) => e,
                    };
                    send(event);
                });
            }
            Effect::CancelPrepare => {
                if let Some(c) = &run.prepare {
                    c.cancel();
                }
            }
            Effect::Monitor => {
                let Some(id) = run.state.container_id.clone() else {
                    return;
                };
                let runtime = self.runtime.clone();
                let path = run.state.bundle_path.clone();
                let h = tokio::spawn(monitor(runtime, id, path, send));
                run.monitor = Some(h.abort_handle());
            }
            Effect::KillContainer => {
                let runtime = self.runtime.clone();
                let uuid = uuid.to_owned();
                tokio::spawn(async move {
                    if let Err(e) = runtime.kill(&uuid).await {
                        tracing::warn!("cannot kill the container of {uuid}: {e}");
                    }
                });
            }
            Effect::CleanUp => {
                if let Some(m) = run.monitor.take() {
                    m.abort();
                }
                let runtime = self.runtime.clone();
                let deps = self.deps.clone();
                let keys: Vec<DepKey> = run
                    .state
                    .bundle
                    .dependencies
                    .iter()
                    .map(|d| (d.parent_uuid.clone(), d.parent_path.clone()))
                    .collect();
                let paths = run.state.paths_to_remove.clone();
                let uuid = uuid.to_owned();
                let resources = self.resources.clone();
                let image = normalize_image(&default_image(&run.state.resources));
                // The container started: the run holds its image until now.
                let pinned = run.state.has_contents;
                tokio::spawn(async move {
                    // Keep trying: a container that cannot be removed would keep running.
                    let mut delay = Duration::from_secs(1);
                    while let Err(e) = runtime.remove(&uuid).await {
                        tracing::warn!("cannot remove the container of {uuid}, retrying: {e}");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(30));
                    }
                    resources.release(&uuid);
                    if pinned {
                        runtime.unpin_image(&image);
                    }
                    runtime.clean_images().await;
                    for k in &keys {
                        deps.release(&uuid, k);
                    }
                    let _ = tokio::task::spawn_blocking(move || {
                        for p in paths {
                            remove_any(&p);
                        }
                    })
                    .await;
                    send(Event::CleanedUp);
                });
            }
            Effect::Upload => {
                let cancel = CancellationToken::new();
                run.upload = Some(cancel.clone());
                let client = self.client.clone();
                let bundle = run.state.bundle.clone();
                let path = run.state.bundle_path.clone();
                let shared = self.cfg.shared_file_system;
                tokio::spawn(async move {
                    let work = async {
                        if shared {
                            // Results are already in the bundle store; only apply excludes.
                            let ex = Excludes::new(&bundle.exclude_patterns());
                            let p = path.clone();
                            tokio::task::spawn_blocking(move || delete_excluded(&p, &ex))
                                .await
                                .map_err(|e| e.to_string())
                                .and_then(|r| r)
                        } else {
                            upload_results(&client, &bundle, &path, &send).await
                        }
                    };
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        r = work => send(Event::UploadFinished(r)),
                    }
                });
            }
            Effect::CancelUpload => {
                if let Some(c) = &run.upload {
                    c.cancel();
                }
            }
            Effect::DeleteLocalData => {
                let path = run.state.bundle_path.clone();
                let shared = self.cfg.shared_file_system;
                self.runs.remove(uuid);
                self.persist();
                self.last_busy = Instant::now();
                if !shared {
                    tokio::task::spawn_blocking(move || remove_any(&path));
                }
            }
        }
    }
}

fn tx_nudge(tx: mpsc::UnboundedSender<Msg>) -> impl Fn() + Send + Sync + 'static {
    move || {
        let _ = tx.send(Msg::Nudge);
    }
}

async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => futures::future::pending().await,
    }
}

fn truncate_json(v: &serde_json::Value) -> String {
    let s = v.to_string();
    if s.len() > 300 {
        format!("{}…", &s[..s.floor_char_boundary(300)])
    } else {
        s
    }
}

fn remove_any(p: &Path) {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    };
    if let Err(e) = r {
        tracing::warn!("cannot remove {}: {e}", p.display());
    }
}

/// Free bytes available to this user on the work dir's file system (0 if unknown: the server
/// cannot handle null).
pub fn free_disk_bytes(path: &Path) -> u64 {
    nix::sys::statvfs::statvfs(path)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

struct PrepareCtx<R: BundleRuntime> {
    cfg: Arc<AgentConfig>,
    runtime: R,
    deps: Arc<Dependencies>,
    pool: CpuGpuPool,
    bundle: BundleInfo,
    resources: RunResources,
    bundle_path: PathBuf,
}

/// Unpins an image when dropped, unless [`PinGuard::keep`] hands the pin to the run.
struct PinGuard<R: BundleRuntime> {
    runtime: R,
    image: String,
    armed: bool,
}

impl<R: BundleRuntime> PinGuard<R> {
    fn keep(mut self) {
        self.armed = false;
    }
}

impl<R: BundleRuntime> Drop for PinGuard<R> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.unpin_image(&self.image);
        }
    }
}

/// The image a run names, or CodaLab's default CPU or GPU image when it names none.
fn default_image(r: &RunResources) -> String {
    match r.docker_image.trim() {
        "" if r.gpus > 0 => "codalab/default-gpu:latest".into(),
        "" => "codalab/default-cpu:latest".into(),
        image => image.to_owned(),
    }
}

/// The worker's CPUs and GPUs, shared by the event loop and preparation tasks.
#[derive(Clone)]
pub struct CpuGpuPool {
    alloc: Arc<std::sync::Mutex<Allocator>>,
    freed: Arc<tokio::sync::Notify>,
}

impl CpuGpuPool {
    pub fn new(a: Allocator) -> Self {
        CpuGpuPool {
            alloc: Arc::new(std::sync::Mutex::new(a)),
            freed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Waits until `req` (cpus, gpus) can be assigned to `run` without sharing.
    async fn acquire(
        &self,
        run: &str,
        req: (u64, u64),
        status: impl Fn(String),
    ) -> Result<Assignment, String> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let grant = self.alloc.lock().unwrap().request(run, req.0, req.1);
            match grant {
                Grant::Assigned(a) => return Ok(a),
                Grant::Impossible(msg) => return Err(msg),
                Grant::Wait {
                    free_cpus,
                    free_gpus,
                } => {
                    status(format!(
                        "Waiting for resources: {} CPUs and {} GPUs requested, {free_cpus} CPUs and \
                         {free_gpus} GPUs free.",
                        req.0.max(1),
                        req.1
                    ));
                    freed.await;
                }
            }
        }
    }

    pub fn restore(&self, run: &str, a: Assignment) {
        self.alloc.lock().unwrap().restore(run, a);
    }

    pub fn release(&self, run: &str) {
        if self.alloc.lock().unwrap().release(run) {
            self.freed.notify_waiters();
        }
    }
}

impl<R: BundleRuntime> PrepareCtx<R> {
    fn resources_req(&self) -> (u64, u64) {
        (self.resources.cpus, self.resources.gpus)
    }

    /// Dependencies, image, bundle dir, links, container. Returns `ContainerStarted` or
    /// `PrepareFailed`.
    async fn run(self, send: &(impl Fn(Event) + Clone + Send + Sync + 'static)) -> Event {
        let uuid = self.bundle.uuid.clone();
        if let Err(e) = tokio::fs::create_dir_all(&self.bundle_path).await {
            return Event::PrepareFailed(format!(
                "Cannot create bundle directory {}: {e}",
                self.bundle_path.display()
            ));
        }
        // Dependencies (all at once), unless the bundle store is shared.
        let mut dep_paths = Vec::new();
        if !self.cfg.shared_file_system {
            let waits = self.bundle.dependencies.iter().map(|d| {
                let deps = self.deps.clone();
                let key = (d.parent_uuid.clone(), d.parent_path.clone());
                let child = d.child_path.clone();
                let uuid = uuid.clone();
                let send = send.clone();
                async move {
                    let path = deps
                        .acquire(&uuid, &key, |status| {
                            send(Event::Status(format!("{status} ({child})")))
                        })
                        .await
                        .map_err(|e| format!("Failed to download dependency {child}: {e}"))?;
                    Ok::<_, String>((child, path))
                }
            });
            for r in futures::future::join_all(waits).await {
                match r {
                    Ok(p) => dep_paths.push(p),
                    Err(e) => return Event::PrepareFailed(e),
                }
            }
        }
        let image = normalize_image(&default_image(&self.resources));
        // Unpins the image if preparation fails or is cancelled from here on.
        let mut pin: Option<PinGuard<R>> = None;
        let digest = {
            let send = send.clone();
            match self
                .runtime
                .ensure_image(&image, |s| send(Event::Status(s)))
                .await
                .inspect(|_| {
                    pin = Some(PinGuard {
                        runtime: self.runtime.clone(),
                        image: image.clone(),
                        armed: true,
                    });
                }) {
                Ok(d) => d,
                Err(e) => {
                    return Event::PrepareFailed(format!("Failed to download Docker image: {e}"))
                }
            }
        };
        // Dependency mounts and the links that make them visible inside the bundle dir.
        let mut binds = Vec::new();
        let mut links = Vec::new();
        if self.cfg.shared_file_system {
            for d in &self.bundle.dependencies {
                if let Some(loc) = &d.location {
                    binds.push(Mount {
                        host: Path::new(loc).join(&d.parent_path),
                        container: format!("/{uuid}/{}", d.child_path),
                        read_only: true,
                    });
                }
            }
        } else {
            for (child, host) in &dep_paths {
                match self.link_dependency(child, host, &mut binds, &mut links) {
                    Ok(()) => {}
                    Err(e) => {
                        send(Event::Mounted(links));
                        return Event::PrepareFailed(format!(
                            "Cannot link dependency {child}: {e}"
                        ));
                    }
                }
            }
        }
        send(Event::Mounted(links));
        let user = match std::fs::metadata(&self.bundle_path) {
            Ok(m) => format!("{}:{}", m.uid(), m.gid()),
            Err(e) => return Event::PrepareFailed(format!("Cannot read bundle directory: {e}")),
        };
        if let Err(e) = self.runtime.prepare().await {
            return Event::PrepareFailed(format!("Cannot start Docker container: {e}"));
        }
        // CPUs and GPUs of its own: wait for them rather than share.
        let assigned = match self
            .pool
            .acquire(&uuid, self.resources_req(), |s| send(Event::Status(s)))
            .await
        {
            Ok(a) => a,
            Err(e) => return Event::PrepareFailed(e),
        };
        let spec = RunSpec {
            uuid: uuid.clone(),
            command: self.bundle.command.clone(),
            image: image.clone(),
            bundle_path: self.bundle_path.clone(),
            mounts: binds,
            user,
            memory_bytes: self.resources.memory,
            cpuset: assigned.cpus,
            gpu_uuids: assigned.gpus,
            shm_size_bytes: self.cfg.shm_size_bytes,
            network: self.resources.network.unwrap_or(true),
            worker_id: self.cfg.worker_id.clone(),
            pids_limit: self.cfg.pids_limit,
        };
        send(Event::Status("Starting Docker container.".into()));
        match self.runtime.start(&spec).await {
            Ok(id) => {
                // The run holds the image now; clean-up unpins it.
                if let Some(p) = pin.take() {
                    p.keep();
                }
                Event::ContainerStarted {
                    container_id: id,
                    docker_image: digest,
                    cpuset: spec.cpuset,
                    gpuset: spec.gpu_uuids,
                }
            }
            Err(e) => Event::PrepareFailed(format!("Cannot start Docker container: {e}")),
        }
    }

    /// Mounts a dependency read-only at `/<uuid>_dependencies/<child>` and links
    /// `<bundle>/<child>` to it (per top-level entry when `child` is `.`).
    fn link_dependency(
        &self,
        child: &str,
        host: &Path,
        binds: &mut Vec<Mount>,
        links: &mut Vec<PathBuf>,
    ) -> std::io::Result<()> {
        let uuid = &self.bundle.uuid;
        let Some(child_rel) = archive::normalize_relative(Path::new(child)) else {
            return Err(std::io::Error::other(format!("bad child path {child:?}")));
        };
        let mut pairs = Vec::new();
        if child_rel.as_os_str().is_empty() {
            for e in std::fs::read_dir(host)? {
                let name = e?.file_name();
                pairs.push((PathBuf::from(&name), host.join(&name)));
            }
        } else {
            pairs.push((child_rel, host.to_owned()));
        }
        for (rel, source) in pairs {
            let docker_path = format!("/{uuid}_dependencies/{}", rel.display());
            let link = self.bundle_path.join(&rel);
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent)?;
            }
            if let Some(first) = rel.components().next() {
                let p = self.bundle_path.join(first);
                if !links.contains(&p) {
                    links.push(p);
                }
            }
            remove_any(&link);
            std::os::unix::fs::symlink(&docker_path, &link)?;
            binds.push(Mount {
                host: source,
                container: docker_path,
                read_only: true,
            });
        }
        Ok(())
    }
}

/// Watches a running container: reports its exit as soon as it happens, and stats every 2 s.
async fn monitor<R: BundleRuntime>(
    runtime: R,
    id: String,
    bundle_path: PathBuf,
    send: impl Fn(Event) + Send + Sync + 'static,
) {
    let mut wait = Box::pin(runtime.wait(&id));
    let mut prev: Option<Sample> = None;
    let mut next_disk = Instant::now();
    let mut started_at: Option<f64> = None;
    let mut ticker = tokio::time::interval(Duration::from_secs(2));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut wait => {
                // Exited (or the wait broke): read the final state.
                for attempt in 0..5 {
                    match runtime.inspect(&id).await {
                        Ok(Some(st)) if !st.running => {
                            let total = match (st.started_at, st.finished_at) {
                                (Some(s), Some(f)) => (f - s).max(0.0),
                                _ => 0.0,
                            };
                            send(Event::Stats(Stats { time_total: total, ..last_stats(prev) }));
                            send(Event::ContainerExited {
                                exitcode: st.exit_code,
                                oom_killed: st.oom_killed,
                                failure: None,
                            });
                            return;
                        }
                        Ok(Some(_)) => break, // still running: the wait stream broke; go on
                        Ok(None) => {
                            send(Event::ContainerExited {
                                exitcode: None,
                                oom_killed: false,
                                failure: Some("Docker container not found".into()),
                            });
                            return;
                        }
                        Err(e) => {
                            tracing::warn!("cannot inspect container {id} (attempt {attempt}): {e}");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
                wait = Box::pin(runtime.wait(&id));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            _ = ticker.tick() => {
                if started_at.is_none() {
                    started_at = runtime.inspect(&id).await.ok().flatten().and_then(|s| s.started_at);
                }
                let sample = match runtime.sample(&id).await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!("no stats for {id}: {e}");
                        continue;
                    }
                };
                let mut stats = stats_from(prev, sample);
                prev = Some(sample);
                stats.time_total = started_at.map(|s| (now_unix() - s).max(0.0)).unwrap_or(0.0);
                if Instant::now() >= next_disk {
                    let p = bundle_path.clone();
                    let t0 = Instant::now();
                    if let Ok(Ok(n)) = tokio::task::spawn_blocking(move || archive::path_size(&p)).await {
                        stats.disk_bytes = Some(n);
                    }
                    // Big trees are measured less often.
                    next_disk = Instant::now() + (t0.elapsed() * 10).max(Duration::from_secs(1));
                }
                send(Event::Stats(stats));
            }
        }
    }
}

fn last_stats(prev: Option<Sample>) -> Stats {
    prev.map(|s| stats_from(None, s)).unwrap_or_default()
}

/// CPU share (× number of CPUs) and memory fraction from two samples, CPU times in seconds.
pub fn stats_from(prev: Option<Sample>, cur: Sample) -> Stats {
    let cpu_usage = match prev {
        Some(p) if cur.system_ns > p.system_ns => {
            let d_cpu = cur.cpu_total_ns.saturating_sub(p.cpu_total_ns) as f64;
            let d_sys = (cur.system_ns - p.system_ns) as f64;
            d_cpu / d_sys * f64::from(cur.online_cpus.max(1))
        }
        _ => 0.0,
    };
    Stats {
        time_total: 0.0,
        time_user: cur.cpu_user_ns as f64 / 1e9,
        time_system: cur.cpu_system_ns as f64 / 1e9,
        cpu_usage,
        memory_usage: if cur.memory_limit > 0 {
            cur.memory_bytes as f64 / cur.memory_limit as f64
        } else {
            0.0
        },
        memory_bytes: cur.memory_bytes,
        disk_bytes: None,
    }
}

fn delete_excluded(root: &Path, ex: &Excludes) -> Result<(), String> {
    fn walk(root: &Path, rel: &Path, ex: &Excludes) -> std::io::Result<()> {
        for e in std::fs::read_dir(root.join(rel))? {
            let e = e?;
            let child = rel.join(e.file_name());
            let full = root.join(&child);
            if ex.matches(&child) {
                remove_any(&full);
            } else if e.file_type()?.is_dir() {
                walk(root, &child, ex)?;
            }
        }
        Ok(())
    }
    walk(root, Path::new(""), ex).map_err(|e| e.to_string())
}

/// Streams a tar.gz of the bundle dir to the server, retrying on network errors and 5xx with
/// exponential backoff (up to about 6 hours, like the Python worker's 720 × 30 s).
async fn upload_results(
    client: &RestClient,
    bundle: &BundleInfo,
    path: &Path,
    send: &(impl Fn(Event) + Send + Sync),
) -> Result<(), String> {
    let excludes = Arc::new(Excludes::new(&bundle.exclude_patterns()));
    let store = bundle.store();
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(60))
        .with_max_times(400)
        .with_jitter();
    let attempt = || async {
        let (btx, brx) = mpsc::channel::<std::io::Result<bytes::Bytes>>(16);
        let sent = Arc::new(AtomicU64::new(0));
        let writer = ChannelWriter::new(btx, sent.clone());
        let root = path.to_owned();
        let ex = excludes.clone();
        let archiver = tokio::task::spawn_blocking(move || {
            let mut w = writer;
            match archive::write_tar_gz(&root, &ex, &mut w) {
                Ok(w) => {
                    let _ = std::io::Write::flush(w);
                }
                Err(e) => {
                    tracing::warn!("cannot archive {}: {e}", root.display());
                    w.fail(e);
                }
            }
        });
        let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(brx));
        let upload = client.upload_bundle_contents(&bundle.uuid, &store, body);
        tokio::pin!(upload);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let result = loop {
            tokio::select! {
                r = &mut upload => break r,
                _ = tick.tick() => send(Event::Status(format!(
                    "Uploading results: {} uploaded (archived size).",
                    size_str(sent.load(Ordering::Relaxed) as f64)
                ))),
            }
        };
        archiver.abort();
        result
    };
    attempt
        .retry(backoff)
        .when(|e: &protocol::Error| e.is_retryable())
        .notify(|e, d| {
            tracing::warn!(
                "upload of {} failed, retrying in {:.0}s: {e}",
                bundle.uuid,
                d.as_secs_f64()
            )
        })
        .await
        .map_err(|e| e.to_string())
}

/// SIGTERM, SIGINT and SIGHUP.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }

    async fn recv(&mut self) -> &'static str {
        async fn one(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => futures::future::pending().await,
            }
        }
        tokio::select! {
            _ = one(&mut self.term) => "SIGTERM",
            _ = one(&mut self.int) => "SIGINT",
            _ = one(&mut self.hup) => "SIGHUP",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_fractions() {
        let a = Sample {
            cpu_total_ns: 1_000_000_000,
            system_ns: 10_000_000_000,
            online_cpus: 2,
            ..Default::default()
        };
        let b = Sample {
            cpu_total_ns: 2_000_000_000,
            cpu_user_ns: 1_500_000_000,
            cpu_system_ns: 500_000_000,
            system_ns: 14_000_000_000,
            online_cpus: 2,
            memory_bytes: 50,
            memory_limit: 200,
        };
        let s = stats_from(Some(a), b);
        assert!((s.cpu_usage - 0.5).abs() < 1e-9);
        assert_eq!((s.time_user, s.time_system), (1.5, 0.5));
        assert_eq!(s.memory_usage, 0.25);
        assert_eq!(stats_from(None, b).cpu_usage, 0.0);
    }

    #[test]
    fn free_disk_is_a_number() {
        assert!(free_disk_bytes(Path::new("/")) > 0);
        assert_eq!(free_disk_bytes(Path::new("/nonexistent/x")), 0);
    }
}
