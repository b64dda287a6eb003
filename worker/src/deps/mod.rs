//! The dependency cache: parent bundles (or paths inside them) downloaded into
//! `<work_dir>/dependencies/` for the runs that need them. Several workers (processes, possibly
//! on different hosts over NFS) may share one work dir, and therefore one cache.
//!
//! # Layout
//! ```text
//! <work_dir>/
//!   dependencies/<name>                      one file or directory per dependency
//!   dependencies/.partial.<name>.<instance>  a download in progress (renamed to <name> when done)
//!   dependencies/.trash.<name>.<instance>.<n>  an evicted entry being deleted
//!   dependencies-state.json                  the shared state (below)
//!   dependencies-state.json.bak              the previous version of the state
//!   dependencies-lock/state.lock             the lock (a hard link to its holder's claim file)
//!   dependencies-lock/state.lock.claim.<instance>.<n>   claim files
//! ```
//! `<name>` is `parent_uuid`, or `parent_uuid_parent_path` with every `/` replaced by `_`, with
//! `_` appended until it is unique among the state's names and the files on disk.
//!
//! # State (`dependencies-state.json`)
//! ```json
//! {"format": "cl-worker-deps/1",
//!  "entries": [{"parent_uuid": "0x…", "parent_path": "data", "name": "0x…_data",
//!               "stage": "downloading" | "ready" | "failed",
//!               "size_bytes": 123,          // bytes on disk when ready; bytes received so far
//!               "last_used": 1700000000.5,  // unix seconds: last acquire or release
//!               "dependents": [{"worker_id": "w1", "run_uuid": "0x…"}],
//!               "downloading_by": {"worker_id": "w1", "instance": "host-123-9f3a…"} | null,
//!               "heartbeat": 1700000000.5,  // last download progress (or the failure time)
//!               "message": "…"}],
//!  "workers": {"w1": {"instance": "host-123-9f3a…", "seen": 1700000000.5}},
//!  "orphans": [{"name": "…", "since": 1700000000.5}]}
//! ```
//! Every change is a read-modify-write of the whole file under the lock; the file is replaced
//! atomically (temp file, fsync, rename), so it can be *read* without the lock: waiters poll it
//! lock-free. Times are wall-clock seconds, so the hosts sharing a cache need roughly
//! synchronised clocks (well within the 60 s lock lease).
//!
//! # Lock (`common::lock`)
//! fcntl/flock locks depend on the NFS lock manager (absent with `nolock` mounts, lost on
//! server reboots, flock emulated over NLM on NFSv3), so they are not used. The lock is the
//! classic NFS-safe protocol (as in flufl.lock): write a unique claim file, `link()` it to
//! `state.lock`; the lock is ours if the link succeeds or the claim's link count became 2 (a
//! retransmitted `link` can report EEXIST although it worked). A lock whose holder is dead
//! (same boot id and pid namespace, and its pid does not exist) or older than the lease (60 s;
//! critical sections take milliseconds) is broken by renaming it away and checking that the
//! renamed file is the stale one. Before replacing the state file, a holder checks that the lock
//! is still its own, so a holder that was frozen past its lease does not overwrite newer state.
//! On a file system that refuses hard links (EPERM/EOPNOTSUPP), the lock file is created with
//! `O_CREAT|O_EXCL` instead (atomic on NFSv3 and later).
//! The lock is never held during a download or a large deletion.
//!
//! # Flow
//! * `acquire` adds `(worker_id, run_uuid)` to the entry's dependents (creating the entry if
//!   needed). The first worker claims the download (`downloading_by` = worker id + a per-process
//!   instance id); the others wait, polling the state every 0.5 s. A claimed download without
//!   progress for 300 s (dead or stuck downloader) is taken over. A failed entry is retried by
//!   the next `acquire`; the runs waiting on the failed attempt fail with its message.
//! * Downloads go to `.partial.<name>.<instance>`, are measured (bytes on disk) and renamed into
//!   place under the lock, if the downloader still owns the entry.
//! * Eviction (after each download and release, and every 5 s): dependents of workers not seen
//!   for 10 min are dropped, failed entries are dropped after a 10 s cooldown, stalled
//!   downloads nobody waits for are dropped; then, while the sizes add up to more than
//!   `--max-work-dir-size`, the least recently used ready entry without dependents is deleted
//!   (renamed to `.trash.*` under the lock, deleted after it). Downloading entries and entries
//!   used by any worker's run are never evicted.
//! * A worker restarting with the same id resumes runs of its predecessor: dependents of its id
//!   that its runs do not claim again within 60 s of the start are dropped.
//! * Startup keeps the entries that are in the state and on disk and deletes files that are not
//!   in the state (temp files of live downloads excepted). An unreadable state file is moved
//!   aside (never deleted) and the `.bak` copy is used, or an empty state; unknown files are then
//!   adopted as "orphans" instead of deleted: a live worker whose run uses one claims it back,
//!   the others are deleted after 10 min.

mod fetch;
mod model;

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::lock::{random_hex, HostIdent, LinkLock, LockGuard};
use protocol::RestClient;

use crate::format::size_str;
use crate::metrics::Metrics;

use self::model::*;

/// `(parent_uuid, parent_path)`
pub type DepKey = (String, String);

/// The cache key of a run's dependency: its path normalised (`big`, `big/.`, `big/./` and
/// `./big` are one entry, downloaded once). A path that climbs out of its bundle is kept as
/// it is: the server refuses it.
pub fn dep_key(d: &protocol::DependencyInfo) -> DepKey {
    let path = crate::archive::normalize_relative(std::path::Path::new(&d.parent_path))
        .and_then(|p| p.to_str().map(str::to_owned))
        .unwrap_or_else(|| d.parent_path.clone());
    (d.parent_uuid.clone(), path)
}

const STATE_FILE: &str = "dependencies-state.json";
const STATE_FORMAT: &str = "cl-worker-deps/1";
const LOCK_DIR: &str = "dependencies-lock";
const LOCK_NAME: &str = "state.lock";
const LOCK_LEASE: Duration = Duration::from_secs(60);
/// A claimed download without progress for this long is taken over.
const DOWNLOAD_STALL_SECS: f64 = 300.0;
/// Failed entries are kept this long (so that waiters see the failure), then dropped.
const FAILURE_COOLDOWN_SECS: f64 = 10.0;
/// Dependents of a worker not seen for this long are dropped.
const WORKER_TIMEOUT_SECS: f64 = 600.0;
/// Unknown files adopted after a state recovery are deleted after this long unless claimed.
const ORPHAN_GRACE_SECS: f64 = 600.0;
/// After a start, dependents of this worker id not claimed by a (resumed) run are kept this long.
const RESUME_GRACE_SECS: f64 = 60.0;
const POLL: Duration = Duration::from_millis(500);
/// Waiters of one process share a read of the state for this long.
const SNAPSHOT_TTL: Duration = Duration::from_millis(250);
const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// How often `spawn_maintenance` evicts and tidies.
pub const MAINTENANCE_EVERY: Duration = Duration::from_secs(5);
/// The server stores the reported dependency list in a 64 KiB BLOB.
const MAX_REPORTED_JSON: usize = 60_000;
const PARTIAL: &str = ".partial.";
const TRASH: &str = ".trash.";

use common::now_unix as now;

/// Longest cache name made from a dependency's path: with `.partial.`/`.trash.` and a worker
/// instance around it, and `_`s added on a clash, it stays far below a file name's 255 bytes.
const MAX_CACHE_NAME: usize = 128;

/// The file name of a dependency in the cache: `parent_uuid` or `parent_uuid_parent_path`
/// with `/` replaced by `_`. The name is a mount source, so it must reach the engine exactly
/// (`runtime::carried_exactly`): a comma, a colon or a control character becomes `_` too. A name so
/// changed, or longer than [`MAX_CACHE_NAME`] bytes (a path with long components), is cut at
/// a character boundary and ends with a checksum of the whole path.
pub fn cache_name(key: &DepKey) -> String {
    let (uuid, path) = key;
    let path = path.trim_matches('/');
    if path.is_empty() {
        return uuid.clone();
    }
    let mut changed = false;
    let flat: String = path
        .chars()
        .map(|c| match c {
            '/' => '_',
            c if c == ',' || c == ':' || c.is_control() => {
                changed = true;
                '_'
            }
            c => c,
        })
        .collect();
    let name = format!("{uuid}_{flat}");
    if !changed && name.len() <= MAX_CACHE_NAME {
        return name;
    }
    let sum = format!("-{:08x}", crc32fast::hash(path.as_bytes()));
    let mut cut = name.len().min(MAX_CACHE_NAME - sum.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{sum}", &name[..cut])
}

// ---------------------------------------------------------------------------------------------
// The cache
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Local {
    /// `(run, key)` → the entry name once ready.
    active: HashMap<(String, DepKey), Option<String>>,
    /// Download tasks of this process, with their progress in bytes.
    downloading: HashMap<DepKey, Arc<AtomicU64>>,
    /// What `keys` reports, refreshed at every read of the state.
    keys: Vec<DepKey>,
    /// The state as last read by a waiter, shared by the waiters of this process for a moment.
    snapshot: Option<(Instant, Arc<State>)>,
}

struct Inner {
    client: RestClient,
    dir: PathBuf,
    state_path: PathBuf,
    lock: LinkLock,
    me: Me,
    max_attempts: u32,
    max_size: u64,
    metrics: Arc<Metrics>,
    started: f64,
    local: Mutex<Local>,
    /// Woken when a download of this process ends.
    done: tokio::sync::Notify,
    trash_seq: AtomicU64,
}

/// Per locked operation: files to delete once the lock is released, and whether the state
/// had to be rebuilt.
#[derive(Default)]
struct Ctx {
    trash: Vec<PathBuf>,
    recovered: bool,
}

pub struct Dependencies {
    inner: Arc<Inner>,
}

/// The periodic maintenance task; stopped when dropped.
pub struct Maintenance(tokio::task::JoinHandle<()>);

impl Drop for Maintenance {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("internal error: {e}"))
}

impl Dependencies {
    /// Opens (or creates) the cache in `dir` (`<work_dir>/dependencies`); the state and the lock
    /// live next to it. `worker_id` names this worker's runs in the shared state; `max_size` is
    /// `--max-work-dir-size`; `metrics` gets the cache's size, hits, misses, evictions and
    /// downloaded bytes.
    pub fn new(
        client: RestClient,
        dir: PathBuf,
        max_attempts: u32,
        worker_id: String,
        max_size: u64,
        metrics: Arc<Metrics>,
    ) -> io::Result<Arc<Self>> {
        fs::create_dir_all(&dir)?;
        let work_dir = dir
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from("."));
        let host = HostIdent::current().host;
        let host: String = host
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let instance = format!("{host}-{}-{}", std::process::id(), &random_hex()[..8]);
        let lock = LinkLock::new(&work_dir.join(LOCK_DIR), LOCK_NAME, &instance, LOCK_LEASE)?;
        let inner = Arc::new(Inner {
            client,
            state_path: work_dir.join(STATE_FILE),
            dir,
            lock,
            me: Me {
                worker_id,
                instance,
            },
            max_attempts: max_attempts.max(1),
            max_size,
            metrics,
            started: now(),
            local: Mutex::new(Local::default()),
            done: tokio::sync::Notify::new(),
            trash_seq: AtomicU64::new(0),
        });
        inner.startup()?;
        Ok(Arc::new(Dependencies { inner }))
    }

    /// Evicts and tidies every few seconds, until the returned guard is dropped or the runtime
    /// ends.
    pub fn spawn_maintenance(self: &Arc<Self>) -> Maintenance {
        let inner = self.inner.clone();
        Maintenance(tokio::spawn(async move {
            let mut tick = tokio::time::interval(MAINTENANCE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let i = inner.clone();
                match blocking(move || i.maintain()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!("dependency cache maintenance failed: {e}"),
                    Err(e) => tracing::warn!("dependency cache maintenance failed: {e}"),
                }
            }
        }))
    }

    /// `--max-work-dir-size`: the cache's size, and what one run's dependencies may total.
    pub fn max_size(&self) -> u64 {
        self.inner.max_size
    }

    /// The size the server records for a dependency ([`fetch::recorded`]), if it tells.
    pub async fn recorded_size(&self, key: &DepKey) -> Option<u64> {
        let info = self
            .inner
            .client
            .get_target_info(&key.0, &key.1)
            .await
            .ok()?;
        fetch::recorded(&self.inner.client, &key.0, &info).await
    }

    /// The dependencies of the shared cache (reported in checkins).
    pub fn keys(&self) -> Vec<DepKey> {
        self.inner.local().keys.clone()
    }

    /// Waits until the dependency is on disk for `run` and returns its path. `progress`
    /// receives status texts while it downloads.
    pub async fn acquire(
        self: &Arc<Self>,
        run: &str,
        key: &DepKey,
        progress: impl FnMut(String),
    ) -> Result<PathBuf, String> {
        self.acquire_sized(run, key, progress).await.map(|(p, _)| p)
    }

    /// As [`Self::acquire`], with the dependency's size in bytes (as the cache recorded it).
    pub async fn acquire_sized(
        self: &Arc<Self>,
        run: &str,
        key: &DepKey,
        mut progress: impl FnMut(String),
    ) -> Result<(PathBuf, u64), String> {
        let inner = &self.inner;
        inner
            .local()
            .active
            .insert((run.to_owned(), key.clone()), None);
        let mut need_join = true;
        let mut first_join = true;
        let mut last_msg = String::new();
        loop {
            if need_join {
                need_join = false;
                let (i, r, k) = (inner.clone(), run.to_owned(), key.clone());
                let handle = tokio::runtime::Handle::current();
                let joined = blocking(move || i.join(&r, &k, &handle))
                    .await?
                    .map_err(|e| format!("cannot update the dependency cache state: {e}"))?;
                if std::mem::take(&mut first_join) {
                    let counter = match joined {
                        Join::Ready(..) => &inner.metrics.dependency_cache_hits,
                        Join::Download(_) | Join::Wait(_) => &inner.metrics.dependency_cache_misses,
                    };
                    counter.inc();
                }
                match joined {
                    Join::Ready(name, bytes) => {
                        return Ok((inner.mark_ready(run, key, name), bytes))
                    }
                    Join::Download(_) => {}
                    Join::Wait(_) => {}
                }
            }
            let notified = inner.done.notified();
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = notified => {}
            }
            let (i, r, k) = (inner.clone(), run.to_owned(), key.clone());
            let (poll, local_bytes) = blocking(move || i.poll(&r, &k)).await?;
            match poll {
                Poll::Ready(name, bytes) => return Ok((inner.mark_ready(run, key, name), bytes)),
                Poll::Failed(msg) => return Err(msg),
                Poll::Rejoin => need_join = true,
                Poll::Downloading { bytes, stalled } => {
                    let msg = format!(
                        "Downloading dependency: {} downloaded",
                        size_str(local_bytes.unwrap_or(bytes) as f64)
                    );
                    if msg != last_msg {
                        progress(msg.clone());
                        last_msg = msg;
                    }
                    if stalled && local_bytes.is_none() {
                        tracing::warn!(
                            "the download of {}/{} made no progress for {}s; taking it over",
                            key.0,
                            key.1,
                            DOWNLOAD_STALL_SECS
                        );
                        need_join = true;
                    }
                }
            }
        }
    }

    /// The run no longer needs the dependency.
    pub fn release(&self, run: &str, key: &DepKey) {
        let was = self
            .inner
            .local()
            .active
            .remove(&(run.to_owned(), key.clone()))
            .is_some();
        if !was {
            return;
        }
        let inner = self.inner.clone();
        let (run, key) = (run.to_owned(), key.clone());
        let work = move || {
            let r = inner.with_state(|st, ctx| {
                st.release(&key, &inner.me.worker_id, &run, now());
                inner.evict(st, ctx);
            });
            if let Err(e) = r {
                tracing::warn!("cannot release dependency {}/{}: {e}", key.0, key.1);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => drop(h.spawn_blocking(work)),
            Err(_) => work(),
        }
    }
}

impl Inner {
    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn on_disk(&self, name: &str) -> bool {
        fs::symlink_metadata(self.dir.join(name)).is_ok()
    }

    fn mark_ready(&self, run: &str, key: &DepKey, name: String) -> PathBuf {
        if let Some(slot) = self.local().active.get_mut(&(run.to_owned(), key.clone())) {
            *slot = Some(name.clone());
        }
        self.dir.join(name)
    }

    fn active_snapshot(&self) -> Vec<Active> {
        self.local()
            .active
            .iter()
            .map(|((run, key), name)| Active {
                run: run.clone(),
                key: key.clone(),
                name: name.clone(),
            })
            .collect()
    }

    /// Reads the state file without the lock. `Ok(None)` if there is none.
    fn read_state(path: &Path) -> io::Result<Option<State>> {
        let mut tries = 0;
        let data = loop {
            match fs::read(path) {
                Ok(d) => break d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                // ESTALE: the file was replaced under an NFS client's cached handle.
                Err(e) if e.raw_os_error() == Some(libc_estale()) && tries < 5 => tries += 1,
                Err(e) => return Err(e),
            }
        };
        let st: State = serde_json::from_slice(&data)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if st.format != STATE_FORMAT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown format {:?}", st.format),
            ));
        }
        Ok(Some(st))
    }

    fn bak_path(&self) -> PathBuf {
        self.state_path.with_file_name(format!("{STATE_FILE}.bak"))
    }

    /// Under the lock: the state, rebuilt from the backup (or empty) if the file is unreadable.
    fn load_locked(&self, ctx: &mut Ctx) -> State {
        match Self::read_state(&self.state_path) {
            Ok(Some(st)) => st,
            Ok(None) => State::default(),
            Err(e) => {
                let aside = self
                    .state_path
                    .with_file_name(format!("{STATE_FILE}.unreadable-{}", now() as u64));
                let moved = fs::rename(&self.state_path, &aside).is_ok();
                let from_bak = Self::read_state(&self.bak_path()).ok().flatten();
                tracing::error!(
                    "the dependency cache state {} cannot be read ({e}); {}; rebuilding it from {}. \
                     Files in {} that no run claims within {}s will be deleted.",
                    self.state_path.display(),
                    if moved {
                        format!("it was moved to {}", aside.display())
                    } else {
                        "it could not be moved aside".to_owned()
                    },
                    if from_bak.is_some() {
                        "its backup"
                    } else {
                        "nothing"
                    },
                    self.dir.display(),
                    ORPHAN_GRACE_SECS
                );
                ctx.recovered = true;
                from_bak.unwrap_or_default()
            }
        }
    }

    fn write_state(&self, st: &State, guard: &LockGuard) -> io::Result<()> {
        let data = serde_json::to_vec(st).map_err(io::Error::other)?;
        let tmp = self
            .state_path
            .with_file_name(format!("{STATE_FILE}.tmp.{}", self.me.instance));
        {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&data)?;
            f.sync_all()?;
        }
        // Keep the previous version: it is what an unreadable state is rebuilt from.
        let bak_tmp = self
            .state_path
            .with_file_name(format!("{STATE_FILE}.bak.{}", self.me.instance));
        let _ = fs::remove_file(&bak_tmp);
        if fs::hard_link(&self.state_path, &bak_tmp).is_ok() {
            let _ = fs::rename(&bak_tmp, self.bak_path());
        }
        if !guard.still_held() {
            let _ = fs::remove_file(&tmp);
            return Err(io::Error::other(
                "lost the dependency cache lock (held past its lease)",
            ));
        }
        fs::rename(&tmp, &self.state_path)?;
        if let Some(parent) = self.state_path.parent() {
            if let Ok(d) = fs::File::open(parent) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    /// Runs `f` on the state under the lock and writes the result; deletes `ctx.trash` after
    /// releasing the lock.
    fn with_state<T>(&self, f: impl FnOnce(&mut State, &mut Ctx) -> T) -> io::Result<T> {
        let mut ctx = Ctx::default();
        let result = (|| {
            let guard = self.lock.acquire(LOCK_LEASE * 3)?;
            let mut st = self.load_locked(&mut ctx);
            st.touch_worker(&self.me, now());
            let out = f(&mut st, &mut ctx);
            self.write_state(&st, &guard)?;
            drop(guard);
            let mut local = self.local();
            local.keys = st.reported_keys();
            local.snapshot = None;
            Ok(out)
        })();
        for p in ctx.trash {
            force_remove(&p);
        }
        result
    }

    /// Under the lock: moves `name` out of the way, to be deleted after the lock is released.
    fn to_trash(&self, name: &str, ctx: &mut Ctx) {
        let n = self.trash_seq.fetch_add(1, Ordering::Relaxed);
        let src = self.dir.join(name);
        let dst = self
            .dir
            .join(format!("{TRASH}{name}.{}.{n}", self.me.instance));
        match fs::rename(&src, &dst) {
            Ok(()) => ctx.trash.push(dst),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!("cannot move {} aside: {e}", src.display());
                ctx.trash.push(src);
            }
        }
    }

    fn evict(&self, st: &mut State, ctx: &mut Ctx) {
        for name in st.cleanup(now(), self.max_size) {
            self.to_trash(&name, ctx);
            self.metrics.dependency_cache_evictions.inc();
        }
        self.metrics
            .dependency_cache_bytes
            .set(i64::try_from(st.total_size()).unwrap_or(i64::MAX));
    }

    /// Under the lock: deletes temp files of dead downloads and leftovers; files that the state
    /// does not know are deleted (`delete_unknown`) or adopted as orphans.
    fn tidy_dir(&self, st: &mut State, now: f64, delete_unknown: bool, ctx: &mut Ctx) {
        let Ok(list) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in list.flatten() {
            let fname = e.file_name();
            let Some(name) = fname.to_str() else {
                tracing::warn!("deleting {:?} from the dependency cache", e.path());
                ctx.trash.push(e.path());
                continue;
            };
            if name.starts_with(TRASH) {
                // Left by an interrupted deletion (deleting it twice is harmless).
                ctx.trash.push(e.path());
            } else if let Some(rest) = name.strip_prefix(PARTIAL) {
                let live = rest.rsplit_once('.').is_some_and(|(dep, instance)| {
                    st.entries.iter().any(|x| {
                        x.name == dep
                            && x.stage == Stage::Downloading
                            && x.owned_by(instance)
                            && !x.stalled(now)
                    })
                });
                if !live {
                    tracing::info!("deleting the abandoned download {name}");
                    self.to_trash(name, ctx);
                }
            } else if name.starts_with('.') || st.name_known(name) {
            } else if delete_unknown {
                tracing::info!("deleting {name} from the dependency cache: not in its state");
                self.to_trash(name, ctx);
            } else {
                tracing::warn!(
                    "{name} in the dependency cache is not in its state; deleting it in {}s \
                     unless a run claims it",
                    ORPHAN_GRACE_SECS
                );
                st.orphans.push(Orphan {
                    name: name.to_owned(),
                    since: now,
                });
            }
        }
    }

    fn startup(&self) -> io::Result<()> {
        self.with_state(|st, ctx| {
            let now = now();
            st.forget_predecessor_downloads(&self.me);
            st.entries.retain(|e| {
                let keep = e.stage != Stage::Ready || self.on_disk(&e.name);
                if !keep {
                    tracing::warn!(
                        "dependency {}/{} is missing from {}; forgetting it",
                        e.parent_uuid,
                        e.parent_path,
                        self.dir.display()
                    );
                }
                keep
            });
            let recovered = ctx.recovered;
            self.tidy_dir(st, now, !recovered, ctx);
            self.evict(st, ctx);
            let ready = st
                .entries
                .iter()
                .filter(|e| e.stage == Stage::Ready)
                .count();
            tracing::info!(
                "dependency cache {}: {ready} ready, {} in all ({}), limit {}",
                self.dir.display(),
                st.entries.len(),
                size_str(st.total_size() as f64),
                size_str(self.max_size as f64)
            );
        })?;
        self.lock.sweep();
        Ok(())
    }

    fn maintain(&self) -> io::Result<()> {
        self.with_state(|st, ctx| {
            let now = now();
            let active = self.active_snapshot();
            st.reconcile(
                &self.me,
                &active,
                now,
                now - self.started < RESUME_GRACE_SECS,
            );
            self.tidy_dir(st, now, false, ctx);
            self.evict(st, ctx);
        })?;
        self.lock.sweep();
        Ok(())
    }

    /// Registers `run`; starts the download if this process claimed it.
    fn join(
        self: &Arc<Self>,
        run: &str,
        key: &DepKey,
        handle: &tokio::runtime::Handle,
    ) -> io::Result<Join> {
        self.with_state(|st, _| {
            let now = now();
            let local_task = self.local().downloading.contains_key(key);
            let j = st.join(key, &self.me, run, now, local_task, &|n| self.on_disk(n));
            match &j {
                Join::Download(name) => {
                    let progress = Arc::new(AtomicU64::new(0));
                    self.local()
                        .downloading
                        .insert(key.clone(), progress.clone());
                    handle.spawn(self.clone().download(key.clone(), name.clone(), progress));
                }
                Join::Wait(_) => {
                    if let Some(d) = st
                        .find(key)
                        .and_then(|i| st.entries[i].downloading_by.as_ref())
                        .filter(|d| d.instance != self.me.instance)
                    {
                        tracing::info!(
                            "dependency {}/{} is being downloaded by worker {} ({}); waiting",
                            key.0,
                            key.1,
                            d.worker_id,
                            d.instance
                        );
                    }
                }
                Join::Ready(..) => {}
            }
            j
        })
    }

    /// A lock-free look at the entry; with this process' own byte count if it downloads it.
    fn poll(&self, run: &str, key: &DepKey) -> (Poll, Option<u64>) {
        let local_bytes = self
            .local()
            .downloading
            .get(key)
            .map(|p| p.load(Ordering::Relaxed));
        let cached = self
            .local()
            .snapshot
            .as_ref()
            .filter(|(t, _)| t.elapsed() < SNAPSHOT_TTL)
            .map(|(_, st)| st.clone());
        let st = match cached {
            Some(st) => st,
            None => match Self::read_state(&self.state_path) {
                Ok(Some(st)) => {
                    let st = Arc::new(st);
                    let mut local = self.local();
                    local.keys = st.reported_keys();
                    local.snapshot = Some((Instant::now(), st.clone()));
                    st
                }
                _ => return (Poll::Rejoin, local_bytes),
            },
        };
        let p = st.poll(key, &self.me, run, now(), local_bytes.is_some());
        let p = match p {
            Poll::Ready(name, _) if !self.on_disk(&name) => Poll::Rejoin,
            p => p,
        };
        (p, local_bytes)
    }
}

fn libc_estale() -> i32 {
    nix::errno::Errno::ESTALE as i32
}

/// Deletes a file or a tree (also when extracted directories are read-only), never following
/// a link in it.
fn force_remove(path: &Path) {
    if let Err(e) = crate::nofollow::tree::remove_path(path) {
        tracing::warn!("cannot delete {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests;
