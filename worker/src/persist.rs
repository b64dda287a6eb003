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

/// Reads the state file; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<Saved>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let saved: Saved =
        serde_json::from_str(&text).map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
    if saved.version != VERSION {
        return Err(format!(
            "{} has version {}, this worker writes {VERSION}",
            path.display(),
            saved.version
        ));
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
        assert!(load(&p).unwrap_err().contains("version 99"));
        std::fs::write(&p, "{garbage").unwrap();
        assert!(load(&p).is_err());
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
