//! The deployment files against the code they deploy, with no cloud and no peer:
//!
//! - every flag of every Terraform module's `manager_command` (the strings its `terraform test`
//!   asserts the output equals) exists on `cl-worker-manager [BACKEND] --help`, global flags
//!   before the backend and the backend's flags after it;
//! - the RBAC rules of `terraform/kubernetes` are exactly the manager's, its lease's and the
//!   Kubernetes runtime's API calls (`backends::kubernetes::rbac::PERMISSIONS` and
//!   `LEASE_PERMISSIONS`, `worker::runtime::kubernetes::rbac`), the tables `examples/kubernetes/`
//!   is checked against, `nodes/proxy` only in the opt-in rules of `kubelet_stats`; the
//!   manager's Role binds both of its tables, and its Deployment passes `--lease` for the Lease
//!   those rules name;
//! - its NetworkPolicies select the pods by the labels the code gives them;
//! - the Azure Batch pool's autoscale formula is `examples/azure/autoscale.formula`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn manager_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cl-worker-manager"))
}

/// The long flags `cl-worker-manager ARGS --help` lists.
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(manager_bin())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == '=' || c == '<')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_alphanumeric())
                .to_string()
        })
        .collect()
}

/// Shell words of a command line written by the modules (words, and single-quoted strings).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            ' ' => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            _ => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// The module directories under terraform/ (those with a versions.tf).
fn modules() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("terraform"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("versions.tf").is_file())
        .collect();
    v.sort();
    v
}

/// The command lines a module's tests assert its manager_command output equals.
fn asserted_commands(module: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(module.join("tests")) else {
        return out;
    };
    for e in dir {
        let p = e.unwrap().path();
        if !p.to_string_lossy().ends_with(".tftest.hcl") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for line in text.lines() {
            if let Some(rest) = line.split("output.manager_command == \"").nth(1) {
                let cmd = rest.rsplit_once('"').unwrap().0;
                out.push(cmd.replace("\\\"", "\""));
            }
        }
    }
    out
}

const BACKENDS: &[&str] = &[
    "aws-batch",
    "azure-batch",
    "kubernetes",
    "slurm-batch",
    "local",
];

#[test]
fn every_flag_of_every_module_command_exists_on_the_binary() {
    let global = help_flags(&[]);
    let mut checked = 0;
    for module in modules() {
        let commands = asserted_commands(&module);
        assert!(
            !commands.is_empty(),
            "{}: no test asserts its manager_command",
            module.display()
        );
        for cmd in commands {
            let words = shell_words(&cmd);
            assert_eq!(words[0], "cl-worker-manager", "{cmd}");
            let at = words
                .iter()
                .position(|w| BACKENDS.contains(&w.as_str()))
                .unwrap_or_else(|| panic!("{}: no backend in {cmd}", module.display()));
            let backend = help_flags(&[&words[at]]);
            for (i, w) in words.iter().enumerate().skip(1) {
                // Flags, not values (a value never starts with `--` in these commands).
                if !w.starts_with("--") {
                    continue;
                }
                let known = if i < at { &global } else { &backend };
                assert!(
                    known.contains(w.as_str()),
                    "{}: {w} is not a flag of `cl-worker-manager {}--help`\n{cmd}",
                    module.display(),
                    if i < at {
                        String::new()
                    } else {
                        format!("{} ", words[at])
                    }
                );
                checked += 1;
            }
        }
    }
    // aws-batch, azure-batch, gke, kubernetes: each with flags on both sides.
    assert!(checked > 60, "only {checked} flags checked");
}

#[test]
fn a_misspelled_flag_would_be_caught() {
    // The check above can fail: a flag that does not exist is not in the help.
    let backend = help_flags(&["kubernetes"]);
    assert!(backend.contains("--nfs-volume-name"), "{backend:?}");
    assert!(!backend.contains("--nfs-volume"), "{backend:?}");
    assert!(!help_flags(&[]).contains("--namespace"));
}

/// One rule of terraform/kubernetes/rbac.tf's locals: (api group, resource, verbs, whether it
/// is restricted to named objects).
type Rule = (String, String, Vec<String>, bool);

/// The rules of the list `local_name = [ … ]` in rbac.tf: one `{ api_groups = [...],
/// resources = [...], verbs = [...], resource_names = [...] }` per line.
fn tf_rules(text: &str, local_name: &str) -> Vec<Rule> {
    let start = text
        .find(&format!("  {local_name} = ["))
        .unwrap_or_else(|| panic!("no local {local_name} in rbac.tf"));
    let body = &text[start..];
    let end = body.find("\n  ]").unwrap();
    let list = |line: &str, key: &str| -> Vec<String> {
        let rest = line.split(&format!("{key} = [")).nth(1).unwrap();
        let inner = rest.split(']').next().unwrap();
        inner
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_string())
            .filter(|s| !s.is_empty() || inner.trim() == "\"\"")
            .collect()
    };
    body[..end]
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .flat_map(|l| {
            let groups = list(l, "api_groups");
            let verbs = list(l, "verbs");
            let resources = list(l, "resources");
            let named = !list(l, "resource_names").is_empty();
            let mut v = Vec::new();
            for g in &groups {
                for r in &resources {
                    v.push((g.clone(), r.clone(), verbs.clone(), named));
                }
            }
            v
        })
        .collect()
}

fn sorted(mut v: Vec<Rule>) -> Vec<Rule> {
    v.iter_mut().for_each(|r| r.2.sort());
    v.sort();
    v
}

/// A table of `backends::kubernetes::rbac` as rules of rbac.tf.
fn manager_table(t: &[backends::kubernetes::rbac::Permission]) -> Vec<Rule> {
    t.iter()
        .map(|p| {
            (
                p.api_group.to_string(),
                p.resource.to_string(),
                p.verbs.iter().map(|v| v.to_string()).collect(),
                // The Secret, the claim, the Lease: the module names them by its variables.
                !p.resource_names.is_empty(),
            )
        })
        .collect()
}

#[test]
fn terraform_kubernetes_grants_exactly_the_calls_of_the_code() {
    let text = std::fs::read_to_string(root().join("terraform/kubernetes/rbac.tf")).unwrap();
    use backends::kubernetes::rbac::{LEASE_PERMISSIONS, PERMISSIONS};
    assert_eq!(
        sorted(tf_rules(&text, "manager_rules")),
        sorted(manager_table(PERMISSIONS))
    );
    assert_eq!(
        sorted(tf_rules(&text, "manager_lease_rules")),
        sorted(manager_table(LEASE_PERMISSIONS))
    );
    let rt = |t: &[worker::runtime::kubernetes::rbac::Permission]| -> Vec<Rule> {
        t.iter()
            .map(|p| {
                (
                    p.group.to_string(),
                    p.resource.to_string(),
                    p.verbs.iter().map(|v| v.to_string()).collect(),
                    false,
                )
            })
            .collect()
    };
    assert_eq!(
        sorted(tf_rules(&text, "runtime_rules")),
        sorted(rt(worker::runtime::kubernetes::rbac::NAMESPACED))
    );
    assert_eq!(
        sorted(tf_rules(&text, "runtime_cluster_rules")),
        sorted(rt(worker::runtime::kubernetes::rbac::CLUSTER))
    );
    // nodes/proxy only in the opt-in rules of kubelet_stats (their own ClusterRole).
    assert_eq!(
        sorted(tf_rules(&text, "runtime_kubelet_stats_rules")),
        sorted(rt(worker::runtime::kubernetes::rbac::KUBELET_STATS))
    );
    for local in [
        "manager_rules",
        "manager_lease_rules",
        "runtime_rules",
        "runtime_cluster_rules",
    ] {
        assert!(
            !tf_rules(&text, local)
                .iter()
                .any(|r| r.1.contains("proxy") || r.1 == "*"),
            "{local}: nodes/proxy is granted only with kubelet_stats"
        );
    }
}

#[test]
fn terraform_kubernetes_passes_kubelet_stats_to_the_workers_through_real_flags() {
    // kubelet_stats = true: the manager's --worker-kubelet-stats, which becomes the workers'
    // --kubernetes-kubelet-stats.
    let main = std::fs::read_to_string(root().join("terraform/kubernetes/main.tf")).unwrap();
    assert!(
        main.contains("local.kubelet_stats ? [\"--worker-kubelet-stats\"] : []"),
        "main.tf must pass --worker-kubelet-stats with kubelet_stats"
    );
    assert!(help_flags(&["kubernetes"]).contains("--worker-kubelet-stats"));
    let worker = <worker::cli::Args as clap::Parser>::try_parse_from([
        "cl-worker",
        "--bundle-runtime",
        "kubernetes",
        "--kubernetes-kubelet-stats",
    ])
    .unwrap();
    assert!(worker.kubernetes.kubernetes_kubelet_stats);
}

#[test]
fn terraform_kubernetes_network_policies_select_the_pods_the_code_labels() {
    // network.tf selects pods by these labels; the code sets them.
    let text = std::fs::read_to_string(root().join("terraform/kubernetes/network.tf")).unwrap();
    let has_line = |want: &str| {
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") == want)
    };
    let managed_by = common::cluster::LABEL_MANAGED_BY;
    for (local, key, value) in [
        (
            "worker_pod_labels",
            managed_by,
            backends::kubernetes::pod::MANAGED_BY,
        ),
        (
            "run_pod_labels",
            managed_by,
            worker::runtime::kubernetes::pod::MANAGED_BY,
        ),
        // The manager's pod template (manager.tf, below).
        (
            "manager_pod_labels",
            "app.kubernetes.io/name",
            "cl-worker-manager",
        ),
    ] {
        let line = format!("{local} = {{ \"{key}\" = \"{value}\" }}");
        assert!(has_line(&line), "network.tf: no `{line}`");
    }
    let network = format!(
        "networked_run_pod_labels = merge(local.run_pod_labels, {{ \"{}\" = \"true\" }})",
        worker::runtime::kubernetes::pod::LABEL_NETWORK
    );
    assert!(has_line(&network), "network.tf: no `{network}`");
    let manager = std::fs::read_to_string(root().join("terraform/kubernetes/manager.tf")).unwrap();
    assert!(manager.contains(
        "manager_labels = merge(local.labels, { \"app.kubernetes.io/name\" = \"cl-worker-manager\" })"
    ));
    assert!(manager.contains("labels = local.manager_labels"));
}

#[test]
fn the_rule_parser_sees_a_changed_verb() {
    let text = std::fs::read_to_string(root().join("terraform/kubernetes/rbac.tf"))
        .unwrap()
        .replacen(
            "verbs = [\"create\", \"delete\", \"list\"]",
            "verbs = [\"create\", \"delete\", \"list\", \"watch\"]",
            1,
        );
    let rules = tf_rules(&text, "manager_rules");
    assert!(rules.iter().any(|r| r.2.contains(&"watch".to_string())));
}

#[test]
fn the_rule_parser_sees_a_missing_or_extra_lease_rule() {
    use backends::kubernetes::rbac::LEASE_PERMISSIONS;
    let text = std::fs::read_to_string(root().join("terraform/kubernetes/rbac.tf")).unwrap();
    let create = "    { api_groups = [\"coordination.k8s.io\"], resources = [\"leases\"], verbs = [\"create\"], resource_names = [] },\n";
    assert!(text.contains(create), "rbac.tf: no `{}`", create.trim());
    let want = sorted(manager_table(LEASE_PERMISSIONS));
    let missing = text.replacen(create, "", 1);
    assert_ne!(sorted(tf_rules(&missing, "manager_lease_rules")), want);
    let extra = text.replacen(
        create,
        &format!("{create}{}", create.replace("create", "delete")),
        1,
    );
    assert_ne!(sorted(tf_rules(&extra, "manager_lease_rules")), want);
}

#[test]
fn terraform_kubernetes_runs_its_managers_under_the_lease_its_role_names() {
    use backends::kubernetes::rbac::{LEASE_NAME, LEASE_PERMISSIONS};
    let rbac = std::fs::read_to_string(root().join("terraform/kubernetes/rbac.tf")).unwrap();
    // The manager's Role: both tables, nothing else.
    let role = rbac
        .split("resource \"kubernetes_role_v1\" \"manager\" {")
        .nth(1)
        .and_then(|r| r.split("\n}\n").next())
        .expect("rbac.tf: no kubernetes_role_v1.manager");
    assert!(
        role.contains("for_each = concat(local.manager_rules, local.manager_lease_rules)"),
        "the manager's Role must hold manager_rules and manager_lease_rules:\n{role}"
    );
    // get and update of the Lease by the variable the Deployment's --lease names.
    assert!(rbac.contains("resource_names = [var.lease_name] }"));
    let main = std::fs::read_to_string(root().join("terraform/kubernetes/main.tf")).unwrap();
    assert!(
        main.contains("[\"--lease\", \"kubernetes:${local.namespace}/${var.lease_name}\"]"),
        "main.tf must pass --lease kubernetes:NAMESPACE/lease_name"
    );
    assert!(help_flags(&[]).contains("--lease"));
    // The variable's default is the examples' Lease, the one the table names.
    let vars = std::fs::read_to_string(root().join("terraform/kubernetes/variables.tf")).unwrap();
    let lease_var = vars
        .split("variable \"lease_name\" {")
        .nth(1)
        .and_then(|v| v.split("\n}\n").next())
        .expect("variables.tf: no lease_name");
    assert!(
        lease_var.contains(&format!("default     = \"{LEASE_NAME}\"")),
        "{lease_var}"
    );
    assert!(LEASE_PERMISSIONS
        .iter()
        .any(|p| p.resource_names == [LEASE_NAME]));
    // And the module's test asserts the flag on the command line.
    let kube = root().join("terraform/kubernetes");
    let want = format!(" --lease kubernetes:codalab/{LEASE_NAME} kubernetes ");
    assert!(
        asserted_commands(&kube).iter().all(|c| c.contains(&want)),
        "every asserted command of terraform/kubernetes runs under the lease ({want})"
    );
}

#[test]
fn the_azure_pool_formula_is_the_examples() {
    let module =
        std::fs::read_to_string(root().join("terraform/azure-batch/autoscale.formula")).unwrap();
    let example = std::fs::read_to_string(root().join("examples/azure/autoscale.formula")).unwrap();
    assert_eq!(module, example);
    // The module replaces these two lines with its bounds.
    assert!(module.contains("\nmaxNodes = 10;\n") && module.contains("\nminNodes = 0;\n"));
    let main = std::fs::read_to_string(root().join("terraform/azure-batch/main.tf")).unwrap();
    assert!(main.contains("\"maxNodes = 10;\"") && main.contains("\"minNodes = 0;\""));
}
