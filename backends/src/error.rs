//! The errors of backends: [`BackendError`] for the calls of a running backend (retryable or
//! permanent), [`BuildError`] for the start-up of one (its pre-flight check).

/// An error of a backend; `retryable` says whether the same call may succeed later.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct BackendError {
    message: String,
    retryable: bool,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl BackendError {
    /// A transient error: the call may succeed if repeated.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            source: None,
        }
    }

    /// A permanent error: repeating the call will not help.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            source: None,
        }
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// Why a backend could not be set up: the text is what the manager prints before it exits.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The backend refused its settings or could not be reached.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The pre-flight check found that the backend cannot run the configured workers.
    #[error("{0}")]
    Preflight(String),
    /// A file of the launch setup (work directory, credentials file) could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
