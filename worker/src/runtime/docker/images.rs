//! Run images: present images are used as they are (no pull per run), `--max-image-size` is
//! checked, and with `--max-image-cache-size` the least recently used images this worker pulled
//! or used are removed once their total size passes the limit. Last-use times live in
//! `<work_dir>/images-state.json` (written atomically), so they survive restarts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::DockerRuntime;
use crate::format::size_str;
use crate::metrics::Metrics;
use crate::persist::write_atomic;
use crate::runtime::RuntimeError;
use common::now_unix;

pub struct ImageCache {
    state_path: PathBuf,
    max_cache_bytes: Option<u64>,
    max_image_bytes: Option<u64>,
    /// image → last use (unix seconds)
    last_used: Mutex<BTreeMap<String, f64>>,
    /// image → runs of this worker using it (never evicted while > 0)
    pinned: Mutex<BTreeMap<String, usize>>,
    /// image → the lock held while it is checked and pulled: a run (or a prefetch) asking for
    /// an image whose pull is under way waits for that pull instead of starting another.
    pulls: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(super) metrics: Arc<Metrics>,
}

/// Images to remove, least recently used first, until `total` is within `limit`.
pub fn eviction_order(
    images: &[(String, f64, u64)], // (image, last_used, size)
    limit: u64,
) -> Vec<String> {
    let mut total: u64 = images.iter().map(|i| i.2).sum();
    let mut by_age: Vec<_> = images.iter().collect();
    by_age.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out = Vec::new();
    for (image, _, size) in by_age {
        if total <= limit {
            break;
        }
        out.push(image.clone());
        total = total.saturating_sub(*size);
    }
    out
}

/// The bytes of an image's layers as a pull's progress tells them: each layer's total once
/// its download starts (compressed; an extracted layer takes at least as much on the engine).
#[derive(Debug, Default)]
pub(super) struct PullTally {
    layers: std::collections::HashMap<String, u64>,
    sum: u64,
}

impl PullTally {
    /// Takes one progress message; returns the bytes of the layers seen so far.
    pub(super) fn see(&mut self, info: &bollard::models::CreateImageInfo) -> u64 {
        let total = info.progress_detail.as_ref().and_then(|d| d.total);
        if let (Some(id), Some(total)) = (&info.id, total) {
            let total = u64::try_from(total).unwrap_or(0);
            let slot = self.layers.entry(id.clone()).or_default();
            if total > *slot {
                self.sum += total - *slot;
                *slot = total;
            }
        }
        self.sum
    }
}

/// CodaLab's refusal of an image over `--max-image-size`.
pub(super) fn too_big(image: &str, size: u64, limit: u64) -> RuntimeError {
    RuntimeError::Other(format!(
        "The size of {image}: {} exceeds the maximum image size allowed {}.",
        size_str(size as f64),
        size_str(limit as f64)
    ))
}

impl ImageCache {
    pub fn new(
        work_dir: &std::path::Path,
        max_cache_bytes: Option<u64>,
        max_image_bytes: Option<u64>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let state_path = work_dir.join("images-state.json");
        let last_used = std::fs::read(&state_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Arc::new(ImageCache {
            state_path,
            max_cache_bytes,
            max_image_bytes,
            last_used: Mutex::new(last_used),
            pinned: Mutex::new(BTreeMap::new()),
            pulls: Mutex::new(BTreeMap::new()),
            metrics,
        })
    }

    fn touch(&self, image: &str) {
        let snapshot = {
            let mut m = self.last_used.lock().unwrap();
            m.insert(image.to_owned(), now_unix());
            serde_json::to_vec(&*m).unwrap_or_default()
        };
        let path = self.state_path.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = write_atomic(&path, &snapshot) {
                tracing::warn!("cannot save {}: {e}", path.display());
            }
        });
    }

    /// A run uses `image` until [`ImageCache::unpin`].
    pub fn pin(&self, image: &str) {
        *self
            .pinned
            .lock()
            .unwrap()
            .entry(image.to_owned())
            .or_default() += 1;
    }

    pub fn unpin(&self, image: &str) {
        let mut p = self.pinned.lock().unwrap();
        if let Some(n) = p.get_mut(image) {
            *n -= 1;
            if *n == 0 {
                p.remove(image);
            }
        }
    }

    /// Makes the image available (pulled only when absent) for a run, which pins it until it
    /// calls [`ImageCache::unpin`]; returns its digest.
    pub async fn ensure(
        &self,
        docker: &DockerRuntime,
        image: &str,
        mut progress: impl FnMut(String),
    ) -> Result<String, RuntimeError> {
        self.pin(image);
        let lock = self
            .pulls
            .lock()
            .unwrap()
            .entry(image.to_owned())
            .or_default()
            .clone();
        let result = {
            let held = match lock.try_lock() {
                Ok(held) => held,
                Err(_) => {
                    progress(format!("Waiting for the pull of {image} under way"));
                    lock.lock().await
                }
            };
            let result = self.check(docker, image, progress).await;
            drop(held);
            result
        };
        {
            // The last one out removes the image's lock.
            let mut pulls = self.pulls.lock().unwrap();
            if Arc::strong_count(&lock) == 2 {
                pulls.remove(image);
            }
        }
        if result.is_err() {
            self.unpin(image);
        }
        result
    }

    async fn check(
        &self,
        docker: &DockerRuntime,
        image: &str,
        progress: impl FnMut(String),
    ) -> Result<String, RuntimeError> {
        // `--max-image-size`: an image already here is judged before it is used; one that is
        // not is judged before the pull where its registry tells the size, and after it
        // otherwise, and then removed when refused: nothing refused stays on disk.
        let present = match self.max_image_bytes {
            Some(_) => docker.image_size(image).await?,
            None => None,
        };
        if let (Some(limit), Some(size)) = (self.max_image_bytes, present) {
            if size > limit {
                return Err(too_big(image, size, limit));
            }
        }
        if let (Some(limit), None) = (self.max_image_bytes, present) {
            match docker.registry_size(image).await {
                Ok(Some(size)) if size > limit => return Err(too_big(image, size, limit)),
                Ok(Some(_)) => {}
                Ok(None) => tracing::info!(
                    "the registry of {image} does not tell its size: it is checked after the \
                     pull (--max-image-size)"
                ),
                Err(e) => tracing::info!(
                    "cannot ask the registry for the size of {image} ({e}): it is checked after \
                     the pull (--max-image-size)"
                ),
            }
        }
        // Where the registry did not tell the size, the pull stops as soon as its layers pass
        // the limit.
        let stop_above = self.max_image_bytes.filter(|_| present.is_none());
        let digest = docker
            .pull_image_within(image, stop_above, progress)
            .await?;
        if let (Some(limit), None) = (self.max_image_bytes, present) {
            let size = docker.image_size(image).await?.unwrap_or(0);
            if size > limit {
                match docker.remove_image(image).await {
                    Ok(()) => tracing::info!("removed image {image}: over --max-image-size"),
                    Err(e) => tracing::warn!("image {image} over --max-image-size kept: {e}"),
                }
                return Err(too_big(image, size, limit));
            }
        }
        self.touch(image);
        let sized = self.sizes(docker).await;
        self.set_size_gauge(&sized);
        Ok(digest)
    }

    /// The images this worker used, with their last use and size; images gone from the engine
    /// are forgotten.
    async fn sizes(&self, docker: &DockerRuntime) -> Vec<(String, f64, u64)> {
        let known: Vec<(String, f64)> = self
            .last_used
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let mut sized = Vec::new();
        for (image, t) in known {
            match docker.image_size(&image).await {
                Ok(Some(size)) => sized.push((image, t, size)),
                Ok(None) => {
                    self.last_used.lock().unwrap().remove(&image);
                }
                Err(e) => tracing::debug!("cannot inspect image {image}: {e}"),
            }
        }
        sized
    }

    fn set_size_gauge(&self, sized: &[(String, f64, u64)]) {
        let total: u64 = sized.iter().map(|i| i.2).sum();
        self.metrics
            .image_cache_bytes
            .set(i64::try_from(total).unwrap_or(i64::MAX));
    }

    /// Removes least recently used images while the cache is over its limit. Images in use by
    /// a container are refused by Docker and kept.
    pub async fn clean(&self, docker: &DockerRuntime) {
        let mut sized = self.sizes(docker).await;
        let Some(limit) = self.max_cache_bytes else {
            self.set_size_gauge(&sized);
            return;
        };
        let pinned: Vec<String> = self.pinned.lock().unwrap().keys().cloned().collect();
        for image in eviction_order(&sized, limit) {
            if pinned.contains(&image) {
                continue;
            }
            match docker.remove_image(&image).await {
                Ok(()) => {
                    tracing::info!(
                        "removed image {image} (image cache over {})",
                        size_str(limit as f64)
                    );
                    self.last_used.lock().unwrap().remove(&image);
                    sized.retain(|i| i.0 != image);
                }
                Err(e) => tracing::debug!("image {image} kept: {e}"),
            }
        }
        self.set_size_gauge(&sized);
    }

    /// Cleans (with `--max-image-cache-size`) and measures the cache every minute until `stop`.
    pub fn spawn_cleaner(self: &Arc<Self>, docker: DockerRuntime, stop: CancellationToken) {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                me.clean(&docker).await;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_is_tallied_by_its_layers_totals() {
        let msg = |id: &str, current: i64, total: i64| bollard::models::CreateImageInfo {
            id: Some(id.into()),
            status: Some("Downloading".into()),
            progress_detail: Some(bollard::models::ProgressDetail {
                current: Some(current),
                total: Some(total),
            }),
            ..Default::default()
        };
        let mut t = PullTally::default();
        assert_eq!(t.see(&bollard::models::CreateImageInfo::default()), 0);
        assert_eq!(t.see(&msg("a", 1, 100)), 100);
        assert_eq!(t.see(&msg("a", 50, 100)), 100);
        assert_eq!(t.see(&msg("b", 1, 30)), 130);
        // "Extracting" reports the same layer again: counted once.
        assert_eq!(t.see(&msg("a", 100, 100)), 130);
        assert_eq!(t.see(&msg("c", 0, -1)), 130);
    }

    #[test]
    fn lru_until_within_limit() {
        let imgs = vec![
            ("new".to_string(), 30.0, 100),
            ("old".to_string(), 10.0, 100),
            ("mid".to_string(), 20.0, 100),
        ];
        assert!(eviction_order(&imgs, 300).is_empty());
        assert_eq!(eviction_order(&imgs, 250), vec!["old"]);
        assert_eq!(eviction_order(&imgs, 100), vec!["old", "mid"]);
        assert_eq!(eviction_order(&imgs, 0), vec!["old", "mid", "new"]);
    }
}
