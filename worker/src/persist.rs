//! The worker's own state file, `<work_dir>/worker-state-<id>.json`: the runs it holds, so that
//! a worker restarted with the same `--id` resumes them. Written atomically (temp file, fsync,
//! rename) by a background task when a run is added, changes stage or goes away; never rewritten
//! on every loop.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::run::state::RunState;

pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Saved {
    pub version: u32,
    pub worker_id: String,
    /// Runs accepted so far (for `--exit-after-num-runs`).
    pub num_runs: i64,
    pub runs: Vec<RunState>,
}

/// `worker-state-<id>.json`, with characters unsafe in file names replaced.
pub fn state_path(work_dir: &Path, worker_id: &str) -> PathBuf {
    let safe = common::fs::safe_name(worker_id, "-_.()@");
    work_dir.join(format!("worker-state-{safe}.json"))
}

/// Why the state file could not be taken up (the worker then stops rather than orphan the runs
/// it names).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{} has version {found}, this worker writes {VERSION}", path.display())]
    Version { path: PathBuf, found: u32 },
}

/// Reads the state file; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<Saved>, LoadError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(LoadError::Read {
                path: path.to_owned(),
                source,
            })
        }
    };
    let saved: Saved = serde_json::from_str(&text).map_err(|source| LoadError::Parse {
        path: path.to_owned(),
        source,
    })?;
    if saved.version != VERSION {
        return Err(LoadError::Version {
            path: path.to_owned(),
            found: saved.version,
        });
    }
    Ok(Some(saved))
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    common::write_atomic(path, bytes, None)
}

/// A background writer: the latest snapshot wins; writes never block the event loop.
pub struct Writer {
    tx: watch::Sender<Option<Vec<u8>>>,
    done: tokio::task::JoinHandle<()>,
}

impl Writer {
    pub fn spawn(path: PathBuf) -> Self {
        let (tx, mut rx) = watch::channel::<Option<Vec<u8>>>(None);
        let done = tokio::spawn(async move {
            loop {
                let changed = rx.changed().await;
                let snapshot = rx.borrow_and_update().clone();
                if let Some(bytes) = snapshot {
                    let p = path.clone();
                    let r = tokio::task::spawn_blocking(move || write_atomic(&p, &bytes)).await;
                    if let Ok(Err(e)) = r {
                        tracing::warn!("cannot save worker state to {}: {e}", path.display());
                    }
                }
                if changed.is_err() {
                    return; // sender gone: the last snapshot was written above
                }
            }
        });
        Writer { tx, done }
    }

    pub fn save(&self, saved: &Saved) {
        match serde_json::to_vec(saved) {
            Ok(bytes) => {
                self.tx.send_replace(Some(bytes));
            }
            Err(e) => tracing::warn!("cannot serialize worker state: {e}"),
        }
    }

    /// Waits until the last snapshot is on disk.
    pub async fn close(self) {
        drop(self.tx);
        let _ = self.done.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        let p = state_path(Path::new("/w"), "host(12)/x y");
        assert_eq!(p, PathBuf::from("/w/worker-state-host(12)_x_y.json"));
    }

    #[test]
    fn round_trip_and_version_check() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        assert_eq!(load(&p).unwrap(), None);
        let s = Saved {
            version: VERSION,
            worker_id: "w".into(),
            num_runs: 3,
            runs: vec![],
        };
        write_atomic(&p, &serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(load(&p).unwrap(), Some(s));
        std::fs::write(
            &p,
            r#"{"version": 99, "worker_id": "w", "num_runs": 0, "runs": []}"#,
        )
        .unwrap();
        let e = load(&p).unwrap_err();
        assert!(matches!(e, LoadError::Version { found: 99, .. }), "{e:?}");
        assert!(e.to_string().contains("version 99"), "{e}");
        std::fs::write(&p, "{garbage").unwrap();
        assert!(matches!(load(&p), Err(LoadError::Parse { .. })));
        // A directory where the file should be: unreadable, not absent.
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert!(matches!(load(&p), Err(LoadError::Read { .. })));
    }

    #[tokio::test]
    async fn writer_keeps_the_latest() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.json");
        let w = Writer::spawn(p.clone());
        for n in 0..50 {
            w.save(&Saved {
                version: VERSION,
                worker_id: "w".into(),
                num_runs: n,
                runs: vec![],
            });
        }
        w.close().await;
        assert_eq!(load(&p).unwrap().unwrap().num_runs, 49);
    }
}
