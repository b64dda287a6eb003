//! What a pod's containers are made of: their environment (the downward API, ConfigMaps,
//! Secrets, dependent variables), the Docker create body, and the files of projected volumes.

use super::*;

/// `$(VAR)` references expanded from earlier variables; `$$(VAR)` escapes; unknown ones stay.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(j) => {
                    let name = &inner[..j];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &inner[j + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Writes a secret's or config map's keys as files (all keys, or the listed `items`).
pub(super) fn write_volume_files(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: i32,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let files: Vec<(String, &Vec<u8>, i32)> = match items {
        Some(items) => items
            .iter()
            .filter_map(|it| {
                data.get(&it.key)
                    .map(|v| (it.path.clone(), v, it.mode.unwrap_or(default_mode)))
            })
            .collect(),
        None => data
            .iter()
            .map(|(k, v)| (k.clone(), v, default_mode))
            .collect(),
    };
    for (path, content, mode) in files {
        if path.split('/').any(|p| p == "..") || path.starts_with('/') {
            continue;
        }
        let p = dir.join(&path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, content)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode((mode & 0o7777) as u32))?;
    }
    Ok(())
}

impl Agent {
    /// The container's environment (KEY=VALUE), or the CreateContainerConfigError message.
    pub(super) async fn container_env(
        &self,
        pod: &Pod,
        c: &Container,
        node_ip: &str,
        node_name: &str,
        gpus: &[u32],
    ) -> Result<Result<Vec<String>, String>> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let secrets: Api<Secret> = Api::namespaced(self.shared.client.clone(), &ns);
        let maps: Api<ConfigMap> = Api::namespaced(self.shared.client.clone(), &ns);
        let mut env: Vec<(String, String)> = Vec::new();
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(x, _)| *x != k);
            env.push((k, v));
        };
        if !gpus.is_empty() {
            let ids = gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            set(&mut env, "NVIDIA_VISIBLE_DEVICES".into(), ids);
        }
        for from in c.env_from.clone().unwrap_or_default() {
            let prefix = from.prefix.clone().unwrap_or_default();
            if let Some(r) = from.secret_ref {
                match secrets.get_opt(&r.name).await? {
                    Some(s) => {
                        for (k, v) in s.data.unwrap_or_default() {
                            set(
                                &mut env,
                                format!("{prefix}{k}"),
                                String::from_utf8_lossy(&v.0).into_owned(),
                            );
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Ok(Err(format!("secret \"{}\" not found", r.name))),
                }
            }
            if let Some(r) = from.config_map_ref {
                match maps.get_opt(&r.name).await? {
                    Some(m) => {
                        for (k, v) in m.data.unwrap_or_default() {
                            set(&mut env, format!("{prefix}{k}"), v);
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Ok(Err(format!("configmap \"{}\" not found", r.name))),
                }
            }
        }
        let labels = labels_of(pod);
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        for e in c.env.clone().unwrap_or_default() {
            let value = if let Some(v) = e.value {
                expand(&v, &env)
            } else if let Some(src) = e.value_from {
                if let Some(f) = src.field_ref {
                    let path = f.field_path.as_str();
                    let v = match path {
                        "metadata.name" => pod.metadata.name.clone(),
                        "metadata.namespace" => Some(ns.clone()),
                        "metadata.uid" => pod.metadata.uid.clone(),
                        "spec.nodeName" => Some(node_name.to_string()),
                        "spec.serviceAccountName" => pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.service_account_name.clone()),
                        "status.hostIP" | "status.podIP" => Some(node_ip.to_string()),
                        "status.hostIPs" | "status.podIPs" => Some(node_ip.to_string()),
                        _ => path
                            .strip_prefix("metadata.labels['")
                            .and_then(|r| r.strip_suffix("']"))
                            .map(|k| labels.get(k).cloned().unwrap_or_default())
                            .or_else(|| {
                                path.strip_prefix("metadata.annotations['")
                                    .and_then(|r| r.strip_suffix("']"))
                                    .map(|k| annotations.get(k).cloned().unwrap_or_default())
                            }),
                    };
                    match v {
                        Some(v) => v,
                        None => return Ok(Err(format!("unsupported fieldRef {path}"))),
                    }
                } else if let Some(r) = src.secret_key_ref {
                    match secrets.get_opt(&r.name).await? {
                        Some(s) => match s.data.unwrap_or_default().get(&r.key) {
                            Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Ok(Err(format!(
                                    "couldn't find key {} in Secret {ns}/{}",
                                    r.key, r.name
                                )))
                            }
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Ok(Err(format!("secret \"{}\" not found", r.name))),
                    }
                } else if let Some(r) = src.config_map_key_ref {
                    match maps.get_opt(&r.name).await? {
                        Some(m) => match m.data.unwrap_or_default().get(&r.key) {
                            Some(v) => v.clone(),
                            None if r.optional == Some(true) => continue,
                            None => {
                                return Ok(Err(format!(
                                    "couldn't find key {} in ConfigMap {ns}/{}",
                                    r.key, r.name
                                )))
                            }
                        },
                        None if r.optional == Some(true) => continue,
                        None => return Ok(Err(format!("configmap \"{}\" not found", r.name))),
                    }
                } else if let Some(r) = src.resource_field_ref {
                    let res = c.resources.clone().unwrap_or_default();
                    let (map, key) = match r.resource.split_once('.') {
                        Some(("limits", k)) => (res.limits.unwrap_or_default(), k.to_string()),
                        Some(("requests", k)) => (res.requests.unwrap_or_default(), k.to_string()),
                        _ => {
                            return Ok(Err(format!("unsupported resourceFieldRef {}", r.resource)))
                        }
                    };
                    let v = map
                        .get(&key)
                        .and_then(|q| sched::parse_quantity(&q.0))
                        .unwrap_or(0.0);
                    let divisor = r
                        .divisor
                        .as_ref()
                        .and_then(|q| sched::parse_quantity(&q.0))
                        .unwrap_or(1.0);
                    format!("{}", (v / divisor).ceil() as i64)
                } else {
                    String::new()
                }
            } else {
                String::new()
            };
            set(&mut env, e.name, value);
        }
        Ok(Ok(env
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()))
    }

    pub(super) fn create_body(
        &self,
        pod: &Pod,
        c: &Container,
        env: Vec<String>,
        binds: Vec<String>,
    ) -> ContainerCreateBody {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let kv: Vec<(String, String)> = env
            .iter()
            .filter_map(|e| {
                e.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        let command = c
            .command
            .clone()
            .map(|v| v.iter().map(|a| expand(a, &kv)).collect::<Vec<_>>());
        let args = c
            .args
            .clone()
            .map(|v| v.iter().map(|a| expand(a, &kv)).collect::<Vec<_>>());
        let limits = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        let memory = limits
            .get(sched::MEMORY)
            .and_then(|q| sched::parse_quantity(&q.0))
            .map(|b| b as i64);
        let nano_cpus = limits
            .get(sched::CPU)
            .and_then(|q| sched::parse_quantity(&q.0))
            .map(|c| (c * 1e9) as i64);
        let labels: HashMap<String, String> = [
            (LABEL_INSTANCE.to_string(), self.shared.instance.clone()),
            (LABEL_STATE.to_string(), self.state_label()),
            (
                LABEL_POD_NAME.to_string(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                LABEL_POD_NAMESPACE.to_string(),
                pod.metadata.namespace.clone().unwrap_or_default(),
            ),
            (LABEL_POD_UID.to_string(), uid),
            (LABEL_CONTAINER_NAME.to_string(), c.name.clone()),
        ]
        .into();
        let sc = c.security_context.clone().unwrap_or_default();
        let psc = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.clone())
            .unwrap_or_default();
        let user = sc.run_as_user.or(psc.run_as_user).map(|u| {
            match sc.run_as_group.or(psc.run_as_group) {
                Some(g) => format!("{u}:{g}"),
                None => u.to_string(),
            }
        });
        ContainerCreateBody {
            image: c.image.clone(),
            // command replaces the image's ENTRYPOINT (and then its CMD too); args replace CMD.
            cmd: match (&command, args) {
                (_, Some(a)) => Some(a),
                (Some(_), None) => Some(Vec::new()),
                (None, None) => None,
            },
            entrypoint: command,
            env: Some(env),
            working_dir: c.working_dir.clone(),
            labels: Some(labels),
            tty: c.tty,
            open_stdin: c.stdin,
            user,
            hostname: None,
            host_config: Some(HostConfig {
                binds: Some(binds),
                network_mode: Some("host".into()),
                memory,
                memory_swap: memory,
                nano_cpus,
                privileged: sc.privileged,
                // The container's securityContext, as a container runtime applies it.
                cap_add: sc.capabilities.as_ref().and_then(|c| c.add.clone()),
                cap_drop: sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
                security_opt: (sc.allow_privilege_escalation == Some(false))
                    .then(|| vec!["no-new-privileges".to_string()]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
