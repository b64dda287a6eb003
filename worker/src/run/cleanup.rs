//! After a run's container stopped: the container goes, then what the run held (CPUs and GPUs,
//! its image, its dependencies) and the links it had in its bundle dir.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    let mut delay = Duration::from_secs(1);
    while let Err(e) = runtime.remove(&uuid).await {
        tracing::warn!("cannot remove the container of {uuid}, retrying: {e}");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
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
