//! After a run's container stopped: what the run held (its dependencies, the links it had in
//! its bundle dir, then its container, CPUs and GPUs, and image) goes. The upload starts once
//! the bundle dir is ready; the exited container is removed beside it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use super::pool::CpuGpuPool;
use super::remove_any;
use super::state::Event;
use crate::deps::{DepKey, Dependencies};
use crate::runtime::BundleRuntime;

/// What a run holds until it is cleaned up.
pub struct Held<R: BundleRuntime> {
    pub runtime: R,
    pub pool: CpuGpuPool,
    pub deps: Arc<Dependencies>,
    pub uuid: String,
    /// Pinned by the run since its container started.
    pub image: Option<String>,
    pub dependencies: Vec<DepKey>,
    pub paths: Vec<PathBuf>,
    /// Remove the container before reporting `CleanedUp` (a run handed back: nothing of it
    /// may be left when the server hears of it). Otherwise the container, which has exited,
    /// goes after: the upload does not wait for it (Python removes containers while
    /// finalizing).
    pub container_first: bool,
}

/// Removes the links the run had in its bundle dir and releases its dependencies; removes its
/// container (retrying: a container that cannot be removed would keep running) and releases
/// its CPUs, GPUs and image, then checks the image cache; reports `CleanedUp` once what the
/// upload needs is done, before the container's removal unless `container_first`.
pub async fn clean_up<R: BundleRuntime>(held: Held<R>, send: impl Fn(Event)) {
    let Held {
        runtime,
        pool,
        deps,
        uuid,
        image,
        dependencies,
        paths,
        container_first,
    } = held;
    let release_container = || async {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_secs(1))
            .with_max_delay(Duration::from_secs(30))
            .without_max_times();
        // Tried until it works (no bound: a container left behind would keep running).
        let _ = (|| runtime.remove(&uuid))
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .notify(|e, _| tracing::warn!("cannot remove the container of {uuid}, retrying: {e}"))
            .await;
        pool.release(&uuid);
        if let Some(image) = &image {
            runtime.unpin_image(image);
        }
        runtime.clean_images().await;
    };
    if container_first {
        release_container().await;
    }
    for k in &dependencies {
        deps.release(&uuid, k);
    }
    let _ = tokio::task::spawn_blocking(move || {
        for p in paths {
            remove_any(&p);
        }
    })
    .await;
    send(Event::CleanedUp);
    if !container_first {
        release_container().await;
    }
}
