//! What an operator sees of a running manager: one [`Status`] model, served as JSON at
//! `/status`, as an HTML page at `/` ([`crate::page`]) and printed as a table by
//! `cl-worker-manager status` ([`render_table`]). The control loop fills it every tick with the
//! help of a [`Journal`] (recent decisions, the last hour of samples, workers lost before
//! check-in); rendering and the exit code are pure functions of it.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::policy::{BreakerState, Plan, PolicyState, Resources, Shape};

/// Samples older than this are dropped from the history.
pub const HISTORY_SECS: f64 = 3600.0;
/// At most this many samples (one per tick; `--sleep-time 1` for an hour).
pub const HISTORY_MAX: usize = 3600;
/// Decisions kept.
pub const DECISIONS_MAX: usize = 50;

/// The manager as `/status` reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub backend: String,
    pub server: String,
    /// Unix time of the last tick (`None` before the first).
    pub updated_at: Option<f64>,
    pub shapes: Vec<Shape>,
    pub min_workers: usize,
    pub max_workers: usize,
    /// What a bounded backend (the `local` machine) can hold at once.
    pub capacity: Option<Resources>,
    /// The backend's pool (`azure-batch --pool-id`), when it reports one.
    pub pool: Option<serde_json::Value>,
    /// The last plan: staged bundles per shape, unschedulable ones with their reasons, actions.
    pub plan: Option<Plan>,
    /// Worker jobs per shape and state.
    pub workers: Vec<WorkerCount>,
    pub breaker: BreakerStatus,
    pub health: Health,
    /// Recent decisions, oldest first.
    pub decisions: Vec<Decision>,
    /// One sample per tick over the last hour, oldest first.
    pub history: Vec<Sample>,
}

/// Worker jobs of one shape.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCount {
    pub shape: String,
    /// Submitted, or started but not checked in yet.
    pub pending: u32,
    /// Checked in with the server.
    pub running: u32,
    /// Jobs that ended unsuccessfully before their worker checked in, since the manager started.
    pub lost_before_checkin: u64,
}

/// The submit circuit breaker and the back-off after failed launches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BreakerStatus {
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Failed launches in a row (refused submits and workers lost before check-in).
    pub consecutive_failures: u32,
    /// Seconds until an open breaker lets a probe launch through.
    pub open_for_secs: Option<f64>,
    /// Seconds until the back-off allows the next launch (0: none).
    pub backoff_secs: f64,
}

/// Whether the last tick could read the server and the backend.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Why the staged bundles could not be read (then nothing was launched or cancelled).
    pub server_error: Option<String>,
    /// Why the backend's jobs could not be listed.
    pub backend_error: Option<String>,
    /// Why the backend's pool could not be read.
    pub pool_error: Option<String>,
}

impl Health {
    pub fn ok(&self) -> bool {
        self.server_error.is_none() && self.backend_error.is_none() && self.pool_error.is_none()
    }
}

/// One decision of the loop and its reason, as logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub at: f64,
    pub text: String,
}

/// The numbers of one tick, for the chart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub at: f64,
    pub staged: usize,
    pub pending: u32,
    pub running: u32,
    /// Workers launched in this tick.
    pub launches: u32,
}

/// What the status keeps between ticks: recent decisions, the last hour of samples and the
/// workers lost before check-in per shape. Bounded in both time and count.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    decisions: VecDeque<Decision>,
    history: VecDeque<Sample>,
    lost: BTreeMap<String, u64>,
}

impl Journal {
    /// Records a decision; the oldest is dropped past [`DECISIONS_MAX`].
    pub fn note(&mut self, at: f64, text: impl Into<String>) {
        if self.decisions.len() == DECISIONS_MAX {
            self.decisions.pop_front();
        }
        self.decisions.push_back(Decision {
            at,
            text: text.into(),
        });
    }

    /// Records a tick's sample; samples older than [`HISTORY_SECS`] before it, and the oldest
    /// past [`HISTORY_MAX`], are dropped.
    pub fn sample(&mut self, s: Sample) {
        while self
            .history
            .front()
            .is_some_and(|f| f.at < s.at - HISTORY_SECS)
            || self.history.len() >= HISTORY_MAX
        {
            self.history.pop_front();
        }
        self.history.push_back(s);
    }

    /// A worker job of `shape` was lost before its worker checked in.
    pub fn lost(&mut self, shape: &str) {
        *self.lost.entry(shape.to_owned()).or_default() += 1;
    }

    pub fn decisions(&self) -> Vec<Decision> {
        self.decisions.iter().cloned().collect()
    }

    pub fn history(&self) -> Vec<Sample> {
        self.history.iter().copied().collect()
    }

    /// Worker jobs per shape from the last plan, with the losses of every shape seen.
    pub fn workers(&self, shapes: &[Shape], plan: Option<&Plan>) -> Vec<WorkerCount> {
        let mut names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
        for n in self.lost.keys() {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
            .into_iter()
            .map(|shape| {
                let p = plan.and_then(|p| p.shape(&shape));
                WorkerCount {
                    pending: p.map_or(0, |p| p.pending),
                    running: p.map_or(0, |p| p.active),
                    lost_before_checkin: self.lost.get(&shape).copied().unwrap_or(0),
                    shape,
                }
            })
            .collect()
    }
}

impl BreakerStatus {
    /// The breaker and back-off of the policy state at `now`.
    pub fn of(state: &PolicyState, now: f64) -> Self {
        let (name, open_for) = match state.breaker.state {
            BreakerState::Closed => ("closed", None),
            BreakerState::Open { until } => ("open", Some((until - now).max(0.0))),
            BreakerState::HalfOpen { .. } => ("half_open", None),
        };
        BreakerStatus {
            state: name.into(),
            consecutive_failures: state.failures(),
            open_for_secs: open_for,
            backoff_secs: state.backoff_until().map_or(0.0, |t| (t - now).max(0.0)),
        }
    }
}

/// `cl-worker-manager status` exit codes.
pub mod exit {
    /// The manager answered and is healthy.
    pub const HEALTHY: u8 = 0;
    /// The answer was not a manager's status (or the URL is not usable).
    pub const INVALID: u8 = 1;
    /// The manager could not be reached.
    pub const UNREACHABLE: u8 = 2;
    /// The submit circuit breaker is open or half-open: launches are failing.
    pub const BREAKER_OPEN: u8 = 3;
    /// The last tick could not read the server, the backend's jobs or its pool.
    pub const DEGRADED: u8 = 4;
}

impl Status {
    /// Staged bundles the manager considers (unschedulable ones included).
    pub fn staged(&self) -> usize {
        self.plan.as_ref().map_or(0, |p| p.staged_total() as usize)
    }

    /// What the staged count is made of: the unschedulable ones and, when the first bundles
    /// already decided the tick, how many were counted but not read.
    pub fn staged_note(&self) -> String {
        let Some(p) = &self.plan else {
            return "0 unschedulable".into();
        };
        let mut note = format!("{} unschedulable", p.unschedulable.len());
        if p.staged_unread > 0 {
            let _ = write!(
                note,
                "; {} not read this tick: the first {} decided it",
                p.staged_unread,
                p.staged_total() - p.staged_unread
            );
        }
        note
    }

    /// The exit code of `cl-worker-manager status` for this answer.
    pub fn exit_code(&self) -> u8 {
        if self.breaker.state != "closed" && !self.breaker.state.is_empty() {
            exit::BREAKER_OPEN
        } else if !self.health.ok() {
            exit::DEGRADED
        } else {
            exit::HEALTHY
        }
    }

    /// One line for the breaker and the back-off.
    pub fn breaker_line(&self) -> String {
        let b = &self.breaker;
        let mut s = match (b.state.as_str(), b.open_for_secs) {
            ("open", Some(t)) => format!("OPEN (probe launch in {})", duration(t)),
            ("open", None) => "OPEN".to_string(),
            ("half_open", _) => "HALF-OPEN (one probe launch allowed)".to_string(),
            ("", _) => "unknown".to_string(),
            (other, _) => other.to_string(),
        };
        let _ = write!(s, ", {} failed launches in a row", b.consecutive_failures);
        if b.backoff_secs > 0.0 {
            let _ = write!(s, ", back-off {} left", duration(b.backoff_secs));
        } else {
            s.push_str(", no back-off");
        }
        s
    }

    /// One line for the server's and the backend's health.
    pub fn health_line(&self) -> String {
        let h = &self.health;
        let part = |name: &str, e: &Option<String>| match e {
            None => format!("{name} ok"),
            Some(e) => format!("{name} ERROR: {e}"),
        };
        let mut parts = vec![
            part("server", &h.server_error),
            part("backend", &h.backend_error),
        ];
        if h.pool_error.is_some() || self.pool.is_some() {
            parts.push(part("pool", &h.pool_error));
        }
        parts.join("; ")
    }

    /// The pool's nodes as one line, when the backend reports a pool.
    pub fn pool_line(&self) -> Option<String> {
        let p = self.pool.as_ref()?;
        let n = |k: &str| p.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        Some(format!(
            "pool {} ({}, {}): {} dedicated + {} low-priority nodes, target {} + {}",
            p.get("id").and_then(|v| v.as_str()).unwrap_or("?"),
            p.get("state").and_then(|v| v.as_str()).unwrap_or("?"),
            p.get("allocation_state")
                .and_then(|v| v.as_str())
                .unwrap_or("?"),
            n("current_dedicated_nodes"),
            n("current_low_priority_nodes"),
            n("target_dedicated_nodes"),
            n("target_low_priority_nodes"),
        ))
    }
}

/// `1.5 GiB`, `512 MiB`.
pub fn bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// `45s`, `3m05s`, `2h10m`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The UTC time of day of a unix time, `HH:MM:SSZ`.
pub fn clock(at: f64) -> String {
    let s = at.max(0.0) as u64 % 86_400;
    format!("{:02}:{:02}:{:02}Z", s / 3600, (s % 3600) / 60, s % 60)
}

/// A shape's size, `1 CPU, 0 GPU, 2.0 GiB`.
pub fn shape_size(s: &Shape) -> String {
    format!("{} CPU, {} GPU, {}", s.cpus, s.gpus, bytes(s.memory_bytes))
}

/// The first `left` columns left-aligned, the numbers after them right-aligned, two spaces
/// apart.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>], left: usize) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::from(" ");
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            l.push(' ');
            if i < left {
                l.push_str(c);
                l.push_str(&" ".repeat(pad));
            } else {
                l.push_str(&" ".repeat(pad));
                l.push_str(c);
            }
            l.push(' ');
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(header.to_vec()));
    for r in rows {
        let _ = writeln!(out, "{}", line(r.iter().map(String::as_str).collect()));
    }
}

/// The status as a compact text table (as `ray status` prints its cluster), for `now`.
pub fn render_table(s: &Status, now: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "======== cl-worker-manager: {} backend, server {} ========",
        if s.backend.is_empty() {
            "?"
        } else {
            &s.backend
        },
        s.server
    );
    match s.updated_at {
        Some(t) => {
            let _ = writeln!(out, "Last tick:  {} ago ({})", duration(now - t), clock(t));
        }
        None => {
            let _ = writeln!(out, "Last tick:  none yet (logging in or first tick)");
        }
    }
    let _ = writeln!(out, "Health:     {}", s.health_line());
    let _ = writeln!(out, "Breaker:    {}", s.breaker_line());
    if let Some(p) = s.pool_line() {
        let _ = writeln!(out, "Pool:       {p}");
    }

    let unsched = s.plan.as_ref().map_or(&[][..], |p| &p.unschedulable[..]);
    let _ = writeln!(
        out,
        "\nStaged bundles: {} ({})",
        s.staged(),
        s.staged_note()
    );
    let rows: Vec<Vec<String>> = s
        .shapes
        .iter()
        .map(|sh| {
            let p = s.plan.as_ref().and_then(|p| p.shape(&sh.name));
            let n = |f: fn(&crate::policy::ShapePlan) -> u64| p.map_or(0, f).to_string();
            vec![
                sh.name.clone(),
                shape_size(sh),
                n(|p| p.staged as u64),
                n(|p| p.covered_by_idle as u64),
                n(|p| u64::from(p.workers_needed)),
                n(|p| u64::from(p.launch_wanted)),
                n(|p| u64::from(p.throttled)),
                n(|p| u64::from(p.over_capacity)),
            ]
        })
        .collect();
    table(
        &mut out,
        &[
            "shape",
            "size",
            "staged",
            "fit idle",
            "workers needed",
            "to launch",
            "throttled",
            "over capacity",
        ],
        &rows,
        2,
    );
    for u in unsched {
        let _ = writeln!(out, "  unschedulable {}: {}", u.uuid, u.reason);
    }

    let (pending, running): (u32, u32) = s
        .workers
        .iter()
        .fold((0, 0), |(p, r), w| (p + w.pending, r + w.running));
    let _ = writeln!(
        out,
        "\nWorkers: {} ({pending} pending, {running} running; min {}, max {})",
        pending + running,
        s.min_workers,
        s.max_workers
    );
    let rows: Vec<Vec<String>> = s
        .workers
        .iter()
        .map(|w| {
            vec![
                w.shape.clone(),
                w.pending.to_string(),
                w.running.to_string(),
                w.lost_before_checkin.to_string(),
            ]
        })
        .collect();
    table(
        &mut out,
        &["shape", "pending", "running", "lost before check-in"],
        &rows,
        1,
    );

    let _ = writeln!(out, "\nRecent decisions:");
    if s.decisions.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    let skip = s.decisions.len().saturating_sub(10);
    for d in &s.decisions[skip..] {
        let _ = writeln!(out, "  {}  {}", clock(d.at), d.text);
    }
    out
}

/// Why `status` got no status.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot reach {0}: {1}")]
    Unreachable(String, String),
    #[error("{0}")]
    Invalid(String),
}

impl FetchError {
    pub fn exit_code(&self) -> u8 {
        match self {
            FetchError::Unreachable(..) => exit::UNREACHABLE,
            FetchError::Invalid(_) => exit::INVALID,
        }
    }
}

/// `http://host:port[/prefix]` (or `host:port`) → (`host:port`, the path of `/status`).
pub fn status_target(url: &str) -> Result<(String, String), FetchError> {
    if url.starts_with("https://") {
        return Err(FetchError::Invalid(format!(
            "{url}: the manager's --metrics-addr speaks plain HTTP (use http:// or a proxy's own client)"
        )));
    }
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() {
        return Err(FetchError::Invalid(format!("{url}: no host")));
    }
    let host = if host.contains(':') && !host.ends_with(']') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    let path = path.strip_suffix("/status").unwrap_or(path);
    Ok((host, format!("{path}/status")))
}

/// `GET <url>/status` (reqwest, plain HTTP), with `timeout` for connecting and for the answer.
pub async fn fetch(url: &str, timeout: std::time::Duration) -> Result<Status, FetchError> {
    let (host, path) = status_target(url)?;
    // reqwest's own text names only the request; its causes say why (refused, timed out).
    let unreachable = |e: &dyn std::error::Error| {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        FetchError::Unreachable(url.into(), text)
    };
    common::install_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(timeout)
        .timeout(timeout)
        .no_proxy()
        .build()
        .map_err(|e| unreachable(&e))?;
    let answer = client
        .get(format!("http://{host}{path}"))
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| unreachable(&e))?;
    let code = answer.status();
    let body = answer.bytes().await.map_err(|e| unreachable(&e))?;
    parse_answer(code, &body)
}

/// The status in an answer of the manager's `/status`.
pub fn parse_answer(code: reqwest::StatusCode, body: &[u8]) -> Result<Status, FetchError> {
    if code != reqwest::StatusCode::OK {
        return Err(FetchError::Invalid(format!("the manager answered {code}")));
    }
    serde_json::from_slice(body)
        .map_err(|e| FetchError::Invalid(format!("not a manager's status: {e}")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::{plan, Config, Job, Observation, StagedBundle};

    /// A status with a plan: 3 staged bundles of which one is unschedulable, a pending job,
    /// one worker lost before check-in and two decisions.
    pub(crate) fn sample_status() -> Status {
        let mut c = Config::with_default_shape(Shape::from_flags(1, 0, 2048));
        c.min_workers = 0;
        c.max_workers = 6;
        let mut st = PolicyState::new(&c);
        let obs = Observation {
            staged: vec![
                StagedBundle::new("0x1", 1, 0, 1 << 30),
                StagedBundle::new("0x2", 1, 0, 1 << 30),
                StagedBundle::new("0x3", 64, 0, 1 << 30),
            ],
            jobs: Ok(vec![Job::pending("j1", "default")]),
            now: 1000.0,
        };
        let p = plan(&c, &mut st, &obs);
        let mut j = Journal::default();
        j.note(990.0, "bundle 0x3 is unschedulable: fits no worker shape");
        j.note(1000.0, "launched 1 worker of shape default");
        j.lost("default");
        j.sample(Sample {
            at: 1000.0,
            staged: 3,
            pending: 1,
            running: 0,
            launches: 1,
        });
        Status {
            backend: "local".into(),
            server: "http://127.0.0.1:2900".into(),
            updated_at: Some(1000.0),
            workers: j.workers(&c.shapes, Some(&p)),
            shapes: c.shapes.clone(),
            min_workers: 0,
            max_workers: 6,
            capacity: None,
            pool: None,
            breaker: BreakerStatus::of(&st, 1000.0),
            health: Health::default(),
            decisions: j.decisions(),
            history: j.history(),
            plan: Some(p),
        }
    }

    #[test]
    fn table_shows_demand_workers_decisions_breaker_and_health() {
        let s = sample_status();
        let t = render_table(&s, 1003.0);
        for want in [
            "cl-worker-manager: local backend, server http://127.0.0.1:2900",
            "Last tick:  3s ago (00:16:40Z)",
            "Health:     server ok; backend ok",
            "Breaker:    closed, 0 failed launches in a row, no back-off",
            "Staged bundles: 3 (1 unschedulable)",
            "unschedulable 0x3: fits no worker shape: 64 cpus > largest 1",
            "Workers: 1 (1 pending, 0 running; min 0, max 6)",
            "00:16:40Z  launched 1 worker of shape default",
        ] {
            assert!(t.contains(want), "{want:?} not in\n{t}");
        }
        // The shape's row: 2 schedulable bundles staged, each needing a 1-CPU worker.
        let demand = t
            .lines()
            .find(|l| l.trim_start().starts_with("default  1 CPU"))
            .unwrap();
        let cols: Vec<&str> = demand.split_whitespace().collect();
        assert_eq!(cols[..2], ["default", "1"], "{demand}");
        assert_eq!(cols[7], "2", "staged: {demand}");
        let workers = t
            .lines()
            .skip_while(|l| !l.starts_with("Workers:"))
            .nth(2)
            .unwrap();
        assert_eq!(
            workers.split_whitespace().collect::<Vec<_>>(),
            ["default", "1", "0", "1"],
            "{t}"
        );
        assert_eq!(s.exit_code(), exit::HEALTHY);
    }

    #[test]
    fn exit_codes_and_lines_of_a_sick_manager() {
        let mut s = sample_status();
        s.health.backend_error = Some("squeue: connection refused".into());
        assert_eq!(s.exit_code(), exit::DEGRADED);
        assert!(render_table(&s, 1000.0)
            .contains("Health:     server ok; backend ERROR: squeue: connection refused"));
        s.breaker = BreakerStatus {
            state: "open".into(),
            consecutive_failures: 5,
            open_for_secs: Some(125.0),
            backoff_secs: 0.0,
        };
        assert_eq!(s.exit_code(), exit::BREAKER_OPEN);
        assert_eq!(
            s.breaker_line(),
            "OPEN (probe launch in 2m05s), 5 failed launches in a row, no back-off"
        );
        s.breaker.state = "half_open".into();
        assert_eq!(s.exit_code(), exit::BREAKER_OPEN);
        // Before the first tick: no plan, healthy.
        let empty = Status {
            breaker: BreakerStatus {
                state: "closed".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(empty.exit_code(), exit::HEALTHY);
        assert!(render_table(&empty, 0.0).contains("Last tick:  none yet"));
    }

    #[test]
    fn journal_is_bounded_by_age_and_count() {
        let mut j = Journal::default();
        for i in 0..5000 {
            j.sample(Sample {
                at: f64::from(i),
                ..Default::default()
            });
            j.note(f64::from(i), format!("d{i}"));
        }
        let h = j.history();
        assert!(h.len() <= HISTORY_MAX);
        assert!(h.first().unwrap().at >= 4999.0 - HISTORY_SECS, "{:?}", h[0]);
        assert_eq!(h.last().unwrap().at, 4999.0);
        let d = j.decisions();
        assert_eq!(d.len(), DECISIONS_MAX);
        assert_eq!(d.last().unwrap().text, "d4999");
        // A sparse history keeps an hour, whatever the count.
        let mut j = Journal::default();
        for t in [0.0, 1000.0, 3000.0, 4000.0] {
            j.sample(Sample {
                at: t,
                ..Default::default()
            });
        }
        let at: Vec<f64> = j.history().iter().map(|s| s.at).collect();
        assert_eq!(at, [1000.0, 3000.0, 4000.0]);
    }

    #[test]
    fn status_round_trips_through_json() {
        let s = sample_status();
        let json = serde_json::to_string(&s).unwrap();
        let back: Status = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        // The keys that /status always had are still there.
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for k in [
            "backend",
            "server",
            "shapes",
            "min_workers",
            "max_workers",
            "plan",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        assert_eq!(v["plan"]["unschedulable"][0]["uuid"], "0x3");
    }

    #[test]
    fn urls_and_answers() {
        assert_eq!(
            status_target("http://127.0.0.1:9464").unwrap(),
            ("127.0.0.1:9464".into(), "/status".into())
        );
        assert_eq!(
            status_target("127.0.0.1:9464/").unwrap(),
            ("127.0.0.1:9464".into(), "/status".into())
        );
        assert_eq!(
            status_target("http://mgr.example/cl/status").unwrap(),
            ("mgr.example:80".into(), "/cl/status".into())
        );
        assert!(status_target("https://x:1").is_err());
        let body = serde_json::to_string(&sample_status()).unwrap();
        use reqwest::StatusCode;
        assert_eq!(
            parse_answer(StatusCode::OK, body.as_bytes()).unwrap(),
            sample_status()
        );
        let e = parse_answer(StatusCode::NOT_FOUND, b"").unwrap_err();
        assert_eq!(e.exit_code(), exit::INVALID);
        assert_eq!(e.to_string(), "the manager answered 404 Not Found");
        let e = parse_answer(StatusCode::OK, b"{\"plan\": 3}").unwrap_err();
        assert_eq!(e.exit_code(), exit::INVALID);
    }

    #[test]
    fn formats() {
        assert_eq!(duration(45.2), "45s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(7800.0), "2h10m");
        assert_eq!(bytes(2 << 30), "2.0 GiB");
        assert_eq!(bytes(512 << 20), "512 MiB");
        assert_eq!(clock(86_400.0 + 3661.0), "01:01:01Z");
    }
}
