//! A backend whose type is chosen at run time: a manager driving several backends at once (its
//! tiers) holds each as a [`DynBackend`]. The [`Backend`] trait's futures are not object-safe;
//! this boxes them, once per call.

use futures::future::BoxFuture;

use crate::{Backend, BackendError, JobSpec, JobStatus};

/// [`Backend`] with boxed futures, implemented for every backend.
trait ObjectBackend: Send + Sync {
    fn name(&self) -> &str;
    fn submit<'a>(&'a self, spec: &'a JobSpec) -> BoxFuture<'a, Result<String, BackendError>>;
    fn list(&self) -> BoxFuture<'_, Result<Vec<JobStatus>, BackendError>>;
    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>>;
}

impl<B: Backend> ObjectBackend for B {
    fn name(&self) -> &str {
        Backend::name(self)
    }

    fn submit<'a>(&'a self, spec: &'a JobSpec) -> BoxFuture<'a, Result<String, BackendError>> {
        Box::pin(Backend::submit(self, spec))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<JobStatus>, BackendError>> {
        Box::pin(Backend::list(self))
    }

    fn cancel<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(Backend::cancel(self, id))
    }
}

/// Any backend, behind one type.
pub struct DynBackend(Box<dyn ObjectBackend>);

impl DynBackend {
    pub fn new<B: Backend + 'static>(backend: B) -> Self {
        DynBackend(Box::new(backend))
    }
}

impl Backend for DynBackend {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn submit(&self, spec: &JobSpec) -> Result<String, BackendError> {
        self.0.submit(spec).await
    }

    async fn list(&self) -> Result<Vec<JobStatus>, BackendError> {
        self.0.list().await
    }

    async fn cancel(&self, id: &str) -> Result<(), BackendError> {
        self.0.cancel(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeBackend, FakeCluster};
    use crate::Resources;

    #[tokio::test]
    async fn a_boxed_backend_passes_the_conformance_suite() {
        let case = crate::conformance::Case {
            job: JobSpec {
                worker_id: "0123456789abcdef".into(),
                shape_name: "small".into(),
                resources: Resources::new(1, 0, 1 << 30),
                command: vec!["cl-worker".into()],
                env: Vec::new(),
            },
            refused: None,
            unknown_id: "fake-999".into(),
            timeout: std::time::Duration::from_secs(5),
            poll: std::time::Duration::from_millis(10),
        };
        let cluster = FakeCluster::new();
        crate::conformance::run(
            async || DynBackend::new(FakeBackend::new(cluster.clone())),
            &case,
        )
        .await;
    }
}
