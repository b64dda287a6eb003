//! A started pod's life: its containers' exits and restarts, the status written back, lost
//! nodes and their pods, and stopping a deleted pod's containers.

use super::*;

pub(super) fn node_conditions(ready: bool) -> Value {
    let t = now();
    let (st, reason, msg) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "Unknown",
            "NodeStatusUnknown",
            "Kubelet stopped posting node status.",
        )
    };
    let mut conds: Vec<Value> = [
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ]
    .iter()
    .map(|(ty, r, m)| {
        if ready {
            json!({"type": ty, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": t, "lastTransitionTime": t})
        } else {
            json!({"type": ty, "status": "Unknown", "reason": "NodeStatusUnknown", "message": msg, "lastHeartbeatTime": t, "lastTransitionTime": t})
        }
    })
    .collect();
    conds.push(json!({"type": "Ready", "status": st, "reason": reason, "message": msg, "lastHeartbeatTime": t, "lastTransitionTime": t}));
    json!(conds)
}

pub(super) fn pod_start_time(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(now)
}

/// The status of a pod with containers, and a digest of what matters in it.
pub(super) fn run_status(
    pod: &Pod,
    run: &Run,
    restart_policy: &str,
    node_ip: &str,
) -> (String, Value) {
    let mut statuses = Vec::new();
    let mut digest = String::new();
    let (mut running, mut done, mut failed) = (0, 0, 0);
    for c in &run.ctrs {
        let is_running = c.state.get("running").is_some();
        if is_running {
            running += 1;
        }
        if let Some(t) = c.state.get("terminated") {
            done += 1;
            if t.get("exitCode").and_then(Value::as_i64) != Some(0) {
                failed += 1;
            }
        }
        let mut s = json!({"name": c.name, "image": c.image, "imageID": c.image_id,
            "containerID": format!("docker://{}", c.id), "ready": is_running, "started": is_running,
            "restartCount": c.restarts, "state": c.state});
        if let Some(l) = &c.last {
            s["lastState"] = l.clone();
        }
        digest.push_str(&format!(
            "{}:{}:{};",
            c.name,
            c.restarts,
            state_key(&c.state)
        ));
        statuses.push(s);
    }
    let n = run.ctrs.len();
    let phase = if done == n && n > 0 && restart_policy != "Always" {
        if failed == 0 {
            "Succeeded"
        } else if restart_policy == "OnFailure" {
            "Running"
        } else {
            "Failed"
        }
    } else {
        "Running"
    };
    let all_ready = running == n;
    let ready_cond = |t: &str| {
        if all_ready {
            cond(t, "True", None, None)
        } else if phase == "Succeeded" || phase == "Failed" {
            cond(t, "False", Some("PodCompleted"), None)
        } else {
            let names: Vec<&str> = run
                .ctrs
                .iter()
                .filter(|c| c.state.get("running").is_none())
                .map(|c| c.name.as_str())
                .collect();
            cond(
                t,
                "False",
                Some("ContainersNotReady"),
                Some(&format!(
                    "containers with unready status: [{}]",
                    names.join(" ")
                )),
            )
        }
    };
    let status = json!({
        "phase": phase, "hostIP": node_ip, "hostIPs": [{"ip": node_ip}], "podIP": node_ip, "podIPs": [{"ip": node_ip}],
        "startTime": pod_start_time(pod),
        "conditions": [
            cond("PodReadyToStartContainers", if phase == "Running" { "True" } else { "False" }, None, None),
            cond("Initialized", "True", None, None),
            ready_cond("Ready"),
            ready_cond("ContainersReady"),
            cond("PodScheduled", "True", None, None),
        ],
        "containerStatuses": statuses,
    });
    (format!("{phase}|{digest}"), status)
}

pub(super) fn state_key(state: &Value) -> String {
    if let Some(t) = state.get("terminated") {
        format!("terminated/{}/{}", t["exitCode"], t["reason"])
    } else if let Some(w) = state.get("waiting") {
        format!("waiting/{}", w["reason"])
    } else {
        "running".into()
    }
}

/// Stops a pod's containers (SIGTERM, SIGKILL after `grace` seconds), removes them and the
/// pod's directory.
pub(super) async fn stop_run(docker: Docker, run: Run, grace: i64) {
    let stops = run.ctrs.iter().map(|c| {
        let docker = docker.clone();
        let id = c.id.clone();
        async move {
            let opts = StopContainerOptionsBuilder::default()
                .t(grace as i32)
                .build();
            let _ = docker.stop_container(&id, Some(opts)).await;
            let rm = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            let _ = docker.remove_container(&id, Some(rm)).await;
        }
    });
    futures::future::join_all(stops).await;
    let _ = std::fs::remove_dir_all(&run.pod_dir);
}

impl Agent {
    /// This instance's containers, each with whether it runs (one Docker call).
    pub(super) async fn container_states(&self) -> Result<HashMap<String, bool>> {
        let filters: HashMap<String, Vec<String>> = [(
            "label".to_string(),
            vec![format!("{LABEL_INSTANCE}={}", self.shared.instance)],
        )]
        .into();
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        Ok(self
            .docker
            .list_containers(Some(opts))
            .await?
            .into_iter()
            .filter_map(|c| {
                let running = c.state == Some(ContainerSummaryStateEnum::RUNNING);
                c.id.map(|id| (id, running))
            })
            .collect())
    }

    /// A started pod's containers: restarts that are due, exits, and the pod's status.
    /// `listed` (this tick's listing, see `container_states`) spares the inspection of a
    /// container that still runs; `None` inspects each.
    pub(super) async fn monitor(
        &mut self,
        pod: &Pod,
        listed: Option<&HashMap<String, bool>>,
        nodes: &[Node],
    ) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let restart_policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        let Some(mut run) = self.runs.remove(&uid) else {
            return Ok(());
        };
        let mut events = Vec::new();
        for c in &mut run.ctrs {
            if let Some(at) = c.restart_at {
                if Instant::now() >= at {
                    c.restart_at = None;
                    c.restarts += 1;
                    if self
                        .docker
                        .start_container(
                            &c.id,
                            None::<bollard::query_parameters::StartContainerOptions>,
                        )
                        .await
                        .is_ok()
                    {
                        c.state = json!({"running": {"startedAt": now()}});
                        events.push(("Normal", "Started", format!("Started container {}", c.name)));
                    }
                }
                continue;
            }
            if c.state.get("running").is_none() {
                continue;
            }
            if listed.and_then(|l| l.get(&c.id)) == Some(&true) {
                continue;
            }
            let info = match self
                .docker
                .inspect_container(
                    &c.id,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await
            {
                Ok(i) => i,
                Err(_) => {
                    // Removed behind our back.
                    c.state = json!({"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the pod was terminated",
                        "startedAt": run.started, "finishedAt": now()}});
                    continue;
                }
            };
            let st = info.state.unwrap_or_default();
            if st.running == Some(true) {
                continue;
            }
            let code = st.exit_code.unwrap_or(0);
            let reason = if st.oom_killed == Some(true) {
                "OOMKilled"
            } else if code == 0 {
                "Completed"
            } else {
                "Error"
            };
            let term = json!({"exitCode": code, "reason": reason,
                "startedAt": k8s_time(st.started_at.as_deref()), "finishedAt": k8s_time(st.finished_at.as_deref()),
                "containerID": format!("docker://{}", c.id)});
            let restart = match restart_policy.as_str() {
                "Always" => true,
                "OnFailure" => code != 0,
                _ => false,
            };
            if restart {
                let delay = Duration::from_secs(10u64.min(1 << c.restarts.clamp(0, 4)));
                c.last = Some(json!({"terminated": term}));
                c.restart_at = Some(Instant::now() + delay);
                c.state = json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off {}s restarting failed container={} pod={}", delay.as_secs(), c.name, run.name)}});
                events.push((
                    "Warning",
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name, run.name
                    ),
                ));
            } else {
                c.state = json!({"terminated": term});
            }
        }
        let node_ip = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(run.node.as_str()))
            .map(|n| self.node_ip(n))
            .unwrap_or_else(|| "127.0.0.1".into());
        let (digest, status) = run_status(pod, &run, &restart_policy, &node_ip);
        let node = run.node.clone();
        self.runs.insert(uid, run);
        self.write_status(pod, digest, status).await?;
        for (t, r, m) in events {
            self.event(pod, t, r, &m, "kubelet", Some(&node)).await;
        }
        Ok(())
    }

    pub(super) async fn set_node_lost(&mut self, node: &Node, lost: bool) -> Result<()> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        taints.retain(|t| t.key != "node.kubernetes.io/unreachable");
        if lost {
            for effect in ["NoSchedule", "NoExecute"] {
                taints.push(Taint {
                    key: "node.kubernetes.io/unreachable".into(),
                    effect: effect.into(),
                    time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    )),
                    ..Default::default()
                });
            }
        }
        let taints = if taints.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&taints)?
        };
        self.nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": taints}})),
            )
            .await?;
        self.nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": node_conditions(!lost)}})),
            )
            .await?;
        tracing::info!(
            "node {name} is now {}",
            if lost {
                "lost (NotReady)"
            } else {
                "Ready again"
            }
        );
        Ok(())
    }

    /// The pod of a node cut off from the control plane, as the node controller marks it: not
    /// Ready, phase unchanged (its containers may well still run there).
    pub(super) async fn mark_not_ready(&mut self, pod: &Pod, node: &str) -> Result<()> {
        let msg = format!("Node {node} is not ready");
        let status = json!({
            "conditions": [
                cond("Ready", "False", Some("NodeNotReady"), Some(&msg)),
                cond("ContainersReady", "False", Some("NodeNotReady"), None),
                cond("PodScheduled", "True", None, None),
            ],
        });
        self.write_status(pod, "notready".into(), status).await?;
        Ok(())
    }

    pub(super) async fn fail_node_lost(&mut self, pod: &Pod, node: &str) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let mut statuses = Vec::new();
        if let Some(run) = self.runs.remove(&uid) {
            for c in &run.ctrs {
                let _ = self
                    .docker
                    .kill_container(
                        &c.id,
                        Some(
                            KillContainerOptionsBuilder::default()
                                .signal("SIGKILL")
                                .build(),
                        ),
                    )
                    .await;
            }
            for c in &run.ctrs {
                statuses.push(json!({"name": c.name, "image": c.image, "imageID": c.image_id,
                    "containerID": format!("docker://{}", c.id), "ready": false, "started": false, "restartCount": c.restarts,
                    "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the pod was terminated",
                        "startedAt": run.started, "finishedAt": now()}}}));
            }
            // The containers stay (killed) until the pod is deleted, like the rest of the pod.
            self.runs.insert(
                uid.clone(),
                Run {
                    ctrs: run.ctrs.clone(),
                    ..run
                },
            );
            if let Some(r) = self.runs.get_mut(&uid) {
                for c in &mut r.ctrs {
                    c.state = json!({"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}});
                    c.restart_at = None;
                }
            }
        } else {
            for c in pod
                .spec
                .as_ref()
                .map(|s| s.containers.clone())
                .unwrap_or_default()
            {
                statuses.push(json!({"name": c.name, "image": c.image, "imageID": "", "ready": false, "started": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown",
                        "message": "The container could not be located when the pod was terminated",
                        "startedAt": null, "finishedAt": now()}}}));
            }
        }
        let msg = format!("Node {node} which was running pod {name} is unresponsive");
        let status = json!({
            "phase": "Failed", "reason": "NodeLost", "message": msg,
            "conditions": [
                cond("DisruptionTarget", "True", Some("DeletionByTaintManager"), Some("Taint manager: deleting due to NoExecute taint")),
                cond("Ready", "False", Some("NodeLost"), Some(&msg)),
                cond("ContainersReady", "False", Some("NodeLost"), None),
                cond("PodScheduled", "True", None, None),
            ],
            "containerStatuses": statuses,
        });
        self.write_status(pod, "nodelost".into(), status).await?;
        self.event(
            pod,
            "Warning",
            "NodeNotReady",
            "Node is not ready",
            "node-controller",
            None,
        )
        .await;
        tracing::info!("{msg}: pod failed (NodeLost)");
        Ok(())
    }
}
