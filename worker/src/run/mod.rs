//! One run: its state machine and the tasks that carry out its effects (prepare, monitor, clean
//! up, upload), written against [`crate::runtime::BundleRuntime`] only.

use std::path::Path;

pub mod cleanup;
pub mod monitor;
mod mounts;
pub mod pool;
pub mod prepare;
pub mod state;
pub mod upload;

/// Removes a file, link or directory tree without following a link in it; one that is gone is
/// fine.
pub fn remove_any(p: &Path) {
    if let Err(e) = crate::nofollow::tree::remove_path(p) {
        tracing::warn!("cannot remove {}: {e}", p.display());
    }
}

/// Prefix of the names under which discarded bundle dirs wait for their deletion.
pub const TRASH_PREFIX: &str = ".trash-";

/// Moves entry `name` of the runs dir aside at once (so that the name is free for a new run
/// dir) and deletes it in the background, never following a link in it.
pub fn discard(runs: &crate::nofollow::Dir, name: &std::ffi::OsStr) -> std::io::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let trash = format!(
        "{TRASH_PREFIX}{}-{}-{nanos}",
        name.to_string_lossy(),
        std::process::id()
    );
    runs.rename(name, runs, trash.as_ref())?;
    let runs = runs.try_clone()?;
    let remove = move || {
        if let Err(e) = runs.remove(trash.as_ref()) {
            tracing::warn!("cannot delete {trash}: {e}");
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) => drop(h.spawn_blocking(remove)),
        Err(_) => remove(),
    }
    Ok(())
}

/// Discards the bundle dir at `path` (a run's dir in the runs dir) if it is there.
pub fn discard_path(path: &Path) {
    let (Some(runs), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let r = crate::nofollow::Dir::open(runs).and_then(|runs| match runs.entry(name)? {
        Some(_) => discard(&runs, name),
        None => Ok(()),
    });
    if let Err(e) = r {
        tracing::warn!("cannot remove {}: {e}", path.display());
    }
}
