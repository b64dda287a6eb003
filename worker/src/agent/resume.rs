//! Start-up after a restart: the runs of the state file are taken back.

use std::collections::HashSet;
use std::time::Instant;

use super::{Run, Worker};
use crate::persist;
use crate::resources::Assignment;
use crate::run::prepare::default_image;
use crate::run::state::{Effect, Stage};
use crate::runtime::{normalize_image, BundleRuntime};

impl<R: BundleRuntime> Worker<R> {
    /// Takes back the runs of an earlier process with this worker id: containers still there
    /// are watched again, interrupted steps are redone. Containers of this worker id that belong
    /// to no run are removed.
    pub async fn resume(&mut self, saved: Option<persist::Saved>) {
        let mut keep = HashSet::new();
        if let Some(saved) = saved {
            self.num_runs = saved.num_runs;
            for state in saved.runs {
                let uuid = state.uuid().to_owned();
                let mut effects = Vec::new();
                match state.stage {
                    Stage::Finished => continue,
                    Stage::Preparing => effects.push(Effect::Prepare),
                    Stage::Running => {
                        keep.insert(uuid.clone());
                        self.runtime
                            .pin_image(&normalize_image(&default_image(&state.resources)));
                        self.pool.restore(
                            &uuid,
                            Assignment {
                                cpus: state.cpuset.clone(),
                                gpus: state.gpuset.clone(),
                            },
                        );
                        effects.push(Effect::Monitor);
                    }
                    Stage::CleaningUp => effects.push(Effect::CleanUp),
                    Stage::UploadingResults => effects.push(Effect::Upload),
                    Stage::Finalizing | Stage::Restaged => {}
                }
                tracing::info!("resuming run {uuid} in stage {:?}", state.stage);
                if state.stage == Stage::Running && !self.cfg.shared_file_system {
                    // Its container still reads its dependencies: mark them in use again.
                    for d in &state.bundle.dependencies {
                        let deps = self.deps.clone();
                        let key = crate::deps::dep_key(d);
                        let run = uuid.clone();
                        tokio::spawn(async move {
                            let _ = deps.acquire(&run, &key, |_| {}).await;
                        });
                    }
                }
                self.runs.insert(
                    uuid.clone(),
                    Run {
                        state,
                        prepare: None,
                        upload: None,
                        monitor: None,
                        reported: None,
                    },
                );
                self.last_busy = Instant::now();
                for e in effects {
                    self.execute(&uuid, e);
                }
            }
            self.report_wanted = !self.runs.is_empty();
        }
        match self.runtime.list_own(&self.cfg.worker_id).await {
            Ok(list) => {
                for own in list {
                    if keep.contains(&own.uuid) {
                        continue;
                    }
                    tracing::warn!(
                        "removing container of run {}, which this worker no longer runs",
                        own.uuid
                    );
                    if let Err(e) = self.runtime.remove(&own.uuid).await {
                        tracing::warn!("cannot remove container {}: {e}", own.id);
                    }
                }
            }
            Err(e) => tracing::warn!("cannot list this worker's containers: {e}"),
        }
        self.persist();
    }
}
