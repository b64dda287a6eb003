"""The checks of tests/examples/check-kubernetes.sh but `schema` (run by it, with the Python and
PyYAML of the tests/peers/k8s.sh venv, from the repository root; see the list of checks there):

    python check-kubernetes.py DIR RBAC RUNTIME_RBAC CLUSTER BACKEND_POD RUNTIME_POD FILE...

Prints `PASS <check>` or one `FAIL <check>: <message>` per finding for every check."""
import ipaddress
import os
import re
import sys

import yaml

directory, rbac_rs, runtime_rbac_rs = sys.argv[1], sys.argv[2], sys.argv[3]
cluster_rs, backend_pod_rs, runtime_pod_rs = sys.argv[4], sys.argv[5], sys.argv[6]
paths = sys.argv[7:]

TEMPLATE = "secret.template.yaml"
PLACEHOLDERS = {
    "username": "REPLACE-WITH-CODALAB-USERNAME",
    "password": "REPLACE-WITH-CODALAB-PASSWORD",
}
ROLE = "cl-worker-manager"
RUNTIME = "cl-worker-runs"
# The opt-in ClusterRole of --kubernetes-kubelet-stats (nodes/proxy), and its file.
KUBELET = "cl-worker-runs-kubelet-stats"
KUBELET_FILE = "runtime-rbac-kubelet-stats.yaml"
WORKER_LABEL_KEYS = ("app.kubernetes.io/managed-by", "codalab.org/manager")
# Where the manager's flags are declared (clap derive): the global flags, the kubernetes
# backend's, and the worker shape flags it flattens in.
GLOBAL_ARGS = ("manager/src/cli.rs", "GlobalArgs")
BACKEND_ARGS = ("backends/src/kubernetes/args.rs", "KubernetesArgs")
SHAPE_ARGS = ("backends/src/profile.rs", "ShapeArgs")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}

results = []  # (check, [failures])


def check(name):
    def wrap(fn):
        problems = []
        try:
            fn(problems.append)
        except Exception as e:  # a malformed manifest is a failure, not a crash
            problems.append(f"{type(e).__name__}: {e}")
        results.append((name, problems))
        return fn
    return wrap


# ---- load every document of every file
objects = []  # (file name, object)
load_errors = []
for path in paths:
    name = os.path.basename(path)
    try:
        with open(path) as f:
            docs = list(yaml.safe_load_all(f))
    except yaml.YAMLError as e:
        load_errors.append(f"{name}: not YAML: {e}")
        continue
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            load_errors.append(f"{name}: document {i + 1} is not a mapping")
            continue
        objects.append((name, doc))


def of_kind(kind):
    return [(n, o) for n, o in objects if o.get("kind") == kind]


def meta(o, key, default=None):
    return (o.get("metadata") or {}).get(key, default)


def deployments():
    return of_kind("Deployment")


def manager_deployment():
    deps = deployments()
    if len(deps) != 1:
        raise ValueError(f"expected one Deployment, found {len(deps)}")
    return deps[0]


def manager_container():
    _, d = manager_deployment()
    containers = d["spec"]["template"]["spec"]["containers"]
    if len(containers) != 1:
        raise ValueError(f"the manager Deployment has {len(containers)} containers, expected 1")
    return containers[0]


def manager_args():
    """(global args, backend args) around the backend name `kubernetes`."""
    c = manager_container()
    args = [str(a) for a in (c.get("command") or [])[1:]] + [str(a) for a in c.get("args") or []]
    if args.count("kubernetes") != 1:
        raise ValueError(f"`kubernetes` appears {args.count('kubernetes')} times in the manager's arguments")
    i = args.index("kubernetes")
    return args[:i], args[i + 1:]


def flag(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def backend_flag(name, required=True):
    _, backend = manager_args()
    v = flag(backend, name)
    if v is None and required:
        raise ValueError(f"the manager has no {name}")
    return v


# ---- the manager's flags, read from its clap structs
def clap_flags(source):
    path, struct = source
    text = open(path).read()
    m = re.search(r"pub\s+struct\s+" + struct + r"\s*\{(.*?)\n\}", text, re.S)
    if not m:
        raise ValueError(f"{path}: no `pub struct {struct}`")
    flags = set()
    attrs_start = 0
    body = m.group(1)
    for f in re.finditer(r"pub\s+(\w+)\s*:\s*([^,]+),", body):
        attrs = body[attrs_start:f.start()]
        attrs_start = f.end()
        if re.search(r"#\[command\(flatten\)\]", attrs):
            if "ShapeArgs" in f.group(2):
                flags |= clap_flags(SHAPE_ARGS)
            continue
        a = re.search(r"#\[arg\((.*?)\)\]\s*$", attrs, re.S)
        if not a or not re.search(r"\blong\b", a.group(1)):
            continue
        named = re.search(r'\blong\s*=\s*"([^"]+)"', a.group(1))
        flags.add("--" + (named.group(1) if named else f.group(1).replace("_", "-")))
    if not flags:
        raise ValueError(f"{path}: no flags found in {struct}")
    return flags


# ---- the PERMISSIONS and LEASE_PERMISSIONS tables of rbac.rs
def rust_permissions(table="PERMISSIONS"):
    text = open(rbac_rs).read()
    text = re.sub(r"//[^\n]*", "", text)
    m = re.search(r"pub\s+const\s+" + table + r"\s*:\s*&\[\s*Permission\s*\]\s*=\s*&\[(.*?)\]\s*;", text, re.S)
    if not m:
        raise ValueError(f"{rbac_rs}: no `pub const {table}: &[Permission] = &[...];`")
    body = m.group(1)
    entries = re.findall(r"Permission\s*\{(.*?)\}", body, re.S)
    if not entries:
        raise ValueError(f"{rbac_rs}: {table} has no Permission entries")
    perms = []
    for e in entries:
        g = re.search(r'\bapi_group\s*:\s*"([^"]*)"', e)
        r = re.search(r'\bresource\s*:\s*"([^"]*)"', e)
        v = re.search(r"\bverbs\s*:\s*&\[([^\]]*)\]", e)
        n = re.search(r"\bresource_names\s*:\s*&\[([^\]]*)\]", e)
        if not (g and r and v and n):
            raise ValueError(f"{rbac_rs}: cannot read the entry `Permission {{{' '.join(e.split())}}}`")
        perms.append((g.group(1), r.group(1), re.findall(r'"([^"]*)"', v.group(1)),
                      re.findall(r'"([^"]*)"', n.group(1))))
    return perms


def grant_table(rules):
    """{(api group, resource, sorted resourceNames): set of verbs}"""
    table = {}
    for group, resource, verbs, names in rules:
        key = (group, resource, tuple(sorted(names)))
        table.setdefault(key, set()).update(verbs)
    return table


def show(key):
    group, resource, names = key
    return (f"{group}/{resource}" if group else resource) + \
        (f" (resourceNames {list(names)})" if names else " (all names)")


def lease_flag():
    """(namespace, name) of the manager's --lease kubernetes:[NAMESPACE/]NAME, or None."""
    glob, _ = manager_args()
    v = flag(glob, "--lease")
    if v is None:
        return None
    if not v.startswith("kubernetes:"):
        raise ValueError(f"--lease {v}: the Deployment's managers share a kubernetes: lease")
    ns, _, name = v[len("kubernetes:"):].rpartition("/")
    return (ns or "default", name)


# ---- checks
@check("objects")
def _(fail):
    for e in load_errors:
        fail(e)
    if not objects:
        fail("no objects")
        return
    for name, o in objects:
        for field in ("apiVersion", "kind"):
            if not o.get(field):
                fail(f"{name}: an object without {field}")
        if not meta(o, "name"):
            fail(f"{name}: a {o.get('kind')} without metadata.name")
    ns = backend_flag("--namespace")
    namespaces = [meta(o, "name") for _, o in of_kind("Namespace")]
    if namespaces != [ns]:
        fail(f"the Namespace objects are {namespaces}, expected [{ns!r}] (the manager's --namespace)")
    for name, o in objects:
        if o.get("kind") in CLUSTER_SCOPED:
            continue
        if meta(o, "namespace") != ns:
            fail(f"{name}: {o.get('kind')} {meta(o, 'name')} is in namespace {meta(o, 'namespace')!r}, not {ns!r}")


@check("role")
def _(fail):
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        for name, o in of_kind(kind):
            if meta(o, "name") not in (RUNTIME, KUBELET):
                fail(f"{name}: {kind} {meta(o, 'name')}: the manager needs no cluster-wide rights")
    roles = of_kind("Role")
    extra = [f"{n}: Role {meta(o, 'name')}" for n, o in roles if meta(o, "name") not in (ROLE, RUNTIME)]
    for e in extra:
        fail(f"{e}: no Role other than {ROLE}")
    mine = [(n, o) for n, o in roles if meta(o, "name") == ROLE]
    if len(mine) != 1:
        fail(f"expected one Role {ROLE}, found {len(mine)}")
        return
    fname, role = mine[0]
    if fname != "rbac.yaml":
        fail(f"the Role {ROLE} is in {fname}, not rbac.yaml")
    rules = []
    for i, rule in enumerate(role.get("rules") or []):
        where = f"rbac.yaml: Role {ROLE} rule {i + 1}"
        if not rule.get("apiGroups"):
            fail(f"{where}: no apiGroups")
        if rule.get("nonResourceURLs"):
            fail(f"{where}: nonResourceURLs {rule['nonResourceURLs']}: not used by the manager")
        for g in rule.get("apiGroups") or []:
            for r in rule.get("resources") or []:
                rules.append((g, r, list(rule.get("verbs") or []), list(rule.get("resourceNames") or [])))
    granted = grant_table(rules)
    # The backend's calls and the lease's (--lease kubernetes:…), both tables of rbac.rs.
    wanted = grant_table(rust_permissions() + rust_permissions("LEASE_PERMISSIONS"))
    for key in sorted(set(wanted) | set(granted)):
        w, g = wanted.get(key), granted.get(key)
        if g is None:
            fail(f"rbac.yaml: Role {ROLE} does not grant {show(key)} {sorted(w)} (in {rbac_rs})")
        elif w is None:
            fail(f"rbac.yaml: Role {ROLE} grants {show(key)} {sorted(g)}, which is not in {rbac_rs}")
        else:
            if w - g:
                fail(f"rbac.yaml: Role {ROLE}: {show(key)}: missing verb(s) {sorted(w - g)} (in {rbac_rs})")
            if g - w:
                fail(f"rbac.yaml: Role {ROLE}: {show(key)}: extra verb(s) {sorted(g - w)} (not in {rbac_rs})")
    for key, verbs in granted.items():
        if "*" in verbs or "*" in key[:2]:
            fail(f"rbac.yaml: Role {ROLE}: wildcard in {show(key)} {sorted(verbs)}")


# ---- the NAMESPACED and CLUSTER tables of the worker's Kubernetes runtime
def runtime_permissions(table):
    text = re.sub(r"//[^\n]*", "", open(runtime_rbac_rs).read())
    m = re.search(r"pub\s+const\s+" + table + r"\s*:\s*&\[\s*Permission\s*\]\s*=\s*&\[(.*?)\]\s*;", text, re.S)
    if not m:
        raise ValueError(f"{runtime_rbac_rs}: no `pub const {table}: &[Permission] = &[...];`")
    out = set()
    for e in re.findall(r"Permission\s*\{(.*?)\}", m.group(1), re.S):
        g = re.search(r'\bgroup\s*:\s*"([^"]*)"', e)
        r = re.search(r'\bresource\s*:\s*"([^"]*)"', e)
        v = re.search(r"\bverbs\s*:\s*&\[([^\]]*)\]", e)
        if not (g and r and v):
            raise ValueError(f"{runtime_rbac_rs}: cannot read `Permission {{{' '.join(e.split())}}}`")
        out |= {(g.group(1), r.group(1), verb) for verb in re.findall(r'"([^"]*)"', v.group(1))}
    if not out:
        raise ValueError(f"{runtime_rbac_rs}: {table} is empty")
    return out


def granted_by(o):
    out = set()
    for rule in o.get("rules") or []:
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            out.add(("?", "resourceNames/nonResourceURLs", "?"))
        for g in rule.get("apiGroups") or []:
            for r in rule.get("resources") or []:
                for v in rule.get("verbs") or []:
                    out.add((g, r, v))
    return out


@check("runtime")
def _(fail):
    for kind, table, role in (("Role", "NAMESPACED", RUNTIME), ("ClusterRole", "CLUSTER", RUNTIME),
                              ("ClusterRole", "KUBELET_STATS", KUBELET)):
        mine = [(n, o) for n, o in of_kind(kind) if meta(o, "name") == role]
        if len(mine) != 1:
            fail(f"expected one {kind} {role}, found {len(mine)}")
            continue
        fname, o = mine[0]
        got, want = granted_by(o), runtime_permissions(table)
        for g, r, v in sorted(want - got):
            fail(f"{fname}: {kind} {role} does not grant {v} on {r} (group {g!r}; {table} in {runtime_rbac_rs})")
        for g, r, v in sorted(got - want):
            fail(f"{fname}: {kind} {role} grants {v} on {r} (group {g!r}), not in {table} of {runtime_rbac_rs}")
        bkind = kind + "Binding"
        binds = [b for _, b in of_kind(bkind) if (b.get("roleRef") or {}).get("name") == role]
        if len(binds) != 1:
            fail(f"expected one {bkind} of {kind} {role}, found {len(binds)}")
            continue
        b = binds[0]
        if (b.get("roleRef") or {}).get("kind") != kind:
            fail(f"{bkind} {meta(b, 'name')}: roleRef {b.get('roleRef')}, expected the {kind} {role}")
        subjects = [(s.get("kind"), s.get("name")) for s in b.get("subjects") or []]
        if subjects != [("ServiceAccount", RUNTIME)]:
            fail(f"{bkind} {meta(b, 'name')}: subjects {subjects}, expected only the ServiceAccount {RUNTIME}")
    accounts = {meta(o, "name"): o for _, o in of_kind("ServiceAccount")}
    sa = accounts.get(RUNTIME)
    if sa is None:
        fail(f"no ServiceAccount {RUNTIME} (the workers of --bundle-runtime kubernetes)")
    elif sa.get("automountServiceAccountToken") is False:
        fail(f"ServiceAccount {RUNTIME}: automountServiceAccountToken false: those workers call the API with it")


@check("kubelet")
def _(fail):
    # nodes/proxy reaches the kubelet's whole API (exec included): only the opt-in ClusterRole
    # may grant it, and only from its own file, so that applying the defaults never does.
    for kind in ("Role", "ClusterRole"):
        for fname, o in of_kind(kind):
            for rule in o.get("rules") or []:
                for r in rule.get("resources") or []:
                    if not (r == "*" or r.startswith("nodes/") or "proxy" in r):
                        continue
                    if kind == "ClusterRole" and meta(o, "name") == KUBELET and fname == KUBELET_FILE and r == "nodes/proxy":
                        continue
                    fail(f"{fname}: {kind} {meta(o, 'name')} grants {r}: nodes/proxy only in the opt-in {KUBELET_FILE}")
                if "*" in (rule.get("verbs") or []) or "*" in (rule.get("apiGroups") or []):
                    fail(f"{fname}: {kind} {meta(o, 'name')}: wildcard in {rule}")
    others = sorted({n for n, o in objects if n == KUBELET_FILE and (o.get("kind"), meta(o, "name")) not in
                     (("ClusterRole", KUBELET), ("ClusterRoleBinding", KUBELET))})
    for n in others:
        fail(f"{n}: holds more than the opt-in ClusterRole {KUBELET} and its binding")


@check("run-account")
def _(fail):
    # Run pods (pod.rs) name no account: the namespace's `default`, with no token, no role.
    accounts = {meta(o, "name"): o for _, o in of_kind("ServiceAccount")}
    sa = accounts.get("default")
    if sa is None:
        fail("no ServiceAccount default (the run pods' account) with automountServiceAccountToken false")
    elif sa.get("automountServiceAccountToken") is not False:
        fail("ServiceAccount default (the run pods' account): automountServiceAccountToken must be false")
    text = open(runtime_pod_rs).read()
    if not re.search(r"automount_service_account_token:\s*Some\(false\)", text):
        fail(f"{runtime_pod_rs}: the run pod does not set automountServiceAccountToken false")
    if re.search(r"service_account_name:\s*Some", text):
        fail(f"{runtime_pod_rs}: the run pod names an account; this check expects the namespace's default")
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for fname, b in of_kind(kind):
            for s in b.get("subjects") or []:
                if s.get("kind") == "ServiceAccount" and s.get("name") == "default":
                    fail(f"{fname}: {kind} {meta(b, 'name')} binds a role to the run pods' account default")
                if s.get("kind") == "Group" and str(s.get("name", "")).startswith("system:serviceaccounts"):
                    fail(f"{fname}: {kind} {meta(b, 'name')} binds a role to every service account ({s.get('name')})")


# ---- the pods' labels, as the code sets them
def rust_const(path, name):
    m = re.search(r"pub\s+const\s+" + name + r'\s*:\s*&str\s*=\s*"([^"]*)"\s*;', open(path).read())
    if not m:
        raise ValueError(f"{path}: no `pub const {name}: &str`")
    return m.group(1)


def worker_pod_labels():
    """The labels of a worker pod: the map built in worker_pod() of backends/src/kubernetes/pod.rs."""
    text = open(backend_pod_rs).read()
    m = re.search(r"pub fn worker_pod\b.*?let labels = BTreeMap::from\(\[(.*?)\]\);", text, re.S)
    if not m:
        raise ValueError(f"{backend_pod_rs}: no `let labels = BTreeMap::from([...]);` in worker_pod")
    labels = {}
    conv = r"\.(?:to_string\(\)|into\(\)|clone\(\))"
    for k, v in re.findall(r'\(\s*"([^"]+)"' + conv + r'\s*,\s*"([^"]+)"' + conv + r"\s*\)", m.group(1)):
        labels[k] = v
    for k, v in re.findall(r"\(\s*([A-Z_]+)" + conv + r"\s*,\s*([\w.]+?)" + conv + r"\s*\)", m.group(1)):
        key = rust_const(cluster_rs if k in ("LABEL_MANAGED_BY", "LABEL_WORKER_ID") else backend_pod_rs, k)
        labels[key] = rust_const(backend_pod_rs, v) if re.fullmatch(r"[A-Z_]+", v) else "x"
    managed_by = rust_const(cluster_rs, "LABEL_MANAGED_BY")
    if labels.get(managed_by) != rust_const(backend_pod_rs, "MANAGED_BY"):
        raise ValueError(f"{backend_pod_rs}: cannot read the worker pod's {managed_by} label ({labels})")
    return labels


def run_pod_labels(network):
    return {
        rust_const(cluster_rs, "LABEL_MANAGED_BY"): rust_const(runtime_pod_rs, "MANAGED_BY"),
        rust_const(cluster_rs, "LABEL_WORKER_ID"): "w1",
        rust_const(runtime_pod_rs, "LABEL_BUNDLE_UUID"): "0x1",
        rust_const(runtime_pod_rs, "LABEL_NETWORK"): "true" if network else "false",
    }


def selector_matches(sel, labels):
    """A LabelSelector (None: not set) against a pod's labels."""
    if sel is None:
        return False
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != str(v):
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e.get("key"), e.get("operator"), [str(v) for v in e.get("values") or []]
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and k in labels and labels[k] in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def policies():
    return [(n, o) for n, o in of_kind("NetworkPolicy")]


def policy_types(p):
    spec = p.get("spec") or {}
    types = spec.get("policyTypes")
    if types is None:
        types = ["Ingress"] + (["Egress"] if "egress" in spec else [])
    return types


def rules_for(labels, direction, files=None):
    """(file, policy, rule) of every `direction` rule that applies to a pod with `labels`, and
    whether some policy isolates the pod in that direction."""
    key = direction.lower()
    out, isolated = [], False
    for n, p in policies():
        if files is not None and n not in files:
            continue
        spec = p.get("spec") or {}
        if not selector_matches(spec.get("podSelector") or {}, labels) or direction not in policy_types(p):
            continue
        isolated = True
        out += [(n, p, r or {}) for r in spec.get(key) or []]
    return out, isolated


METADATA = [ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("168.63.129.16")]
NOT_INTERNET = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8",
                "169.254.0.0/16", "168.63.129.16/32"}
DNS_PEER = ({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})
API_PORTS = {443, 6443}


def reaches(block, ip):
    net = ipaddress.ip_network(block["cidr"], strict=False)
    if ip.version != net.version or ip not in net:
        return False
    return not any(ip in ipaddress.ip_network(x, strict=False) for x in block.get("except") or [])


def is_dns_peer(peer, rule):
    ns = (peer.get("namespaceSelector") or {}).get("matchLabels")
    pods = (peer.get("podSelector") or {}).get("matchLabels")
    ports = rule.get("ports") or []
    return ((ns, pods) == DNS_PEER and not peer.get("ipBlock") and ports
            and all(str(p.get("port")) == "53" for p in ports))


@check("network")
def _(fail):
    if not policies():
        fail("no NetworkPolicy: every pod of the namespace may reach everything, the metadata server included")
        return
    deny = [(n, p) for n, p in policies()
            if not ((p.get("spec") or {}).get("podSelector") or {}).get("matchLabels")
            and not ((p.get("spec") or {}).get("podSelector") or {}).get("matchExpressions")
            and set(policy_types(p)) == {"Ingress", "Egress"}
            and not (p.get("spec") or {}).get("ingress") and not (p.get("spec") or {}).get("egress")]
    if len(deny) != 1 or deny[0][0] != "networkpolicy.yaml":
        fail(f"expected one default-deny NetworkPolicy (podSelector {{}}, Ingress and Egress, no rule) in networkpolicy.yaml, found {[(n, meta(p, 'name')) for n, p in deny]}")
    _, d = manager_deployment()
    manager = {str(k): str(v) for k, v in ((d["spec"]["template"].get("metadata") or {}).get("labels") or {}).items()}
    worker = worker_pod_labels()
    offline, online = run_pod_labels(False), run_pod_labels(True)
    pods = {"manager": manager, "worker": worker, "run without network": offline, "run with network": online}
    for what, labels in pods.items():
        for direction in ("Ingress", "Egress"):
            if not rules_for(labels, direction)[1]:
                fail(f"no NetworkPolicy isolates the {what} pods ({labels}) for {direction}")
    # No allow-all rule, and no pod reaches the metadata servers.
    for n, p in policies():
        spec = p.get("spec") or {}
        for key, peers in (("ingress", "from"), ("egress", "to")):
            for r in spec.get(key) or []:
                if not (r or {}).get(peers):
                    fail(f"{n}: NetworkPolicy {meta(p, 'name')}: an {key} rule without `{peers}` allows every address")
                    continue
                for peer in r[peers]:
                    if peer.get("ipBlock"):
                        for ip in METADATA:
                            if reaches(peer["ipBlock"], ip):
                                fail(f"{n}: NetworkPolicy {meta(p, 'name')}: {key} {peer['ipBlock']} holds the metadata address {ip}")
                    elif peer.get("namespaceSelector") is not None and not (peer["namespaceSelector"].get("matchLabels") or peer["namespaceSelector"].get("matchExpressions")):
                        fail(f"{n}: NetworkPolicy {meta(p, 'name')}: {key} with every namespace ({peer})")
    # Runs without network: nothing.
    for n, p, r in rules_for(offline, "Egress")[0]:
        fail(f"{n}: NetworkPolicy {meta(p, 'name')} gives run pods without network an egress rule {r}")
    # Runs with network: DNS and the internet, nothing private.
    rules = rules_for(online, "Egress")[0]
    has_dns = has_internet = False
    for n, p, r in rules:
        for peer in r.get("to") or []:
            b = peer.get("ipBlock")
            if b:
                if b.get("cidr") != "0.0.0.0/0" or not NOT_INTERNET <= set(b.get("except") or []):
                    fail(f"{n}: NetworkPolicy {meta(p, 'name')}: run pods reach {b}: only 0.0.0.0/0 except {sorted(NOT_INTERNET)}")
                else:
                    has_internet = True
            elif is_dns_peer(peer, r):
                has_dns = True
            else:
                fail(f"{n}: NetworkPolicy {meta(p, 'name')}: run pods reach {peer} (only kube-dns, port 53, in the cluster)")
    if not (has_dns and has_internet):
        fail(f"run pods with network get {'no DNS' if not has_dns else 'no internet'}")
    # Run pods: connections from the workers only.
    for labels in (offline, online):
        for n, p, r in rules_for(labels, "Ingress")[0]:
            for peer in r.get("from") or []:
                if peer.get("ipBlock") or peer.get("namespaceSelector") is not None or \
                        not selector_matches(peer.get("podSelector"), worker) or \
                        any(selector_matches(peer.get("podSelector"), l) for l in (manager, offline, online)):
                    fail(f"{n}: NetworkPolicy {meta(p, 'name')}: run pods accept {peer} (the worker pods only)")
    # Workers: nothing comes in; the API server only with the Kubernetes runtime.
    for n, p, r in rules_for(worker, "Ingress")[0]:
        fail(f"{n}: NetworkPolicy {meta(p, 'name')}: worker pods accept {r}")
    for n, p, r in rules_for(worker, "Egress", files={"networkpolicy.yaml"})[0]:
        if {int(q.get("port", 0)) for q in r.get("ports") or [] if str(q.get("port", "")).isdigit()} & API_PORTS:
            fail(f"networkpolicy.yaml: NetworkPolicy {meta(p, 'name')}: docker-runtime workers reach the API server ({r}); that is networkpolicy-runtime.yaml's")
    runtime_rules = rules_for(worker, "Egress", files={"networkpolicy-runtime.yaml"})[0]
    if not any({int(q.get("port", 0)) for q in r.get("ports") or []} & API_PORTS for _, _, r in runtime_rules):
        fail("networkpolicy-runtime.yaml: the workers of the Kubernetes runtime do not reach the API server")
    if not any(any(selector_matches(peer.get("podSelector"), online) and peer.get("namespaceSelector") is None
                   for peer in r.get("to") or []) for _, _, r in runtime_rules):
        fail("networkpolicy-runtime.yaml: the workers of the Kubernetes runtime do not reach their run pods (netcat)")
    # The manager: the API server; its metrics port from the monitoring namespace only.
    if not any({int(q.get("port", 0)) for q in r.get("ports") or []} & API_PORTS
               for _, _, r in rules_for(manager, "Egress")[0]):
        fail("the manager does not reach the API server (ports 443, 6443)")
    glob, _ = manager_args()
    addr = flag(glob, "--metrics-addr")
    metrics = int(addr.rsplit(":", 1)[1]) if addr else None
    ingress = rules_for(manager, "Ingress")[0]
    if not ingress:
        fail("the manager's metrics port is open to no namespace (expected: monitoring)")
    for n, p, r in ingress:
        ports = [(str(q.get("port")), q.get("protocol", "TCP")) for q in r.get("ports") or []]
        if ports not in ([(str(metrics), "TCP")], [("metrics", "TCP")]):
            fail(f"{n}: NetworkPolicy {meta(p, 'name')}: the manager accepts ports {ports}, not only the metrics port {metrics}")
        for peer in r.get("from") or []:
            ns = (peer.get("namespaceSelector") or {}).get("matchLabels")
            if peer.get("ipBlock") or peer.get("podSelector") is not None or ns != {"kubernetes.io/metadata.name": "monitoring"}:
                fail(f"{n}: NetworkPolicy {meta(p, 'name')}: the metrics port is open to {peer}, not only to the namespace monitoring")


@check("bindings")
def _(fail):
    _, d = manager_deployment()
    manager_sa = d["spec"]["template"]["spec"].get("serviceAccountName")
    worker_sa = backend_flag("--service-account")
    accounts = {meta(o, "name"): o for _, o in of_kind("ServiceAccount")}
    for sa in (manager_sa, worker_sa):
        if sa not in accounts:
            fail(f"no ServiceAccount {sa!r} (used by the manager Deployment or --service-account)")
    if manager_sa == worker_sa:
        fail(f"the manager and the workers share the ServiceAccount {manager_sa!r}")
    if worker_sa in accounts and accounts[worker_sa].get("automountServiceAccountToken") is not False:
        fail(f"ServiceAccount {worker_sa}: automountServiceAccountToken must be false (the workers do not call the API)")
    bindings = of_kind("RoleBinding")
    for name, b in bindings:
        subjects = b.get("subjects") or []
        ref = b.get("roleRef") or {}
        for s in subjects:
            if s.get("kind") == "ServiceAccount" and s.get("name") == worker_sa:
                fail(f"{name}: RoleBinding {meta(b, 'name')} binds {ref.get('name')} to the workers' account {worker_sa}")
    mine = [b for _, b in bindings if (b.get("roleRef") or {}).get("name") == ROLE]
    if len(mine) != 1:
        fail(f"expected one RoleBinding of the Role {ROLE}, found {len(mine)}")
        return
    b = mine[0]
    ref = b["roleRef"]
    if ref.get("kind") != "Role" or ref.get("apiGroup") != "rbac.authorization.k8s.io":
        fail(f"RoleBinding {meta(b, 'name')}: roleRef {ref}, expected the Role {ROLE}")
    subjects = [(s.get("kind"), s.get("name"), s.get("namespace")) for s in b.get("subjects") or []]
    want = [("ServiceAccount", manager_sa, meta(b, "namespace"))]
    if subjects != want:
        fail(f"RoleBinding {meta(b, 'name')}: subjects {subjects}, expected {want}")


@check("names")
def _(fail):
    secret = backend_flag("--password-secret")
    nfs = backend_flag("--nfs-volume-name", required=False)
    names = {}
    for _, r in of_kind("Role"):
        for rule in r.get("rules") or []:
            for res in rule.get("resources") or []:
                names.setdefault(res, []).extend(rule.get("resourceNames") or [])
    lease = lease_flag()
    if lease and lease[0] != backend_flag("--namespace"):
        fail(f"--lease kubernetes:{lease[0]}/{lease[1]}: not in the namespace of the Role (--namespace)")
    if lease and names.get("leases") != [lease[1]]:
        fail(f"the Role may get and update leases {names.get('leases')}, expected [{lease[1]!r}] (--lease)")
    if names.get("secrets") != [secret]:
        fail(f"the Role may get secrets {names.get('secrets')}, expected [{secret!r}] (--password-secret)")
    claim = f"{nfs}-claim" if nfs else None
    if claim and names.get("persistentvolumeclaims") != [claim]:
        fail(f"the Role may get persistentvolumeclaims {names.get('persistentvolumeclaims')}, expected [{claim!r}] (--nfs-volume-name {nfs})")
    if claim:
        pvcs = {meta(o, "name"): o for _, o in of_kind("PersistentVolumeClaim")}
        if claim not in pvcs:
            fail(f"no PersistentVolumeClaim {claim!r} (--nfs-volume-name {nfs} mounts <name>-claim)")
        elif "ReadWriteMany" not in (pvcs[claim].get("spec") or {}).get("accessModes", []):
            fail(f"PersistentVolumeClaim {claim}: not ReadWriteMany (every worker pod mounts it)")


@check("deployment")
def _(fail):
    name, d = manager_deployment()
    spec = d["spec"]
    # Several managers with one --manager-name, or two at once in a rollout, only under a
    # lease; the example runs a holder and a standby.
    if lease_flag() is None:
        if spec.get("replicas") != 1:
            fail(f"{name}: replicas {spec.get('replicas')} without --lease, expected 1 (one manager per --manager-name)")
        if (spec.get("strategy") or {}).get("type") != "Recreate":
            fail(f"{name}: strategy {spec.get('strategy')} without --lease, expected Recreate (no two managers during a rollout)")
    elif spec.get("replicas") != 2:
        fail(f"{name}: replicas {spec.get('replicas')}, expected 2 (the holder of --lease and a standby)")
    labels = (spec["template"].get("metadata") or {}).get("labels") or {}
    for k in WORKER_LABEL_KEYS:
        if k in labels:
            fail(f"{name}: the manager pod carries the worker pods' label {k}")
    pod = spec["template"]["spec"]
    if pod.get("automountServiceAccountToken") is False:
        fail(f"{name}: automountServiceAccountToken false: the manager needs its token")
    glob, backend = manager_args()
    global_flags, backend_flags = clap_flags(GLOBAL_ARGS), clap_flags(BACKEND_ARGS)
    for a in glob:
        f = a.split("=", 1)[0]
        if not f.startswith("--") or f in global_flags:
            continue
        if f in backend_flags:
            fail(f"{name}: the backend flag {f} comes before `kubernetes` (backend flags go after it)")
        else:
            fail(f"{name}: {f} is not a global flag of cl-worker-manager ({GLOBAL_ARGS[0]})")
    for a in backend:
        f = a.split("=", 1)[0]
        if not f.startswith("--") or f in backend_flags:
            continue
        if f in global_flags:
            fail(f"{name}: the global flag {f} comes after `kubernetes` (global flags go first)")
        else:
            fail(f"{name}: {f} is not a flag of the kubernetes backend ({BACKEND_ARGS[0]})")
    c = manager_container()
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    addr = flag(glob, "--metrics-addr")
    if addr is None or ports.get("metrics") != int(addr.rsplit(":", 1)[1]):
        fail(f"{name}: the port named metrics {ports.get('metrics')} is not the one of --metrics-addr {addr}")


@check("credentials")
def _(fail):
    name, d = manager_deployment()
    pod = d["spec"]["template"]["spec"]
    c = manager_container()
    secret = backend_flag("--password-secret")
    path = backend_flag("--password-file")
    mounts = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") == path]
    if len(mounts) != 1:
        fail(f"{name}: --password-file {path} is not a volume mount")
        return
    if mounts[0].get("readOnly") is not True:
        fail(f"{name}: the mount at {path} is not readOnly")
    vols = {v.get("name"): v for v in pod.get("volumes") or []}
    vol = vols.get(mounts[0].get("name")) or {}
    if (vol.get("secret") or {}).get("secretName") != secret:
        fail(f"{name}: the volume at {path} is not the Secret {secret} (--password-secret)")
    secrets = {meta(o, "name"): o for _, o in of_kind("Secret")}
    s = secrets.get(secret)
    if s is None:
        fail(f"no Secret {secret} (template) in {directory}")
    elif set((s.get("stringData") or {})) != {"username", "password"}:
        fail(f"Secret {secret}: keys {sorted(s.get('stringData') or {})}, expected password, username")


@check("secrets")
def _(fail):
    for name, o in of_kind("Secret"):
        if name != TEMPLATE:
            fail(f"{name}: Secret {meta(o, 'name')}: Secrets belong in {TEMPLATE}, created with kubectl create secret")
            continue
        if o.get("data"):
            fail(f"{name}: Secret {meta(o, 'name')} has `data`: only placeholder `stringData`")
        for k, v in (o.get("stringData") or {}).items():
            if PLACEHOLDERS.get(k) != v:
                fail(f"{name}: Secret {meta(o, 'name')}: stringData.{k} is not the placeholder {PLACEHOLDERS.get(k)!r}")

    def walk(fname, node, where, in_template_secret):
        if isinstance(node, dict):
            for k, v in node.items():
                here = f"{where}.{k}" if where else str(k)
                if re.search(r"passw(or)?d", str(k), re.I) and isinstance(v, (str, int, float)):
                    ok = in_template_secret and here == "stringData.password" and v == PLACEHOLDERS["password"]
                    if not ok:
                        fail(f"{fname}: {here} holds a literal password")
                walk(fname, v, here, in_template_secret)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(fname, v, f"{where}[{i}]", in_template_secret)
        elif isinstance(node, str):
            if re.search(r"(^--password(=|$))|CODALAB_PASSWORD=", node):
                fail(f"{fname}: {where}: {node!r} passes a password")

    for fname, o in objects:
        walk(fname, o, "", fname == TEMPLATE and o.get("kind") == "Secret")


@check("env")
def _(fail):
    for name, d in deployments():
        pod = d["spec"]["template"]["spec"]
        for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
            for e in c.get("env") or []:
                n = str(e.get("name", ""))
                if n == "CODALAB_PASSWORD":
                    fail(f"{name}: container {c.get('name')} has env CODALAB_PASSWORD (use the mounted Secret)")
                elif "PASSWORD" in n.upper():
                    fail(f"{name}: container {c.get('name')} has env {n}")
            for ef in c.get("envFrom") or []:
                if ef.get("secretRef"):
                    fail(f"{name}: container {c.get('name')} takes env from the Secret {ef['secretRef'].get('name')}")


for name, problems in results:
    if problems:
        for p in problems:
            print(f"FAIL {name}: {p}")
    else:
        print(f"PASS {name}")
