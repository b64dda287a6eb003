#!/usr/bin/env bash
# End-to-end check of the Kubernetes stand-in with third-party clients only (kubectl, curl
# and the official Python `kubernetes` client). Run through `tests/peers/k8s.sh selftest`,
# which starts a private instance (own port, state and token) and points CLW_K8S_* at it.
set -uo pipefail
[[ ${CLW_K8S_SELFTEST_INNER:-} == 1 ]] || {
  echo "run this through: tests/peers/k8s.sh selftest" >&2
  exit 2
}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SELF="$ROOT/tests/peers/k8s.sh"
eval "$("$SELF" env)"
IMAGE=cl-worker-test/base:latest
PASSED=0 FAILED=0 T0=$SECONDS

note() { printf '[selftest %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
ok() {
  PASSED=$((PASSED + 1))
  note "ok: $*"
}
bad() {
  FAILED=$((FAILED + 1))
  note "FAILED: $*"
}
k() { kubectl --request-timeout=10s "$@"; }
jp() { k get "$1" "$2" -o "jsonpath=$3" 2>/dev/null; } # jp KIND NAME JSONPATH
# wait_jp KIND NAME JSONPATH WANTED TIMEOUT: until the jsonpath prints WANTED.
wait_jp() {
  local end=$((SECONDS + $5)) got=''
  while ((SECONDS <= end)); do
    got=$(jp "$1" "$2" "$3")
    [[ $got == "$4" ]] && return 0
    sleep 0.3
  done
  note "  $1/$2 $3 = '$got', wanted '$4'"
  return 1
}
export -f note k jp wait_jp
expect() { # expect DESC COMMAND...: the command must succeed
  local d=$1
  shift
  if "$@"; then ok "$d"; else bad "$d"; fi
}

pod_yaml() { # pod_yaml NAME LABEL_CASE COMMAND [EXTRA_SPEC_YAML]
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: {app: selftest, case: $2}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: ${IMAGE_OVERRIDE:-$IMAGE}
    command: ["/bin/sh", "-c", "$3"]
    env:
    - name: NODE
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    resources:
      limits: {cpu: "1", memory: 256Mi}
      requests: {cpu: 500m}
${4:-}
EOF
}

# --- cluster basics ------------------------------------------------------------
expect "GET /version answers v1.36" bash -c '[[ $(k version -o json | python3 -c "import json,sys; print(json.load(sys.stdin)[\"serverVersion\"][\"minor\"])") == 36 ]]'
expect "two nodes, both Ready" bash -c '[[ $(k get nodes -o jsonpath="{range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}") == "node-a=True node-b=True " ]]'
expect "node-a advertises 2 nvidia.com/gpu" bash -c '[[ $(jp node node-a "{.status.allocatable.nvidia\.com/gpu}") == 2 ]]'

# --- a pod runs to completion ----------------------------------------------------------
pod_yaml ok ok 'echo hello from $NODE at $POD_IP; sleep 2; exit 0' | k create -f - >/dev/null
expect "pod ok created" test $? -eq 0
expect "pod ok Running" wait_jp pod ok '{.status.phase}' Running 30
expect "pod ok has podIP/hostIP while Running" bash -c '[[ -n $(jp pod ok "{.status.podIP}") && -n $(jp pod ok "{.status.hostIP}") ]]'
expect "pod ok container running" bash -c '[[ -n $(jp pod ok "{.status.containerStatuses[0].state.running.startedAt}") ]]'
expect "pod ok Succeeded" wait_jp pod ok '{.status.phase}' Succeeded 30
expect "pod ok exit code 0, reason Completed" bash -c '[[ $(jp pod ok "{.status.containerStatuses[0].state.terminated.exitCode}/{.status.containerStatuses[0].state.terminated.reason}") == 0/Completed ]]'
expect "pod ok logs show spec.nodeName and podIP" bash -c 'k logs ok | grep -q "hello from node-[ab] at 127.0.0.1"'
expect "pod ok container labelled with its pod" bash -c '[[ -n $(docker ps -aq --filter label=io.kubernetes.pod.name=ok --filter label=io.kubernetes.container.name=main) ]]'

# --- what a kubelet gives a running pod: its service account token, the API's address in env,
# and its stats in the Summary API (through the API server's node proxy).
pod_yaml sa sa 'cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo :$KUBERNETES_SERVICE_PORT; sleep 30' | k create -f - >/dev/null
expect "pod sa Running" wait_jp pod sa '{.status.phase}' Running 30
expect "pod sa has its service account's namespace file and KUBERNETES_SERVICE_PORT" bash -c 'sleep 1; [[ $(k logs sa) == "default:${CLW_K8S_URL##*:}" ]]'
expect "the Summary API of its node has pod sa's CPU time and working set" bash -c '
  node=$(jp pod sa "{.spec.nodeName}")
  k get --raw "/api/v1/nodes/$node/proxy/stats/summary" | python3 -c "
import json, sys
s = json.load(sys.stdin)
p = [p for p in s[\"pods\"] if p[\"podRef\"][\"name\"] == \"sa\"][0]
c = p[\"containers\"][0]
assert c[\"cpu\"][\"usageCoreNanoSeconds\"] > 0 and c[\"memory\"][\"workingSetBytes\"] > 0, c
"'
k delete pod sa --wait=false >/dev/null 2>&1 || true

pod_yaml fail fail 'exit 3' | k create -f - >/dev/null
expect "pod fail Failed" wait_jp pod fail '{.status.phase}' Failed 40
expect "pod fail exit code 3, reason Error" bash -c '[[ $(jp pod fail "{.status.containerStatuses[0].state.terminated.exitCode}/{.status.containerStatuses[0].state.terminated.reason}") == 3/Error ]]'

cat <<EOF | k create -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: oom, labels: {app: selftest, case: oom}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: $IMAGE
    command: ["/bin/sh", "-c", "exec dd if=/dev/zero of=/dev/null bs=200M count=1"]
    resources: {limits: {memory: 32Mi}}
EOF
expect "pod over its memory limit: Failed, 137, OOMKilled" wait_jp pod oom '{.status.phase}/{.status.containerStatuses[0].state.terminated.exitCode}/{.status.containerStatuses[0].state.terminated.reason}' Failed/137/OOMKilled 30

# --- selectors, 409 --------------------------------------------------------------------
expect "label selector case=ok lists only pod ok" bash -c '[[ $(k get pods -l case=ok -o name) == pod/ok ]]'
expect "label selector app=selftest,case notin (ok,oom) lists only pod fail" bash -c '[[ $(k get pods -l "app=selftest,case notin (ok,oom)" -o name) == pod/fail ]]'
expect "field selector status.phase==Succeeded lists only pod ok" bash -c '[[ $(k get pods --field-selector status.phase==Succeeded -o name) == pod/ok ]]'
out=$(pod_yaml ok ok 'true' | k create -f - 2>&1)
expect "duplicate create: 409 AlreadyExists ($out)" grep -q 'AlreadyExists' <<<"$out"

# --- Unschedulable -------------------------------------------------------------------
"$SELF" unschedulable on 'case=hold' >/dev/null
pod_yaml hold hold 'exit 0' | k create -f - >/dev/null
expect "pod hold: PodScheduled=False, reason Unschedulable" wait_jp pod hold '{.status.conditions[?(@.type=="PodScheduled")].status}/{.status.conditions[?(@.type=="PodScheduled")].reason}' False/Unschedulable 20
sleep 1
expect "pod hold stays Pending with no node" bash -c '[[ $(jp pod hold "{.status.phase}/{.spec.nodeName}") == Pending/ ]]'
expect "FailedScheduling event" bash -c 'k get events --field-selector involvedObject.name=hold,reason=FailedScheduling -o name | grep -q .'
"$SELF" unschedulable off >/dev/null
expect "pod hold scheduled and Succeeded after the fault is lifted" wait_jp pod hold '{.status.phase}' Succeeded 40

# A real shortage: 3 GPUs fit no node.
pod_yaml greedy greedy 'exit 0' '  nodeSelector: {pool: small}' | k create -f - >/dev/null
expect "pod greedy (nodeSelector pool=small on node-b only)... runs on node-b" wait_jp pod greedy '{.spec.nodeName}' node-b 20
cat <<EOF | k create -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: gpus3, labels: {app: selftest}}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: $IMAGE, command: ["true"], resources: {limits: {nvidia.com/gpu: 3}}}
EOF
expect "pod asking 3 GPUs: Unschedulable with Insufficient nvidia.com/gpu" bash -c 'sleep 1; jp pod gpus3 "{.status.conditions[?(@.type==\"PodScheduled\")].message}" | grep -q "Insufficient nvidia.com/gpu"'

# --- image pull failures ----------------------------------------------------------------
IMAGE_OVERRIDE=cl-worker-test/absent:1 pod_yaml noimage noimage 'true' | k create -f - >/dev/null
expect "missing image: waiting ErrImagePull" wait_jp pod noimage '{.status.containerStatuses[0].state.waiting.reason}' ErrImagePull 20
expect "missing image: then ImagePullBackOff" wait_jp pod noimage '{.status.containerStatuses[0].state.waiting.reason}' ImagePullBackOff 20
expect "missing image: pod stays Pending" bash -c '[[ $(jp pod noimage "{.status.phase}") == Pending ]]'
"$SELF" image-pull-fail on 'case=pullfail' >/dev/null
pod_yaml pullfail pullfail 'true' | k create -f - >/dev/null
expect "injected pull failure on an existing image: ErrImagePull" wait_jp pod pullfail '{.status.containerStatuses[0].state.waiting.reason}' ErrImagePull 20
"$SELF" image-pull-fail off >/dev/null

# --- CreateContainerConfigError, secrets ------------------------------------------------
cat <<EOF | k create -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: needsecret, labels: {app: selftest}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: $IMAGE
    command: ["/bin/sh", "-c", "echo pw=\$PW; stat -c %a /etc/sec/..data 2>/dev/null; stat -c 'mode=%a' /etc/sec/password; cat /etc/sec/password; echo"]
    env:
    - name: PW
      valueFrom: {secretKeyRef: {name: st-secret, key: password}}
    volumeMounts:
    - {name: sec, mountPath: /etc/sec, readOnly: true}
  volumes:
  - name: sec
    secret: {secretName: st-secret, defaultMode: 0400}
EOF
expect "missing secret: waiting ContainerCreating or CreateContainerConfigError" bash -c 'sleep 1.5; [[ $(jp pod needsecret "{.status.phase}") == Pending ]]'
# (kubectl's typed `create secret` sends protobuf, which the stand-in refuses: JSON via -f.)
k create secret generic st-secret --from-literal=password=s3cret --dry-run=client -o json | k create -f - >/dev/null
expect "secret created: pod runs and Succeeds" wait_jp pod needsecret '{.status.phase}' Succeeded 30
expect "secret env and file (mode 400) reach the container" bash -c 'out=$(k logs needsecret); grep -q "pw=s3cret" <<<"$out" && grep -q "mode=400" <<<"$out" && grep -q "^s3cret" <<<"$out"'
cat <<EOF | k create -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: badref, labels: {app: selftest}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: $IMAGE
    command: ["true"]
    env:
    - name: X
      valueFrom: {secretKeyRef: {name: no-such-secret, key: k}}
EOF
expect "env from a missing secret: CreateContainerConfigError" wait_jp pod badref '{.status.containerStatuses[0].state.waiting.reason}' CreateContainerConfigError 20
"$SELF" config-error on 'case=cfg' >/dev/null
pod_yaml cfg cfg 'true' | k create -f - >/dev/null
expect "injected config error: CreateContainerConfigError" wait_jp pod cfg '{.status.containerStatuses[0].state.waiting.reason}' CreateContainerConfigError 20
"$SELF" config-error off >/dev/null

# --- PVC ------------------------------------------------------------------------------
cat <<EOF | k create -f - >/dev/null
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: work}
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 1Gi}}
EOF
expect "PVC bound" wait_jp pvc work '{.status.phase}' Bound 10
pod_yaml pvcpod pvc 'echo data > /work/sub/f.txt' '  volumes: [{name: w, persistentVolumeClaim: {claimName: work}}]' |
  sed 's|^    resources:|    volumeMounts: [{name: w, mountPath: /work/sub, subPath: run1}]\n    resources:|' | k create -f - >/dev/null
expect "pod writing to the PVC Succeeded" wait_jp pod pvcpod '{.status.phase}' Succeeded 30
expect "file landed in the claim's directory (subPath)" test -f "$CLW_K8S_PVC_DIR/default/work/run1/f.txt"

# --- lose a node ------------------------------------------------------------------------
pod_yaml sleeper lost 'sleep 300' '  nodeSelector: {kubernetes.io/hostname: node-b}' | k create -f - >/dev/null
expect "pod sleeper Running on node-b" wait_jp pod sleeper '{.status.phase}/{.spec.nodeName}' Running/node-b 30
"$SELF" lose-node node-b >/dev/null
expect "node-b NotReady (Ready=Unknown)" wait_jp node node-b '{.status.conditions[?(@.type=="Ready")].status}' Unknown 10
expect "pod sleeper Failed, reason NodeLost" wait_jp pod sleeper '{.status.phase}/{.status.reason}' Failed/NodeLost 15
expect "its container was killed" bash -c '[[ -z $(docker ps -q --filter label=io.kubernetes.pod.name=sleeper) ]]'
pod_yaml tob lost2 'true' '  nodeSelector: {kubernetes.io/hostname: node-b}' | k create -f - >/dev/null
expect "new pod for node-b: Unschedulable (untolerated unreachable taint)" bash -c 'sleep 1.5; jp pod tob "{.status.conditions[?(@.type==\"PodScheduled\")].message}" | grep -q unreachable'
"$SELF" restore-node node-b >/dev/null
expect "node-b Ready again; the waiting pod runs" wait_jp pod tob '{.status.phase}' Succeeded 30

# --- delete -------------------------------------------------------------------------------
pod_yaml victim del "trap 'echo TERM; exit 0' TERM; while :; do sleep 0.2; done" | k create -f - >/dev/null
expect "pod victim Running" wait_jp pod victim '{.status.phase}' Running 30
cid=$(docker ps -q --filter label=io.kubernetes.pod.name=victim)
k delete pod victim --wait=false >/dev/null
expect "pod victim gone from the API" bash -c '! k get pod victim >/dev/null 2>&1'
end=$((SECONDS + 15))
while [[ -n $(docker ps -aq --filter "id=$cid") ]] && ((SECONDS < end)); do sleep 0.3; done
expect "its container was stopped and removed" test -z "$(docker ps -aq --filter "id=$cid")"
expect "kubectl delete of the rest by label" bash -c 'k delete pods -l app=selftest --wait=false >/dev/null && [[ -z $(k get pods -l app=selftest -o name) ]]'

# --- the official Python client, and the validation oracle -------------------------------
expect "validate: everything created so far is valid" "$SELF" validate
# The worker pod a Python manager builds, with its misplaced anti-affinity term, sent as is
# (kubernetes.utils.create_from_dict of the 12.x client passed dicts through; the current
# client's models refuse the object before sending it).
MALFORMED=$(dirname "$CLW_K8S_STATE")/malformed-pod.json
cat >"$MALFORMED" <<'JSON'
{"apiVersion": "v1", "kind": "Pod",
 "metadata": {"name": "cl-worker-py", "labels": {"app": "cl-worker"}},
 "spec": {"restartPolicy": "Never",
  "containers": [{"name": "cl-worker-py-container", "image": "cl-worker-test/base:latest", "command": ["sleep", "30"],
    "env": [{"name": "CODALAB_KUBERNETES_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    "resources": {"limits": {"cpu": 1, "memory": "2048Mi"}, "requests": {"cpu": 0.5, "memory": "2048Mi"}},
    "volumeMounts": [{"name": "workdir", "mountPath": "/tmp/codalab-worker-scratch"}]}],
  "volumes": [{"name": "workdir", "hostPath": {"path": "/tmp/codalab-worker-scratch"}}],
  "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"podAffinityTerm": {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["cl-worker"]}]}},
     "topologyKey": "topology.kubernetes.io/hostname"}]}}}}
JSON
code=$(curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
  --data @"$MALFORMED" "$CLW_K8S_URL/api/v1/namespaces/default/pods?fieldValidation=Strict")
expect "malformed worker pod refused (400) with fieldValidation=Strict ($code)" test "$code" = 400
hdrs=$(curl -sS -D - -o /dev/null -H 'Content-Type: application/json' \
  --data @"$MALFORMED" "$CLW_K8S_URL/api/v1/namespaces/default/pods")
expect "... and accepted (201) with an unknown-field warning without it, as a real API server does" \
  bash -c 'grep -q "^HTTP/1.1 201" <<<"$1" && grep -qi "^warning:.*unknown field.*podAffinityTerm" <<<"$1"' _ "$hdrs"
out=$("$CLW_K8S_PYTHON" - <<'PY' 2>&1
import os, time
from kubernetes import client, config
config.load_kube_config(os.environ["KUBECONFIG"])
v1 = client.CoreV1Api()
for _ in range(100):
    running = v1.list_namespaced_pod("default", field_selector="status.phase==Running").items
    if any(p.metadata.name == "cl-worker-py" for p in running):
        break
    time.sleep(0.3)
else:
    raise SystemExit("cl-worker-py never listed as Running")
p = v1.read_namespaced_pod("cl-worker-py", "default")
assert p.spec.node_name in ("node-a", "node-b"), p.spec.node_name
# The unknown wrapper was dropped: the term has no selector left.
assert p.spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution[0].label_selector is None
body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cl-worker-py", "labels": {"app": "cl-worker"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "cl-worker-test/base:latest"}]}}
try:
    v1.create_namespaced_pod("default", body)
    raise SystemExit("duplicate create did not fail")
except client.exceptions.ApiException as e:
    assert e.status == 409, e.status
assert [x.metadata.name for x in v1.list_namespaced_pod("default", label_selector="app=cl-worker").items] == ["cl-worker-py"]
v1.delete_namespaced_pod("cl-worker-py", "default", grace_period_seconds=0)
print("python client ok")
PY
)
expect "Python client: field selector status.phase==Running, read, 409, label selector, delete ($(tail -1 <<<"$out"))" grep -q 'python client ok' <<<"$out"
out=$("$SELF" validate 2>&1)
rc=$?
printf '%s\n' "$out" | grep '^ERROR' >&2
expect "validate catches the misplaced podAffinityTerm (exit $rc)" \
  bash -c '[[ $1 -ne 0 ]] && grep -q "create-Pod-default-cl-worker-py.json.*podAffinityTerm" <<<"$2"' _ "$rc" "$out"

# --- bearer token: restart the private instance with one ---------------------------------
CLW_K8S_TOKEN=selftest-token "$SELF" restart >/dev/null 2>&1
eval "$("$SELF" env)"
code=$(curl -s -o /dev/null -w '%{http_code}' "$CLW_K8S_URL/api/v1/nodes")
expect "token set: no token gets 401 ($code)" test "$code" = 401
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer wrong' "$CLW_K8S_URL/api/v1/nodes")
expect "token set: a wrong token gets 401 ($code)" test "$code" = 401
out=$("$CLW_K8S_PYTHON" -c '
import os
from kubernetes import client, config
config.load_kube_config(os.environ["KUBECONFIG"])
print(len(client.CoreV1Api().list_node().items), "nodes")' 2>&1)
expect "token set: the Python client with the kubeconfig's token lists nodes ($(tail -1 <<<"$out"))" grep -q '^2 nodes' <<<"$out"

note "selftest: $PASSED passed, $FAILED failed"
echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
