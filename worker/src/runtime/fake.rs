//! An in-memory runtime for tests. It runs no process: a test decides when and how each run
//! ends (exit code, out of memory), what its stats are, which images fail, and reads back every
//! call the worker made.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::{BundleRuntime, OwnRun, RunSpec, RunStatus, RuntimeError, Sample};
use common::now_unix;

/// How a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i64),
    OutOfMemory,
}

/// A call the worker made, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Prepare,
    EnsureImage(String),
    /// The bundle uuid.
    Start(String),
    Kill(String),
    Remove(String),
    ListOwn(String),
    Shutdown,
}

/// A run as the fake holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeRun {
    pub id: String,
    pub uuid: String,
    pub worker_id: String,
    /// `None` for a run adopted with [`FakeRuntime::adopt`].
    pub spec: Option<RunSpec>,
    pub status: RunStatus,
    pub sample: Sample,
}

#[derive(Default)]
struct State {
    /// By id.
    runs: BTreeMap<String, FakeRun>,
    /// Runs (by uuid) that end as soon as they start.
    exit_on_start: BTreeMap<String, Exit>,
    image_failures: BTreeMap<String, RuntimeError>,
    pinned: BTreeMap<String, usize>,
    calls: Vec<Call>,
    next_id: u64,
}

/// The in-memory runtime; clones share their state.
#[derive(Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    /// Bumped on every change of a run, for [`BundleRuntime::wait`].
    changed: Arc<watch::Sender<u64>>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime {
            state: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

/// A run that has just started.
fn running(id: &str, uuid: &str, worker_id: &str, spec: Option<RunSpec>) -> FakeRun {
    let memory_limit = spec.as_ref().map_or(0, |s| s.memory_bytes);
    FakeRun {
        id: id.to_owned(),
        uuid: uuid.to_owned(),
        worker_id: worker_id.to_owned(),
        spec,
        status: RunStatus {
            running: true,
            exit_code: None,
            oom_killed: false,
            started_at: Some(now_unix()),
            finished_at: None,
            failure: None,
        },
        sample: Sample {
            memory_limit,
            ..Sample::default()
        },
    }
}

fn stop(run: &mut FakeRun, exit: Exit) {
    run.status.running = false;
    run.status.finished_at = Some(now_unix());
    match exit {
        Exit::Code(c) => run.status.exit_code = Some(c),
        Exit::OutOfMemory => {
            run.status.exit_code = Some(137);
            run.status.oom_killed = true;
        }
    }
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    fn record(&self, call: Call) {
        self.with(|s| s.calls.push(call));
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// The bundle's run ends as soon as it starts.
    pub fn exit_on_start(&self, uuid: &str, exit: Exit) {
        self.with(|s| s.exit_on_start.insert(uuid.to_owned(), exit));
    }

    /// Ends the bundle's running run; false when there is none.
    pub fn exit(&self, uuid: &str, exit: Exit) -> bool {
        let found = self.with(|s| {
            s.runs
                .values_mut()
                .find(|r| r.uuid == uuid && r.status.running)
                .map(|r| stop(r, exit))
                .is_some()
        });
        self.bump();
        found
    }

    /// A run left running by an earlier worker process.
    pub fn adopt(&self, worker_id: &str, uuid: &str, id: &str) {
        self.with(|s| {
            s.runs
                .insert(id.to_owned(), running(id, uuid, worker_id, None))
        });
    }

    /// What [`BundleRuntime::sample`] answers for the bundle's run from now on.
    pub fn set_sample(&self, uuid: &str, sample: Sample) {
        self.with(|s| {
            for r in s.runs.values_mut().filter(|r| r.uuid == uuid) {
                r.sample = sample;
            }
        });
    }

    /// [`BundleRuntime::ensure_image`] fails for `image` with `error`.
    pub fn fail_image(&self, image: &str, error: RuntimeError) {
        self.with(|s| s.image_failures.insert(image.to_owned(), error));
    }

    pub fn calls(&self) -> Vec<Call> {
        self.with(|s| s.calls.clone())
    }

    /// The runs that exist (not removed).
    pub fn runs(&self) -> Vec<FakeRun> {
        self.with(|s| s.runs.values().cloned().collect())
    }

    /// Images held by runs, with how many runs hold each.
    pub fn pinned_images(&self) -> BTreeMap<String, usize> {
        self.with(|s| s.pinned.clone())
    }

    fn status_of(&self, id: &str) -> Option<RunStatus> {
        self.with(|s| s.runs.get(id).map(|r| r.status.clone()))
    }
}

impl BundleRuntime for FakeRuntime {
    async fn prepare(&self) -> Result<(), RuntimeError> {
        self.record(Call::Prepare);
        Ok(())
    }

    async fn ensure_image(
        &self,
        image: &str,
        mut progress: impl FnMut(String) + Send,
    ) -> Result<String, RuntimeError> {
        self.record(Call::EnsureImage(image.to_owned()));
        if let Some(e) = self.with(|s| s.image_failures.get(image).cloned()) {
            return Err(e);
        }
        progress(format!("Pulling docker image {image}"));
        self.pin_image(image);
        Ok(format!("{image}@sha256:fake"))
    }

    fn pin_image(&self, image: &str) {
        self.with(|s| *s.pinned.entry(image.to_owned()).or_default() += 1);
    }

    fn unpin_image(&self, image: &str) {
        self.with(|s| {
            if let Some(n) = s.pinned.get_mut(image) {
                *n -= 1;
                if *n == 0 {
                    s.pinned.remove(image);
                }
            }
        });
    }

    async fn clean_images(&self) {}

    async fn start(
        &self,
        spec: &RunSpec,
        _progress: impl FnMut(String) + Send,
    ) -> Result<String, RuntimeError> {
        self.record(Call::Start(spec.uuid.clone()));
        let id = self.with(|s| {
            s.runs.retain(|_, r| r.uuid != spec.uuid);
            s.next_id += 1;
            let id = format!("fake-{}", s.next_id);
            let mut run = running(&id, &spec.uuid, &spec.worker_id, Some(spec.clone()));
            if let Some(exit) = s.exit_on_start.get(&spec.uuid) {
                stop(&mut run, *exit);
            }
            s.runs.insert(id.clone(), run);
            id
        });
        self.bump();
        Ok(id)
    }

    async fn inspect(&self, id: &str) -> Result<Option<RunStatus>, RuntimeError> {
        Ok(self.status_of(id))
    }

    async fn wait(&self, id: &str) {
        let mut rx = self.changed.subscribe();
        while self.status_of(id).is_some_and(|s| s.running) {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn sample(&self, id: &str) -> Result<Sample, RuntimeError> {
        self.with(|s| s.runs.get(id).map(|r| r.sample))
            .ok_or_else(|| RuntimeError::NotFound(format!("no such run: {id}")))
    }

    async fn kill(&self, uuid: &str) -> Result<(), RuntimeError> {
        self.record(Call::Kill(uuid.to_owned()));
        self.exit(uuid, Exit::Code(137));
        Ok(())
    }

    async fn remove(&self, uuid: &str) -> Result<(), RuntimeError> {
        self.record(Call::Remove(uuid.to_owned()));
        self.with(|s| s.runs.retain(|_, r| r.uuid != uuid));
        self.bump();
        Ok(())
    }

    async fn address(&self, uuid: &str, id: &str) -> Result<String, RuntimeError> {
        match self.status_of(id) {
            Some(_) => Ok("127.0.0.1".into()),
            None => Err(RuntimeError::NotFound(format!(
                "The container of bundle {uuid} has no address"
            ))),
        }
    }

    async fn list_own(&self, worker_id: &str) -> Result<Vec<OwnRun>, RuntimeError> {
        self.record(Call::ListOwn(worker_id.to_owned()));
        Ok(self.with(|s| {
            s.runs
                .values()
                .filter(|r| r.worker_id == worker_id)
                .map(|r| OwnRun {
                    id: r.id.clone(),
                    uuid: r.uuid.clone(),
                })
                .collect()
        }))
    }

    async fn shutdown(&self) {
        self.record(Call::Shutdown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::conformance;

    fn spec(uuid: &str) -> RunSpec {
        RunSpec {
            uuid: uuid.into(),
            command: "true".into(),
            image: "img:latest".into(),
            bundle_path: "/w/runs/x".into(),
            mounts: vec![],
            user: "0:0".into(),
            memory_bytes: 0,
            cpuset: vec![0],
            gpu_uuids: vec![],
            shm_size_bytes: 0,
            network: false,
            worker_id: "w".into(),
            pids_limit: 0,
            no_capabilities: false,
        }
    }

    #[tokio::test]
    async fn a_run_waits_until_it_is_ended() {
        let rt = FakeRuntime::new();
        let id = rt.start(&spec("0x1"), |_| {}).await.unwrap();
        let wait = tokio::spawn({
            let rt = rt.clone();
            let id = id.clone();
            async move { rt.wait(&id).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!wait.is_finished());
        assert!(rt.exit("0x1", Exit::OutOfMemory));
        wait.await.unwrap();
        let st = rt.inspect(&id).await.unwrap().unwrap();
        assert_eq!(
            (st.running, st.exit_code, st.oom_killed),
            (false, Some(137), true)
        );
        rt.remove("0x1").await.unwrap();
        assert_eq!(rt.inspect(&id).await.unwrap(), None);
        assert_eq!(
            rt.calls(),
            vec![Call::Start("0x1".into()), Call::Remove("0x1".into())]
        );
    }

    /// The fake under the runtime conformance suite: behaviours are scripted exits, the
    /// missing image a scripted image failure, and a restarted worker sees the same runs.
    struct Fake {
        rt: FakeRuntime,
        work_dir: tempfile::TempDir,
    }

    const MISSING: &str = "registry.invalid/absent:1";

    impl conformance::Harness for Fake {
        type Runtime = FakeRuntime;

        fn runtime(&self) -> &FakeRuntime {
            &self.rt
        }

        async fn restarted(&self) -> FakeRuntime {
            self.rt.clone()
        }

        fn spec(&self, b: conformance::Behaviour) -> RunSpec {
            let spec = conformance::spec_in(self.work_dir.path(), "w", "img:1", b);
            match b {
                conformance::Behaviour::Exit(c) => self.rt.exit_on_start(&spec.uuid, Exit::Code(c)),
                conformance::Behaviour::ExhaustMemory => {
                    self.rt.exit_on_start(&spec.uuid, Exit::OutOfMemory)
                }
                conformance::Behaviour::RunLong => {}
            }
            spec
        }

        fn missing_image(&self) -> (String, String) {
            (MISSING.into(), MISSING.into())
        }

        fn executes(&self) -> bool {
            false
        }
    }

    #[tokio::test]
    async fn the_fake_passes_the_runtime_conformance_suite() {
        let rt = FakeRuntime::new();
        rt.fail_image(
            MISSING,
            RuntimeError::Image(format!("manifest for {MISSING} not found")),
        );
        let h = Fake {
            rt,
            work_dir: tempfile::tempdir().unwrap(),
        };
        conformance::run_all(&h).await;
    }

    #[tokio::test]
    async fn images_are_pinned_and_can_fail() {
        let rt = FakeRuntime::new();
        assert!(rt.ensure_image("a:1", |_| {}).await.is_ok());
        rt.fail_image("b:1", RuntimeError::NotFound("manifest unknown".into()));
        assert_eq!(
            rt.ensure_image("b:1", |_| {})
                .await
                .unwrap_err()
                .to_string(),
            "manifest unknown"
        );
        assert_eq!(rt.pinned_images(), BTreeMap::from([("a:1".to_string(), 1)]));
        rt.unpin_image("a:1");
        assert!(rt.pinned_images().is_empty());
    }
}
