//! The cache's shared state and the pure rules that change it: joining a download, polling it,
//! finishing it, eviction, the workers seen. No I/O here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::format::size_str;

use super::{
    cache_name, DepKey, DOWNLOAD_STALL_SECS, FAILURE_COOLDOWN_SECS, MAX_REPORTED_JSON,
    ORPHAN_GRACE_SECS, STATE_FORMAT, WORKER_TIMEOUT_SECS,
};

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub(super) enum Stage {
    Downloading,
    Ready,
    Failed,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Downloader {
    pub(super) worker_id: String,
    pub(super) instance: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Dependent {
    pub(super) worker_id: String,
    pub(super) run_uuid: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(super) struct Entry {
    pub(super) parent_uuid: String,
    pub(super) parent_path: String,
    pub(super) name: String,
    pub(super) stage: Stage,
    #[serde(default)]
    pub(super) size_bytes: u64,
    pub(super) last_used: f64,
    #[serde(default)]
    pub(super) dependents: Vec<Dependent>,
    #[serde(default)]
    pub(super) downloading_by: Option<Downloader>,
    pub(super) heartbeat: f64,
    #[serde(default)]
    pub(super) message: String,
}

impl Entry {
    pub(super) fn matches(&self, key: &DepKey) -> bool {
        self.parent_uuid == key.0 && self.parent_path == key.1
    }

    pub(super) fn key(&self) -> DepKey {
        (self.parent_uuid.clone(), self.parent_path.clone())
    }

    pub(super) fn has_dependent(&self, worker: &str, run: &str) -> bool {
        self.dependents
            .iter()
            .any(|d| d.worker_id == worker && d.run_uuid == run)
    }

    pub(super) fn add_dependent(&mut self, worker: &str, run: &str) {
        if !self.has_dependent(worker, run) {
            self.dependents.push(Dependent {
                worker_id: worker.to_owned(),
                run_uuid: run.to_owned(),
            });
        }
    }

    pub(super) fn owned_by(&self, instance: &str) -> bool {
        self.downloading_by
            .as_ref()
            .is_some_and(|d| d.instance == instance)
    }

    pub(super) fn stalled(&self, now: f64) -> bool {
        now - self.heartbeat > DOWNLOAD_STALL_SECS
    }

    pub(super) fn claim(&mut self, me: &Me, now: f64) {
        self.stage = Stage::Downloading;
        self.downloading_by = Some(Downloader {
            worker_id: me.worker_id.clone(),
            instance: me.instance.clone(),
        });
        self.heartbeat = now;
        self.size_bytes = 0;
        self.message = "Downloading dependency".into();
    }
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(super) struct WorkerSeen {
    pub(super) instance: String,
    pub(super) seen: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(super) struct Orphan {
    pub(super) name: String,
    pub(super) since: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(super) struct State {
    pub(super) format: String,
    #[serde(default)]
    pub(super) entries: Vec<Entry>,
    #[serde(default)]
    pub(super) workers: BTreeMap<String, WorkerSeen>,
    #[serde(default)]
    pub(super) orphans: Vec<Orphan>,
}

impl Default for State {
    fn default() -> Self {
        State {
            format: STATE_FORMAT.into(),
            entries: Vec::new(),
            workers: BTreeMap::new(),
            orphans: Vec::new(),
        }
    }
}

/// This process: the worker id and an id unique to the process.
#[derive(Clone, Debug)]
pub(super) struct Me {
    pub(super) worker_id: String,
    pub(super) instance: String,
}

/// What `acquire` should do after registering its run.
#[derive(Debug, PartialEq)]
pub(super) enum Join {
    /// On disk, usable: its name and size in bytes.
    Ready(String, u64),
    /// Claimed by this process: start the download.
    Download(String),
    /// Another download is under way.
    Wait(String),
}

/// A waiter's view of an entry.
#[derive(Debug, PartialEq)]
pub(super) enum Poll {
    /// On disk, usable: its name and size in bytes.
    Ready(String, u64),
    Failed(String),
    Downloading {
        bytes: u64,
        stalled: bool,
    },
    /// The entry or the run's registration is gone, or its downloader in this process ended:
    /// join again.
    Rejoin,
}

impl State {
    pub(super) fn find(&self, key: &DepKey) -> Option<usize> {
        self.entries.iter().position(|e| e.matches(key))
    }

    pub(super) fn name_known(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.name == name) || self.orphans.iter().any(|o| o.name == name)
    }

    pub(super) fn allocate_name(&self, key: &DepKey, on_disk: &dyn Fn(&str) -> bool) -> String {
        let mut name = cache_name(key);
        while self.name_known(&name) || on_disk(&name) {
            name.push('_');
        }
        name
    }

    pub(super) fn touch_worker(&mut self, me: &Me, now: f64) {
        self.workers.insert(
            me.worker_id.clone(),
            WorkerSeen {
                instance: me.instance.clone(),
                seen: now,
            },
        );
    }

    /// Registers `run` as a dependent of `key` and says what to do next. `local_task`: this
    /// process has a download task for `key`.
    pub(super) fn join(
        &mut self,
        key: &DepKey,
        me: &Me,
        run: &str,
        now: f64,
        local_task: bool,
        on_disk: &dyn Fn(&str) -> bool,
    ) -> Join {
        let Some(i) = self.find(key) else {
            let name = self.allocate_name(key, on_disk);
            let mut e = Entry {
                parent_uuid: key.0.clone(),
                parent_path: key.1.clone(),
                name: name.clone(),
                stage: Stage::Downloading,
                size_bytes: 0,
                last_used: now,
                dependents: Vec::new(),
                downloading_by: None,
                heartbeat: now,
                message: String::new(),
            };
            e.claim(me, now);
            e.add_dependent(&me.worker_id, run);
            self.entries.push(e);
            return Join::Download(name);
        };
        let e = &mut self.entries[i];
        e.add_dependent(&me.worker_id, run);
        e.last_used = now;
        let name = e.name.clone();
        let take = match e.stage {
            Stage::Ready => !on_disk(&name),
            Stage::Failed => true,
            Stage::Downloading => {
                if e.owned_by(&me.instance) {
                    !local_task
                } else {
                    e.downloading_by.is_none() || e.stalled(now)
                }
            }
        };
        if take {
            e.claim(me, now);
            Join::Download(name)
        } else if e.stage == Stage::Ready {
            Join::Ready(name, e.size_bytes)
        } else {
            Join::Wait(name)
        }
    }

    pub(super) fn poll(
        &self,
        key: &DepKey,
        me: &Me,
        run: &str,
        now: f64,
        local_task: bool,
    ) -> Poll {
        let Some(e) = self.find(key).map(|i| &self.entries[i]) else {
            return Poll::Rejoin;
        };
        if !e.has_dependent(&me.worker_id, run) {
            return Poll::Rejoin;
        }
        match e.stage {
            Stage::Ready => Poll::Ready(e.name.clone(), e.size_bytes),
            Stage::Failed => Poll::Failed(e.message.clone()),
            Stage::Downloading if e.owned_by(&me.instance) && !local_task => Poll::Rejoin,
            Stage::Downloading => Poll::Downloading {
                bytes: e.size_bytes,
                stalled: e.downloading_by.is_none() || e.stalled(now),
            },
        }
    }

    pub(super) fn owns(&self, key: &DepKey, me: &Me) -> bool {
        self.find(key).is_some_and(|i| {
            let e = &self.entries[i];
            e.stage == Stage::Downloading && e.owned_by(&me.instance)
        })
    }

    /// Download progress. `false` if the download is no longer ours.
    pub(super) fn heartbeat(&mut self, key: &DepKey, me: &Me, bytes: u64, now: f64) -> bool {
        if !self.owns(key, me) {
            return false;
        }
        let i = self.find(key).expect("owned");
        let e = &mut self.entries[i];
        e.heartbeat = now;
        e.size_bytes = bytes;
        e.message = format!(
            "Downloading dependency: {} downloaded",
            size_str(bytes as f64)
        );
        true
    }

    /// The end of our download: `Ok(bytes on disk)` or the failure message. `false` (and no
    /// change) if the download is no longer ours.
    pub(super) fn complete(
        &mut self,
        key: &DepKey,
        me: &Me,
        outcome: Result<u64, String>,
        now: f64,
    ) -> bool {
        if !self.owns(key, me) {
            return false;
        }
        let i = self.find(key).expect("owned");
        let e = &mut self.entries[i];
        e.heartbeat = now;
        match outcome {
            Ok(size) => {
                e.stage = Stage::Ready;
                e.size_bytes = size;
                e.last_used = now;
                e.message = "Download complete".into();
            }
            Err(msg) => {
                e.stage = Stage::Failed;
                e.size_bytes = 0;
                e.message = msg;
            }
        }
        true
    }

    pub(super) fn release(&mut self, key: &DepKey, worker: &str, run: &str, now: f64) {
        if let Some(i) = self.find(key) {
            let e = &mut self.entries[i];
            let before = e.dependents.len();
            e.dependents
                .retain(|d| !(d.worker_id == worker && d.run_uuid == run));
            if e.dependents.len() != before {
                e.last_used = now;
            }
        }
    }

    /// Makes this worker's dependents match the runs of this process: adds the missing ones
    /// (claiming back orphans by name) and, unless `keep_unclaimed` (just after a start, while
    /// resumed runs claim theirs again), drops the ones no run of this process holds.
    pub(super) fn reconcile(&mut self, me: &Me, active: &[Active], now: f64, keep_unclaimed: bool) {
        self.touch_worker(me, now);
        if !keep_unclaimed {
            for e in &mut self.entries {
                let key = e.key();
                e.dependents.retain(|d| {
                    d.worker_id != me.worker_id
                        || active.iter().any(|a| a.run == d.run_uuid && a.key == key)
                });
            }
        }
        for a in active {
            if let Some(i) = self.find(&a.key) {
                let e = &mut self.entries[i];
                // Only runs that got the entry ready are re-added; the others join themselves.
                if a.name.as_deref() == Some(e.name.as_str()) {
                    e.add_dependent(&me.worker_id, &a.run);
                }
            } else if let Some(name) = &a.name {
                if let Some(o) = self.orphans.iter().position(|o| &o.name == name) {
                    self.orphans.remove(o);
                    tracing::warn!("claiming back {name} for run {} after a state loss", a.run);
                    self.entries.push(Entry {
                        parent_uuid: a.key.0.clone(),
                        parent_path: a.key.1.clone(),
                        name: name.clone(),
                        stage: Stage::Ready,
                        size_bytes: 0,
                        last_used: now,
                        dependents: vec![Dependent {
                            worker_id: me.worker_id.clone(),
                            run_uuid: a.run.clone(),
                        }],
                        downloading_by: None,
                        heartbeat: now,
                        message: "Recovered after a state loss".into(),
                    });
                }
            }
        }
    }

    /// At a start: downloads of an earlier process with this worker id are dead.
    pub(super) fn forget_predecessor_downloads(&mut self, me: &Me) {
        for e in &mut self.entries {
            if e.stage == Stage::Downloading
                && e.downloading_by
                    .as_ref()
                    .is_some_and(|d| d.worker_id == me.worker_id && d.instance != me.instance)
            {
                e.heartbeat = 0.0;
            }
        }
    }

    pub(super) fn total_size(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.stage != Stage::Failed)
            .map(|e| e.size_bytes)
            .sum()
    }

    /// Drops what is no longer needed and evicts least recently used entries while the cache is
    /// over `max_size`. Returns the names whose files must be deleted.
    pub(super) fn cleanup(&mut self, now: f64, max_size: u64) -> Vec<String> {
        let live = |w: &str, workers: &BTreeMap<String, WorkerSeen>| {
            workers
                .get(w)
                .is_some_and(|s| now - s.seen <= WORKER_TIMEOUT_SECS)
        };
        for e in &mut self.entries {
            let workers = &self.workers;
            e.dependents.retain(|d| live(&d.worker_id, workers));
        }
        self.workers
            .retain(|_, s| now - s.seen <= WORKER_TIMEOUT_SECS);
        let mut doomed = Vec::new();
        self.entries.retain(|e| {
            let drop = match e.stage {
                Stage::Failed => now - e.heartbeat > FAILURE_COOLDOWN_SECS,
                Stage::Downloading => e.dependents.is_empty() && e.stalled(now),
                Stage::Ready => false,
            };
            if drop {
                doomed.push(e.name.clone());
            }
            !drop
        });
        self.orphans.retain(|o| {
            let drop = now - o.since > ORPHAN_GRACE_SECS;
            if drop {
                doomed.push(o.name.clone());
            }
            !drop
        });
        let mut total = self.total_size();
        while total > max_size {
            let victim = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.stage == Stage::Ready && e.dependents.is_empty())
                .min_by(|a, b| a.1.last_used.total_cmp(&b.1.last_used))
                .map(|(i, _)| i);
            let Some(i) = victim else { break };
            let e = self.entries.remove(i);
            tracing::info!(
                "evicting dependency {}/{} ({}): the cache holds {} > {}",
                e.parent_uuid,
                e.parent_path,
                size_str(e.size_bytes as f64),
                size_str(total as f64),
                size_str(max_size as f64)
            );
            total -= e.size_bytes;
            doomed.push(e.name);
        }
        doomed
    }

    /// The keys reported in checkins (ready or downloading, most recently used first), as many
    /// as fit the server's column.
    pub(super) fn reported_keys(&self) -> Vec<DepKey> {
        let mut usable: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.stage != Stage::Failed)
            .collect();
        usable.sort_by(|a, b| b.last_used.total_cmp(&a.last_used));
        let mut len = 2;
        let mut keys = Vec::new();
        for e in usable {
            len += e.parent_uuid.len() + e.parent_path.len() + 10;
            if len > MAX_REPORTED_JSON {
                break;
            }
            keys.push(e.key());
        }
        keys
    }
}

/// A run of this process that acquired (or is acquiring) a dependency; `name` once it is ready.
#[derive(Clone, Debug)]
pub(super) struct Active {
    pub(super) run: String,
    pub(super) key: DepKey,
    pub(super) name: Option<String>,
}
