//! A worker that starts warm: the images and dependencies its manager launched it for
//! (`--prefetch-image`, `--prefetch-dependency`) are fetched as it starts, beside its first
//! check-ins, instead of after the server hands it a run. They go through the same image cache
//! and dependency cache as a run's (the same limits, the same single pull or download: a run
//! asking for one that is still being fetched waits for it), and the cached dependencies are
//! reported in check-ins, so the server prefers this worker for those runs. A prefetch never
//! holds what it fetched: eviction treats it as any unused entry.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::deps::{DepKey, Dependencies};
use crate::metrics::Metrics;
use crate::runtime::{normalize_image, BundleRuntime};

/// At most this many `--prefetch-image` flags.
pub const MAX_IMAGES: usize = 16;
/// At most this many `--prefetch-dependency` flags.
pub const MAX_DEPENDENCIES: usize = 64;

/// The name a prefetch holds dependencies under in the cache's state (a run's is its uuid,
/// `0x…`: never this).
const HOLDER: &str = "prefetch";

/// What to fetch as the worker starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefetch {
    pub images: Vec<String>,
    pub dependencies: Vec<DepKey>,
}

impl Prefetch {
    pub fn is_empty(&self) -> bool {
        self.images.is_empty() && self.dependencies.is_empty()
    }
}

/// `--prefetch-dependency UUID[:PATH]`: a bundle uuid (`0x` and 32 hex digits), then the path
/// inside it after the first colon (none: the whole bundle). The path is normalised as a run's
/// dependency key is; one that climbs out of its bundle is refused.
pub fn parse_dependency(s: &str) -> Result<DepKey, String> {
    let (uuid, path) = s.split_once(':').unwrap_or((s, ""));
    let hex = uuid.strip_prefix("0x").unwrap_or("");
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{uuid:?} is not a bundle uuid (0x and 32 hex digits), in UUID[:PATH]"
        ));
    }
    let key = crate::deps::dep_key(&protocol::DependencyInfo {
        child_path: String::new(),
        parent_uuid: uuid.to_owned(),
        parent_path: path.to_owned(),
        child_uuid: None,
        parent_name: None,
        location: None,
    });
    if key.1.split('/').any(|c| c == "..") || key.1.starts_with('/') {
        return Err(format!("{path:?} climbs out of its bundle"));
    }
    Ok(key)
}

/// `--prefetch-image`: checked against the image reference grammar when fetched (as a run's
/// image is); here only its length and that it is one printable word.
pub fn parse_image(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 512 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{s:?} is not an image name"));
    }
    Ok(s.to_owned())
}

/// Fetches the images (one after the other) and the dependencies (one after the other, each
/// only if what the server records of its size fits beside what was prefetched before within
/// `--max-work-dir-size`: a prefetch never makes the cache evict what it fetched itself) side
/// by side; each failure is logged and the rest goes on. Stops at `stop`.
pub async fn fetch<R: BundleRuntime>(
    what: Prefetch,
    runtime: R,
    deps: Arc<Dependencies>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let images = async {
        for image in &what.images {
            let image = normalize_image(image);
            match runtime.ensure_image(&image, |_| {}).await {
                Ok(digest) => {
                    runtime.unpin_image(&image);
                    metrics.prefetched_images.inc();
                    tracing::info!("prefetched image {image} ({digest})");
                    runtime.clean_images().await;
                }
                Err(e) => tracing::warn!("cannot prefetch image {image}: {e}"),
            }
        }
    };
    let dependencies = async {
        let budget = deps.max_size();
        let mut held = 0u64;
        for key in &what.dependencies {
            // A dependency already in the cache costs nothing more; another is fetched only
            // if it fits beside what this prefetch already holds.
            let cached = deps.keys().contains(key);
            if !cached {
                match deps.recorded_size(key).await {
                    Some(size) if held.saturating_add(size) > budget => {
                        tracing::info!(
                            "not prefetching dependency {}/{} ({size} bytes): with the {held} bytes prefetched it passes --max-work-dir-size ({budget} bytes); its run fetches it",
                            key.0,
                            key.1
                        );
                        continue;
                    }
                    _ => {}
                }
            }
            match deps.acquire_sized(HOLDER, key, |_| {}).await {
                Ok((_, bytes)) => {
                    held = held.saturating_add(bytes);
                    metrics.prefetched_dependencies.inc();
                    tracing::info!("prefetched dependency {}/{} ({bytes} bytes)", key.0, key.1);
                }
                Err(e) => tracing::warn!("cannot prefetch dependency {}/{}: {e}", key.0, key.1),
            }
            deps.release(HOLDER, key);
        }
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = futures::future::join(images, dependencies) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dependency_is_a_uuid_and_a_path_inside_it() {
        let u = "0x0123456789abcdef0123456789abcdef";
        assert_eq!(parse_dependency(u).unwrap(), (u.to_string(), String::new()));
        assert_eq!(
            parse_dependency(&format!("{u}:a/./b/")).unwrap(),
            (u.to_string(), "a/b".to_string())
        );
        // Only the first colon splits.
        assert_eq!(
            parse_dependency(&format!("{u}:a:b")).unwrap().1,
            "a:b".to_string()
        );
        for bad in [
            "0x0123",
            "0123456789abcdef0123456789abcdef",
            "0x0123456789abcdef0123456789abcdeg",
            &format!("{u}:../x"),
            &format!("{u}:a/../../x"),
            &format!("{u}:/etc"),
        ] {
            assert!(parse_dependency(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_image_is_one_word() {
        assert!(parse_image("ubuntu:22.04").is_ok());
        for bad in ["", "a b", "a\nb", &"x".repeat(513)] {
            assert!(parse_image(bad).is_err(), "{bad:?}");
        }
    }
}
