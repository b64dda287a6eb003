#!/usr/bin/env bash
# Checks of the example manifests in examples/kubernetes/ (the kubernetes backend's Deployment,
# RBAC, credentials Secret template and work-dir claim). Non-interactive; needs the venv of
# tests/peers/k8s.sh (kubernetes-validate, PyYAML), which `k8s.sh validate` installs if missing.
#
#   tests/examples/check-kubernetes.sh
#
# Checks:
#   schema       kubernetes-validate --strict against Kubernetes 1.36, every object of every file
#   objects      every document is one object with apiVersion, kind and metadata.name, in the
#                namespace of the manager's --namespace (defined by namespace.yaml)
#   role         the Role cl-worker-manager in rbac.yaml grants exactly the PERMISSIONS and
#                LEASE_PERMISSIONS tables of backends/src/kubernetes/rbac.rs (apiGroups,
#                resources, verbs, resourceNames): a missing or extra rule, verb or name fails;
#                and there is no other Role, ClusterRole or ClusterRoleBinding than the runtime's
#   runtime      the Role and ClusterRole cl-worker-runs in runtime-rbac.yaml grant exactly the
#                NAMESPACED and CLUSTER tables of worker/src/runtime/kubernetes/rbac.rs, and the
#                opt-in ClusterRole cl-worker-runs-kubelet-stats exactly its KUBELET_STATS table,
#                bound to the ServiceAccount cl-worker-runs only, which gets its token
#   kubelet      nodes/proxy (the kubelet's API), or a wildcard, is granted by no object but the
#                opt-in ClusterRole, which is alone in runtime-rbac-kubelet-stats.yaml
#   run-account  the run pods' account (the namespace's `default`) has no token and no binding
#   network      the NetworkPolicies, evaluated against pods labelled as the code labels them
#                (common/src/cluster.rs, backends/src/kubernetes/pod.rs, worker/src/runtime/
#                kubernetes/pod.rs, the manager's template): a default-deny of the namespace;
#                run pods without network have no egress, run pods with network only kube-dns
#                port 53 and 0.0.0.0/0 except the metadata, Azure and private ranges; run pods
#                accept connections from the worker pods only; the manager's metrics port only
#                from the namespace `monitoring`; no allow-all rule; no pod reaches
#                169.254.169.254 or 168.63.129.16; the API server only for the manager and (in
#                networkpolicy-runtime.yaml) the workers of the Kubernetes runtime
#   bindings     the RoleBinding gives that Role to the manager's ServiceAccount only; the
#                workers' account (--service-account) has no binding and no token
#   names        the Role's resourceNames are the manager's --password-secret,
#                <--nfs-volume-name>-claim and the NAME of --lease kubernetes:NAMESPACE/NAME
#                (NAMESPACE the manager's --namespace), and that claim exists (ReadWriteMany)
#   deployment   two replicas under --lease (without it: one replica, Recreate), runs as the
#                bound account, pod labels are not the worker pods' labels; every flag exists
#                (the clap structs of manager/src/cli.rs, backends/src/kubernetes/args.rs),
#                global flags before `kubernetes` and backend flags after; the port `metrics` is
#                the one of --metrics-addr
#   credentials  --password-file is a read-only mount of the --password-secret Secret
#   secrets      the only Secret is the template's, with placeholder values and no `data`;
#                no other password anywhere (keys, args)
#   env          the manager has no CODALAB_PASSWORD (nor any *PASSWORD*) environment variable
#
# Prints `FAIL <check>: <message>` per finding and `examples/kubernetes: N checks passed`, or
# `examples/kubernetes: M of N checks failed` and exits 1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
DIR=examples/kubernetes
K8S=tests/peers/k8s.sh

shopt -s nullglob
files=("$DIR"/*.yaml)
shopt -u nullglob
if [[ ${#files[@]} -eq 0 ]]; then
  echo "FAIL objects: no manifests in $DIR"
  echo "examples/kubernetes: 1 of 1 checks failed"
  exit 1
fi

passed=0
failed=0

# --- schema: kubernetes-validate reads every document of a multi-document file.
if out=$("$K8S" validate "${files[@]}" 2>&1); then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  printf '%s\n' "$out" | sed 's/^/  /'
  echo "FAIL schema: kubernetes-validate --strict (Kubernetes 1.36) rejects objects in $DIR (above)"
fi

# --- the other checks, in Python with PyYAML from the same venv (check-kubernetes.py).
eval "$("$K8S" env)"
py=${CLW_K8S_PYTHON:-}
if [[ -z $py || ! -x $py ]] || ! "$py" -c 'import yaml' 2>/dev/null; then
  echo "FAIL objects: no Python with PyYAML at '${py}' (tests/peers/k8s.sh install)"
  echo "examples/kubernetes: $((failed + 1)) of $((passed + failed + 1)) checks failed"
  exit 1
fi

report=$("$py" "$HERE/check-kubernetes.py" "$DIR" backends/src/kubernetes/rbac.rs \
  worker/src/runtime/kubernetes/rbac.rs common/src/cluster.rs backends/src/kubernetes/pod.rs \
  worker/src/runtime/kubernetes/pod.rs "${files[@]}") || {
  echo "$report"
  echo "FAIL objects: the Python checks did not run to the end"
  echo "examples/kubernetes: $((failed + 1)) of $((passed + failed + 1)) checks failed"
  exit 1
}

declare -A failed_checks=()
while IFS= read -r line; do
  case $line in
  PASS\ *) passed=$((passed + 1)) ;;
  FAIL\ *)
    echo "$line"
    # A check fails once however many findings it prints.
    name=${line#FAIL }
    failed_checks[${name%%:*}]=1
    ;;
  *) if [[ -n $line ]]; then echo "$line"; fi ;;
  esac
done <<<"$report"
failed=$((failed + ${#failed_checks[@]}))

total=$((passed + failed))
if [[ $failed -eq 0 ]]; then
  echo "examples/kubernetes: $total checks passed"
else
  echo "examples/kubernetes: $failed of $total checks failed"
  exit 1
fi
