//! The runtime conformance suite: what the run state machine, the monitor and resumption expect
//! of every [`BundleRuntime`], checked the same way on each. The in-memory fake passes it in
//! this crate's unit tests; Docker, Podman and the Kubernetes stand-in pass it in
//! `worker/tests/runtime_conformance.rs`. A new runtime gets a [`Harness`] and one test there.
//!
//! The suite speaks of what a run does ([`Behaviour`]); each harness turns that into a command
//! (real runtimes) or a script (the fake), and knows how a restarted worker reconnects.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{BundleRuntime, Mount, OwnRun, RunSpec, RunStatus, RuntimeError};

/// What a run of the suite does once started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Prints [`MARK`] and exits with this code.
    Exit(i64),
    /// Runs until killed.
    RunLong,
    /// Uses memory until its limit stops it.
    ExhaustMemory,
}

/// What an [`Behaviour::Exit`] run prints on its stdout.
pub const MARK: &str = "conformance";

/// Memory limit of the suite's runs.
pub const MEMORY_BYTES: u64 = 64 << 20;

/// How long any one step may take (a cluster's scheduler included).
const STEP: Duration = Duration::from_secs(120);

/// The command a real runtime runs for `b` (in the image's bash, as the worker wraps it).
pub fn command(b: Behaviour) -> String {
    match b {
        Behaviour::Exit(code) => format!("echo {MARK}; exit {code}"),
        Behaviour::RunLong => "sleep 600".into(),
        // One line that never ends: tail holds it all in memory.
        Behaviour::ExhaustMemory => "tail /dev/zero".into(),
    }
}

/// One runtime under test.
pub trait Harness: Send + Sync {
    type Runtime: BundleRuntime;

    /// The runtime the suite drives (prepared).
    fn runtime(&self) -> &Self::Runtime;

    /// A new connection as a worker restarted with the same id and work dir makes it.
    fn restarted(&self) -> impl Future<Output = Self::Runtime> + Send;

    /// A run of a new bundle doing `b`, its bundle dir made (see [`spec_in`]).
    fn spec(&self, b: Behaviour) -> RunSpec;

    /// An image that cannot be had, and a piece of text its failure names.
    fn missing_image(&self) -> (String, String);

    /// Whether runs really execute their command (then their stdout is checked).
    fn executes(&self) -> bool {
        true
    }

    /// `None` where the runtime has control groups (limits enforced, use measured); otherwise
    /// why it has none here. The out-of-memory and stats cases are then left out, loudly (the
    /// first would eat the machine's memory, the second has nothing to read).
    fn without_cgroups(&self) -> Option<&'static str> {
        None
    }
}

/// A run spec for a new bundle under `work_dir`: the bundle dir made and owned as the worker
/// makes it, no dependency, no network, [`MEMORY_BYTES`] of memory.
pub fn spec_in(work_dir: &Path, worker_id: &str, image: &str, b: Behaviour) -> RunSpec {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let uuid = format!(
        "0x{:08x}{:04x}c0f0{:016x}",
        std::process::id(),
        n,
        now_nanos()
    );
    let bundle_path: PathBuf = work_dir.join("runs").join(&uuid);
    std::fs::create_dir_all(&bundle_path).expect("bundle dir");
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    RunSpec {
        uuid,
        command: command(b),
        image: image.to_owned(),
        bundle_path,
        mounts: Vec::<Mount>::new(),
        user: format!("{uid}:{gid}"),
        memory_bytes: MEMORY_BYTES,
        cpuset: Vec::new(),
        gpu_uuids: Vec::new(),
        shm_size_bytes: 64 << 20,
        network: false,
        worker_id: worker_id.to_owned(),
        pids_limit: 256,
        no_capabilities: false,
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64 & 0xffff_ffff_ffff)
}

/// Runs every case, one after another; a failure names its case.
pub async fn run_all<H: Harness>(h: &H) {
    let rt = h.runtime();
    rt.prepare().await.expect("prepare");
    exit_code_and_times(h).await;
    kill(h).await;
    out_of_memory(h).await;
    image_failure(h).await;
    start_replaces_a_leftover(h).await;
    stats(h).await;
    list_own_after_a_restart(h).await;
}

async fn start<R: BundleRuntime>(rt: &R, spec: &RunSpec, case: &str) -> String {
    let image = rt
        .ensure_image(&spec.image, |_| {})
        .await
        .unwrap_or_else(|e| panic!("{case}: ensure_image({}): {e}", spec.image));
    let id = tokio::time::timeout(STEP, rt.start(spec, |_| {}))
        .await
        .unwrap_or_else(|_| panic!("{case}: start took over {STEP:?}"))
        .unwrap_or_else(|e| panic!("{case}: start: {e}"));
    rt.unpin_image(&image);
    id
}

/// Waits until the run has stopped; its last status (`None`: gone).
async fn stopped<R: BundleRuntime>(rt: &R, id: &str, case: &str) -> Option<RunStatus> {
    let t0 = Instant::now();
    loop {
        let left = STEP.saturating_sub(t0.elapsed());
        assert!(
            !left.is_zero(),
            "{case}: run {id} still running after {STEP:?}"
        );
        // `wait` may break early (a lost connection): inspect tells.
        let _ = tokio::time::timeout(left.min(Duration::from_secs(10)), rt.wait(id)).await;
        match rt.inspect(id).await {
            Ok(Some(s)) if s.running => {}
            Ok(s) => return s,
            Err(e) => panic!("{case}: inspect {id}: {e}"),
        }
    }
}

async fn running<R: BundleRuntime>(rt: &R, id: &str, case: &str) -> RunStatus {
    let t0 = Instant::now();
    loop {
        match rt.inspect(id).await {
            Ok(Some(s)) if s.running => return s,
            Ok(s) => assert!(
                t0.elapsed() < STEP,
                "{case}: run {id} not running after {STEP:?}: {s:?}"
            ),
            Err(e) => panic!("{case}: inspect {id}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn removed<R: BundleRuntime>(rt: &R, spec: &RunSpec, id: &str, case: &str) {
    for n in 1..=2 {
        rt.remove(&spec.uuid)
            .await
            .unwrap_or_else(|e| panic!("{case}: remove #{n}: {e}"));
    }
    let t0 = Instant::now();
    while rt.inspect(id).await.ok().flatten().is_some() {
        assert!(
            t0.elapsed() < STEP,
            "{case}: run {id} still there after remove"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A run's exit code, its start and end times, and (where commands run) its stdout in the
/// bundle dir.
async fn exit_code_and_times<H: Harness>(h: &H) {
    let case = "exit code";
    let rt = h.runtime();
    let spec = h.spec(Behaviour::Exit(3));
    let id = start(rt, &spec, case).await;
    let s = stopped(rt, &id, case)
        .await
        .unwrap_or_else(|| panic!("{case}: the run is gone before it was removed"));
    assert_eq!(s.exit_code, Some(3), "{case}: {s:?}");
    assert!(!s.oom_killed, "{case}: {s:?}");
    let (started, finished) = (s.started_at.expect("started_at"), s.finished_at);
    let finished = finished.unwrap_or_else(|| panic!("{case}: no finished_at: {s:?}"));
    assert!(started > 1e9 && started <= finished + 1.0, "{case}: {s:?}");
    if h.executes() {
        let out = std::fs::read_to_string(spec.bundle_path.join("stdout")).unwrap_or_default();
        assert_eq!(out, format!("{MARK}\n"), "{case}: stdout in the bundle dir");
    }
    removed(rt, &spec, &id, case).await;
}

/// A killed run stops; killing it again, or once gone, is fine.
async fn kill<H: Harness>(h: &H) {
    let case = "kill";
    let rt = h.runtime();
    let spec = h.spec(Behaviour::RunLong);
    let id = start(rt, &spec, case).await;
    running(rt, &id, case).await;
    rt.kill(&spec.uuid).await.expect("kill");
    if let Some(s) = stopped(rt, &id, case).await {
        assert!(!s.running && !s.oom_killed, "{case}: {s:?}");
    }
    rt.kill(&spec.uuid).await.expect("kill of a stopped run");
    removed(rt, &spec, &id, case).await;
    rt.kill(&spec.uuid).await.expect("kill of a removed run");
}

/// A run over its memory limit stops marked out of memory.
async fn out_of_memory<H: Harness>(h: &H) {
    let case = "out of memory";
    if let Some(why) = h.without_cgroups() {
        eprintln!("!!! runtime conformance: the out-of-memory case is left out here: {why}");
        return;
    }
    let rt = h.runtime();
    let spec = h.spec(Behaviour::ExhaustMemory);
    let id = start(rt, &spec, case).await;
    let s = stopped(rt, &id, case)
        .await
        .unwrap_or_else(|| panic!("{case}: the run is gone before it was removed"));
    assert!(s.oom_killed, "{case}: not marked out of memory: {s:?}");
    removed(rt, &spec, &id, case).await;
}

/// An image that cannot be had is an [`RuntimeError::Image`] naming it, from `ensure_image` or
/// at the latest from `start`; the clean-up that follows (`remove`) leaves no run behind.
async fn image_failure<H: Harness>(h: &H) {
    let case = "image failure";
    let rt = h.runtime();
    let (image, named) = h.missing_image();
    let mut spec = h.spec(Behaviour::Exit(0));
    spec.image = image.clone();
    let err = match rt.ensure_image(&image, |_| {}).await {
        Err(e) => e,
        Ok(_) => {
            let r = tokio::time::timeout(STEP, rt.start(&spec, |_| {}))
                .await
                .unwrap_or_else(|_| panic!("{case}: start took over {STEP:?}"));
            rt.unpin_image(&image);
            match r {
                Err(e) => e,
                Ok(id) => panic!("{case}: {image} started as {id}"),
            }
        }
    };
    assert!(
        matches!(&err, RuntimeError::Image(t) if t.contains(&named)),
        "{case}: want an image error naming {named:?}, got {err:?}"
    );
    rt.remove(&spec.uuid)
        .await
        .expect("remove after a failed start");
    let own = rt.list_own(&spec.worker_id).await.expect("list_own");
    assert!(
        !own.iter().any(|r| r.uuid == spec.uuid),
        "{case}: a run was left: {own:?}"
    );
}

/// Starting a bundle again replaces the run it left (the id may be the same: a Kubernetes pod
/// is named by its bundle).
async fn start_replaces_a_leftover<H: Harness>(h: &H) {
    let case = "start again";
    let rt = h.runtime();
    let spec = h.spec(Behaviour::RunLong);
    let first = start(rt, &spec, case).await;
    running(rt, &first, case).await;
    let second = start(rt, &spec, case).await;
    running(rt, &second, case).await;
    let own = rt.list_own(&spec.worker_id).await.expect("list_own");
    let of_bundle: Vec<&OwnRun> = own.iter().filter(|r| r.uuid == spec.uuid).collect();
    assert_eq!(of_bundle.len(), 1, "{case}: {own:?}");
    assert_eq!(of_bundle[0].id, second, "{case}");
    removed(rt, &spec, &second, case).await;
    assert!(
        rt.inspect(&first).await.expect("inspect").is_none(),
        "{case}: the first run is still there"
    );
    let own = rt.list_own(&spec.worker_id).await.expect("list_own");
    assert!(!own.iter().any(|r| r.uuid == spec.uuid), "{case}: {own:?}");
}

/// A running run has samples with its memory limit.
async fn stats<H: Harness>(h: &H) {
    let case = "stats";
    if let Some(why) = h.without_cgroups() {
        eprintln!("!!! runtime conformance: the stats case is left out here: {why}");
        return;
    }
    let rt = h.runtime();
    let spec = h.spec(Behaviour::RunLong);
    let id = start(rt, &spec, case).await;
    running(rt, &id, case).await;
    let t0 = Instant::now();
    let sample = loop {
        // A cluster's stats can lag a new pod by a scrape.
        match rt.sample(&id).await {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < STEP => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{case}: sample: {e}"),
        }
    };
    assert_eq!(sample.memory_limit, MEMORY_BYTES, "{case}: {sample:?}");
    removed(rt, &spec, &id, case).await;
}

/// A worker restarted with the same id finds its running run, can inspect and remove it.
async fn list_own_after_a_restart<H: Harness>(h: &H) {
    let case = "list own after a restart";
    let rt = h.runtime();
    let spec = h.spec(Behaviour::RunLong);
    let id = start(rt, &spec, case).await;
    running(rt, &id, case).await;
    let again = h.restarted().await;
    let own = again.list_own(&spec.worker_id).await.expect("list_own");
    assert!(
        own.contains(&OwnRun {
            id: id.clone(),
            uuid: spec.uuid.clone()
        }),
        "{case}: {id} not among {own:?}"
    );
    let other = again
        .list_own(&format!("{}-other", spec.worker_id))
        .await
        .expect("list_own");
    assert!(
        !other.iter().any(|r| r.uuid == spec.uuid),
        "{case}: another worker id lists it: {other:?}"
    );
    running(&again, &id, case).await;
    removed(&again, &spec, &id, case).await;
    let own = again.list_own(&spec.worker_id).await.expect("list_own");
    assert!(
        !own.iter().any(|r| r.uuid == spec.uuid),
        "{case}: still listed after remove: {own:?}"
    );
}
