//! The control loop around the pure policy: observe (staged bundles, free capacity of checked-in
//! workers, the backend's jobs) → [`plan`] → submit and cancel. Thin I/O, no decisions of its own.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use backends::{Backend, JobSpec, JobStatus, WorkerProfile};
use futures::StreamExt;
use protocol::{Bundle, RestClient};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::metrics::{FailedLaunchLabels, Metrics, ShapeLabels};
use crate::policy::{self, Action, Config, Job, Observation, Plan, PolicyState, Resources};
use crate::policy::{Shape, StagedBundle};
use crate::settings::Settings;
use crate::status::{BreakerStatus, Health, Journal, Sample, Status};

/// Submissions in flight at once within one tick.
pub const SUBMIT_CONCURRENCY: usize = 8;
/// Page size of the staged-bundle search.
pub const SEARCH_PAGE: usize = 100;

/// Why [`Manager::run`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// SIGTERM/SIGINT, or `--once` done.
    Stopped,
    /// `--restart-after-seconds` passed: the caller re-executes the program.
    Restart,
    /// More worker jobs failed than `--exit-after-num-failed` allows.
    TooManyFailures(String),
}

/// One manager: a server client, a backend, the policy and its state.
pub struct Manager<B: Backend> {
    pub client: RestClient,
    pub backend: B,
    /// How the backend's workers are started.
    pub profile: WorkerProfile,
    pub config: Config,
    pub state: PolicyState,
    pub settings: Settings,
    pub keywords: Vec<String>,
    pub metrics: Arc<Metrics>,
    /// `--exit-after-num-failed`.
    pub exit_after_num_failed: Option<u32>,
    /// What the listings so far said about this manager's jobs.
    pub book: JobBook,
    last_reasons: Vec<String>,
    /// The backend's pool at the last tick (backends that report one).
    pool: Option<backends::PoolStatus>,
    /// Recent decisions, the last hour of samples, workers lost before check-in (`/status`).
    pub journal: Journal,
    /// The last plan made (kept while the server cannot be read).
    last_plan: Option<Plan>,
    /// Why the staged bundles could not be read at the last tick.
    server_error: Option<String>,
    /// Why the backend's pool could not be read at the last tick.
    pool_error: Option<String>,
    /// Workers launched in this tick.
    launched: u32,
    /// What new workers are told to fetch as they start (`--no-worker-prefetch` switches it off).
    prefetch: prefetch::Book,
    /// With `--lease`: asked before each tick and each launch or cancel; only the holder acts.
    pub lease: Option<crate::lease::Gate>,
}

fn meta_u32(b: &Bundle, key: &str, default: u32) -> u32 {
    match b.metadata(key) {
        Some(Value::Number(n)) => n.as_u64().map_or(default, |n| n as u32),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(default),
        _ => default,
    }
}

/// A staged bundle's request, with the server's defaults (1 CPU, 0 GPUs, 2 GiB).
pub fn staged_bundle(b: &Bundle) -> StagedBundle {
    let memory = b
        .metadata("request_memory")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .and_then(|s| protocol::parse_size(s).ok())
        .unwrap_or(2 << 30);
    let mut sb = StagedBundle::new(
        b.uuid.clone(),
        meta_u32(b, "request_cpus", 1).max(1),
        meta_u32(b, "request_gpus", 0),
        memory,
    );
    if let Some(q) = b
        .metadata("request_queue")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
    {
        sb = sb.with_queue(q);
    }
    sb.needs = needs(b);
    sb
}

/// The image a staged bundle asks for and its dependencies, as the bundle search gives them
/// (`metadata.request_docker_image`, `dependencies[].parent_uuid`/`parent_path`).
fn needs(b: &Bundle) -> crate::policy::Needs {
    let image = b
        .metadata("request_docker_image")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let dependencies = b
        .attributes
        .get("dependencies")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| {
            let uuid = d.get("parent_uuid")?.as_str()?;
            let path = d.get("parent_path").and_then(Value::as_str).unwrap_or("");
            Some((uuid.to_owned(), path.to_owned()))
        })
        .collect();
    crate::policy::Needs {
        image,
        dependencies,
    }
}

use common::now_unix as now;

/// A random 16-hex-digit worker id (the worker's `--id` is `host-<id>`, as Python's).
pub fn new_worker_id() -> String {
    let mut bytes = [0u8; 8];
    // Never a silent all-zero id: two workers with one id would share runs on the server.
    getrandom::getrandom(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl<B: Backend> Manager<B> {
    pub fn new(
        client: RestClient,
        backend: B,
        profile: WorkerProfile,
        config: Config,
        settings: Settings,
        keywords: Vec<String>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let state = PolicyState::new(&config);
        Manager {
            client,
            backend,
            profile,
            config,
            state,
            settings,
            keywords,
            metrics,
            exit_after_num_failed: None,
            book: JobBook::default(),
            last_reasons: Vec::new(),
            pool: None,
            journal: Journal::default(),
            last_plan: None,
            server_error: None,
            pool_error: None,
            launched: 0,
            prefetch: prefetch::Book::default(),
            lease: None,
        }
    }

    /// Observes and plans; `None` when the staged bundles could not be read (then nothing is
    /// launched or cancelled this tick: an unknown queue is not an empty one).
    pub async fn observe_and_plan(&mut self) -> Option<Plan> {
        let first = match self
            .client
            .search_bundles_page(&self.keywords, SEARCH_PAGE, 0)
            .await
        {
            Ok(list) => list,
            Err(e) => return self.server_unreadable(&e),
        };
        let mut staged = first.iter().map(staged_bundle).collect::<Vec<_>>();
        let listed = self.backend.list().await;
        self.observe_pool().await;
        let seen = free_capacity(&self.client, std::slice::from_ref(&listed)).await;
        seen.drop_taken(&mut staged);
        let jobs = self.absorb_listing(listed, &seen.free);
        // A full first page: more may be staged. They are read only if the plan can use them.
        let mut staged_unread = 0;
        if first.len() == SEARCH_PAGE {
            match self.rest_of_staged(&mut staged, &jobs).await {
                Ok(unread) => staged_unread = unread,
                Err(e) => return self.server_unreadable(&e),
            }
        }
        self.server_error = None;
        Some(self.plan_with(staged, jobs, staged_unread))
    }

    /// Takes one listing of the backend's jobs (with the free capacity of the checked-in
    /// workers) into the book and the policy state; the jobs as the policy sees them, or why
    /// they are unknown.
    pub fn absorb_listing(
        &mut self,
        listed: Result<Vec<JobStatus>, backends::BackendError>,
        free: &HashMap<String, Resources>,
    ) -> Result<Vec<Job>, String> {
        match listed {
            Ok(list) => {
                let absorbed = self.book.absorb(list, free);
                if absorbed.checked_in {
                    policy::record_checkin(&mut self.state);
                }
                for (shape, reason) in absorbed.interrupted {
                    self.metrics
                        .interrupted
                        .get_or_create(&FailedLaunchLabels {
                            shape,
                            reason: reason.unwrap_or_else(|| "exited".into()),
                        })
                        .inc();
                }
                for (shape, reason) in absorbed.lost {
                    policy::record_early_exit(&mut self.state, &shape, now());
                    self.journal.lost(&shape);
                    self.journal.note(
                        now(),
                        format!(
                            "a worker of shape {shape} was lost before it checked in ({})",
                            reason.as_deref().unwrap_or("exited")
                        ),
                    );
                    self.metrics.early_exits.inc();
                    self.metrics
                        .failed_launches
                        .get_or_create(&FailedLaunchLabels {
                            shape,
                            reason: reason.unwrap_or_else(|| "exited".into()),
                        })
                        .inc();
                }
                Ok(absorbed.jobs)
            }
            Err(e) => {
                self.metrics.observation_error("backend_list");
                Err(e.to_string())
            }
        }
    }

    /// Plans this tick with the staged bundles read and the jobs absorbed; logs and journals
    /// the reasons.
    pub fn plan_with(
        &mut self,
        staged: Vec<StagedBundle>,
        jobs: Result<Vec<Job>, String>,
        staged_unread: u64,
    ) -> Plan {
        if self.settings.worker.prefetch {
            self.prefetch.observe(&staged, now());
        }
        let obs = Observation {
            staged,
            jobs,
            now: now(),
        };
        let mut plan = policy::plan(&self.config, &mut self.state, &obs);
        plan.staged_unread = staged_unread;
        self.metrics.launch_backoff.set(
            self.state
                .backoff_until()
                .map_or(0.0, |t| (t - obs.now).max(0.0)),
        );
        // Each decision and its reason: at info when something changed, else at debug.
        if plan.reasons != self.last_reasons || !plan.actions.is_empty() {
            for r in &plan.reasons {
                tracing::info!("{r}");
                self.journal.note(obs.now, r.clone());
            }
            self.last_reasons = plan.reasons.clone();
        } else {
            for r in &plan.reasons {
                tracing::debug!("{r}");
            }
        }
        plan
    }

    /// Past a full first page: when those bundles already decide the tick
    /// ([`policy::staged_prefix_decides`]) the server only counts the rest (one query), else
    /// the rest is read. Returns how many were counted but not read.
    async fn rest_of_staged(
        &self,
        staged: &mut Vec<StagedBundle>,
        jobs: &Result<Vec<Job>, String>,
    ) -> Result<u64, protocol::Error> {
        if policy::staged_prefix_decides(&self.config, staged, jobs) {
            match self.client.count_bundles(&self.keywords).await {
                Ok(n) => return Ok(n.saturating_sub(staged.len() as u64)),
                Err(e) => tracing::warn!("cannot count the staged bundles ({e}); reading them all"),
            }
        }
        read_rest_of_staged(&self.client, &self.keywords, staged).await?;
        Ok(0)
    }

    /// The staged bundles could not be read: nothing is launched or cancelled this tick.
    fn server_unreadable(&mut self, e: &protocol::Error) -> Option<Plan> {
        self.metrics.observation_error("server");
        let msg =
            format!("cannot read staged bundles, nothing launched or cancelled this tick: {e}");
        tracing::warn!("{msg}");
        if self.server_error.is_none() {
            self.journal.note(now(), msg);
        }
        self.server_error = Some(e.to_string());
        None
    }

    fn shape(&self, name: &str) -> Shape {
        self.config
            .shapes
            .iter()
            .find(|s| s.name == name)
            .unwrap_or(&self.config.shapes[0])
            .clone()
    }

    /// The worker argv of [`WorkerFlags::command`](crate::settings::WorkerFlags::command) plus
    /// the backend's own flags, `--gpuset NONE` for a shape without GPUs (unless the backend
    /// sets `--gpuset` itself) and, where the backend has one, its credentials file.
    pub fn worker_command(&self, id: &str, work_dir: &str, gpus: u32) -> Vec<String> {
        let mut cmd =
            self.settings
                .worker
                .command(id, work_dir, self.profile.network_prefix.as_deref());
        for a in &self.profile.extra_args {
            if !cmd.contains(a) {
                cmd.push(a.clone());
            }
        }
        if let Some(n) = backend_preemption_notice(
            self.settings.worker.preemption_notice.as_deref(),
            self.profile.default_preemption_notice,
        ) {
            cmd.extend(["--preemption-notice".into(), n.into()]);
        }
        if no_gpus_offered(gpus, self.profile.sets_gpuset) {
            cmd.extend(["--gpuset".into(), "NONE".into()]);
        }
        if let Some(dir) = self
            .profile
            .dependency_cache_dir
            .as_ref()
            .filter(|_| self.settings.worker.prefetch)
        {
            cmd.extend(["--dependency-cache-dir".into(), dir.clone()]);
        }
        if let Some(p) = &self.profile.password_file {
            cmd.push("--password-file".into());
            cmd.push(p.to_string_lossy().into_owned());
        }
        cmd
    }

    /// Submits and cancels as `plan` says, feeding every submit outcome back to the policy.
    pub async fn execute(&mut self, plan: &Plan) {
        let mut specs = Vec::new();
        for action in &plan.actions {
            if let Action::Launch { shape, count } = action {
                let sh = self.shape(shape);
                let told = match self.settings.worker.prefetch {
                    true => self.prefetch.deal(&sh.resources, *count as usize, now()),
                    false => Vec::new(),
                };
                for i in 0..*count as usize {
                    let id = format!("{}{}", self.profile.id_prefix, new_worker_id());
                    let work_dir = self.profile.work_dir(&id);
                    let mut command = self.worker_command(&id, &work_dir, sh.resources.gpus);
                    if let Some(p) = told.get(i).filter(|p| !p.bundles.is_empty()) {
                        tracing::info!(
                            "worker host-{id} is told to fetch what {} need{}: {} image(s), {} dependenc{}",
                            p.bundles.join(", "),
                            if p.bundles.len() == 1 { "s" } else { "" },
                            p.images.len(),
                            p.dependencies.len(),
                            if p.dependencies.len() == 1 { "y" } else { "ies" },
                        );
                        command.extend(p.args());
                    }
                    specs.push(JobSpec {
                        worker_id: id.clone(),
                        shape_name: sh.name.clone(),
                        resources: sh.resources,
                        command,
                        env: self.settings.worker.env.clone(),
                    });
                }
            }
        }
        let backend = &self.backend;
        let gate = &self.lease;
        let results: Vec<(JobSpec, Option<Result<String, backends::BackendError>>)> =
            futures::stream::iter(specs)
                .map(|spec| async move {
                    // Each launch asks the lease first: a manager that lost it mid-tick (or
                    // was stopped past it) launches nothing more.
                    if !may_act(gate) {
                        return (spec, None);
                    }
                    let r = backend.submit(&spec).await;
                    (spec, Some(r))
                })
                .buffer_unordered(SUBMIT_CONCURRENCY)
                .collect()
                .await;
        let mut failures = 0u32;
        let mut launched: std::collections::BTreeMap<String, u32> = Default::default();
        for (spec, r) in results {
            let labels = ShapeLabels {
                shape: spec.shape_name.clone(),
            };
            let Some(r) = r else {
                tracing::warn!(
                    "worker host-{} (shape {}) not launched: this manager no longer holds the lease",
                    spec.worker_id,
                    spec.shape_name
                );
                continue;
            };
            let ok = match r {
                Ok(job) => {
                    tracing::info!(
                        "launched worker host-{} as job {job} (shape {})",
                        spec.worker_id,
                        spec.shape_name
                    );
                    self.metrics.launches.get_or_create(&labels).inc();
                    self.book.submitted(&job, now());
                    *launched.entry(spec.shape_name.clone()).or_default() += 1;
                    true
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot launch a worker of shape {}: {e}{}",
                        spec.shape_name,
                        if e.is_retryable() { "" } else { " (permanent)" }
                    );
                    self.metrics.submit_failures.get_or_create(&labels).inc();
                    self.journal.note(
                        now(),
                        format!("cannot launch a worker of shape {}: {e}", spec.shape_name),
                    );
                    failures += 1;
                    false
                }
            };
            policy::record_submit(&mut self.state, &spec.shape_name, ok, now());
        }
        for (shape, n) in launched {
            self.launched += n;
            self.journal.note(
                now(),
                format!(
                    "launched {n} worker{} of shape {shape}",
                    if n == 1 { "" } else { "s" }
                ),
            );
        }
        if failures > 0 {
            tracing::warn!(
                "{} consecutive failed launches; circuit breaker {:?}",
                self.state.failures(),
                self.state.breaker.state
            );
        }
        self.metrics
            .set_breaker(self.state.breaker.state, self.state.failures());
        for job_id in plan.cancels() {
            if !may_act(&self.lease) {
                tracing::warn!(
                    "job {job_id} not cancelled: this manager no longer holds the lease"
                );
                continue;
            }
            match self.backend.cancel(job_id).await {
                Ok(()) => {
                    self.book.cancelled(job_id);
                    tracing::info!("cancelled job {job_id}: no staged bundle needs it");
                    self.journal.note(
                        now(),
                        format!("cancelled job {job_id}: no staged bundle needs it"),
                    );
                    self.metrics.cancels.inc();
                }
                Err(e) => {
                    tracing::warn!("cannot cancel job {job_id}: {e}");
                    self.metrics.cancel_failures.inc();
                }
            }
        }
    }

    /// Reads the backend's pool, if it reports one; an unreadable pool is reported as unknown.
    async fn observe_pool(&mut self) {
        let Some(source) = self.profile.pool.clone() else {
            return;
        };
        match source.pool().await {
            Ok(pool) => {
                self.metrics.observe_pool(&pool);
                self.pool = Some(pool);
                self.pool_error = None;
            }
            Err(e) => {
                self.metrics.observation_error("backend_pool");
                tracing::warn!("cannot read the pool: {e}");
                self.pool = None;
                self.pool_error = Some(e.to_string());
            }
        }
    }

    /// The status after a tick that made `plan` (`None`: the server could not be read), at
    /// `now`; a tick with a plan adds a sample to the history.
    pub fn status_after_tick(&mut self, plan: Option<&Plan>, now: f64) -> Status {
        if let Some(p) = plan {
            self.last_plan = Some(p.clone());
            let (pending, running) = p
                .shapes
                .iter()
                .fold((0, 0), |(a, b), s| (a + s.pending, b + s.active));
            self.journal.sample(Sample {
                at: now,
                staged: p.staged_total() as usize,
                pending,
                running,
                launches: self.launched,
            });
        }
        let p = self.last_plan.as_ref();
        let (bundles, bundles_unlisted) = p.map_or_else(Default::default, |p| {
            crate::status::bounded(&p.waits, p.staged_unread)
        });
        // The explanations go to `bundles`, bounded; the plan of `/status` carries none.
        let plan = p.cloned().map(|mut p| {
            p.waits = Vec::new();
            p
        });
        Status {
            backend: self.backend.name().to_owned(),
            server: self.settings.server.clone(),
            updated_at: Some(now),
            shapes: self.config.shapes.clone(),
            min_workers: self.config.min_workers,
            max_workers: self.config.max_workers,
            capacity: self.config.capacity,
            pool: self
                .pool
                .as_ref()
                .and_then(|p| serde_json::to_value(p).ok()),
            plan,
            workers: self.journal.workers(&self.config.shapes, p),
            breaker: BreakerStatus::of(&self.state, now),
            health: Health {
                server_error: self.server_error.clone(),
                backend_error: p.and_then(|p| p.listing_error.clone()),
                pool_error: self.pool_error.clone(),
            },
            decisions: self.journal.decisions(),
            history: self.journal.history(),
            bundles,
            bundles_unlisted,
            tiers: Vec::new(),
            lease: None,
        }
    }

    /// One tick: observe, plan, act; returns the plan (`None` when the staged bundles could not
    /// be read). With `dry` (`--once`) nothing is submitted or cancelled.
    pub async fn tick(&mut self, dry: bool) -> Option<Plan> {
        // A standby neither observes nor plans: the holder does.
        if !dry && !may_act(&self.lease) {
            return None;
        }
        let started = Instant::now();
        self.launched = 0;
        let plan = self.observe_and_plan().await;
        if let Some(p) = &plan {
            self.metrics.observe_plan(p);
        }
        // After the plan's numbers, so that the breaker gauges show the submit outcomes.
        if let (Some(p), false) = (&plan, dry) {
            self.execute(p).await;
        }
        let status = self.status_after_tick(plan.as_ref(), now());
        self.metrics.set_status(status);
        self.metrics.ticks.inc();
        self.metrics
            .tick_duration
            .observe(started.elapsed().as_secs_f64());
        plan
    }

    /// Ticks every `--sleep-time` seconds until `shutdown` (SIGTERM) or `--restart-after-seconds`.
    /// A tick in progress is finished first, so no submission is cut in half.
    pub async fn run(&mut self, shutdown: CancellationToken) -> Exit {
        let settings = self.settings.clone();
        tick_until(&settings, shutdown, async || {
            self.tick(false).await;
            self.too_many_failures()
        })
        .await
    }

    /// `--exit-after-num-failed` passed, if so.
    pub fn too_many_failures(&self) -> Option<String> {
        let n = self.exit_after_num_failed?;
        (self.book.failed_jobs > n).then(|| {
            format!(
                "{} worker jobs failed, more than --exit-after-num-failed {n}",
                self.book.failed_jobs
            )
        })
    }
}

/// The loop of one manager or of several tiers: `tick` every `--sleep-time` until `shutdown`
/// or `--restart-after-seconds`, or until `tick` says too many launches failed.
pub async fn tick_until(
    settings: &Settings,
    shutdown: CancellationToken,
    mut tick: impl AsyncFnMut() -> Option<String>,
) -> Exit {
    let started = Instant::now();
    loop {
        if settings
            .restart_after
            .is_some_and(|d| started.elapsed() >= d)
        {
            tracing::info!("--restart-after-seconds passed: restarting");
            return Exit::Restart;
        }
        if let Some(why) = tick().await {
            return Exit::TooManyFailures(why);
        }
        if shutdown.is_cancelled() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.sleep_time) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    tracing::info!(
        "stopping; running workers finish their runs and exit when idle, pending jobs stay queued"
    );
    Exit::Stopped
}

/// Reads the staged bundles past the first page into `staged` (a bundle already there once).
pub async fn read_rest_of_staged(
    client: &RestClient,
    keywords: &[String],
    staged: &mut Vec<StagedBundle>,
) -> Result<(), protocol::Error> {
    let more = client
        .search_bundles_from(keywords, SEARCH_PAGE, SEARCH_PAGE)
        .await?;
    let seen: HashSet<String> = staged.iter().map(|b| b.uuid.clone()).collect();
    staged.extend(
        more.iter()
            .filter(|b| !seen.contains(&b.uuid))
            .map(staged_bundle),
    );
    Ok(())
}

/// Whether this manager may launch and cancel now: always without `--lease`, else while it
/// holds the lease.
pub fn may_act(lease: &Option<crate::lease::Gate>) -> bool {
    lease.as_ref().is_none_or(|g| g.may_act())
}

/// A worker of a shape without GPUs is told to offer none (`--gpuset NONE`): on a GPU host it
/// would otherwise find every GPU through the engine and take GPU runs on GPUs its job was never
/// given. Not where the backend gives `--gpuset` itself (local, Slurm).
fn no_gpus_offered(shape_gpus: u32, backend_sets_gpuset: bool) -> bool {
    shape_gpus == 0 && !backend_sets_gpuset
}

/// The `--preemption-notice` the backend adds to a worker command: its default, unless the
/// manager's `--worker-preemption-notice` was given (then [`WorkerFlags::command`] passes it,
/// `none` passing nothing).
///
/// [`WorkerFlags::command`]: crate::settings::WorkerFlags::command
fn backend_preemption_notice<'a>(given: Option<&str>, default: Option<&'a str>) -> Option<&'a str> {
    match given {
        Some(_) => None,
        None => default,
    }
}

mod book;
pub mod prefetch;
mod workers;
pub use book::{Absorbed, JobBook};
pub use workers::{free_by_worker, free_capacity, WorkersSeen};

#[cfg(test)]
mod tests;
