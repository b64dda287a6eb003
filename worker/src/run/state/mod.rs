//! The run state machine, as a pure function: `step(state, event, now) -> effects`.
//!
//! The I/O around it (worker.rs) turns effects into tasks (prepare, monitor, clean up, upload,
//! delete) whose outcomes come back as events. Nothing here touches Docker, disk or network, so
//! every transition is tested below without any of them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use protocol::{BundleInfo, RunReport, RunResources, StageTiming, PROFILE_STAGES};
use serde::{Deserialize, Serialize};
use serde_json::Map;

use crate::format::{duration_str, size_str};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Stage {
    Preparing,
    Running,
    CleaningUp,
    UploadingResults,
    Finalizing,
    Finished,
    Restaged,
}

impl Stage {
    /// The state string the server expects in checkins.
    pub fn server_state(self) -> &'static str {
        match self {
            Stage::Preparing => "preparing",
            Stage::Running | Stage::CleaningUp | Stage::UploadingResults => "running",
            Stage::Finalizing => "finalizing",
            Stage::Finished => "ready",
            Stage::Restaged => "staged",
        }
    }

    /// The key used in `bundle_profile_stats`.
    pub fn profile_key(self) -> Option<&'static str> {
        match self {
            Stage::Preparing => Some(PROFILE_STAGES[0]),
            Stage::Running => Some(PROFILE_STAGES[1]),
            Stage::CleaningUp => Some(PROFILE_STAGES[2]),
            Stage::UploadingResults => Some(PROFILE_STAGES[3]),
            Stage::Finalizing => Some(PROFILE_STAGES[4]),
            Stage::Finished | Stage::Restaged => None,
        }
    }
}

/// At most this many entries in a running bundle's dir: the walk that measures it stops there
/// (its time, and so the gap between two measurements, stays bounded), and the run fails.
pub const MAX_BUNDLE_ENTRIES: u64 = 1_000_000;

/// And at most this many bytes of names (what the walk holds at once is bounded by both).
pub const MAX_BUNDLE_NAME_BYTES: usize = 64 << 20;

/// The failure text of a run whose bundle dir passed [`MAX_BUNDLE_ENTRIES`].
fn too_many_entries_text() -> String {
    format!(
        "Too many files: the bundle holds more than {MAX_BUNDLE_ENTRIES} entries (or {} MiB of \
         names), the most a worker measures.",
        MAX_BUNDLE_NAME_BYTES >> 20
    )
}

/// For fields added since the state file's first version: written only when set, so that a
/// state without them keeps that version's exact bytes.
fn is_false(b: &bool) -> bool {
    !b
}

/// At most this many uploads are repeated for writes that came after the first began. What
/// really ends them is the server: it finalizes the bundle at the worker's next checkin, which
/// a repeated upload holds back for 30 s at most (`agent::checkin`), and then refuses writes.
/// Writes that come during an upload are uploaded once after it, together. This bound only
/// stops a run that writes to itself for longer than that window; 8, the first bound, was
/// passed under load in the suite (writes every half second for 4.4 s before the server
/// finalized: the last two were lost).
pub const MAX_REUPLOADS: u32 = 64;

/// Everything the worker knows about one run. Serializable so that it can be persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub bundle: BundleInfo,
    pub resources: RunResources,
    pub stage: Stage,
    pub run_status: String,
    pub bundle_path: PathBuf,
    pub bundle_start_time: f64,
    pub container_id: Option<String>,
    pub docker_image: Option<String>,
    pub container_time_total: f64,
    pub container_time_user: f64,
    pub container_time_system: f64,
    pub cpu_usage: f64,
    pub memory_usage: f64,
    pub max_memory: u64,
    pub disk_utilization: u64,
    /// The bundle dir's size could not be measured (it counts as over a disk limit).
    #[serde(default, skip_serializing_if = "is_false")]
    pub disk_unmeasurable: bool,
    /// Its bundle dir held more entries than the worker measures.
    #[serde(default, skip_serializing_if = "is_false")]
    pub too_many_entries: bool,
    /// Over its disk limit, its contents were not uploaded: it reports no disk use, so that the
    /// server charges its owner nothing for it (the server keeps a bundle's `data_size`, and
    /// its owner's `disk_used`, as the last reported `disk_utilization`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub contents_discarded: bool,
    /// A `write` arrived after the upload began (the server accepts writes until it has
    /// finalized the bundle): the results are uploaded again. Not persisted, like the upload
    /// itself (a restarted worker has none under way).
    #[serde(skip)]
    pub write_pending: bool,
    /// An upload (a repeated one, while finalizing) is under way.
    #[serde(skip)]
    pub uploading: bool,
    /// Uploads repeated for late writes so far (bounded: a write loop cannot keep the run here).
    #[serde(skip)]
    pub reuploads: u32,
    pub exitcode: Option<i64>,
    pub failure_message: Option<String>,
    pub kill_message: Option<String>,
    pub is_killed: bool,
    pub is_restaged: bool,
    pub has_contents: bool,
    pub finalized: bool,
    /// Dependency symlinks and mount points made in the bundle dir; removed before upload.
    /// (Named by a dependency's entries, so not always UTF-8: kept as their bytes.)
    #[serde(with = "path_bytes")]
    pub paths_to_remove: Vec<PathBuf>,
    pub cpuset: Vec<usize>,
    pub gpuset: Vec<String>,
    pub profile: BTreeMap<String, StageTiming>,
}

/// What happened: an outcome of a task, a server message, or a signal.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The run was accepted (`start_bundle` returned true).
    Accepted,
    /// Progress text while preparing, uploading, ...
    Status(String),
    /// Dependency symlinks made in the bundle dir (to be removed before upload).
    Mounted(Vec<PathBuf>),
    ContainerStarted {
        container_id: String,
        docker_image: String,
        cpuset: Vec<usize>,
        gpuset: Vec<String>,
    },
    /// Preparing failed (dependency, image, container start); the message is the failure text.
    PrepareFailed(String),
    Stats(Stats),
    ContainerExited {
        exitcode: Option<i64>,
        oom_killed: bool,
        /// Set when the container vanished (e.g. `Docker container not found`).
        failure: Option<String>,
    },
    CleanedUp,
    UploadFinished(Result<(), String>),
    /// A `write` from the server was applied to the bundle dir.
    Written,
    KillRequested(String),
    Restage,
    MarkFinalized,
}

/// Live measurements of a running container.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    pub time_total: f64,
    pub time_user: f64,
    pub time_system: f64,
    pub cpu_usage: f64,
    pub memory_usage: f64,
    /// Bytes in use now (the maximum is kept).
    pub memory_bytes: u64,
    /// Bundle dir size, symlinks not followed; `None` when not measured this time.
    pub disk_bytes: Option<u64>,
    /// The bundle dir could not be measured (a tree that cannot be walked): it counts against
    /// the disk limit, so that a run cannot switch the limit off.
    pub disk_unmeasurable: bool,
    /// The bundle dir holds more entries than the worker measures (the run fails).
    pub too_many_entries: bool,
}

/// What the I/O layer must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Download dependencies, get the image, make the bundle dir, link dependencies and start the
    /// container. Reports `Status`, `Mounted`, then `ContainerStarted` or `PrepareFailed`.
    Prepare,
    /// Stop the preparation (kill or restage while preparing).
    CancelPrepare,
    /// Watch the container: `Stats` now and then, `ContainerExited` at the end.
    Monitor,
    /// Kill the container (its exit comes back as `ContainerExited`).
    KillContainer,
    /// Release dependencies, remove `paths_to_remove`, remove the container (before reporting
    /// `CleanedUp` for a run handed back, after it otherwise). Reports `CleanedUp`.
    CleanUp,
    /// Upload the bundle dir. Reports `Status` and `UploadFinished`.
    Upload,
    CancelUpload,
    /// Remove the bundle dir and forget the run.
    DeleteLocalData,
    /// Tell the server soon (a state change worth a checkin).
    CheckinSoon,
}

pub use common::now_unix;

impl RunState {
    pub fn new(
        bundle: BundleInfo,
        resources: RunResources,
        bundle_path: PathBuf,
        now: f64,
    ) -> Self {
        let mut s = RunState {
            bundle,
            resources,
            stage: Stage::Preparing,
            run_status: "Preparing to run bundle.".into(),
            bundle_path,
            bundle_start_time: now,
            container_id: None,
            docker_image: None,
            container_time_total: 0.0,
            container_time_user: 0.0,
            container_time_system: 0.0,
            cpu_usage: 0.0,
            memory_usage: 0.0,
            max_memory: 0,
            disk_utilization: 0,
            disk_unmeasurable: false,
            too_many_entries: false,
            contents_discarded: false,
            write_pending: false,
            uploading: false,
            reuploads: 0,
            exitcode: None,
            failure_message: None,
            kill_message: None,
            is_killed: false,
            is_restaged: false,
            has_contents: false,
            finalized: false,
            paths_to_remove: Vec::new(),
            cpuset: Vec::new(),
            gpuset: Vec::new(),
            profile: BTreeMap::new(),
        };
        s.enter(Stage::Preparing, now);
        s
    }

    pub fn uuid(&self) -> &str {
        &self.bundle.uuid
    }

    /// True once the run is over for this worker (it is no longer reported).
    pub fn is_done(&self) -> bool {
        self.stage == Stage::Finished
    }

    fn enter(&mut self, stage: Stage, now: f64) {
        if let Some(key) = self.stage.profile_key() {
            if let Some(t) = self.profile.get_mut(key) {
                if t.end == 0.0 && self.stage != stage {
                    t.end = now;
                    t.elapsed = (now - t.start).max(0.0);
                }
            }
        }
        self.stage = stage;
        if let Some(key) = stage.profile_key() {
            self.profile.entry(key.to_owned()).or_insert(StageTiming {
                start: now,
                end: 0.0,
                elapsed: 0.0,
            });
        }
    }

    /// Kill-message texts of the limits this run is over (CodaLab's exact wording).
    pub fn limit_violations(&self, oom_killed: bool) -> Vec<String> {
        let mut msgs = Vec::new();
        let r = &self.resources;
        if r.time > 0.0 && self.container_time_total > r.time {
            msgs.push(format!(
                "Time limit exceeded. (Container uptime {} > time limit {})",
                duration_str(self.container_time_total),
                duration_str(r.time)
            ));
        }
        if oom_killed || (r.memory > 0 && self.max_memory > r.memory) {
            msgs.push(format!(
                "Memory limit {} exceeded.",
                size_str(r.memory as f64)
            ));
        }
        if self.too_many_entries {
            // Its disk use is not known (it counts as over a disk limit: nothing is uploaded).
            msgs.push(too_many_entries_text());
        } else if self.over_disk_limit() {
            msgs.push(format!("Disk limit {}b exceeded.", size_str(r.disk as f64)));
        }
        msgs
    }

    /// Over its disk limit (or not measurable while it has one): such a run's contents are not
    /// uploaded, so that it cannot charge its owner more disk than the limit allowed.
    pub fn over_disk_limit(&self) -> bool {
        let disk = self.resources.disk;
        disk > 0 && (self.disk_utilization > disk || self.disk_unmeasurable)
    }

    /// The entry reported in every checkin.
    pub fn report(&self, worker_id: &str) -> RunReport {
        let mut stats = Map::new();
        for key in PROFILE_STAGES {
            let t = self.profile.get(key).copied().unwrap_or_default();
            stats.insert(
                key.to_owned(),
                serde_json::json!({"start": t.start, "end": t.end, "elapsed": t.elapsed}),
            );
        }
        RunReport {
            uuid: self.bundle.uuid.clone(),
            run_status: self.run_status.clone(),
            bundle_start_time: self.bundle_start_time,
            container_time_total: self.container_time_total,
            container_time_user: self.container_time_user,
            container_time_system: self.container_time_system,
            docker_image: self.docker_image.clone(),
            state: self.stage.server_state().to_owned(),
            remote: worker_id.to_owned(),
            exitcode: self.exitcode,
            failure_message: self.failure_message.clone(),
            bundle_profile_stats: stats,
            cpu_usage: self.cpu_usage,
            memory_usage: self.memory_usage,
            disk_utilization: if self.contents_discarded {
                0
            } else {
                self.disk_utilization
            },
        }
    }

    /// Gives an accepted run back to the server without running it (reported as `staged`).
    pub fn hand_back(&mut self, now: f64) {
        self.is_restaged = true;
        self.run_status = "Restaged.".into();
        self.enter(Stage::Restaged, now);
    }

    fn kill(&mut self, message: String) {
        self.is_killed = true;
        self.kill_message = Some(match self.kill_message.take() {
            Some(prev) if !prev.is_empty() && prev != message => format!("{prev} {message}"),
            _ => message,
        });
    }

    fn finalize(&mut self, now: f64) -> Vec<Effect> {
        if self.is_killed {
            let kill = self.kill_message.clone().unwrap_or_default();
            self.failure_message = Some(match self.failure_message.take() {
                Some(f) if !f.is_empty() => format!("{f}. {kill}"),
                _ => kill,
            });
        }
        self.run_status = "Finalizing bundle.".into();
        self.enter(Stage::Finalizing, now);
        vec![Effect::CheckinSoon]
    }

    /// Whether a write came after the upload began and may be uploaded again (then counted).
    fn take_pending_write(&mut self) -> bool {
        let again = self.write_pending && self.reuploads < MAX_REUPLOADS;
        self.write_pending = false;
        if again {
            self.reuploads += 1;
        }
        again
    }

    fn finish(&mut self, now: f64) -> Vec<Effect> {
        self.run_status = "Finished".into();
        self.enter(Stage::Finished, now);
        vec![Effect::DeleteLocalData]
    }

    fn after_cleanup(&mut self, now: f64) -> Vec<Effect> {
        if self.is_restaged {
            self.run_status = "Restaged.".into();
            self.enter(Stage::Restaged, now);
            return vec![Effect::CheckinSoon];
        }
        if self.has_contents && self.over_disk_limit() {
            self.contents_discarded = true;
        } else if self.has_contents {
            self.run_status = "Uploading results.".into();
            self.enter(Stage::UploadingResults, now);
            return vec![Effect::Upload, Effect::CheckinSoon];
        }
        self.finalize(now)
    }

    fn enter_cleaning_up(&mut self, now: f64) -> Vec<Effect> {
        self.run_status = "Cleaning up.".into();
        self.enter(Stage::CleaningUp, now);
        vec![Effect::CleanUp, Effect::CheckinSoon]
    }
}

/// Applies `event` to `state` and returns what the I/O layer must do.
pub fn step(state: &mut RunState, event: Event, now: f64) -> Vec<Effect> {
    use Stage::*;
    match (state.stage, event) {
        (Preparing, Event::Accepted) => vec![Effect::Prepare, Effect::CheckinSoon],
        (Preparing | UploadingResults, Event::Status(s)) => {
            state.run_status = s;
            vec![]
        }
        (_, Event::Status(_)) => vec![],
        (Preparing, Event::Mounted(paths)) => {
            for p in paths {
                if !state.paths_to_remove.contains(&p) {
                    state.paths_to_remove.push(p);
                }
            }
            vec![]
        }
        (
            Preparing,
            Event::ContainerStarted {
                container_id,
                docker_image,
                cpuset,
                gpuset,
            },
        ) => {
            state.container_id = Some(container_id);
            state.docker_image = Some(docker_image);
            state.cpuset = cpuset;
            state.gpuset = gpuset;
            state.has_contents = true;
            state.run_status = "Running job in container.".into();
            state.enter(Running, now);
            let mut effects = vec![Effect::Monitor, Effect::CheckinSoon];
            if state.is_killed || state.is_restaged {
                effects.push(Effect::KillContainer);
            }
            effects
        }
        (Preparing, Event::PrepareFailed(msg)) => {
            if !(state.is_killed || state.is_restaged) {
                state.failure_message = Some(msg);
            }
            state.enter_cleaning_up(now)
        }
        (Running, Event::Stats(st)) => {
            state.container_time_total = st.time_total;
            state.container_time_user = st.time_user;
            state.container_time_system = st.time_system;
            state.cpu_usage = st.cpu_usage;
            state.memory_usage = st.memory_usage;
            state.max_memory = state.max_memory.max(st.memory_bytes);
            state.too_many_entries |= st.too_many_entries;
            if st.disk_unmeasurable {
                state.disk_unmeasurable = true;
            } else if let Some(d) = st.disk_bytes {
                state.disk_utilization = d;
                state.disk_unmeasurable = false;
            }
            if state.is_killed || state.is_restaged {
                return vec![];
            }
            let msgs = state.limit_violations(false);
            if msgs.is_empty() {
                return vec![];
            }
            state.kill(msgs.join(" "));
            vec![Effect::KillContainer]
        }
        (
            Running,
            Event::ContainerExited {
                exitcode,
                oom_killed,
                failure,
            },
        ) => {
            if !(state.is_killed || state.is_restaged) {
                state.exitcode = exitcode;
                state.failure_message = failure;
                let msgs = state.limit_violations(oom_killed);
                if !msgs.is_empty() {
                    state.kill(msgs.join(" "));
                }
            }
            state.enter_cleaning_up(now)
        }
        (CleaningUp, Event::CleanedUp) => state.after_cleanup(now),
        (UploadingResults, Event::Written) => {
            state.write_pending = true;
            vec![]
        }
        (UploadingResults, Event::UploadFinished(Ok(()))) if state.take_pending_write() => {
            vec![Effect::Upload]
        }
        // A write the server accepted while it had not finalized the bundle yet (it accepts
        // them in `finalizing` too): the results go up again before the local copy goes.
        (Finalizing, Event::Written) => {
            if state.uploading {
                state.write_pending = true;
                vec![]
            } else if state.reuploads < MAX_REUPLOADS && state.has_contents {
                state.reuploads += 1;
                state.uploading = true;
                vec![Effect::Upload]
            } else {
                vec![]
            }
        }
        (Finalizing, Event::UploadFinished(result)) if state.uploading => {
            state.uploading = false;
            if let Err(e) = result {
                tracing::warn!(
                    "{}: the upload after a late write failed ({e}); the server keeps the \
                     earlier upload",
                    state.uuid()
                );
            }
            if state.take_pending_write() {
                state.uploading = true;
                return vec![Effect::Upload];
            }
            if state.finalized {
                return state.finish(now);
            }
            vec![]
        }
        (UploadingResults, Event::UploadFinished(result)) => {
            if let Err(e) = result {
                let msg = format!("Error while uploading: {e}");
                state.failure_message = Some(match state.failure_message.take() {
                    Some(f) if !f.is_empty() => format!("{f}. {msg}"),
                    _ => msg,
                });
                // The server holds none of its results (it refused them: over its owner's disk
                // quota, say): it reports no disk use from now on, so that the server takes
                // back what the earlier reports charged its owner.
                state.contents_discarded = true;
            }
            state.finalize(now)
        }
        // A kill is recorded in every stage before finalizing; what it stops depends on the stage.
        (Preparing, Event::KillRequested(msg)) => {
            let first = !state.is_killed;
            state.kill(msg);
            if first {
                vec![Effect::CancelPrepare, Effect::CheckinSoon]
            } else {
                vec![]
            }
        }
        (Running, Event::KillRequested(msg)) => {
            state.kill(msg);
            vec![Effect::KillContainer, Effect::CheckinSoon]
        }
        (CleaningUp | UploadingResults, Event::KillRequested(msg)) => {
            // The upload goes on: partial results stay readable, and the run ends killed.
            state.kill(msg);
            vec![]
        }
        (Preparing, Event::Restage) if !state.is_restaged => {
            state.is_restaged = true;
            vec![Effect::CancelPrepare]
        }
        (Running, Event::Restage) if !state.is_restaged => {
            state.is_restaged = true;
            vec![Effect::KillContainer]
        }
        (CleaningUp, Event::Restage) => {
            state.is_restaged = true;
            vec![]
        }
        (UploadingResults, Event::Restage) => {
            state.is_restaged = true;
            state.run_status = "Restaged.".into();
            state.enter(Restaged, now);
            vec![Effect::CancelUpload, Effect::CheckinSoon]
        }
        (Finalizing, Event::MarkFinalized) => {
            state.finalized = true;
            if state.uploading {
                // The local copy stays until the repeated upload is over.
                return vec![];
            }
            state.finish(now)
        }
        // Anything else (late stats, a second kill after finalizing, a restage of a finished run,
        // mark_finalized before finalizing) changes nothing.
        _ => vec![],
    }
}

#[cfg(test)]
mod tests;

/// Paths in the worker's state file: a UTF-8 path as a string (as every earlier version wrote
/// them), any other as the array of its bytes; both read back exactly.
mod path_bytes {
    use std::ffi::OsString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::PathBuf;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Stored {
        Text(String),
        Bytes(Vec<u8>),
    }

    pub fn serialize<S: Serializer>(paths: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
        let stored: Vec<Stored> = paths
            .iter()
            .map(|p| match p.to_str() {
                Some(t) => Stored::Text(t.to_owned()),
                None => Stored::Bytes(p.as_os_str().as_bytes().to_vec()),
            })
            .collect();
        stored.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
        Ok(Vec::<Stored>::deserialize(d)?
            .into_iter()
            .map(|s| match s {
                Stored::Text(t) => PathBuf::from(t),
                Stored::Bytes(b) => PathBuf::from(OsString::from_vec(b)),
            })
            .collect())
    }

    #[cfg(test)]
    #[test]
    fn paths_that_are_not_utf8_are_kept_exactly() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct S(#[serde(with = "super::path_bytes")] Vec<PathBuf>);
        let paths = S(vec![
            PathBuf::from("/w/runs/0x1/d"),
            PathBuf::from(OsString::from_vec(b"/w/runs/0x1/x\xff".to_vec())),
        ]);
        let text = serde_json::to_string(&paths).unwrap();
        assert_eq!(
            text,
            r#"["/w/runs/0x1/d",[47,119,47,114,117,110,115,47,48,120,49,47,120,255]]"#
        );
        assert_eq!(serde_json::from_str::<S>(&text).unwrap(), paths);
    }
}
