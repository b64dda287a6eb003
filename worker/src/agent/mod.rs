//! The worker's event loop: checkins, server messages, and the tasks that carry out the run
//! state machine's effects. One task owns all state; everything else reports back through a
//! channel, so there are no locks around run state and no polling loops.

mod checkin;
mod messages;
mod resume;
mod signals;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::{BundleInfo, MalformedMessage, RestClient, RunResources, ServerMessage};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::signals::Signals;
use crate::archive::Excludes;
// The loop's settings live with the rest of the typed configuration (the run preparation reads
// them too); re-exported here, where the loop's users look.
pub use crate::config::AgentConfig;
use crate::deps::Dependencies;
use crate::metrics::{self, Metrics};
use crate::persist;
use crate::resources::Allocator;
use crate::run::cleanup::{clean_up, Held};
use crate::run::discard_path;
use crate::run::monitor::monitor;
use crate::run::pool::CpuGpuPool;
use crate::run::prepare::{default_image, PrepareCtx};
use crate::run::state::{now_unix, step, Effect, Event, RunState, Stage};
use crate::run::upload::{delete_excluded, upload_results};
use crate::runtime::{normalize_image, BundleRuntime};

/// Threads compressing a results archive at most.
const MAX_COMPRESSION_THREADS: usize = 4;

/// How long an exiting worker waits for the containers of finished runs to be removed.
const BACKGROUND_GRACE: Duration = Duration::from_secs(60);

/// The name of a run's directory under the runs dir: the bundle's uuid and this worker's id.
/// Workers may share a work dir (Azure Batch pools, Kubernetes nodes, a site's NFS), and a
/// bundle handed back by one worker may start on another at once: each attempt has a directory
/// of its own, so that the first worker's clean-up never removes the second one's files.
pub fn run_dir_name(uuid: &str, worker_id: &str) -> String {
    let id: String = worker_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    format!("{uuid}.{id}")
}

/// Why the worker stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    Idle,
    NumRuns,
    Signal,
    /// The cloud gave notice of a reclaim (`--preemption-notice`): the runs were handed back.
    Reclaimed,
    /// The cloud recommended leaving the machine: the runs it had ended, no new ones taken.
    Drained,
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
    Notice(crate::notice::Notice),
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
    metrics: Arc<Metrics>,
    pool: CpuGpuPool,
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
    /// The last checkin brought a message: the server hands out one message per checkin (the
    /// bundle manager's `mark_finalized` of many finished runs among them), so the next one
    /// goes at once ([`checkin::MESSAGE_FOLLOW_UP`] after the last one's start at the soonest).
    messages_pending: bool,
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
    /// Runs are being handed back; the worker gives up waiting for the server at this time.
    handback_deadline: Option<tokio::time::Instant>,
    /// A notice of a coming reclaim arrived: runs handed back (as with
    /// `--pass-down-termination`), then exit.
    reclaimed: bool,
    /// A rebalance recommendation arrived: no new runs; exit once those it has are done.
    draining: bool,
    shutdown: CancellationToken,
    /// Container removals that go on after their runs moved on (`clean_up`): the worker waits
    /// for them before it exits.
    background: TaskTracker,
}

impl<R: BundleRuntime> Worker<R> {
    pub fn new(
        cfg: AgentConfig,
        client: RestClient,
        runtime: R,
        deps: Arc<Dependencies>,
        shutdown: CancellationToken,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let pool = CpuGpuPool::new(Allocator::new(cfg.cpuset.clone(), cfg.gpuset.clone()));
        let state_file = persist::Writer::spawn(persist::state_path(&cfg.work_dir, &cfg.worker_id));
        Worker {
            cfg: Arc::new(cfg),
            client,
            runtime,
            deps,
            metrics,
            pool,
            state_file,
            runs: BTreeMap::new(),
            tx,
            rx,
            num_runs: 0,
            starting: HashSet::new(),
            report_wanted: false,
            nudged: false,
            messages_pending: false,
            checkin_in_flight: false,
            last_checkin_start: None,
            last_checkin_end: None,
            last_checkin_ok: false,
            checkin_failures: 0,
            last_busy: Instant::now(),
            terminating: false,
            restaging: false,
            handback_deadline: None,
            reclaimed: false,
            draining: false,
            shutdown,
            background: TaskTracker::new(),
        }
    }

    /// Runs until a signal, idleness or the run limit ends the worker.
    pub async fn run(mut self) -> ExitReason {
        let reason = self.run_loop().await;
        // The containers of runs that already moved on are removed before the worker goes.
        self.background.close();
        if tokio::time::timeout(BACKGROUND_GRACE, self.background.wait())
            .await
            .is_err()
        {
            tracing::warn!("exiting with containers still being removed");
        }
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
        if let Some(w) = self.cfg.preemption_notice.clone() {
            let tx = self.tx.clone();
            let stop = self.shutdown.clone();
            tokio::spawn(crate::notice::watch(
                w,
                move |n| {
                    let _ = tx.send(Msg::Notice(n));
                },
                stop,
            ));
        }
        if !self.cfg.prefetch.is_empty() {
            tokio::spawn(crate::prefetch::fetch(
                self.cfg.prefetch.clone(),
                self.runtime.clone(),
                self.deps.clone(),
                self.metrics.clone(),
                self.shutdown.clone(),
            ));
        }
        let mut signals = Signals::new();
        loop {
            if let Some(reason) = self.exit_reason() {
                tracing::info!("worker exiting: {reason:?}");
                self.shutdown.cancel();
                return reason;
            }
            if let Some(d) = self.handback_deadline {
                if tokio::time::Instant::now() >= d {
                    tracing::warn!("gave up waiting for runs to be handed back; exiting");
                    self.shutdown.cancel();
                    return if self.reclaimed {
                        ExitReason::Reclaimed
                    } else {
                        ExitReason::Signal
                    };
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
                        self.hand_back_all();
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1)), if self.handback_deadline.is_some() => {}
            }
        }
    }

    fn exit_reason(&self) -> Option<ExitReason> {
        let active = !self.runs.is_empty() || !self.starting.is_empty();
        let told_server = !self.checkin_in_flight && self.last_checkin_ok;
        if self.reclaimed {
            return (!active && told_server).then_some(ExitReason::Reclaimed);
        }
        if self.terminating {
            if !self.cfg.pass_down_termination {
                // Runs keep going in their containers, as the Python worker does.
                return Some(ExitReason::Signal);
            }
            if !active && told_server {
                return Some(ExitReason::Signal);
            }
            return None;
        }
        if active {
            return None;
        }
        if self.draining && told_server {
            return Some(ExitReason::Drained);
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

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Run(uuid, event) => self.apply(&uuid, event),
            Msg::Notice(n) => self.on_notice(n),
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
                        self.messages_pending = !messages.is_empty();
                        // Restaged runs were reported as staged: the server has them back.
                        for uuid in reported {
                            if let Some(r) = self.runs.get(&uuid) {
                                if r.state.stage == Stage::Restaged {
                                    // Its dir stays, as CodaLab leaves it: a later attempt
                                    // on this work dir resumes from its checkpoints.
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
                        self.metrics.checkin_failures.inc();
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
            _ => self
                .cfg
                .runs_dir()
                .join(run_dir_name(&bundle.uuid, &self.cfg.worker_id)),
        }
    }

    /// Hands every run back to the server (staged) and gives the server two minutes to take
    /// them before the worker exits anyway.
    fn hand_back_all(&mut self) {
        self.restage_all();
        self.handback_deadline
            .get_or_insert(tokio::time::Instant::now() + Duration::from_secs(120));
    }

    /// A cloud's notice: a reclaim hands the runs back now (whatever `--pass-down-termination`
    /// says: the machine and its containers are going); a rebalance recommendation stops new
    /// runs. Either way the next checkin says the worker is terminating.
    fn on_notice(&mut self, n: crate::notice::Notice) {
        use crate::notice::Kind;
        self.report_wanted = true;
        match n.kind {
            Kind::Reclaim => {
                tracing::warn!(
                    "{}: {}; handing {} run(s) back to the server",
                    n.cloud,
                    n.detail,
                    self.runs.len()
                );
                self.metrics.reclaim_notices.inc();
                self.reclaimed = true;
                self.terminating = true;
                self.hand_back_all();
            }
            Kind::Rebalance => {
                tracing::warn!(
                    "{}: {}; taking no new runs, exiting after the {} it has",
                    n.cloud,
                    n.detail,
                    self.runs.len()
                );
                self.draining = true;
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
            // A run ends once: when it reaches `finalizing` or is handed back.
            if matches!(run.state.stage, Stage::Finalizing | Stage::Restaged) {
                if let Some(o) = metrics::outcome(&run.state) {
                    self.metrics.run_ended(o);
                }
            }
        }
        for effect in effects {
            self.execute(uuid, effect);
        }
        if changed {
            self.persist();
        }
    }

    /// Saves the runs (in the background; the latest snapshot wins) and updates the runs-by-stage
    /// gauge: called on every change of the runs.
    fn persist(&self) {
        self.metrics
            .set_runs(self.runs.values().map(|r| &r.state.stage));
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
                    pool: self.pool.clone(),
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
                let held = Held {
                    runtime: self.runtime.clone(),
                    pool: self.pool.clone(),
                    deps: self.deps.clone(),
                    uuid: uuid.to_owned(),
                    // The container started: the run holds its image until now.
                    image: run
                        .state
                        .has_contents
                        .then(|| normalize_image(&default_image(&run.state.resources))),
                    dependencies: run
                        .state
                        .bundle
                        .dependencies
                        .iter()
                        .map(crate::deps::dep_key)
                        .collect(),
                    paths: run.state.paths_to_remove.clone(),
                    // A run handed back leaves no container behind before it is reported.
                    container_first: run.state.is_restaged,
                };
                self.background.spawn(clean_up(held, send));
            }
            Effect::Upload => {
                if run.state.reuploads > 0 {
                    tracing::info!(
                        "{uuid}: uploading the results again (upload {}): a write came after \
                         the upload began, before the server finalized the bundle",
                        run.state.reuploads + 1
                    );
                }
                let cancel = CancellationToken::new();
                run.upload = Some(cancel.clone());
                let client = self.client.clone();
                let bundle = run.state.bundle.clone();
                let path = run.state.bundle_path.clone();
                let shared = self.cfg.shared_file_system;
                let metrics = self.metrics.clone();
                // The archive is compressed on the cores the worker may use (at most 4).
                let threads = self.cfg.cpuset.len().clamp(1, MAX_COMPRESSION_THREADS);
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
                            upload_results(&client, &bundle, &path, &metrics, &send, threads).await
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
                    discard_path(&path);
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
