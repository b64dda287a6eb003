//! Downloads of dependencies: one per dependency across the workers sharing the cache, retried
//! on network errors, written beside the cache and moved into place when done.

use std::fs;
use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::TryStreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::format::size_str;
use crate::nofollow::extract::{extract_tar_gz_capped, ExtractError, ENTRY_COST};
use crate::nofollow::tree;
use crate::nofollow::Dir;

use super::{blocking, force_remove, now, DepKey, Inner, HEARTBEAT_EVERY, PARTIAL};

/// A download error, and whether another attempt may help.
#[derive(Debug)]
pub(super) struct DlError {
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

impl Inner {
    pub(super) async fn download(
        self: Arc<Self>,
        key: DepKey,
        name: String,
        progress: Arc<AtomicU64>,
    ) {
        /// Forgets the task however it ends, and wakes the waiters.
        struct Done(Arc<Inner>, DepKey);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.local().downloading.remove(&self.1);
                self.0.done.notify_waiters();
            }
        }
        let _done = Done(self.clone(), key.clone());
        let temp = self
            .dir
            .join(format!("{PARTIAL}{name}.{}", self.me.instance));
        enum End {
            Fetched,
            Failed(String),
            Lost,
        }
        let end = {
            let work = self.fetch_with_retries(&key, &temp, &progress);
            tokio::pin!(work);
            let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
            tick.tick().await;
            let mut last = 0;
            loop {
                tokio::select! {
                    r = &mut work => break match r {
                        Ok(()) => End::Fetched,
                        Err(e) => End::Failed(e.message),
                    },
                    _ = tick.tick() => {
                        let bytes = progress.load(Ordering::Relaxed);
                        if bytes == last {
                            continue;
                        }
                        last = bytes;
                        let (i, k) = (self.clone(), key.clone());
                        let owned = blocking(move || {
                            i.with_state(|st, _| st.heartbeat(&k, &i.me, bytes, now()))
                        })
                        .await;
                        match owned {
                            Ok(Ok(false)) => break End::Lost,
                            Ok(Ok(true)) => {}
                            Ok(Err(e)) => tracing::warn!("cannot record download progress: {e}"),
                            Err(e) => tracing::warn!("cannot record download progress: {e}"),
                        }
                    }
                }
            }
        };
        let i = self.clone();
        let _ = blocking(move || i.finish(&key, &name, &temp, end_result(end))).await;

        fn end_result(end: End) -> Option<Result<(), String>> {
            match end {
                End::Fetched => Some(Ok(())),
                End::Failed(m) => Some(Err(m)),
                End::Lost => None,
            }
        }
    }

    /// Records the end of a download (`None`: another worker took it over) and puts the files
    /// in place.
    pub(super) fn finish(
        &self,
        key: &DepKey,
        name: &str,
        temp: &Path,
        outcome: Option<Result<(), String>>,
    ) {
        let (uuid, path) = key;
        let Some(outcome) = outcome else {
            tracing::warn!("the download of {uuid}/{path} was taken over by another worker");
            force_remove(temp);
            return;
        };
        let outcome = outcome
            .and_then(|()| measure(temp).map_err(|e| format!("cannot measure the download: {e}")));
        if outcome.is_err() {
            force_remove(temp);
        }
        let r = self.with_state(|st, ctx| {
            if !st.owns(key, &self.me) {
                return false;
            }
            let outcome = outcome.and_then(|size| {
                if self.on_disk(name) {
                    self.to_trash(name, ctx);
                }
                fs::rename(temp, self.dir.join(name))
                    .map(|()| size)
                    .map_err(|e| format!("cannot move the download into place: {e}"))
            });
            match &outcome {
                Ok(size) => tracing::info!(
                    "downloaded dependency {uuid}/{path} ({} on disk) to {}",
                    size_str(*size as f64),
                    self.dir.join(name).display()
                ),
                Err(e) => tracing::warn!("dependency {uuid}/{path} failed: {e}"),
            }
            st.complete(key, &self.me, outcome, now());
            self.evict(st, ctx);
            true
        });
        match r {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("the download of {uuid}/{path} was taken over by another worker");
                force_remove(temp);
            }
            Err(e) => {
                tracing::warn!("cannot record the end of the download of {uuid}/{path}: {e}");
                force_remove(temp);
            }
        }
    }

    pub(super) async fn fetch_with_retries(
        &self,
        key: &DepKey,
        temp: &Path,
        progress: &Arc<AtomicU64>,
    ) -> Result<(), DlError> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(30))
            .with_max_times(self.max_attempts as usize - 1)
            .with_jitter();
        let attempt = AtomicU32::new(0);
        // In the tests' builds only (feature `test-hooks`): a download held back for
        // `CLW_TEST_DOWNLOAD_DELAY_MS`, so that a test sees another worker wait for it.
        #[cfg(feature = "test-hooks")]
        if let Some(ms) = std::env::var("CLW_TEST_DOWNLOAD_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        (|| async {
            let n = attempt.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::info!(
                "downloading dependency {}/{} (attempt {n} of {})",
                key.0,
                key.1,
                self.max_attempts
            );
            self.fetch(key, temp, progress).await
        })
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
        .await
    }

    pub(super) async fn fetch(
        &self,
        key: &DepKey,
        path: &Path,
        progress: &Arc<AtomicU64>,
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
        let is_dir = kind == "directory";
        let recorded = recorded(&self.client, uuid, &info).await;
        let limit = download_limit(self.max_size, recorded);
        let max_entries = (self.max_size / ENTRY_COST).max(1);
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
        progress.store(0, Ordering::Relaxed);
        let counter = progress.clone();
        let metrics = self.metrics.clone();
        let stream = resp
            .bytes_stream()
            .inspect_ok(move |chunk| {
                counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                metrics.downloaded_bytes.inc_by(chunk.len() as u64);
            })
            .map_err(io::Error::other);
        let reader = SyncIoBridge::new(StreamReader::new(stream));
        let target = path.to_owned();
        let outcome = tokio::task::spawn_blocking(move || -> Result<(), (String, bool)> {
            force_remove(&target);
            let too_large = |limit: u64| {
                (
                    format!(
                        "it is larger than its limit of {} (the bundle's recorded size, at most \
                         --max-work-dir-size)",
                        size_str(limit as f64)
                    ),
                    false,
                )
            };
            if is_dir {
                // Directories always arrive as .tar.gz.
                let dir = fs::create_dir(&target)
                    .and_then(|()| Dir::open(&target))
                    .map_err(|e| (format!("cannot create {}: {e}", target.display()), false))?;
                extract_tar_gz_capped(reader, &dir, limit, max_entries)
                    .map(drop)
                    .map_err(|e| match e {
                        ExtractError::Corrupt(m) => (m, true),
                        ExtractError::TooLarge(_) => too_large(limit),
                        ExtractError::Refused(m) | ExtractError::Io(m) => (m, false),
                    })
            } else {
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .map_err(|e| (format!("cannot write {}: {e}", target.display()), false))?;
                let mut reader: Box<dyn io::Read> = if gzipped {
                    Box::new(flate2::read::GzDecoder::new(reader))
                } else {
                    Box::new(reader)
                };
                let copied = io::copy(&mut (&mut reader).take(limit.saturating_add(1)), &mut out)
                    .map_err(|e| (format!("download interrupted: {e}"), true))?;
                if copied > limit {
                    return Err(too_large(limit));
                }
                Ok(())
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

/// Bytes on disk of a finished download (a file, or a tree whose links are not followed).
fn measure(path: &Path) -> io::Result<u64> {
    match fs::symlink_metadata(path)? {
        m if m.is_dir() => tree::size(&Dir::open(path)?),
        m => Ok(m.len()),
    }
}

/// What the server records of a dependency's target, given its target info: a file's size,
/// or (for a directory, whose target info gives only the directory entry's own size) its
/// bundle's `data_size`, an upper bound of any path inside it.
pub(super) async fn recorded(
    client: &protocol::RestClient,
    uuid: &str,
    info: &serde_json::Value,
) -> Option<u64> {
    if info.get("type").and_then(|t| t.as_str()) == Some("directory") {
        match client.get_bundle(uuid).await {
            Ok(b) => b.metadata("data_size").and_then(serde_json::Value::as_u64),
            Err(e) => {
                tracing::debug!("no recorded size of {uuid}: {e}");
                None
            }
        }
    } else {
        recorded_size(info)
    }
}

/// The size the server records for a dependency's target (`size` of its target info), if any.
fn recorded_size(info: &serde_json::Value) -> Option<u64> {
    info.get("size").and_then(serde_json::Value::as_u64)
}

/// At most `--max-work-dir-size`, and at most the target's recorded size (with a little room
/// for what a directory's entries add to it).
pub(super) fn download_limit(max_work_dir: u64, recorded: Option<u64>) -> u64 {
    match recorded {
        Some(r) => max_work_dir.min(r.saturating_add(r / 8).saturating_add(1 << 20)),
        None => max_work_dir,
    }
}
