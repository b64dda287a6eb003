//! After a run's container stopped: the container goes, then what the run held (CPUs and GPUs,
//! its image, its dependencies) and the links it had in its bundle dir.

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
}

/// Removes the run's container (retrying: a container that cannot be removed would keep
/// running), releases what the run held, and reports `CleanedUp`.
pub async fn clean_up<R: BundleRuntime>(held: Held<R>, send: impl Fn(Event)) {
    let Held {
        runtime,
        pool,
        deps,
        uuid,
        image,
        dependencies,
        paths,
    } = held;
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
    if let Some(image) = image {
        runtime.unpin_image(&image);
    }
    runtime.clean_images().await;
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
}
