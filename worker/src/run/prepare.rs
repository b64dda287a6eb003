//! Preparing a run: dependencies, image, bundle dir and links, CPUs and GPUs, then the start.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use protocol::{BundleInfo, RunResources};

use super::pool::CpuGpuPool;
use super::remove_any;
use super::state::Event;
use crate::agent::AgentConfig;
use crate::archive;
use crate::deps::Dependencies;
use crate::runtime::{normalize_image, BundleRuntime, Mount, RunSpec, RuntimeError};

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
        if let Err(e) = tokio::fs::create_dir_all(&self.bundle_path).await {
            return Event::PrepareFailed(format!(
                "Cannot create bundle directory {}: {e}",
                self.bundle_path.display()
            ));
        }
        // Dependencies (all at once), unless the bundle store is shared.
        let mut dep_paths = Vec::new();
        if !self.cfg.shared_file_system {
            let waits = self.bundle.dependencies.iter().map(|d| {
                let deps = self.deps.clone();
                let key = (d.parent_uuid.clone(), d.parent_path.clone());
                let child = d.child_path.clone();
                let uuid = uuid.clone();
                let send = send.clone();
                async move {
                    let path = deps
                        .acquire(&uuid, &key, |status| {
                            send(Event::Status(format!("{status} ({child})")))
                        })
                        .await
                        .map_err(|e| format!("Failed to download dependency {child}: {e}"))?;
                    Ok::<_, String>((child, path))
                }
            });
            for r in futures::future::join_all(waits).await {
                match r {
                    Ok(p) => dep_paths.push(p),
                    Err(e) => return Event::PrepareFailed(e),
                }
            }
        }
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
        if self.cfg.shared_file_system {
            for d in &self.bundle.dependencies {
                if let Some(loc) = &d.location {
                    binds.push(Mount {
                        host: Path::new(loc).join(&d.parent_path),
                        container: format!("/{uuid}/{}", d.child_path),
                        read_only: true,
                    });
                }
            }
        } else {
            for (child, host) in &dep_paths {
                match self.link_dependency(child, host, &mut binds, &mut links) {
                    Ok(()) => {}
                    Err(e) => {
                        send(Event::Mounted(links));
                        return Event::PrepareFailed(format!(
                            "Cannot link dependency {child}: {e}"
                        ));
                    }
                }
            }
        }
        send(Event::Mounted(links));
        let user = match std::fs::metadata(&self.bundle_path) {
            Ok(m) => format!("{}:{}", m.uid(), m.gid()),
            Err(e) => return Event::PrepareFailed(format!("Cannot read bundle directory: {e}")),
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

    /// Mounts a dependency read-only at `/<uuid>_dependencies/<child>` and links
    /// `<bundle>/<child>` to it (per top-level entry when `child` is `.`).
    fn link_dependency(
        &self,
        child: &str,
        host: &Path,
        binds: &mut Vec<Mount>,
        links: &mut Vec<PathBuf>,
    ) -> std::io::Result<()> {
        let uuid = &self.bundle.uuid;
        let Some(child_rel) = archive::normalize_relative(Path::new(child)) else {
            return Err(std::io::Error::other(format!("bad child path {child:?}")));
        };
        let mut pairs = Vec::new();
        if child_rel.as_os_str().is_empty() {
            for e in std::fs::read_dir(host)? {
                let name = e?.file_name();
                pairs.push((PathBuf::from(&name), host.join(&name)));
            }
        } else {
            pairs.push((child_rel, host.to_owned()));
        }
        for (rel, source) in pairs {
            let docker_path = format!("/{uuid}_dependencies/{}", rel.display());
            let link = self.bundle_path.join(&rel);
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent)?;
            }
            if let Some(first) = rel.components().next() {
                let p = self.bundle_path.join(first);
                if !links.contains(&p) {
                    links.push(p);
                }
            }
            remove_any(&link);
            std::os::unix::fs::symlink(&docker_path, &link)?;
            binds.push(Mount {
                host: source,
                container: docker_path,
                read_only: true,
            });
        }
        Ok(())
    }
}
