//! A finished run's results: streamed to the server as a tar.gz, or (shared file system) only
//! trimmed of excluded files.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use protocol::{BundleInfo, RestClient};
use tokio::sync::mpsc;

use super::state::Event;
use crate::archive::{self, ChannelWriter, Excludes};
use crate::format::size_str;
use crate::metrics::Metrics;
use crate::nofollow::walk::{walk, Step};
use crate::nofollow::Dir;

/// Removes what the bundle's exclude patterns name (shared file system), without following a
/// link.
pub fn delete_excluded(root: &Path, ex: &Excludes) -> Result<(), String> {
    let dir = Dir::open(root).map_err(|e| format!("{}: {e}", root.display()))?;
    walk(&dir, |e| {
        if ex.matches(e.rel) {
            e.parent.remove(e.name)?;
            return Ok(Step::Skip);
        }
        Ok(Step::Descend)
    })
    .map_err(|e| e.to_string())
}

/// Streams a tar.gz of the bundle dir to the server, retrying on network errors and 5xx with
/// exponential backoff of at most 30 s between tries (so results leave soon after an outage), for
/// about 6 hours like the Python worker's 720 tries 30 s apart.
pub async fn upload_results(
    client: &RestClient,
    bundle: &BundleInfo,
    path: &Path,
    metrics: &Metrics,
    send: &(impl Fn(Event) + Send + Sync),
    threads: usize,
) -> Result<(), String> {
    let excludes = Arc::new(Excludes::new(&bundle.exclude_patterns()));
    let store = bundle.store();
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(30))
        .with_max_times(720)
        .with_jitter();
    let attempt = || async {
        let (btx, brx) = mpsc::channel::<std::io::Result<bytes::Bytes>>(16);
        let sent = Arc::new(AtomicU64::new(0));
        let writer = ChannelWriter::new(btx, sent.clone());
        let root = path.to_owned();
        let ex = excludes.clone();
        let failer = writer.failer();
        let archiver = tokio::task::spawn_blocking(move || {
            let written =
                Dir::open(&root).and_then(|d| archive::write_tar_gz_par(&d, &ex, writer, threads));
            match written {
                Ok(mut w) => {
                    let _ = std::io::Write::flush(&mut w);
                }
                Err(e) => {
                    tracing::warn!("cannot archive {}: {e}", root.display());
                    failer.fail(e);
                }
            }
        });
        let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(brx));
        let upload = client.upload_bundle_contents(&bundle.uuid, &store, body);
        tokio::pin!(upload);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let result = loop {
            tokio::select! {
                r = &mut upload => break r,
                _ = tick.tick() => send(Event::Status(format!(
                    "Uploading results: {} uploaded (archived size).",
                    size_str(sent.load(Ordering::Relaxed) as f64)
                ))),
            }
        };
        archiver.abort();
        metrics.uploaded_bytes.inc_by(sent.load(Ordering::Relaxed));
        result
    };
    attempt
        .retry(backoff)
        .when(|e: &protocol::Error| e.is_retryable())
        .notify(|e, d| {
            tracing::warn!(
                "upload of {} failed, retrying in {:.0}s: {e}",
                bundle.uuid,
                d.as_secs_f64()
            )
        })
        .await
        .map_err(|e| e.to_string())
}
