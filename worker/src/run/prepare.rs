//! Preparing a run: dependencies, image, bundle dir and links, CPUs and GPUs, then the start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use protocol::{BundleInfo, RunResources};

use super::pool::CpuGpuPool;
use super::state::Event;
use crate::archive;
use crate::config::AgentConfig;
use crate::deps::Dependencies;
use crate::nofollow::{is_plain_name, kind, link_error, Dir, Kind};
use crate::runtime::{
    carried_exactly, normalize_image, BundleRuntime, Mount, RunSpec, RuntimeError,
};

/// What preparing one run needs.
pub struct PrepareCtx<R: BundleRuntime> {
    pub cfg: Arc<AgentConfig>,
    pub runtime: R,
    pub deps: Arc<Dependencies>,
    pub pool: CpuGpuPool,
    pub bundle: BundleInfo,
    pub resources: RunResources,
    pub bundle_path: PathBuf,
}

/// Unpins an image when dropped, unless [`PinGuard::keep`] hands the pin to the run.
struct PinGuard<R: BundleRuntime> {
    runtime: R,
    image: String,
    armed: bool,
}

impl<R: BundleRuntime> PinGuard<R> {
    fn keep(mut self) {
        self.armed = false;
    }
}

impl<R: BundleRuntime> Drop for PinGuard<R> {
    fn drop(&mut self) {
        if self.armed {
            self.runtime.unpin_image(&self.image);
        }
    }
}

/// The image a run names, or CodaLab's default CPU or GPU image when it names none.
pub fn default_image(r: &RunResources) -> String {
    match r.docker_image.trim() {
        "" if r.gpus > 0 => "codalab/default-gpu:latest".into(),
        "" => "codalab/default-cpu:latest".into(),
        image => image.to_owned(),
    }
}

impl<R: BundleRuntime> PrepareCtx<R> {
    fn resources_req(&self) -> (u64, u64) {
        (self.resources.cpus, self.resources.gpus)
    }

    /// Dependencies, image, bundle dir, links, container. Returns `ContainerStarted` or
    /// `PrepareFailed`.
    pub async fn run(self, send: &(impl Fn(Event) + Clone + Send + Sync + 'static)) -> Event {
        let uuid = self.bundle.uuid.clone();
        if self.cfg.shared_file_system {
            if let Err(e) = self.wait_for_shared_bundle_dir(send).await {
                return Event::PrepareFailed(e);
            }
        }
        let bundle_dir = match self.open_bundle_dir() {
            Ok(d) => d,
            Err(e) => {
                return Event::PrepareFailed(format!(
                    "Cannot create bundle directory {}: {e}",
                    self.bundle_path.display()
                ))
            }
        };
        // Dependencies (all at once), unless the bundle store is shared. Together they stay
        // within --max-work-dir-size: the run fails as soon as those on disk pass it.
        let mut dep_paths = Vec::new();
        if !self.cfg.shared_file_system {
            let mut waits: futures::stream::FuturesUnordered<_> = self
                .bundle
                .dependencies
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let deps = self.deps.clone();
                    let key = crate::deps::dep_key(d);
                    let child = d.child_path.clone();
                    let uuid = uuid.clone();
                    let send = send.clone();
                    async move {
                        let (path, bytes) = deps
                            .acquire_sized(&uuid, &key, |status| {
                                send(Event::Status(format!("{status} ({child})")))
                            })
                            .await
                            .map_err(|e| format!("Failed to download dependency {child}: {e}"))?;
                        Ok::<_, String>((i, child, path, bytes))
                    }
                })
                .collect();
            let limit = self.deps.max_size();
            let mut total = 0u64;
            while let Some(r) = futures::StreamExt::next(&mut waits).await {
                match r {
                    Ok((i, child, path, bytes)) => {
                        total = total.saturating_add(bytes);
                        if total > limit {
                            return Event::PrepareFailed(too_many_dependency_bytes(total, limit));
                        }
                        dep_paths.push((i, child, path));
                    }
                    Err(e) => return Event::PrepareFailed(e),
                }
            }
            // In the bundle's order, as they are planned.
            dep_paths.sort_by_key(|d| d.0);
        }
        let dep_paths: Vec<(String, PathBuf)> =
            dep_paths.into_iter().map(|(_, c, p)| (c, p)).collect();
        let image = normalize_image(&default_image(&self.resources));
        // Unpins the image if preparation fails or is cancelled from here on.
        let mut pin: Option<PinGuard<R>> = None;
        let digest = {
            let send = send.clone();
            match self
                .runtime
                .ensure_image(&image, |s| send(Event::Status(s)))
                .await
                .inspect(|_| {
                    pin = Some(PinGuard {
                        runtime: self.runtime.clone(),
                        image: image.clone(),
                        armed: true,
                    });
                }) {
                Ok(d) => d,
                Err(e) => {
                    return Event::PrepareFailed(format!("Failed to download Docker image: {e}"))
                }
            }
        };
        // Dependency mounts and the links that make them visible inside the bundle dir.
        let mut binds = Vec::new();
        let mut links = Vec::new();
        let linked = if self.cfg.shared_file_system {
            self.bundle.dependencies.iter().try_for_each(|d| {
                self.mount_shared(&bundle_dir, d, &mut binds, &mut links)
                    .map_err(|e| format!("Cannot mount dependency {}: {e}", d.child_path))
            })
        } else {
            dep_paths.iter().try_for_each(|(child, host)| {
                self.link_dependency(&bundle_dir, child, host, &mut binds, &mut links)
                    .map_err(|e| format!("Cannot link dependency {child}: {e}"))
            })
        };
        send(Event::Mounted(links));
        if let Err(e) = linked {
            return Event::PrepareFailed(e);
        }
        let user = match self.cfg.run_as_user {
            // The run's user owns its bundle directory (through its descriptor: never a path
            // that a link could redirect), and nothing else the worker made.
            Some((uid, gid)) => match bundle_dir.chown(uid, gid) {
                Ok(()) => format!("{uid}:{gid}"),
                Err(e) => {
                    return Event::PrepareFailed(format!(
                        "Cannot give the bundle directory to user {uid}:{gid} (--run-as-user): {e}"
                    ))
                }
            },
            None => match bundle_dir.stat() {
                Ok(st) => format!("{}:{}", st.st_uid, st.st_gid),
                Err(e) => {
                    return Event::PrepareFailed(format!("Cannot read bundle directory: {e}"))
                }
            },
        };
        if let Err(e) = self.runtime.prepare().await {
            return Event::PrepareFailed(format!("Cannot start Docker container: {e}"));
        }
        // CPUs and GPUs of its own: wait for them rather than share.
        let assigned = match self
            .pool
            .acquire(&uuid, self.resources_req(), |s| send(Event::Status(s)))
            .await
        {
            Ok(a) => a,
            Err(e) => return Event::PrepareFailed(e),
        };
        let spec = RunSpec {
            uuid: uuid.clone(),
            command: self.bundle.command.clone(),
            image: image.clone(),
            bundle_path: self.bundle_path.clone(),
            mounts: binds,
            user,
            memory_bytes: self.resources.memory,
            cpuset: assigned.cpus,
            gpu_uuids: assigned.gpus,
            shm_size_bytes: self.cfg.shm_size_bytes,
            network: self.resources.network.unwrap_or(true),
            worker_id: self.cfg.worker_id.clone(),
            pids_limit: self.cfg.pids_limit,
            no_capabilities: self.cfg.run_as_user.is_some(),
        };
        send(Event::Status("Starting Docker container.".into()));
        match self.runtime.start(&spec, |s| send(Event::Status(s))).await {
            Ok(id) => {
                // The run holds the image now; clean-up unpins it.
                if let Some(p) = pin.take() {
                    p.keep();
                }
                Event::ContainerStarted {
                    container_id: id,
                    docker_image: digest,
                    cpuset: spec.cpuset,
                    gpuset: spec.gpu_uuids,
                }
            }
            Err(RuntimeError::Image(e)) => {
                Event::PrepareFailed(format!("Failed to download Docker image: {e}"))
            }
            Err(e) => Event::PrepareFailed(format!("Cannot start Docker container: {e}")),
        }
    }

    /// With a shared file system the server makes the run's directory before it sends the run
    /// (to avoid NFS's directory cache, as CodaLab does); the worker waits for it to appear, a
    /// second at a time, [`SHARED_BUNDLE_DIR_WAIT_TRIES`] times, then fails the run with
    /// CodaLab's text. A location the server should not send is refused at once.
    async fn wait_for_shared_bundle_dir(&self, send: &impl Fn(Event)) -> Result<(), String> {
        if shared_location(&self.bundle_path.to_string_lossy()).is_none() {
            return Err(format!(
                "Cannot create bundle directory {}: the server sent a bad location",
                self.bundle_path.display()
            ));
        }
        let mut tries = shared_bundle_dir_wait_tries();
        // `symlink_metadata`: a link in its place is not followed (and is refused when opened).
        while std::fs::symlink_metadata(&self.bundle_path).is_err() {
            if tries == 0 {
                tracing::error!(
                    "run {}: {} is not on this machine's view of the bundle store",
                    self.bundle.uuid,
                    self.bundle_path.display()
                );
                return Err(SHARED_BUNDLE_DIR_MISSING.into());
            }
            tries -= 1;
            tracing::info!(
                "waiting for bundle directory {} to be created by the server ({tries} tries left)",
                self.bundle_path.display()
            );
            send(Event::Status(
                "Waiting for bundle directory to be created by the server".into(),
            ));
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        Ok(())
    }

    /// The run's bundle dir, opened. Without a shared file system it is in the runs dir; what an
    /// earlier attempt of the same bundle left there (a restage, a crash, a preempted worker
    /// sharing the work dir) is kept, as CodaLab keeps it, so that a run can resume from its
    /// checkpoints: this worker's own directory, or else the newest other attempt's, moved
    /// here. What such an attempt planted is never followed: the host reaches the directory's
    /// entries only through no-follow walks, and the dependency links replace whatever stands
    /// in their way ([`clear_way`]). With a shared file system, it is the server's directory,
    /// which must not be a link.
    fn open_bundle_dir(&self) -> std::io::Result<Dir> {
        if self.cfg.shared_file_system {
            if shared_location(&self.bundle_path.to_string_lossy()).is_none() {
                return Err(std::io::Error::other(format!(
                    "the server sent a bad location {}",
                    self.bundle_path.display()
                )));
            }
            // Made by the server (`wait_for_shared_bundle_dir`), never by the worker: a
            // directory made here would be one the server never sees.
            return Dir::open(&self.bundle_path);
        }
        let (Some(runs), Some(name)) = (self.bundle_path.parent(), self.bundle_path.file_name())
        else {
            return Err(std::io::Error::other("no bundle directory name"));
        };
        // `<uuid>.<worker id>` (agent::run_dir_name): this run's own entry of the runs dir;
        // `<uuid>` alone in the state file of an earlier version.
        let ours = name
            .to_str()
            .and_then(|n| n.strip_prefix(self.bundle.uuid.as_str()));
        let ours = ours.is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix('.')
                    .is_some_and(|a| !a.is_empty() && is_plain_name(a))
        });
        if !is_plain_name(&self.bundle.uuid) || !ours {
            return Err(std::io::Error::other(format!(
                "{:?} is not a bundle uuid",
                self.bundle.uuid
            )));
        }
        let runs = Dir::open(runs)?;
        match runs.entry(name)?.map(|st| kind(&st)) {
            Some(Kind::Dir) => {
                tracing::info!(
                    "run {}: keeping what an earlier attempt left in {}",
                    self.bundle.uuid,
                    self.bundle_path.display()
                );
                return runs.open_dir(name);
            }
            Some(_) => super::discard(&runs, name)?,
            None => {}
        }
        if let Some(earlier) = earlier_attempt(&runs, &self.bundle.uuid, name)? {
            // Atomic: a worker that discards its own attempt renames it first too, so that
            // the directory is either moved here whole or gone.
            match runs.rename(&earlier, &runs, name) {
                Ok(()) => {
                    tracing::info!(
                        "run {}: resuming from what attempt {} left",
                        self.bundle.uuid,
                        earlier.to_string_lossy()
                    );
                    return runs.open_dir(name);
                }
                Err(e) => tracing::info!(
                    "run {}: cannot take over attempt {}: {e}",
                    self.bundle.uuid,
                    earlier.to_string_lossy()
                ),
            }
        }
        runs.create_dir(name, 0o777)
    }

    /// Mounts a dependency read-only at `/<uuid>_dependencies/<child>` and links
    /// `<bundle>/<child>` to it (per top-level entry when `child` is `.`). A top-level entry that
    /// is itself a link is recreated as the same link in the bundle dir instead of being
    /// mounted: Docker would resolve a mount source on the host. Nothing in the bundle dir is
    /// reached through a link.
    ///
    /// Every path handed to the engine names exactly the entry checked here: a name that the
    /// engine's API cannot carry byte for byte ([`carried_exactly`]: not UTF-8, a comma, a control
    /// character) is never mounted under an approximation of itself, which could name another
    /// entry (a link `x\u{FFFD}` beside a directory `x\xff`). Instead the whole dependency (its
    /// cache directory, whose name the worker chose) is mounted at an alias
    /// (`/<uuid>_dependency_aliases/<n>`), and the bundle's link, whose target is bytes, reaches
    /// the entry through it: the run sees the entry under its own name.
    fn link_dependency(
        &self,
        bundle: &Dir,
        child: &str,
        host: &Path,
        binds: &mut Vec<Mount>,
        links: &mut Vec<PathBuf>,
    ) -> std::io::Result<()> {
        let uuid = &self.bundle.uuid;
        let (Some(cache), Some(name)) = (host.parent(), host.file_name()) else {
            return Err(std::io::Error::other("no dependency path"));
        };
        let cache = Dir::open(cache)?;
        match cache.entry(name)?.map(|st| kind(&st)) {
            None => {
                return Err(std::io::Error::other(
                    "the dependency is gone from the cache",
                ))
            }
            Some(Kind::Link) => return Err(link_error(host)),
            Some(_) => {}
        }
        if child.starts_with('/') {
            // Mounted where asked in the container, read-only; nothing made on the host.
            binds.push(Mount {
                host: host.to_owned(),
                container: super::mounts::absolute_target(uuid, child)
                    .map_err(std::io::Error::other)?,
                read_only: true,
            });
            return Ok(());
        }
        let Some(child_rel) = archive::normalize_relative(Path::new(child)) else {
            return Err(std::io::Error::other(format!("bad child path {child:?}")));
        };
        let dep = match child_rel.as_os_str().is_empty() {
            true => Some(cache.open_dir(name)?),
            false => None,
        };
        let planned = super::mounts::plan(uuid, &child_rel, host, dep.as_ref(), binds)?;
        for (rel, target) in planned {
            if let Some(first) = rel.components().next() {
                record(links, self.bundle_path.join(first));
            }
            clear_way(bundle, &rel)?;
            let parent = bundle.create_dirs(rel.parent().unwrap_or(Path::new("")), 0o777)?;
            let last = rel.file_name().expect("a normalised non-empty path");
            parent.symlink(&target, last)?;
        }
        Ok(())
    }

    /// With a shared file system: the dependency `location/parent_path` mounted read-only at
    /// `/<uuid>/<child>`. `parent_path` must stay inside its bundle and is walked without
    /// following a link; when its last component is a link, the same link is made at `child`
    /// in the bundle dir instead of a mount.
    fn mount_shared(
        &self,
        bundle: &Dir,
        d: &protocol::DependencyInfo,
        binds: &mut Vec<Mount>,
        links: &mut Vec<PathBuf>,
    ) -> Result<(), String> {
        let uuid = &self.bundle.uuid;
        let Some(loc) = &d.location else {
            return Ok(());
        };
        let Some(loc) = shared_location(loc) else {
            return Err(format!("the server sent a bad location {loc:?}"));
        };
        let Some(rel) = archive::normalize_relative(Path::new(&d.parent_path)) else {
            return Err(format!("{:?} leaves its bundle", d.parent_path));
        };
        let Some(child) = archive::normalize_relative(Path::new(&d.child_path))
            .filter(|c| !c.as_os_str().is_empty())
        else {
            return Err(format!("bad child path {:?}", d.child_path));
        };
        let root = Dir::open(&loc).map_err(|e| format!("{}: {e}", loc.display()))?;
        let source = loc.join(&rel);
        if let (Some(parent), Some(last)) = (rel.parent(), rel.file_name()) {
            let parent = root.beneath(parent).map_err(|e| e.to_string())?;
            match parent.entry(last).map_err(|e| e.to_string())? {
                None => return Err(format!("{} does not exist", source.display())),
                Some(st) if kind(&st) == Kind::Link => {
                    let target = parent.readlink(last).map_err(|e| e.to_string())?;
                    let at = bundle
                        .create_dirs(child.parent().unwrap_or(Path::new("")), 0o777)
                        .map_err(|e| e.to_string())?;
                    at.symlink(&target, child.file_name().expect("non-empty"))
                        .map_err(|e| e.to_string())?;
                    if let Some(first) = child.components().next() {
                        record(links, self.bundle_path.join(first));
                    }
                    return Ok(());
                }
                Some(_) => {}
            }
        }
        // The bundle store's own paths: there is no worker-made directory to alias them by, so
        // a path the engine cannot receive exactly is refused rather than approximated.
        let (Some(c), true) = (child.to_str(), carried_exactly(source.as_os_str())) else {
            return Err(format!(
                "{:?} cannot be mounted: the container engine's API cannot carry a path \
                 holding a comma, a colon or a control character exactly",
                d.parent_path
            ));
        };
        if !carried_exactly(child.as_os_str()) {
            return Err(format!(
                "{:?} cannot be mounted at: the container engine's API cannot carry a path \
                 holding a comma, a colon or a control character exactly",
                d.child_path
            ));
        }
        binds.push(Mount {
            host: source,
            container: format!("/{uuid}/{c}"),
            read_only: true,
        });
        Ok(())
    }
}

/// CodaLab's failure message when a shared-file-system run's directory never appears.
pub const SHARED_BUNDLE_DIR_MISSING: &str = "Bundle directory cannot be found on the shared \
     filesystem. Please ensure the shared filesystem between the server and your worker is \
     mounted properly or contact your administrators.";

/// How many one-second checks for a shared-file-system run's directory (CodaLab's 120).
pub const SHARED_BUNDLE_DIR_WAIT_TRIES: u32 = 120;

/// The failure of a run whose dependencies together pass `--max-work-dir-size`.
fn too_many_dependency_bytes(total: u64, limit: u64) -> String {
    format!(
        "The dependencies of this run total at least {}b, more than the worker's \
         --max-work-dir-size of {}b",
        crate::format::size_str(total as f64),
        crate::format::size_str(limit as f64)
    )
}

/// [`SHARED_BUNDLE_DIR_WAIT_TRIES`]; in the tests' builds only (feature `test-hooks`), what
/// `CLW_SHARED_BUNDLE_DIR_WAIT_TRIES` says where a test sets it.
fn shared_bundle_dir_wait_tries() -> u32 {
    #[cfg(feature = "test-hooks")]
    if let Some(n) = std::env::var("CLW_SHARED_BUNDLE_DIR_WAIT_TRIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    SHARED_BUNDLE_DIR_WAIT_TRIES
}

/// A path the worker is told to use on a shared file system: absolute, with no `.` or `..`.
fn shared_location(loc: &str) -> Option<PathBuf> {
    let rest = loc.strip_prefix('/')?;
    let clean = rest
        .trim_end_matches('/')
        .split('/')
        .all(|c| !matches!(c, "" | "." | ".."));
    (clean && !rest.is_empty()).then(|| PathBuf::from(loc))
}

/// The newest directory of another attempt of bundle `uuid` in the runs dir (`<uuid>` as
/// CodaLab names it, or `<uuid>.<worker id>`), other than `ours`.
fn earlier_attempt(
    runs: &Dir,
    uuid: &str,
    ours: &std::ffi::OsStr,
) -> std::io::Result<Option<std::ffi::OsString>> {
    let mut newest: Option<(i64, std::ffi::OsString)> = None;
    for name in runs.list()? {
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(uuid)) else {
            continue;
        };
        let same_bundle = rest.is_empty()
            || rest
                .strip_prefix('.')
                .is_some_and(|a| !a.is_empty() && is_plain_name(a));
        if !same_bundle || name == ours {
            continue;
        }
        let Some(st) = runs.entry(&name)? else {
            continue;
        };
        if kind(&st) == Kind::Dir && newest.as_ref().is_none_or(|(t, _)| st.st_mtime > *t) {
            newest = Some((st.st_mtime, name));
        }
    }
    Ok(newest.map(|(_, n)| n))
}

/// Makes way for a dependency link at `rel` in a bundle dir that an earlier attempt may have
/// filled: a non-directory where a directory of the path goes, and whatever stands at the
/// link's own place, are removed (links removed, never followed).
fn clear_way(bundle: &Dir, rel: &Path) -> std::io::Result<()> {
    let mut cur = bundle.try_clone()?;
    let mut parts = rel.components().peekable();
    while let Some(c) = parts.next() {
        let name = c.as_os_str();
        let Some(st) = cur.entry(name)? else {
            return Ok(());
        };
        if parts.peek().is_none() {
            return cur.remove(name);
        }
        if kind(&st) != Kind::Dir {
            return cur.remove_non_dir(name);
        }
        cur = cur.open_dir(name)?;
    }
    Ok(())
}

fn record(links: &mut Vec<PathBuf>, p: PathBuf) {
    if !links.contains(&p) {
        links.push(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_locations_are_absolute_and_normal() {
        assert_eq!(
            shared_location("/srv/bundles/0xabc"),
            Some(PathBuf::from("/srv/bundles/0xabc"))
        );
        for bad in ["srv/bundles", "/srv/../etc", "/srv/./b", "", "../x"] {
            assert_eq!(shared_location(bad), None, "{bad}");
        }
    }
}
