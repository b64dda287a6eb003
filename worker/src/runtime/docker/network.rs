//! The worker's Docker networks: the shared ones it makes at start (checked, de-duplicated,
//! removed at exit) and each run's own network when the run asks for isolation.
//!
//! Workers that share a prefix (the default one, on one host) and start together can each make
//! a network of the same name: Docker checks for the name and then creates, so both pass, and
//! the name then means two networks ("ambiguous" to every call that names it). Runs are started
//! on the networks by id: the lowest id of each name, which every worker picks alike.

use backon::Retryable;
use bollard::models::{EndpointSettings, Network};

use super::*;

/// The worker's three shared networks under Docker, by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NetworkIds {
    pub general: String,
    pub ext: String,
    pub int: String,
}

/// Where a run's container goes: `run` (its network mode) and `general` (joined before the
/// start), names or ids.
pub(super) struct RunNetworks {
    pub run: String,
    pub general: Option<String>,
    pub by_id: bool,
}

impl RunNetworks {
    /// The endpoint settings that name a network by id. Docker keeps a container's networks by
    /// name and, at the start, looks each one up by the id its settings hold, else by that
    /// name: an ambiguous name then fails the start, whatever id the request named.
    pub fn endpoint(&self, network: &str) -> Option<EndpointSettings> {
        self.by_id.then(|| EndpointSettings {
            network_id: Some(network.to_owned()),
            ..Default::default()
        })
    }
}

const SUFFIXES: [(&str, bool); 3] = [("_general", true), ("_ext", false), ("_int", true)];

impl DockerRuntime {
    /// Creates `<prefix>_general` (internal), `<prefix>_ext` and `<prefix>_int` (internal) if
    /// they are missing, and notes their ids for the runs to start on.
    pub(super) async fn ensure_networks(&self) -> Result<(), RuntimeError> {
        if self.engine == Engine::Podman {
            // Each run gets a network of its own (`start_container`).
            return Ok(());
        }
        let prefix = &self.network_prefix;
        // One listing, the check made before every run (the full one inspects each network).
        if let Ok(list) = self.list_networks(prefix).await {
            if let Some(ids) = networks_in_place(prefix, &list) {
                *self.network_ids.lock().unwrap() = Some(ids);
                return Ok(());
            }
        }
        let mut ids = Vec::with_capacity(3);
        for (suffix, internal) in SUFFIXES {
            let name = format!("{prefix}{suffix}");
            let id = (|| self.ensure_network(&name, internal))
                .retry(short_retries(5))
                .sleep(tokio::time::sleep)
                .notify(|e, _| tracing::debug!("network {name}: {e}; retrying"))
                .await?;
            ids.push(id);
        }
        let [general, ext, int] = <[String; 3]>::try_from(ids).expect("three networks");
        *self.network_ids.lock().unwrap() = Some(NetworkIds { general, ext, int });
        Ok(())
    }

    /// The networks whose names hold `part` (Docker's name filter matches substrings).
    async fn list_networks(&self, part: &str) -> Result<Vec<Network>, RuntimeError> {
        let filters = HashMap::from([("name".to_owned(), vec![part.to_owned()])]);
        let opts = bollard::query_parameters::ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        self.docker
            .list_networks(Some(opts))
            .await
            .map_err(|e| with_text(&e, format!("cannot list networks named {part}: {e}")))
    }

    /// The networks of exactly this name, lowest id first.
    async fn named(&self, name: &str) -> Result<Vec<Network>, RuntimeError> {
        let list = self.list_networks(name).await?;
        Ok(same_name(&list, name).cloned().collect())
    }

    /// Makes sure a network of this name exists with containers isolated; returns the id runs
    /// use (the lowest of the name's). Duplicates are removed where Docker lets us (not while
    /// a container uses one).
    pub(super) async fn ensure_network(
        &self,
        name: &str,
        internal: bool,
    ) -> Result<String, RuntimeError> {
        let mut same = self.named(name).await?;
        if same.is_empty() {
            self.create_shared(name, internal).await?;
            same = self.named(name).await?;
        }
        // An empty network mode would be Docker's default bridge: never one without an id.
        let Some((keeper, id)) = same
            .first()
            .and_then(|n| Some((n.clone(), n.id.clone().filter(|i| !i.is_empty())?)))
        else {
            return Err(RuntimeError::NotFound(format!(
                "network {name} was created but is not listed"
            )));
        };
        for other in same.iter().skip(1).filter_map(|n| n.id.as_deref()) {
            match self.docker.remove_network(other).await {
                Ok(()) => tracing::info!("removed duplicate Docker network {name} ({other})"),
                Err(e) => tracing::debug!(
                    "duplicate network {name} ({other}) not removed: {}",
                    docker_message(&e)
                ),
            }
        }
        if isolates(keeper.options.as_ref()) {
            return Ok(id);
        }
        let ours = keeper
            .labels
            .as_ref()
            .and_then(|l| l.get(NETWORK_LABEL))
            .is_some_and(|v| v == "true");
        if ours {
            // Made by a worker with the option, which the engine did not keep. Re-creating
            // would not help. Said once per process, not at every run.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    "networks {prefix}_*: the engine does not keep {ICC_OPTION}=false, so runs \
                     on them can reach one another",
                    prefix = self.network_prefix
                );
            }
            return Ok(id);
        }
        // A listing leaves out the containers: the network itself says whether it is in use.
        let in_use = match self
            .docker
            .inspect_network(
                &id,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
        {
            Ok(n) => n.containers.as_ref().is_some_and(|c| !c.is_empty()),
            Err(e) if is_not_found(&e) => false,
            Err(e) => return Err(with_text(&e, format!("cannot inspect network {name}: {e}"))),
        };
        if in_use {
            tracing::warn!(
                "network {name} lets containers reach one another (made by an older worker); it \
                 is in use, so it is kept"
            );
            return Ok(id);
        }
        tracing::info!("re-creating network {name} with containers isolated");
        match self.docker.remove_network(&id).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                return Err(with_text(
                    &e,
                    format!("cannot re-create network {name}: {e}"),
                ))
            }
        }
        self.create_shared(name, internal).await?;
        let same = self.named(name).await?;
        same.first()
            .and_then(|n| n.id.clone())
            .filter(|i| !i.is_empty())
            .ok_or_else(|| RuntimeError::NotFound(format!("network {name} is not listed")))
    }

    /// Creates one of the shared networks; one made meanwhile by another worker is fine.
    async fn create_shared(&self, name: &str, internal: bool) -> Result<(), RuntimeError> {
        let req = NetworkCreateRequest {
            name: name.to_string(),
            internal: Some(internal),
            labels: Some(HashMap::from([(
                NETWORK_LABEL.to_owned(),
                "true".to_owned(),
            )])),
            // Runs share these bridges but must not reach one another.
            options: Some(HashMap::from([(ICC_OPTION.to_owned(), "false".to_owned())])),
            ..Default::default()
        };
        match self.docker.create_network(req).await {
            Ok(_) => tracing::info!("created Docker network {name}"),
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(with_text(&e, format!("cannot create network {name}: {e}"))),
        }
        Ok(())
    }

    /// The network a run's container starts on, and the one it joins besides (`_general`)
    /// under Docker: by id once `ensure_networks` has found them, else by name.
    pub(super) fn run_networks(&self, spec: &RunSpec) -> RunNetworks {
        let by_name = || RunNetworks {
            run: run_network(spec, &self.network_prefix, self.engine),
            general: (self.engine == Engine::Docker)
                .then(|| format!("{}_general", self.network_prefix)),
            by_id: false,
        };
        if self.engine == Engine::Podman {
            return by_name();
        }
        match self.network_ids.lock().unwrap().clone() {
            Some(ids) => RunNetworks {
                run: if spec.network { ids.ext } else { ids.int },
                general: Some(ids.general),
                by_id: true,
            },
            None => by_name(),
        }
    }

    /// Removes the worker's networks (clean exit), every network of their names. Networks that
    /// other workers' containers still use are left alone (Docker refuses to remove them).
    pub(super) async fn remove_networks(&self) {
        let prefix = &self.network_prefix;
        let Ok(list) = self.list_networks(prefix).await else {
            return;
        };
        for (suffix, _) in SUFFIXES {
            let name = format!("{prefix}{suffix}");
            for id in same_name(&list, &name).filter_map(|n| n.id.as_deref()) {
                if let Err(e) = self.docker.remove_network(id).await {
                    if !is_not_found(&e) {
                        tracing::debug!("network {name} not removed: {}", docker_message(&e));
                    }
                }
            }
        }
    }
    /// Under Podman: the run's own bridge network, made with `isolate` (no traffic to or from
    /// other such networks) and `internal` when the run asks for no network. A leftover one of
    /// the same name (a crash) is replaced.
    pub(super) async fn create_own_network(&self, spec: &RunSpec) -> Result<(), RuntimeError> {
        let name = own_network(&self.network_prefix, &spec.uuid);
        self.remove_own_network(&spec.uuid).await;
        let req = NetworkCreateRequest {
            name: name.clone(),
            internal: Some(!spec.network),
            labels: Some(HashMap::from([
                (NETWORK_LABEL.to_owned(), "true".to_owned()),
                (LABEL_WORKER_ID.to_owned(), spec.worker_id.clone()),
                (LABEL_BUNDLE_UUID.to_owned(), spec.uuid.clone()),
            ])),
            options: Some(HashMap::from([(
                PODMAN_ISOLATE.to_owned(),
                "true".to_owned(),
            )])),
            ..Default::default()
        };
        // Podman lists the host's interfaces to choose a free subnet; one that goes away
        // meanwhile (another network removed at that moment) fails the call, which is worth
        // another try. Podman says so only in its message.
        (|| self.docker.create_network(req.clone()))
            .retry(short_retries(4))
            .sleep(tokio::time::sleep)
            .when(|e| docker_message(e).contains("no such network interface"))
            .notify(|e, _| tracing::debug!("network {name}: {e}; retrying"))
            .await
            .map(|_| ())
            .map_err(|e| with_text(&e, format!("cannot create network {name}: {e}")))
    }

    /// Removes a run's own network (Podman); one that is gone is fine.
    pub(super) async fn remove_own_network(&self, uuid: &str) {
        if self.engine != Engine::Podman {
            return;
        }
        let name = own_network(&self.network_prefix, uuid);
        if let Err(e) = self.docker.remove_network(&name).await {
            if !is_not_found(&e) {
                tracing::warn!("network {name} not removed: {}", docker_message(&e));
            }
        }
    }
}

/// A few quick tries (100 ms apart, doubling) for races between workers on one engine.
fn short_retries(times: usize) -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(100))
        .with_max_delay(std::time::Duration::from_secs(1))
        .with_max_times(times)
}

/// Whether a network's options keep its containers from reaching one another.
fn isolates(options: Option<&HashMap<String, String>>) -> bool {
    options
        .and_then(|o| o.get(ICC_OPTION))
        .is_some_and(|v| v == "false")
}

/// The networks of exactly this name in a listing, lowest id first.
fn same_name<'a>(list: &'a [Network], name: &str) -> std::vec::IntoIter<&'a Network> {
    let mut same: Vec<&Network> = list
        .iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .collect();
    same.sort_by(|a, b| a.id.cmp(&b.id));
    same.into_iter()
}

/// The ids of the worker's three networks when each name means one network with containers
/// isolated: then nothing needs doing before a run.
pub(super) fn networks_in_place(prefix: &str, list: &[Network]) -> Option<NetworkIds> {
    let mut ids = SUFFIXES.iter().map(|(suffix, _)| {
        let mut same = same_name(list, &format!("{prefix}{suffix}"));
        match (same.next(), same.next()) {
            (Some(n), None) if isolates(n.options.as_ref()) => {
                n.id.clone().filter(|i| !i.is_empty())
            }
            _ => None,
        }
    });
    Some(NetworkIds {
        general: ids.next()??,
        ext: ids.next()??,
        int: ids.next()??,
    })
}
