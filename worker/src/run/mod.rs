//! One run: its state machine and the tasks that carry out its effects (prepare, monitor, clean
//! up, upload), written against [`crate::runtime::BundleRuntime`] only.

use std::path::Path;

pub mod cleanup;
pub mod monitor;
pub mod pool;
pub mod prepare;
pub mod state;
pub mod upload;

/// Removes a file, link or directory tree; one that is gone is fine.
pub fn remove_any(p: &Path) {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    };
    if let Err(e) = r {
        tracing::warn!("cannot remove {}: {e}", p.display());
    }
}
