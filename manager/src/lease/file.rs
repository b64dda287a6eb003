//! The lease in a file on a file system every manager shares (NFS included): JSON with the
//! holder, its renewal and a version number. A write is a compare-and-swap made under the
//! dependency cache's NFS-safe lock (a hard link to a claim file, `<file>.lock` beside it):
//! the file is read again under the lock, its version compared, and the new record renamed
//! over it. Reads take no lock: a rename replaces the whole file at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::lock::LinkLock;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{Read, Record, Store, StoreError, Write};

/// How long a lock on the lease file may be held before others break it (a holder killed
/// mid-write on another host); a dead holder on this host is seen at once.
const LOCK_LEASE: Duration = Duration::from_secs(10);
/// How long a write waits for the lock.
const LOCK_WAIT: Duration = Duration::from_secs(3);

#[derive(Debug, Serialize, Deserialize)]
struct OnDisk {
    version: u64,
    #[serde(flatten)]
    record: Record,
}

pub struct FileStore {
    path: PathBuf,
    lock: Arc<LinkLock>,
}

impl FileStore {
    /// The lease at `path` (its directory is created); `me` names this manager's lock claims.
    pub fn new(path: &Path, me: &str) -> Result<Self, StoreError> {
        let name = path
            .file_name()
            .ok_or_else(|| StoreError(format!("{}: not a file name", path.display())))?;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let lock_name = format!("{}.lock", name.to_string_lossy());
        let lock = LinkLock::new(dir, &lock_name, me, LOCK_LEASE)
            .map_err(|e| StoreError(format!("{}: {e}", dir.display())))?;
        Ok(FileStore {
            path: path.to_owned(),
            lock: Arc::new(lock),
        })
    }
}

fn read_file(path: &Path) -> Result<Option<OnDisk>, StoreError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StoreError(format!("{}: not a lease file: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError(format!("{}: {e}", path.display()))),
    }
}

fn write_locked(path: &Path, lock: &LinkLock, write: &Write) -> Result<bool, StoreError> {
    let guard = lock
        .acquire(LOCK_WAIT)
        .map_err(|e| StoreError(format!("{}: {e}", path.display())))?;
    let current = read_file(path)?;
    let version = match (write, &current) {
        (Write::Create(_), None) => 0,
        (Write::Replace { version, .. }, Some(c)) if c.version.to_string() == *version => {
            c.version + 1
        }
        _ => return Ok(false),
    };
    let bytes = serde_json::to_vec_pretty(&OnDisk {
        version,
        record: write.record().clone(),
    })
    .map_err(|e| StoreError(e.to_string()))?;
    // Broken meanwhile (this process stalled past the lock's lease): another writer may be
    // in; this write does not count.
    if !guard.still_held() {
        return Ok(false);
    }
    common::write_atomic(path, &bytes, None)
        .map_err(|e| StoreError(format!("{}: {e}", path.display())))?;
    Ok(true)
}

impl Store for FileStore {
    fn describe(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn read(&self) -> BoxFuture<'_, Result<Read, StoreError>> {
        let path = self.path.clone();
        Box::pin(async move {
            let on_disk = tokio::task::spawn_blocking(move || read_file(&path))
                .await
                .map_err(|e| StoreError(e.to_string()))??;
            Ok(match on_disk {
                Some(d) => Read {
                    record: Some(d.record),
                    version: Some(d.version.to_string()),
                },
                None => Read {
                    record: None,
                    version: None,
                },
            })
        })
    }

    fn write<'a>(&'a self, write: &'a Write) -> BoxFuture<'a, Result<bool, StoreError>> {
        let path = self.path.clone();
        let lock = self.lock.clone();
        let write = write.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || write_locked(&path, &lock, &write))
                .await
                .map_err(|e| StoreError(e.to_string()))?
        })
    }
}
