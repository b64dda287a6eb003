//! Server messages: runs to start, kills, finalizations, and reads handed to [`crate::read`].

use protocol::{ServerMessage, DEFAULT_KILL_MESSAGE};

use super::{Msg, Worker};
use crate::run::state::{now_unix, Event};
use crate::runtime::BundleRuntime;

impl<R: BundleRuntime> Worker<R> {
    pub(super) fn on_message(&mut self, m: ServerMessage) {
        match m {
            ServerMessage::Run { bundle, resources } => {
                let uuid = bundle.uuid.clone();
                tracing::debug!("run message for {uuid}: {resources:?}");
                if self.runs.contains_key(&uuid) || self.starting.contains(&uuid) {
                    tracing::warn!("ignoring duplicate run message for {uuid}");
                    return;
                }
                let refuse = self.terminating
                    || self.draining
                    || self.num_runs + self.starting.len() as i64 >= self.cfg.exit_after_num_runs;
                self.starting.insert(uuid.clone());
                let client = self.client.clone();
                let tx = self.tx.clone();
                let id = self.cfg.worker_id.clone();
                let host = self.cfg.hostname.clone();
                tokio::spawn(async move {
                    let accepted = client
                        .start_bundle(&id, &uuid, &host, now_unix() as i64)
                        .await;
                    let _ = tx.send(Msg::Started {
                        bundle: Box::new(bundle),
                        resources: Box::new(resources),
                        accepted,
                        refuse,
                    });
                });
            }
            ServerMessage::Kill { uuid, kill_message } => {
                if self.runs.contains_key(&uuid) {
                    let msg = kill_message.unwrap_or_else(|| DEFAULT_KILL_MESSAGE.to_owned());
                    tracing::info!("kill of {uuid}: {msg}");
                    self.apply(&uuid, Event::KillRequested(msg));
                } else {
                    tracing::debug!("kill for unknown run {uuid} ignored");
                }
            }
            ServerMessage::MarkFinalized { uuid } => self.apply(&uuid, Event::MarkFinalized),
            m @ (ServerMessage::Read { .. }
            | ServerMessage::Netcat { .. }
            | ServerMessage::Write { .. }) => {
                let target = self.runs.get(m.uuid()).map(|r| crate::read::Target {
                    uuid: r.state.uuid().to_owned(),
                    bundle_path: r.state.bundle_path.clone(),
                    dependency_paths: r
                        .state
                        .bundle
                        .dependencies
                        .iter()
                        .map(|d| d.child_path.clone())
                        .collect(),
                    container_id: r.state.container_id.clone(),
                });
                let tx = self.tx.clone();
                let uuid = m.uuid().to_owned();
                crate::read::spawn(
                    self.client.clone(),
                    self.runtime.clone(),
                    self.cfg.worker_id.clone(),
                    target,
                    m,
                    move || {
                        let _ = tx.send(Msg::Run(uuid, Event::Written));
                    },
                );
            }
        }
    }
}
