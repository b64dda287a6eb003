//! Dependency downloads into `<work_dir>/dependencies/`, shared by the runs of this worker: a
//! dependency that several runs need is downloaded once, and waiters share the outcome.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::TryStreamExt;
use protocol::RestClient;
use tokio::sync::watch;
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::archive;
use crate::format::size_str;

/// `(parent_uuid, parent_path)`
pub type DepKey = (String, String);

#[derive(Debug, Clone, PartialEq)]
pub enum DepStatus {
    Downloading { bytes: u64 },
    Ready,
    Failed(String),
}

struct Entry {
    path: PathBuf,
    status: watch::Receiver<DepStatus>,
    dependents: HashSet<String>,
}

pub struct Dependencies {
    client: RestClient,
    dir: PathBuf,
    max_attempts: u32,
    entries: Mutex<HashMap<DepKey, Entry>>,
}

/// A download error, and whether another attempt may help.
#[derive(Debug)]
struct DlError {
    message: String,
    retryable: bool,
}

impl From<protocol::Error> for DlError {
    fn from(e: protocol::Error) -> Self {
        DlError {
            retryable: e.is_retryable(),
            message: e.to_string(),
        }
    }
}

/// The file name of a dependency in the cache: `parent_uuid` or `parent_uuid_parent_path`
/// with `/` replaced by `_`.
pub fn cache_name(key: &DepKey) -> String {
    let (uuid, path) = key;
    let path = path.trim_matches('/');
    if path.is_empty() {
        uuid.clone()
    } else {
        format!("{uuid}_{}", path.replace('/', "_"))
    }
}

impl Dependencies {
    pub fn new(client: RestClient, dir: PathBuf, max_attempts: u32) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(&dir)?;
        // Leftovers of an earlier process (including half-written downloads) are not trusted.
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let p = entry.path();
            let _ = if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
        Ok(Arc::new(Dependencies {
            client,
            dir,
            max_attempts: max_attempts.max(1),
            entries: Mutex::new(HashMap::new()),
        }))
    }

    /// Every dependency this worker holds or is downloading (reported in checkins).
    pub fn keys(&self) -> Vec<DepKey> {
        let mut keys: Vec<_> = self.entries.lock().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Waits until the dependency is on disk for `run` and returns its path. `progress`
    /// receives status texts while it downloads.
    pub async fn acquire(
        self: &Arc<Self>,
        run: &str,
        key: &DepKey,
        mut progress: impl FnMut(String),
    ) -> Result<PathBuf, String> {
        let (path, mut rx) = {
            let mut entries = self.entries.lock().unwrap();
            if !entries.contains_key(key) {
                let path = self.unique_path(&entries, key);
                let (tx, rx) = watch::channel(DepStatus::Downloading { bytes: 0 });
                entries.insert(
                    key.clone(),
                    Entry {
                        path: path.clone(),
                        status: rx,
                        dependents: HashSet::new(),
                    },
                );
                let me = self.clone();
                let key = key.clone();
                tokio::spawn(async move { me.download(key, path, tx).await });
            }
            let entry = entries.get_mut(key).expect("inserted above");
            entry.dependents.insert(run.to_owned());
            (entry.path.clone(), entry.status.clone())
        };
        loop {
            let status = rx.borrow_and_update().clone();
            match status {
                DepStatus::Ready => return Ok(path),
                DepStatus::Failed(msg) => return Err(msg),
                DepStatus::Downloading { bytes } => progress(format!(
                    "Downloading dependency: {} downloaded",
                    size_str(bytes as f64)
                )),
            }
            if rx.changed().await.is_err() {
                return Err("the download stopped".into());
            }
        }
    }

    /// The run no longer needs the dependency.
    pub fn release(&self, run: &str, key: &DepKey) {
        if let Some(e) = self.entries.lock().unwrap().get_mut(key) {
            e.dependents.remove(run);
        }
    }

    fn unique_path(&self, entries: &HashMap<DepKey, Entry>, key: &DepKey) -> PathBuf {
        let mut name = cache_name(key);
        loop {
            let path = self.dir.join(&name);
            let taken = entries.values().any(|e| e.path == path) || path.exists();
            if !taken {
                return path;
            }
            name.push('_');
        }
    }

    async fn download(self: Arc<Self>, key: DepKey, path: PathBuf, tx: watch::Sender<DepStatus>) {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(30))
            .with_max_times(self.max_attempts as usize - 1)
            .with_jitter();
        let result = (|| self.fetch(&key, &path, &tx))
            .retry(backoff)
            .when(|e: &DlError| e.retryable)
            .notify(|e, d| {
                tracing::warn!(
                    "download of {}/{} failed, retrying in {:.1}s: {}",
                    key.0,
                    key.1,
                    d.as_secs_f64(),
                    e.message
                )
            })
            .await;
        match result {
            Ok(()) => {
                tracing::info!(
                    "downloaded dependency {}/{} to {}",
                    key.0,
                    key.1,
                    path.display()
                );
                let _ = tx.send(DepStatus::Ready);
            }
            Err(e) => {
                tracing::warn!("dependency {}/{} failed: {}", key.0, key.1, e.message);
                remove_path(&path).await;
                // Forget it so that a later run tries again.
                self.entries.lock().unwrap().remove(&key);
                let _ = tx.send(DepStatus::Failed(e.message));
            }
        }
    }

    async fn fetch(
        &self,
        key: &DepKey,
        path: &Path,
        tx: &watch::Sender<DepStatus>,
    ) -> Result<(), DlError> {
        let (uuid, subpath) = key;
        let info = self.client.get_target_info(uuid, subpath).await?;
        let kind = info
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or("")
            .to_owned();
        if kind == "link" {
            return Err(DlError {
                message: format!("{uuid}/{subpath} is a link, which cannot be downloaded"),
                retryable: false,
            });
        }
        let resp = self.client.download_blob(uuid, subpath).await?;
        let encoding = resp
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("identity")
            .to_ascii_lowercase();
        let gzipped = match encoding.as_str() {
            "gzip" => true,
            "identity" | "" => false,
            other => {
                return Err(DlError {
                    message: format!("unsupported Content-Encoding {other:?}"),
                    retryable: false,
                })
            }
        };
        let counter = tx.clone();
        let mut bytes = 0u64;
        let stream = resp
            .bytes_stream()
            .inspect_ok(move |chunk| {
                bytes += chunk.len() as u64;
                let _ = counter.send(DepStatus::Downloading { bytes });
            })
            .map_err(std::io::Error::other);
        let reader = SyncIoBridge::new(StreamReader::new(stream));
        remove_path(path).await;
        let target = path.to_owned();
        let is_dir = kind == "directory";
        let outcome = tokio::task::spawn_blocking(move || -> Result<(), (String, bool)> {
            if is_dir {
                // Directories always arrive as .tar.gz.
                archive::extract_tar_gz(reader, &target).map_err(|e| {
                    let retryable = e.contains("corrupt") || e.contains("not a tar");
                    (e, retryable)
                })
            } else {
                let mut out = std::fs::File::create(&target)
                    .map_err(|e| (format!("cannot write {}: {e}", target.display()), false))?;
                let copied = if gzipped {
                    std::io::copy(&mut flate2::read::GzDecoder::new(reader), &mut out)
                } else {
                    let mut reader = reader;
                    std::io::copy(&mut reader, &mut out)
                };
                copied
                    .map(drop)
                    .map_err(|e| (format!("download interrupted: {e}"), true))
            }
        })
        .await
        .map_err(|e| DlError {
            message: format!("download task failed: {e}"),
            retryable: false,
        })?;
        outcome.map_err(|(message, retryable)| DlError { message, retryable })
    }
}

async fn remove_path(path: &Path) {
    let p = path.to_owned();
    let _ = tokio::task::spawn_blocking(move || match std::fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
        Ok(_) => std::fs::remove_file(&p),
        Err(_) => Ok(()),
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(cache_name(&("0x1".into(), "".into())), "0x1");
        assert_eq!(cache_name(&("0x1".into(), "a/b".into())), "0x1_a_b");
    }
}
