//! Scheduling rules as pure functions: quantities, pod requests, node fit, taints and
//! tolerations, node selectors and affinity, required pod anti-affinity.
//!
//! The rules follow the default kube-scheduler filters that matter for one-pod-per-run
//! workloads (NodeResourcesFit, NodeName, NodeAffinity, TaintToleration, NodeUnschedulable,
//! InterPodAffinity for required anti-affinity). Scoring is not modelled: the first node (in
//! name order) that passes every filter wins.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodAffinityTerm, Taint,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Resource names the scheduler counts.
pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const GPU: &str = "nvidia.com/gpu";

/// Parses a Kubernetes quantity ("500m", "2", "1.5", "8Gi", "100M", "1e3") into base units.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    if q.is_empty() {
        return None;
    }
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let num: f64 = num.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some(num * factor)
}

/// A set of resource amounts in base units (cpu in cores, memory in bytes, counts for the rest).
pub type Resources = BTreeMap<String, f64>;

fn add_quantities(into: &mut Resources, from: Option<&BTreeMap<String, Quantity>>) {
    for (k, v) in from.into_iter().flatten() {
        if let Some(x) = parse_quantity(&v.0) {
            *into.entry(k.clone()).or_default() += x;
        }
    }
}

/// What one container asks for: its requests, or its limits where a request is missing (the
/// API server defaults requests to limits).
pub fn container_requests(c: &Container) -> Resources {
    let mut r = Resources::new();
    let res = c.resources.as_ref();
    add_quantities(&mut r, res.and_then(|r| r.limits.as_ref()));
    let mut req = Resources::new();
    add_quantities(&mut req, res.and_then(|r| r.requests.as_ref()));
    r.extend(req);
    r
}

/// What a pod asks for: the sum over its containers, or the largest init container if that
/// is more (init containers run one at a time), per resource.
pub fn pod_requests(pod: &Pod) -> Resources {
    let mut total = Resources::new();
    let Some(spec) = pod.spec.as_ref() else {
        return total;
    };
    for c in &spec.containers {
        for (k, v) in container_requests(c) {
            *total.entry(k).or_default() += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in container_requests(c) {
            let e = total.entry(k).or_default();
            if v > *e {
                *e = v;
            }
        }
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        add_quantities(&mut total, Some(overhead));
    }
    total
}

/// A node's allocatable resources (status.allocatable, else status.capacity).
pub fn node_allocatable(node: &Node) -> Resources {
    let mut r = Resources::new();
    let status = node.status.as_ref();
    add_quantities(
        &mut r,
        status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref())),
    );
    r
}

/// The resources that are short on a node for `want`, given what is already in use there.
/// Empty when the pod fits. Names follow the scheduler's "Insufficient <resource>" wording.
pub fn insufficient(allocatable: &Resources, used: &Resources, want: &Resources) -> Vec<String> {
    let mut short = Vec::new();
    for (k, &v) in want {
        if v <= 0.0 {
            continue;
        }
        let have = allocatable.get(k).copied().unwrap_or(0.0);
        let taken = used.get(k).copied().unwrap_or(0.0);
        // A small tolerance absorbs float rounding of milli-units.
        if taken + v > have + 1e-9 {
            short.push(k.clone());
        }
    }
    short
}

/// Does `toleration` tolerate `taint`? (The upstream ToleratesTaint rule.)
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty()) {
        if effect != taint.effect {
            return false;
        }
    }
    match toleration.key.as_deref().filter(|k| !k.is_empty()) {
        // An empty key with operator Exists matches every taint.
        None => toleration.operator.as_deref() == Some("Exists"),
        Some(key) if key != taint.key => false,
        Some(_) => match toleration.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            "Equal" | "" => {
                toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
            }
            _ => false,
        },
    }
}

/// The first taint with effect NoSchedule or NoExecute that none of `tolerations` tolerates.
pub fn untolerated_taint<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

fn node_requirement_matches(
    req: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let value = labels.get(&req.key);
    let values = req.values.as_deref().unwrap_or(&[]);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn node_term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing.
        return false;
    }
    let mut node_fields = BTreeMap::new();
    if let Some(name) = node.metadata.name.clone() {
        node_fields.insert("metadata.name".to_string(), name);
    }
    exprs.iter().all(|r| node_requirement_matches(r, labels))
        && fields
            .iter()
            .all(|r| node_requirement_matches(r, &node_fields))
}

/// nodeSelector and required node affinity (the NodeAffinity filter).
pub fn node_selector_matches(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    if let Some(sel) = spec.node_selector.as_ref() {
        if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        // Terms are ORed.
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| node_term_matches(t, node)),
        None => true,
    }
}

/// Does a LabelSelector match `labels`? A missing selector matches nothing, an empty one
/// matches everything (the metav1.LabelSelectorAsSelector rules).
pub fn label_selector_matches(
    sel: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(sel) = sel else {
        return false;
    };
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or(&[]);
        let ok = match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// A pod already placed on a node, as the anti-affinity check sees it.
pub struct Placed<'a> {
    pub pod: &'a Pod,
    pub node: &'a Node,
}

fn term_selects(term: &PodAffinityTerm, owner_ns: &str, other: &Pod) -> bool {
    let other_ns = other.metadata.namespace.as_deref().unwrap_or("default");
    let in_scope = match term.namespaces.as_deref() {
        Some(list) if !list.is_empty() => list.iter().any(|n| n == other_ns),
        // A namespaceSelector is accepted but only its empty form (all namespaces) is honoured.
        _ if term.namespace_selector.is_some() => true,
        _ => other_ns == owner_ns,
    };
    let empty = BTreeMap::new();
    in_scope
        && label_selector_matches(
            term.label_selector.as_ref(),
            other.metadata.labels.as_ref().unwrap_or(&empty),
        )
}

/// Required pod anti-affinity (both directions, as the InterPodAffinity filter does): false if
/// placing `pod` on `node` puts it in the same topology domain as a pod it repels, or as a pod
/// that repels it.
pub fn anti_affinity_allows(pod: &Pod, node: &Node, placed: &[Placed<'_>]) -> bool {
    let owner_ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let node_labels = node.metadata.labels.clone().unwrap_or_default();
    let same_domain = |key: &str, other: &Node| -> bool {
        let mine = node_labels.get(key);
        mine.is_some() && other.metadata.labels.as_ref().and_then(|l| l.get(key)) == mine
    };
    let terms = |p: &Pod| -> Vec<PodAffinityTerm> {
        p.spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .clone()
            })
            .unwrap_or_default()
    };
    let empty = BTreeMap::new();
    for term in terms(pod) {
        for p in placed {
            if same_domain(&term.topology_key, p.node) && term_selects(&term, owner_ns, p.pod) {
                return false;
            }
        }
    }
    let my_labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    for p in placed {
        let their_ns = p.pod.metadata.namespace.as_deref().unwrap_or("default");
        for term in terms(p.pod) {
            let in_scope = match term.namespaces.as_deref() {
                Some(list) if !list.is_empty() => list.iter().any(|n| n == owner_ns),
                _ if term.namespace_selector.is_some() => true,
                _ => their_ns == owner_ns,
            };
            if in_scope
                && same_domain(&term.topology_key, p.node)
                && label_selector_matches(term.label_selector.as_ref(), my_labels)
            {
                return false;
            }
        }
    }
    true
}

/// Why one node cannot take a pod, worded like the scheduler's FailedScheduling reasons.
pub fn node_rejects(
    pod: &Pod,
    node: &Node,
    used: &Resources,
    placed: &[Placed<'_>],
    node_ready: bool,
) -> Vec<String> {
    let mut reasons = Vec::new();
    let spec = pod.spec.as_ref();
    if let Some(name) = spec.and_then(|s| s.node_name.as_deref()) {
        if Some(name) != node.metadata.name.as_deref() {
            return vec!["node(s) didn't match the requested node name".into()];
        }
    }
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        reasons.push("node(s) were unschedulable".into());
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tolerations = spec.and_then(|s| s.tolerations.clone()).unwrap_or_default();
    if !node_ready {
        // The node lifecycle controller taints a node that stopped reporting.
        let unreachable = Taint {
            key: "node.kubernetes.io/unreachable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if untolerated_taint(std::slice::from_ref(&unreachable), &tolerations).is_some() {
            reasons.push("node(s) had untolerated taint {node.kubernetes.io/unreachable: }".into());
        }
    }
    if let Some(t) = untolerated_taint(&taints, &tolerations) {
        reasons.push(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            t.key,
            t.value.as_deref().unwrap_or("")
        ));
    }
    if !node_selector_matches(pod, node) {
        reasons.push("node(s) didn't match Pod's node affinity/selector".into());
    }
    if !anti_affinity_allows(pod, node, placed) {
        reasons.push("node(s) didn't match pod anti-affinity rules".into());
    }
    for r in insufficient(&node_allocatable(node), used, &pod_requests(pod)) {
        reasons.push(format!("Insufficient {r}"));
    }
    reasons
}

/// The FailedScheduling message: "0/N nodes are available: 1 Insufficient cpu, 2 node(s) ...".
pub fn unschedulable_message(node_count: usize, reasons: &[Vec<String>]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for per_node in reasons {
        for r in per_node {
            *counts.entry(r.as_str()).or_default() += 1;
        }
    }
    if counts.is_empty() {
        return format!("0/{node_count} nodes are available.");
    }
    let parts: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    format!(
        "0/{node_count} nodes are available: {}. preemption: 0/{node_count} nodes are available: {node_count} Preemption is not helpful for scheduling.",
        parts.join(", ")
    )
}

/// The pod's QoS class, as the API server computes it.
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = pod.spec.as_ref() else {
        return "BestEffort";
    };
    let mut any = false;
    let mut guaranteed = true;
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let res = c.resources.as_ref();
        let limits = res.and_then(|r| r.limits.clone()).unwrap_or_default();
        let requests = res.and_then(|r| r.requests.clone()).unwrap_or_default();
        if !limits.is_empty() || !requests.is_empty() {
            any = true;
        }
        for k in [CPU, MEMORY] {
            let l = limits.get(k).and_then(|q| parse_quantity(&q.0));
            let r = requests.get(k).and_then(|q| parse_quantity(&q.0)).or(l);
            if l.is_none() || l != r {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, NodeSpec, NodeStatus, PodAntiAffinity, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    fn q(s: &str) -> Quantity {
        Quantity(s.into())
    }

    fn node(
        name: &str,
        cpu: &str,
        mem: &str,
        gpu: &str,
        labels: &[(&str, &str)],
        taints: Vec<Taint>,
    ) -> Node {
        let cap: BTreeMap<String, Quantity> = [(CPU, cpu), (MEMORY, mem), (GPU, gpu)]
            .iter()
            .map(|(k, v)| (k.to_string(), q(v)))
            .collect();
        let mut l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.insert("kubernetes.io/hostname".into(), name.into());
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(l),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(cap.clone()),
                allocatable: Some(cap),
                ..Default::default()
            }),
        }
    }

    fn pod(name: &str, limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Pod {
        let m = |xs: &[(&str, &str)]| -> Option<BTreeMap<String, Quantity>> {
            (!xs.is_empty()).then(|| xs.iter().map(|(k, v)| (k.to_string(), q(v))).collect())
        };
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some("img".into()),
                    resources: Some(ResourceRequirements {
                        limits: m(limits),
                        requests: m(requests),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("1.5"), Some(1.5));
        assert_eq!(parse_quantity("2048Mi"), Some(2048.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("8Gi"), Some(8.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("100M"), Some(1e8));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("12x"), None);
        assert_eq!(parse_quantity(""), None);
    }

    #[test]
    fn requests_default_to_limits_and_fit() {
        // The manager's worker pod: limit 1 cpu with request 0.5, 2048Mi, 1 GPU.
        let p = pod(
            "w",
            &[(CPU, "1"), (MEMORY, "2048Mi"), (GPU, "1")],
            &[(CPU, "0.5")],
        );
        let want = pod_requests(&p);
        assert_eq!(want[CPU], 0.5);
        assert_eq!(want[MEMORY], 2048.0 * 1024.0 * 1024.0);
        assert_eq!(want[GPU], 1.0);
        let n = node("a", "4", "8Gi", "2", &[], vec![]);
        let alloc = node_allocatable(&n);
        assert!(insufficient(&alloc, &Resources::new(), &want).is_empty());
        let mut used = Resources::new();
        used.insert(GPU.into(), 2.0);
        used.insert(CPU.into(), 3.75);
        assert_eq!(
            insufficient(&alloc, &used, &want),
            vec![CPU.to_string(), GPU.to_string()]
        );
        // A resource the node does not have at all never fits.
        let p = pod("x", &[("example.com/fpga", "1")], &[]);
        assert_eq!(
            insufficient(&alloc, &Resources::new(), &pod_requests(&p)),
            vec!["example.com/fpga"]
        );
    }

    #[test]
    fn taints_and_tolerations() {
        let taint = Taint {
            key: "nvidia.com/gpu".into(),
            value: Some("present".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let tol =
            |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
                key: key.map(Into::into),
                operator: Some(op.into()),
                value: value.map(Into::into),
                effect: effect.map(Into::into),
                ..Default::default()
            };
        assert!(tolerates(
            &tol(
                Some("nvidia.com/gpu"),
                "Equal",
                Some("present"),
                Some("NoSchedule")
            ),
            &taint
        ));
        assert!(tolerates(
            &tol(Some("nvidia.com/gpu"), "Exists", None, None),
            &taint
        ));
        assert!(tolerates(&tol(None, "Exists", None, None), &taint));
        assert!(!tolerates(
            &tol(Some("nvidia.com/gpu"), "Equal", Some("absent"), None),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some("nvidia.com/gpu"), "Exists", None, Some("NoExecute")),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some("other"), "Exists", None, None),
            &taint
        ));
        let soft = Taint {
            effect: "PreferNoSchedule".into(),
            ..taint.clone()
        };
        assert!(untolerated_taint(&[soft], &[]).is_none());
        assert!(untolerated_taint(std::slice::from_ref(&taint), &[]).is_some());

        let n = node("gpu", "8", "16Gi", "4", &[], vec![taint]);
        let p = pod("p", &[(CPU, "1")], &[]);
        let reasons = node_rejects(&p, &n, &Resources::new(), &[], true);
        assert_eq!(
            reasons,
            vec!["node(s) had untolerated taint {nvidia.com/gpu: present}".to_string()]
        );
        let mut p2 = p.clone();
        p2.spec.as_mut().unwrap().tolerations = Some(vec![tol(
            Some("nvidia.com/gpu"),
            "Exists",
            None,
            Some("NoSchedule"),
        )]);
        assert!(node_rejects(&p2, &n, &Resources::new(), &[], true).is_empty());
        // A lost node repels everything but pods tolerating "unreachable".
        assert_eq!(
            node_rejects(&p2, &n, &Resources::new(), &[], false).len(),
            1
        );
    }

    #[test]
    fn selectors_and_anti_affinity() {
        let a = node("a", "4", "8Gi", "0", &[("pool", "cpu")], vec![]);
        let b = node("b", "4", "8Gi", "2", &[("pool", "gpu")], vec![]);
        let mut p = pod("p", &[], &[]);
        p.spec.as_mut().unwrap().node_selector =
            Some([("pool".to_string(), "gpu".to_string())].into());
        assert!(!node_selector_matches(&p, &a));
        assert!(node_selector_matches(&p, &b));

        // One worker per node: required anti-affinity on app=cl-worker by hostname.
        let mut w = pod("w1", &[], &[]);
        w.metadata.labels = Some([("app".to_string(), "cl-worker".to_string())].into());
        w.spec.as_mut().unwrap().affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                    label_selector: Some(LabelSelector {
                        match_expressions: Some(vec![LabelSelectorRequirement {
                            key: "app".into(),
                            operator: "In".into(),
                            values: Some(vec!["cl-worker".into()]),
                        }]),
                        ..Default::default()
                    }),
                    topology_key: "kubernetes.io/hostname".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut w2 = w.clone();
        w2.metadata.name = Some("w2".into());
        let placed = [Placed { pod: &w, node: &a }];
        assert!(!anti_affinity_allows(&w2, &a, &placed));
        assert!(anti_affinity_allows(&w2, &b, &placed));
        // The malformed term (labelSelector wrapped in podAffinityTerm) arrives with no
        // selector at all, and a missing selector selects nothing: it enforces nothing.
        let mut loose = w2.clone();
        let term = &mut loose.spec.as_mut().unwrap().affinity.as_mut().unwrap();
        term.pod_anti_affinity
            .as_mut()
            .unwrap()
            .required_during_scheduling_ignored_during_execution = Some(vec![PodAffinityTerm {
            topology_key: "kubernetes.io/hostname".into(),
            ..Default::default()
        }]);
        let placed_plain = [Placed {
            pod: &pod("plain", &[], &[]),
            node: &a,
        }];
        assert!(anti_affinity_allows(&loose, &a, &placed_plain));
    }

    #[test]
    fn message_and_qos() {
        let msg = unschedulable_message(
            2,
            &[
                vec!["Insufficient cpu".into()],
                vec!["Insufficient cpu".into()],
            ],
        );
        assert!(
            msg.starts_with("0/2 nodes are available: 2 Insufficient cpu."),
            "{msg}"
        );
        assert_eq!(qos_class(&pod("p", &[], &[])), "BestEffort");
        assert_eq!(
            qos_class(&pod("p", &[(CPU, "1"), (MEMORY, "1Gi")], &[])),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&pod("p", &[(CPU, "1"), (MEMORY, "1Gi")], &[(CPU, "0.5")])),
            "Burstable"
        );
    }
}
