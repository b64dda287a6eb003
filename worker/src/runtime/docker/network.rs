//! The worker's Docker networks: the shared ones it makes at start (checked, de-duplicated,
//! removed at exit) and each run's own network when the run asks for isolation.

use backon::Retryable;

use super::*;

impl DockerRuntime {
    /// Creates `<prefix>_general` (internal), `<prefix>_ext` and `<prefix>_int` (internal) if
    /// they are missing.
    pub(super) async fn ensure_networks(&self) -> Result<(), RuntimeError> {
        if self.engine == Engine::Podman {
            // Each run gets a network of its own (`start_container`).
            return Ok(());
        }
        if self.networks_in_place().await {
            return Ok(());
        }
        let prefix = &self.network_prefix;
        for (suffix, internal) in [("_general", true), ("_ext", false), ("_int", true)] {
            let name = format!("{prefix}{suffix}");
            // Workers sharing a prefix that start together race here: Docker allows several
            // networks of one name, and a name is ambiguous until the duplicates are removed.
            (|| self.ensure_network(&name, internal))
                .retry(short_retries(5))
                .sleep(tokio::time::sleep)
                .notify(|e, _| tracing::debug!("network {name}: {e}; retrying"))
                .await?;
        }
        Ok(())
    }

    /// Whether each of the worker's three networks exists once, with containers isolated: one
    /// listing, the check made before every run (the full one inspects each network).
    async fn networks_in_place(&self) -> bool {
        let prefix = &self.network_prefix;
        let filters = HashMap::from([("name".to_owned(), vec![prefix.clone()])]);
        let opts = bollard::query_parameters::ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        let Ok(list) = self.docker.list_networks(Some(opts)).await else {
            return false;
        };
        ["_general", "_ext", "_int"].iter().all(|suffix| {
            let name = format!("{prefix}{suffix}");
            let mut same = list.iter().filter(|n| n.name.as_deref() == Some(&name));
            same.next().is_some_and(|n| isolates(n.options.as_ref())) && same.next().is_none()
        })
    }

    pub(super) async fn ensure_network(
        &self,
        name: &str,
        internal: bool,
    ) -> Result<(), RuntimeError> {
        // A name must mean one network.
        self.dedupe_network(name).await?;
        match self
            .docker
            .inspect_network(
                name,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
        {
            Ok(n) => {
                let isolated = isolates(n.options.as_ref());
                let empty = n.containers.as_ref().is_none_or(|c| c.is_empty());
                if isolated {
                    return Ok(());
                }
                let ours = n
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(NETWORK_LABEL))
                    .is_some_and(|v| v == "true");
                if ours {
                    // Made by a worker with the option, which the engine did not keep.
                    // Re-creating would not help. Said once per process, not at every run.
                    static SAID: std::sync::atomic::AtomicBool =
                        std::sync::atomic::AtomicBool::new(false);
                    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        return Ok(());
                    }
                    tracing::warn!(
                        "networks {prefix}_*: the engine does not keep {ICC_OPTION}=false, so runs \
                             on them can reach one another",
                        prefix = self.network_prefix
                    );
                    return Ok(());
                }
                if !empty {
                    tracing::warn!(
                        "network {name} lets containers reach one another (made by an older \
                         worker); it is in use, so it is kept"
                    );
                    return Ok(());
                }
                tracing::info!("re-creating network {name} with containers isolated");
                if let Err(e) = self.docker.remove_network(name).await {
                    return Err(with_text(
                        &e,
                        format!("cannot re-create network {name}: {e}"),
                    ));
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(with_text(&e, format!("cannot inspect network {name}: {e}"))),
        }
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
        self.dedupe_network(name).await?;
        Ok(())
    }

    /// Keeps one network of this exact name, the one with the lowest id (every worker picks the
    /// same), and removes the others; one in use by containers stays (Docker refuses).
    pub(super) async fn dedupe_network(&self, name: &str) -> Result<(), RuntimeError> {
        let filters = HashMap::from([("name".to_owned(), vec![name.to_owned()])]);
        let opts = bollard::query_parameters::ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build();
        let list = self
            .docker
            .list_networks(Some(opts))
            .await
            .map_err(|e| with_text(&e, format!("cannot list networks named {name}: {e}")))?;
        let mut ids: Vec<String> = list
            .into_iter()
            .filter(|n| n.name.as_deref() == Some(name))
            .filter_map(|n| n.id)
            .collect();
        if ids.len() <= 1 {
            return Ok(());
        }
        ids.sort();
        for id in &ids[1..] {
            match self.docker.remove_network(id).await {
                Ok(()) => tracing::info!("removed duplicate Docker network {name} ({id})"),
                Err(e) => tracing::debug!(
                    "duplicate network {name} ({id}) not removed: {}",
                    docker_message(&e)
                ),
            }
        }
        Ok(())
    }

    /// Removes the worker's networks (clean exit). Networks that other workers' containers
    /// still use are left alone (Docker refuses to remove them).
    pub(super) async fn remove_networks(&self) {
        let prefix = &self.network_prefix;
        for suffix in ["_general", "_ext", "_int"] {
            let name = format!("{prefix}{suffix}");
            if let Err(e) = self.docker.remove_network(&name).await {
                if !is_not_found(&e) {
                    tracing::debug!("network {name} not removed: {}", docker_message(&e));
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
