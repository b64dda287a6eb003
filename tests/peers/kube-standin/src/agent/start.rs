//! Starting a bound pod: its image (pulled or backed off), its volumes and claims, its GPUs,
//! then its containers; the waiting reasons a real kubelet reports while it cannot.

use super::*;

impl Agent {
    /// The pending status of a bound pod whose containers wait for `reason`.
    /// A container that cannot be configured or created (`reason`:
    /// `CreateContainerConfigError`, `CreateContainerError`), as the kubelet reports it: the
    /// pod's waiting status, a `Failed` event, another try later.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn container_error(
        &mut self,
        pod: &Pod,
        uid: &str,
        node_ip: &str,
        node_name: &str,
        reason: &str,
        msg: &str,
    ) -> Result<()> {
        let status = self.waiting_status(pod, node_ip, reason, Some(msg));
        let tag = match reason {
            "CreateContainerConfigError" => "configerror",
            _ => "createerror",
        };
        self.write_status(pod, format!("{tag}:{msg}"), status)
            .await?;
        self.event(
            pod,
            "Warning",
            "Failed",
            &format!("Error: {msg}"),
            "kubelet",
            Some(node_name),
        )
        .await;
        self.retry_later(uid);
        Ok(())
    }

    pub(super) fn waiting_status(
        &self,
        pod: &Pod,
        node_ip: &str,
        reason: &str,
        message: Option<&str>,
    ) -> Value {
        let spec = pod.spec.clone().unwrap_or_default();
        let statuses: Vec<Value> = spec
            .containers
            .iter()
            .map(|c| {
                let mut w = json!({"reason": reason});
                if let Some(m) = message {
                    w["message"] = json!(m);
                }
                json!({"name": c.name, "image": c.image, "imageID": "", "ready": false, "started": false,
                       "restartCount": 0, "state": {"waiting": w}})
            })
            .collect();
        let not_ready = format!(
            "containers with unready status: [{}]",
            spec.containers
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
        json!({
            "phase": "Pending", "hostIP": node_ip, "hostIPs": [{"ip": node_ip}],
            "podIP": node_ip, "podIPs": [{"ip": node_ip}], "startTime": pod_start_time(pod),
            "conditions": [
                cond("PodReadyToStartContainers", "True", None, None),
                cond("Initialized", "True", None, None),
                cond("Ready", "False", Some("ContainersNotReady"), Some(&not_ready)),
                cond("ContainersReady", "False", Some("ContainersNotReady"), Some(&not_ready)),
                cond("PodScheduled", "True", None, None),
            ],
            "containerStatuses": statuses,
        })
    }

    pub(super) async fn try_start(
        &mut self,
        pod: &Pod,
        node: &Node,
        faults: &crate::state::Faults,
    ) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let node_ip = self.node_ip(node);
        let (in_backoff, pull_failed_at, attempts) = {
            let w = self.waiting.entry(uid.clone()).or_default();
            (
                w.next_try.is_some_and(|t| Instant::now() < t),
                w.pull_failed_at,
                w.attempts,
            )
        };
        if in_backoff {
            // In back-off. After a failed pull, ErrImagePull turns into ImagePullBackOff.
            if let Some(at) = pull_failed_at {
                if at.elapsed() >= Duration::from_millis(1500) {
                    let image = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.containers.first())
                        .and_then(|c| c.image.clone())
                        .unwrap_or_default();
                    let msg = format!("Back-off pulling image \"{image}\"");
                    let status = self.waiting_status(pod, &node_ip, "ImagePullBackOff", Some(&msg));
                    self.write_status(pod, format!("backoff:{attempts}"), status)
                        .await?;
                    self.event(pod, "Normal", "BackOff", &msg, "kubelet", Some(&node_name))
                        .await;
                }
            }
            return Ok(());
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let labels = labels_of(pod);
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());

        // Image "pulls": there is no registry, so an image must already be in the engine.
        for c in &spec.containers {
            let image = c.image.clone().unwrap_or_default();
            let present = self.docker.inspect_image(&image).await.is_ok();
            let injected = fault_selects(&faults.image_pull, &labels);
            if !present || injected {
                let why = if injected {
                    "injected fault (kube-standin image-pull-fail)".to_string()
                } else {
                    "the image is not present on the node and no registry is reachable".to_string()
                };
                let msg = format!("Failed to pull image \"{image}\": {why}");
                let w = self.waiting.get_mut(&uid).expect("waiting entry");
                w.attempts += 1;
                let backoff = self.cfg.image_backoff * 2u32.saturating_pow(w.attempts.min(4) - 1);
                w.next_try = Some(Instant::now() + backoff.max(Duration::from_millis(1600)));
                w.pull_failed_at = Some(Instant::now());
                let attempts = w.attempts;
                let status = self.waiting_status(pod, &node_ip, "ErrImagePull", Some(&msg));
                self.write_status(pod, format!("errimagepull:{attempts}"), status)
                    .await?;
                self.event(
                    pod,
                    "Warning",
                    "Failed",
                    &format!("Error: ErrImagePull: {msg}"),
                    "kubelet",
                    Some(&node_name),
                )
                .await;
                return Ok(());
            }
        }

        // Volumes: secrets, config maps, claims, host paths, empty dirs.
        let pod_dir = self.shared.state_dir.join("pods").join(&uid);
        let mut volume_dirs: HashMap<String, (PathBuf, bool)> = HashMap::new();
        for v in spec.volumes.clone().unwrap_or_default() {
            let dir = pod_dir.join("volumes").join(&v.name);
            let source = if let Some(h) = &v.host_path {
                let p = PathBuf::from(&h.path);
                if h.type_.as_deref() == Some("DirectoryOrCreate") {
                    let _ = std::fs::create_dir_all(&p);
                }
                Some((p, false))
            } else if let Some(c) = &v.persistent_volume_claim {
                let p = self.claim_dir(&ns, &c.claim_name);
                std::fs::create_dir_all(&p)?;
                Some((p, c.read_only.unwrap_or(false)))
            } else if v.empty_dir.is_some() {
                std::fs::create_dir_all(&dir)?;
                Some((dir.clone(), false))
            } else if let Some(s) = &v.secret {
                let name = s.secret_name.clone().unwrap_or_default();
                let api: Api<Secret> = Api::namespaced(self.shared.client.clone(), &ns);
                match api.get_opt(&name).await? {
                    Some(secret) => {
                        let data: BTreeMap<String, Vec<u8>> = secret
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0))
                            .collect();
                        write_volume_files(
                            &dir,
                            &data,
                            s.items.as_deref(),
                            s.default_mode.unwrap_or(0o644),
                        )?;
                        Some((dir.clone(), true))
                    }
                    None if s.optional == Some(true) => {
                        std::fs::create_dir_all(&dir)?;
                        Some((dir.clone(), true))
                    }
                    None => {
                        let msg = format!("MountVolume.SetUp failed for volume \"{}\" : secret \"{name}\" not found", v.name);
                        let status = self.waiting_status(pod, &node_ip, "ContainerCreating", None);
                        self.write_status(pod, format!("mount:{msg}"), status)
                            .await?;
                        self.event(
                            pod,
                            "Warning",
                            "FailedMount",
                            &msg,
                            "kubelet",
                            Some(&node_name),
                        )
                        .await;
                        self.retry_later(&uid);
                        return Ok(());
                    }
                }
            } else if let Some(cm) = &v.config_map {
                let name = cm.name.clone();
                let api: Api<ConfigMap> = Api::namespaced(self.shared.client.clone(), &ns);
                match api.get_opt(&name).await? {
                    Some(m) => {
                        let mut data: BTreeMap<String, Vec<u8>> = m
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.into_bytes()))
                            .collect();
                        data.extend(
                            m.binary_data
                                .unwrap_or_default()
                                .into_iter()
                                .map(|(k, v)| (k, v.0)),
                        );
                        write_volume_files(
                            &dir,
                            &data,
                            cm.items.as_deref(),
                            cm.default_mode.unwrap_or(0o644),
                        )?;
                        Some((dir.clone(), true))
                    }
                    None if cm.optional == Some(true) => {
                        std::fs::create_dir_all(&dir)?;
                        Some((dir.clone(), true))
                    }
                    None => {
                        let msg = format!("MountVolume.SetUp failed for volume \"{}\" : configmap \"{name}\" not found", v.name);
                        let status = self.waiting_status(pod, &node_ip, "ContainerCreating", None);
                        self.write_status(pod, format!("mount:{msg}"), status)
                            .await?;
                        self.event(
                            pod,
                            "Warning",
                            "FailedMount",
                            &msg,
                            "kubelet",
                            Some(&node_name),
                        )
                        .await;
                        self.retry_later(&uid);
                        return Ok(());
                    }
                }
            } else {
                None
            };
            if let Some(s) = source {
                volume_dirs.insert(v.name.clone(), s);
            }
        }

        // The service account's token, as a kubelet projects it (unless the pod opts out):
        // token, namespace and ca.crt at the well-known path, and the API's address in env.
        let sa_dir = (spec.automount_service_account_token != Some(false))
            .then(|| pod_dir.join("volumes").join("kube-api-access-standin"));
        if let Some(dir) = &sa_dir {
            let token = self
                .shared
                .token
                .clone()
                .unwrap_or_else(|| "kube-standin-anonymous".into());
            let files = BTreeMap::from([
                ("token".to_string(), token.into_bytes()),
                ("namespace".to_string(), ns.clone().into_bytes()),
                ("ca.crt".to_string(), Vec::new()),
            ]);
            write_volume_files(dir, &files, None, 0o644)?;
        }

        // Container configs (environment needs secrets and config maps).
        let gpus = self.allocate_gpus(&node_name, pod);
        let mut bodies = Vec::new();
        for c in &spec.containers {
            let env = if fault_selects(&faults.config_error, &labels) {
                Err("injected fault (kube-standin config-error)".to_string())
            } else {
                self.container_env(pod, c, &node_ip, &node_name, &gpus)
                    .await?
            };
            let env = match env {
                Ok(mut e) if sa_dir.is_some() => {
                    e.push("KUBERNETES_SERVICE_HOST=127.0.0.1".into());
                    e.push(format!("KUBERNETES_SERVICE_PORT={}", self.shared.port));
                    e
                }
                Ok(e) => e,
                Err(msg) => {
                    return self
                        .container_error(
                            pod,
                            &uid,
                            &node_ip,
                            &node_name,
                            "CreateContainerConfigError",
                            &msg,
                        )
                        .await;
                }
            };
            let mut binds = Vec::new();
            for m in c.volume_mounts.clone().unwrap_or_default() {
                let Some((src, vol_ro)) = volume_dirs.get(&m.name) else {
                    tracing::warn!(
                        "pod {ns}/{}: volume {} is not mounted (unsupported volume type)",
                        pod.metadata.name.clone().unwrap_or_default(),
                        m.name
                    );
                    continue;
                };
                let mut src = src.clone();
                if let Some(sp) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                    // As the kubelet does: a subPath must stay inside its volume, links on the
                    // way included (it is refused, never mounted from outside).
                    let joined = src.join(sp);
                    if !joined.exists() && std::fs::symlink_metadata(&joined).is_err() {
                        let _ = std::fs::create_dir_all(&joined);
                    }
                    let inside = match (joined.canonicalize(), src.canonicalize()) {
                        (Ok(real), Ok(root)) => real.starts_with(&root).then_some(real),
                        _ => None,
                    };
                    let Some(real) = inside else {
                        let msg = format!(
                            "failed to prepare subPath for volumeMount \"{}\" of container \"{}\": \
                             subpath {sp:?} is outside the volume",
                            m.name, c.name
                        );
                        return self
                            .container_error(
                                pod,
                                &uid,
                                &node_ip,
                                &node_name,
                                "CreateContainerConfigError",
                                &msg,
                            )
                            .await;
                    };
                    src = real;
                }
                let ro = m.read_only.unwrap_or(false) || *vol_ro;
                binds.push(format!(
                    "{}:{}{}",
                    src.display(),
                    m.mount_path,
                    if ro { ":ro" } else { "" }
                ));
            }
            if let Some(dir) = &sa_dir {
                let mounted = c
                    .volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.mount_path.trim_end_matches('/') == SA_PATH);
                if !mounted {
                    binds.push(format!("{}:{SA_PATH}:ro", dir.display()));
                }
            }
            bodies.push((c.clone(), self.create_body(pod, c, env, binds)));
        }

        // Create and start.
        std::fs::create_dir_all(&pod_dir)?;
        let mut ctrs = Vec::new();
        for (c, body) in bodies {
            let cname = format!(
                "k8s_{}_{}_{}_{}_0",
                c.name,
                pod.metadata.name.clone().unwrap_or_default(),
                ns,
                uid
            );
            let opts = CreateContainerOptionsBuilder::default()
                .name(&cname)
                .build();
            let created = match self.docker.create_container(Some(opts), body).await {
                Ok(r) => r,
                Err(e) => {
                    for ctr in &ctrs {
                        let c: &Ctr = ctr;
                        let _ = self
                            .docker
                            .remove_container(
                                &c.id,
                                Some(RemoveContainerOptionsBuilder::default().force(true).build()),
                            )
                            .await;
                    }
                    let msg = format!(
                        "failed to create container {}: {}",
                        c.name,
                        docker_message(&e)
                    );
                    return self
                        .container_error(
                            pod,
                            &uid,
                            &node_ip,
                            &node_name,
                            "CreateContainerError",
                            &msg,
                        )
                        .await;
                }
            };
            let image = c.image.clone().unwrap_or_default();
            let image_id = self
                .docker
                .inspect_image(&image)
                .await
                .ok()
                .and_then(|i| i.id)
                .unwrap_or_default();
            ctrs.push(Ctr {
                name: c.name.clone(),
                id: created.id,
                image,
                image_id,
                restarts: 0,
                last: None,
                state: json!({"waiting": {"reason": "ContainerCreating"}}),
                restart_at: None,
            });
        }
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        for c in &mut ctrs {
            self.docker
                .start_container(
                    &c.id,
                    None::<bollard::query_parameters::StartContainerOptions>,
                )
                .await
                .with_context(|| format!("starting container {} of {ns}/{pod_name}", c.name))?;
            c.state = json!({"running": {"startedAt": now()}});
        }
        let started = now();
        for c in &ctrs {
            self.event(
                pod,
                "Normal",
                "Started",
                &format!("Started container {}", c.name),
                "kubelet",
                Some(&node_name),
            )
            .await;
        }
        tracing::info!(
            "pod {ns}/{pod_name} running on {node_name} ({} container(s))",
            ctrs.len()
        );
        self.waiting.remove(&uid);
        self.runs.insert(
            uid,
            Run {
                ns,
                name: pod_name,
                node: node_name,
                grace: spec.termination_grace_period_seconds.unwrap_or(30),
                ctrs,
                pod_dir,
                gpus,
                started,
            },
        );
        // The pod was just started on `node`: its address is all the status needs.
        self.monitor(pod, None, std::slice::from_ref(node)).await
    }

    pub(super) fn retry_later(&mut self, uid: &str) {
        let w = self.waiting.entry(uid.to_string()).or_default();
        w.attempts += 1;
        w.pull_failed_at = None;
        w.next_try = Some(Instant::now() + Duration::from_secs(2));
    }

    /// GPU indexes for the pod on its node (its nvidia.com/gpu limit), not in use by others.
    pub(super) fn allocate_gpus(&self, node: &str, pod: &Pod) -> Vec<u32> {
        let want = sched::pod_requests(pod)
            .get(sched::GPU)
            .copied()
            .unwrap_or(0.0) as u32;
        if want == 0 {
            return Vec::new();
        }
        let taken: HashSet<u32> = self
            .runs
            .values()
            .filter(|r| r.node == node)
            .flat_map(|r| r.gpus.clone())
            .collect();
        (0..64)
            .filter(|i| !taken.contains(i))
            .take(want as usize)
            .collect()
    }
}
