//! The scheduler's part: claims bound to their volumes, pods bound to a node that fits them
//! (resources, selectors, taints and tolerations, affinity), with the events a real scheduler
//! writes.

use super::*;

impl Agent {
    pub(super) async fn bind_claims(&mut self) -> Result<()> {
        let api: Api<PersistentVolumeClaim> = Api::all(self.shared.client.clone());
        for pvc in api.list(&ListParams::default()).await?.items {
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                continue;
            }
            let ns = pvc.metadata.namespace.clone().unwrap_or_default();
            let name = pvc.metadata.name.clone().unwrap_or_default();
            let dir = self.claim_dir(&ns, &name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let spec = pvc.spec.clone().unwrap_or_default();
            let storage = spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage").cloned())
                .map(|q| q.0)
                .unwrap_or_else(|| "1Gi".into());
            let volume = format!("pvc-{}", pvc.metadata.uid.clone().unwrap_or_default());
            let nsapi: Api<PersistentVolumeClaim> =
                Api::namespaced(self.shared.client.clone(), &ns);
            nsapi
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"volumeName": volume}})),
                )
                .await?;
            nsapi
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"status": {"phase": "Bound", "accessModes": spec.access_modes,
                                                     "capacity": {"storage": storage}}}),
                    ),
                )
                .await?;
            tracing::info!("claim {ns}/{name} bound to {}", dir.display());
        }
        Ok(())
    }

    pub(super) fn claim_dir(&self, ns: &str, name: &str) -> PathBuf {
        self.shared.state_dir.join("pvcs").join(ns).join(name)
    }

    pub(super) async fn schedule(
        &mut self,
        pod: &Pod,
        nodes: &[Node],
        faults: &crate::state::Faults,
        used: &HashMap<String, Resources>,
        placed: &[(Pod, String)],
    ) -> Result<Option<String>> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let unschedulable = |msg: String| -> (String, Value) {
            let status = json!({"phase": "Pending",
                "conditions": [cond("PodScheduled", "False", Some("Unschedulable"), Some(&msg))]});
            (format!("unschedulable:{msg}"), status)
        };
        // Claims must exist (and are bound by now).
        let mut missing_claim = None;
        for v in pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default()
        {
            if let Some(c) = v.persistent_volume_claim {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.shared.client.clone(), &ns);
                if api.get_opt(&c.claim_name).await?.is_none() {
                    missing_claim = Some(c.claim_name);
                    break;
                }
            }
        }
        let (digest, status, reason) = if fault_selects(&faults.unschedulable, &labels_of(pod)) {
            let msg = format!(
                "0/{} nodes are available: {} node(s) were unschedulable. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.",
                nodes.len(), nodes.len(), nodes.len(), nodes.len()
            );
            let (d, s) = unschedulable(msg.clone());
            (d, s, Some(msg))
        } else if let Some(claim) = missing_claim {
            let msg = format!("persistentvolumeclaim \"{claim}\" not found. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.", nodes.len(), nodes.len());
            let (d, s) = unschedulable(msg.clone());
            (d, s, Some(msg))
        } else {
            let pairs: Vec<(&Pod, &Node)> = placed
                .iter()
                .filter_map(|(p, n)| {
                    nodes
                        .iter()
                        .find(|x| x.metadata.name.as_deref() == Some(n.as_str()))
                        .map(|x| (p, x))
                })
                .collect();
            let placed_refs: Vec<Placed<'_>> = pairs
                .iter()
                .map(|(p, n)| Placed { pod: p, node: n })
                .collect();
            let mut sorted_nodes: Vec<&Node> = nodes.iter().collect();
            sorted_nodes.sort_by_key(|n| n.metadata.name.clone());
            let mut all_reasons = Vec::new();
            let mut chosen = None;
            for n in sorted_nodes {
                let nname = n.metadata.name.clone().unwrap_or_default();
                let ready = !self.lost_applied.contains(&nname);
                let empty = Resources::new();
                let u = used.get(&nname).unwrap_or(&empty);
                let mut reasons = sched::node_rejects(pod, n, u, &placed_refs, ready);
                let max_pods = sched::node_allocatable(n)
                    .get("pods")
                    .copied()
                    .unwrap_or(110.0);
                if u.get("pods").copied().unwrap_or(0.0) + 1.0 > max_pods {
                    reasons.push("Too many pods".into());
                }
                if reasons.is_empty() {
                    chosen = Some(nname);
                    break;
                }
                all_reasons.push(reasons);
            }
            match chosen {
                Some(node) => {
                    let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &ns);
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"nodeName": node}})),
                    )
                    .await?;
                    let status = json!({"phase": "Pending", "conditions": [cond("PodScheduled", "True", None, None)]});
                    self.write_status(pod, format!("scheduled:{node}"), status)
                        .await?;
                    let msg = format!("Successfully assigned {ns}/{name} to {node}");
                    self.event(pod, "Normal", "Scheduled", &msg, "default-scheduler", None)
                        .await;
                    tracing::info!("{msg}");
                    return Ok(Some(node));
                }
                None => {
                    let msg = sched::unschedulable_message(nodes.len(), &all_reasons);
                    let (d, s) = unschedulable(msg.clone());
                    (d, s, Some(msg))
                }
            }
        };
        self.write_status(pod, digest, status).await?;
        if let Some(msg) = reason {
            self.event(
                pod,
                "Warning",
                "FailedScheduling",
                &msg,
                "default-scheduler",
                None,
            )
            .await;
        }
        Ok(None)
    }
}
