//! Plumbing that both binaries need exactly once: logging set-up, the async runtime, logging in
//! until the server answers, atomic file writes, the NFS-safe hard-link lock, the wall clock, the
//! way to a Kubernetes API and the HTTP server of `--metrics-addr`, and the one CPU/GPU/memory
//! type.

pub mod clock;
pub mod cluster;
pub mod docs;
pub mod fs;
pub mod http;
pub mod lock;
pub mod login;
pub mod process;
pub mod resources;

pub use clock::now_unix;
pub use fs::write_atomic;
pub use login::login_until_success;
pub use resources::{Resources, Shape};

/// Installs ring as the process's rustls provider (kube-rs and the HTTP clients built without
/// one need it); a provider installed earlier stays.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
