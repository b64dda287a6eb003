//! Pulling an image, stopped once it passes the size it may take.

use bollard::query_parameters::CreateImageOptionsBuilder;
use futures::StreamExt;

use super::{images, runtime_error, DockerRuntime};
use crate::format::size_str;
use crate::runtime::RuntimeError;

impl DockerRuntime {
    /// Makes sure the image is present: no pull when it already is. Returns its digest. For
    /// the worker's own images (GPU discovery): not counted as a run image's pull.
    pub(super) async fn pull_image(
        &self,
        image: &str,
        progress: impl FnMut(String),
    ) -> Result<String, RuntimeError> {
        self.pull(image, None, progress, false).await
    }

    /// As [`Self::pull_image`]; with `max_bytes`, the pull is stopped (and what it left removed)
    /// as soon as its layers' sizes, as the engine's progress tells them, pass it: the error
    /// names the size seen so far.
    /// A run image's pull: counted (`cl_worker_image_pulls_total`).
    pub(super) async fn pull_image_within(
        &self,
        image: &str,
        max_bytes: Option<u64>,
        progress: impl FnMut(String),
    ) -> Result<String, RuntimeError> {
        self.pull(image, max_bytes, progress, true).await
    }

    async fn pull(
        &self,
        image: &str,
        max_bytes: Option<u64>,
        mut progress: impl FnMut(String),
        counted: bool,
    ) -> Result<String, RuntimeError> {
        if let Some(digest) = self.local_image(image).await? {
            return Ok(digest);
        }
        progress(format!("Pulling docker image {image}"));
        if counted {
            self.images.metrics.image_pulls.inc();
        }
        let opts = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let mut stream = self.docker.create_image(Some(opts), None, None);
        let mut pull_error = None;
        let mut tally = images::PullTally::default();
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    let seen = tally.see(&info);
                    if let Some(limit) = max_bytes.filter(|l| seen > *l) {
                        // Dropping the stream cancels the engine's pull.
                        drop(stream);
                        if let Err(e) = self.remove_image(image).await {
                            tracing::debug!("nothing of {image} to remove: {e}");
                        }
                        return Err(images::too_big(image, seen, limit));
                    }
                    if let Some(status) = info.status {
                        let detail = info
                            .progress_detail
                            .and_then(|d| Some((d.current?, d.total?)))
                            .map(|(c, t)| format!(" {}/{}", size_str(c as f64), size_str(t as f64)))
                            .unwrap_or_default();
                        progress(format!("Pulling docker image {image}. {status}{detail}"));
                    }
                }
                Err(e) => {
                    // The engine's own text (it names the registry or the image), as the
                    // failure message shows it; an engine that cannot be reached stays so.
                    pull_error = Some(match runtime_error(&e) {
                        RuntimeError::Unavailable(t) => RuntimeError::Unavailable(t),
                        other => RuntimeError::Image(other.to_string()),
                    });
                    break;
                }
            }
        }
        match self.local_image(image).await? {
            Some(digest) => Ok(digest),
            None => Err(pull_error
                .unwrap_or_else(|| RuntimeError::Image(format!("image {image} not found")))),
        }
    }
}
