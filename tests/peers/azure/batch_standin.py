#!/usr/bin/env python3
"""A small stateful stand-in for the Azure Batch data-plane service (plus a
minimal Blob service for task output files), for testing the
cl-worker-manager's azure-batch backend on one machine.

No Azure Batch emulator exists; this is the project's own. It serves, on
127.0.0.1 only:

  Batch (--port, 10100), SharedKey or bearer-token auth on every request:
    GET    /jobs/{job}                      get job (404 JobNotFound)
    GET    /pools/{pool}                    get pool (allocationState, node counts, resizeErrors)
    GET    /pools/{pool}/nodes              list nodes ($filter, $select, maxresults, odata.nextLink)
    GET    /pools/{pool}/nodes/{node}       get node
    POST   /pools/{pool}/removenodes        remove nodes (202; 409 while the pool is not steady)
    POST   /jobs/{job}/tasks                add task (201; 409 TaskExists)
    GET    /jobs/{job}/tasks                list ($filter, $select, maxresults, odata.nextLink)
    GET    /jobs/{job}/tasks/{task}         get task
    POST   /jobs/{job}/tasks/{task}/terminate   (204; 409 TaskCompleted)
    DELETE /jobs/{job}/tasks/{task}         (200)
  Control, no auth (loopback):
    GET  /_clw/state        config, controls and every task's state (JSON)
    GET  /_clw/requests     the last 500 Batch API requests (method, path,
                            query, headers, body, status), oldest first
    POST /_clw/control      JSON: {"hold": bool, "nodes": N, "low_priority_nodes": M,
                            "slots_per_node": K, "job_missing": bool,
                            "throttle": {"count": K, "status": 429|503, "retry_after": S},
                            "preempt": {"node": ID | "low-priority", "notice_seconds": N,
                                        "down_seconds": M}}
                            preempt: a Spot (low-priority) node's eviction as Azure does it:
                            a Scheduled Event `Preempt` of the node (NotBefore now+N), then
                            at that time the node's VM goes (its task containers and the
                            containers their workers started, by the workers' `--id`, are
                            killed), its running tasks are requeued (state active,
                            requeueCount + 1) and the node is away for M seconds
                            "node_state": {"node": ID | "first" | "last", "state":
                                           "unusable" | "starttaskfailed" | "ok",
                                           "code": C, "message": M}
                            a node broken as Azure reports it: `unusable` (with
                            `errors`) or `starttaskfailed` (with `startTaskInfo`); it
                            takes no new task, what runs on it goes on; "ok" heals it
                            "resize_failure": {"code": C, "message": M, "max_nodes": N} | null
                            a resize that failed (quota, allocation): the pool is steady
                            with at most N nodes and reports `resizeErrors` until cleared
    Remove Nodes: the pool is `resizing` for --remove-seconds; the nodes are `leavingpool`
    (no new task); with nodeDeallocationOption `requeue` (the default) their tasks are
    requeued, with `terminate` they end with failureInfo TaskEnded, with `taskcompletion`
    or `retaineddata` the removal waits for them. Then the VMs go (their containers and the
    containers their workers started are killed); the pool keeps its target, as an
    autoscale formula does, so a fresh node (a new id) joins --replace-seconds later.
    GET  /_clw/imds/{node}/metadata/scheduledevents | /metadata/instance[/compute/name]
                            the node's instance metadata service (Metadata: true), which
                            the node's tasks find in CL_WORKER_AZURE_METADATA_ENDPOINT
    POST /_clw/reset        kill all task containers, drop tasks, blobs, controls
                            and the request log (not the journal: every request is
                            also appended to <state-dir>/journal.jsonl, kept across
                            resets and restarts)
  Blob (--blob-port, 10101), SAS check on every request:
    PUT  /{container}?restype=container          create container
    PUT  /{container}/{blob}  (x-ms-blob-type: BlockBlob)   Put Blob
    GET|HEAD /{container}/{blob}                  Get Blob
    DELETE /{container}/{blob}                    Delete Blob
    GET  /{container}?restype=container&comp=list[&prefix=]  List Blobs (XML)
    GET  /_clw/blobs                              every blob (JSON, no auth)

Tasks run in the machine's Docker engine (docker CLI): see README.md
("Azure Batch stand-in") for the lifecycle, what containerRunOptions are
accepted, the environment, output-file upload and what is not emulated.
"""

import argparse
import base64
import datetime
import email.utils
import glob
import hashlib
import hmac
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, quote, unquote, urlsplit
from xml.sax.saxutils import escape as xml_escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sharedkey  # noqa: E402

API_VERSION = "2025-06-01"
LABEL = "org.cl-worker-test.azure-batch"
TASK_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DATE_SKEW = datetime.timedelta(minutes=15)


def log(msg):
    ts = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
    print(f"{ts} {msg}", flush=True)


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def iso(dt):
    """Batch's time format: 7 fractional digits and Z."""
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"


def rfc1123(dt):
    return email.utils.format_datetime(dt.astimezone(datetime.timezone.utc), usegmt=True)


_etag_lock = threading.Lock()
_etag_last = [0]


def new_etag():
    # Like the service's: 0x + hex of a growing 100 ns counter.
    with _etag_lock:
        v = max(time.time_ns() // 100 + 116444736000000000, _etag_last[0] + 1)
        _etag_last[0] = v
    return "0x%X" % v


def is_loopback_host(host):
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiError(Exception):
    def __init__(self, status, code, message, values=None, headers=None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.values = values or []
        self.headers = headers or {}


# ---------------------------------------------------------------------------
# OData $filter: a small parser for what the list-tasks filter needs
# (comparisons on property paths, startswith/endswith, and/or/not, parens).
# ---------------------------------------------------------------------------
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<dt>datetime'[^']*')|(?P<num>-?\d+(?:\.\d+)?)"
    r"|(?P<punct>[(),])|(?P<word>[A-Za-z_$][A-Za-z0-9_/$.]*))"
)
_CMP = {"eq", "ne", "gt", "ge", "lt", "le"}


class FilterError(Exception):
    pass


def _tokenize(text):
    pos, out = 0, []
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        mt = _TOKEN.match(text, pos)
        if not mt or mt.end() == pos:
            raise FilterError(f"unexpected text at offset {pos}: {text[pos:pos + 20]!r}")
        pos = mt.end()
        if mt.group("str") is not None:
            out.append(("lit", mt.group("str")[1:-1].replace("''", "'")))
        elif mt.group("dt") is not None:
            out.append(("lit", mt.group("dt")[9:-1]))
        elif mt.group("num") is not None:
            n = mt.group("num")
            out.append(("lit", float(n) if "." in n else int(n)))
        elif mt.group("punct") is not None:
            out.append((mt.group("punct"), None))
        else:
            w = mt.group("word")
            lw = w.lower()
            if lw in ("and", "or", "not") or lw in _CMP:
                out.append((lw, None))
            elif lw in ("true", "false"):
                out.append(("lit", lw == "true"))
            elif lw == "null":
                out.append(("lit", None))
            else:
                out.append(("name", w))
    return out


class _Parser:
    FUNCS = {"startswith", "endswith"}

    def __init__(self, text):
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self):
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self, kind=None):
        if self.i >= len(self.toks):
            raise FilterError("unexpected end of filter")
        tok = self.toks[self.i]
        if kind is not None and tok[0] != kind:
            raise FilterError(f"expected {kind!r}, found {tok[0]!r} {tok[1] or ''}".strip())
        self.i += 1
        return tok

    def parse(self):
        node = self.or_()
        if self.i != len(self.toks):
            raise FilterError(f"unexpected {self.toks[self.i][0]!r} {self.toks[self.i][1] or ''}".strip())
        return node

    def or_(self):
        node = self.and_()
        while self.peek() == "or":
            self.take()
            node = ("or", node, self.and_())
        return node

    def and_(self):
        node = self.not_()
        while self.peek() == "and":
            self.take()
            node = ("and", node, self.not_())
        return node

    def not_(self):
        if self.peek() == "not":
            self.take()
            return ("not", self.not_())
        return self.cmp()

    def operand(self):
        k = self.peek()
        if k == "lit":
            return ("lit", self.take()[1])
        if k == "name":
            name = self.take()[1]
            if name.lower() in self.FUNCS and self.peek() == "(":
                self.take("(")
                a = self.operand()
                self.take(",")
                b = self.operand()
                self.take(")")
                return ("fn", name.lower(), a, b)
            return ("prop", name)
        raise FilterError(f"expected a property or literal, found {k!r}")

    def cmp(self):
        if self.peek() == "(":
            self.take()
            node = self.or_()
            self.take(")")
            return node
        left = self.operand()
        if self.peek() in _CMP:
            op = self.take()[0]
            return ("cmp", op, left, self.operand())
        if left[0] == "fn":
            return left
        raise FilterError("expected a comparison (eq, ne, gt, ge, lt, le) or a function")


def parse_filter(text):
    return _Parser(text).parse()


def _value(node, obj):
    if node[0] == "lit":
        return node[1]
    if node[0] == "prop":
        cur = obj
        for part in node[1].split("/"):
            if not isinstance(cur, dict):
                return None
            cur = cur.get(part)
        return cur
    if node[0] == "fn":
        a, b = _value(node[2], obj), _value(node[3], obj)
        if not isinstance(a, str) or not isinstance(b, str):
            return False
        return a.startswith(b) if node[1] == "startswith" else a.endswith(b)
    return eval_filter(node, obj)


def eval_filter(node, obj):
    kind = node[0]
    if kind == "or":
        return eval_filter(node[1], obj) or eval_filter(node[2], obj)
    if kind == "and":
        return eval_filter(node[1], obj) and eval_filter(node[2], obj)
    if kind == "not":
        return not eval_filter(node[1], obj)
    if kind == "fn":
        return bool(_value(node, obj))
    if kind == "cmp":
        op, a, b = node[1], _value(node[2], obj), _value(node[3], obj)
        if op == "eq":
            return a == b
        if op == "ne":
            return a != b
        if a is None or b is None:
            return False
        try:
            return {"gt": a > b, "ge": a >= b, "lt": a < b, "le": a <= b}[op]
        except TypeError:
            return False
    raise FilterError(f"cannot evaluate {kind}")


# ---------------------------------------------------------------------------
# containerRunOptions
# ---------------------------------------------------------------------------
# options passed on to `docker run` (they take a value)
VALUE_OPTS = {
    "--cpus": "--cpus", "--memory": "--memory", "-m": "--memory", "--memory-swap": "--memory-swap",
    "--memory-reservation": "--memory-reservation", "--user": "--user", "-u": "--user",
    "--volume": "--volume", "-v": "--volume", "--mount": "--mount", "--network": "--network",
    "--net": "--network", "--env": "--env", "-e": "--env", "--workdir": "--workdir", "-w": "--workdir",
    "--entrypoint": "--entrypoint", "--shm-size": "--shm-size", "--ulimit": "--ulimit", "--label": "--label",
    "-l": "--label", "--add-host": "--add-host", "--hostname": "--hostname", "-h": "--hostname",
    "--ipc": "--ipc", "--pids-limit": "--pids-limit", "--cpu-shares": "--cpu-shares", "-c": "--cpu-shares",
    "--cpuset-cpus": "--cpuset-cpus", "--group-add": "--group-add", "--tmpfs": "--tmpfs",
    "--stop-signal": "--stop-signal", "--dns": "--dns", "--security-opt": "--security-opt",
    "--cap-add": "--cap-add", "--cap-drop": "--cap-drop", "--device": "--device",
}
# flags passed on
FLAG_OPTS = {"--init", "--read-only", "--privileged"}
# accepted but not used (value-taking ones first); logged
IGNORED_VALUE_OPTS = {"--name", "--gpus", "--restart", "--pull", "--platform", "--stop-timeout", "--cidfile"}
IGNORED_FLAGS = {"--rm", "-d", "--detach", "-i", "--interactive", "-t", "--tty", "-it", "-ti"}


class RunOptionsError(Exception):
    pass


def parse_run_options(text, ncpus):
    """Returns (docker args, notes, network given?) or raises RunOptionsError."""
    try:
        words = shlex.split(text or "")
    except ValueError as err:
        raise RunOptionsError(f"containerRunOptions cannot be split like a shell: {err}")
    args, notes, network = [], [], False
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, inline = w.partition("=") if w.startswith("--") else (w, "", "")
        if not eq:
            name, inline = w, None
        if name in IGNORED_FLAGS and inline is None:
            notes.append(f"ignored {w} (the stand-in runs and removes containers itself)")
            i += 1
            continue
        if name in FLAG_OPTS and inline is None:
            args.append(name)
            i += 1
            continue
        if name in VALUE_OPTS or name in IGNORED_VALUE_OPTS:
            if inline is None:
                if i + 1 >= len(words):
                    raise RunOptionsError(f"option {w} needs a value")
                value = words[i + 1]
                i += 2
            else:
                value = inline
                i += 1
            if name in IGNORED_VALUE_OPTS:
                notes.append(f"ignored {name} {value}")
                continue
            canon = VALUE_OPTS[name]
            if canon == "--cpus":
                try:
                    cpus = float(value)
                except ValueError:
                    raise RunOptionsError(f"--cpus {value!r} is not a number")
                if cpus > ncpus:
                    notes.append(f"--cpus {value} clamped to {ncpus} (this machine's CPUs)")
                    value = str(ncpus)
            if canon == "--network":
                network = True
            args += [canon, value]
            continue
        raise RunOptionsError(
            f"containerRunOptions: {w!r} is not an option the stand-in accepts "
            "(see tests/peers/README.md, Azure Batch stand-in)"
        )
    return args, notes, network


# ---------------------------------------------------------------------------
# state
# ---------------------------------------------------------------------------
class Task:
    def __init__(self, job_id, body, seq):
        self.job_id = job_id
        self.seq = seq
        self.body = body
        self.json = None  # the REST representation (built by the service)
        self.node = None
        self.slots = 1
        self.proc = None
        self.container = None
        self.terminate = False  # terminate requested
        self.deleted = False
        self.notes = []
        self.task_dir = None
        self.wake = threading.Event()
        self.preempted = False  # its node was evicted under it: requeue, do not complete


class Service:
    def __init__(self, args):
        self.args = args
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.instance = hashlib.sha256(os.path.abspath(args.state_dir).encode()).hexdigest()[:10]
        self.ncpus = os.cpu_count() or 1
        self.requests = deque(maxlen=500)
        self.blob_lock = threading.Lock()
        self.stopping = False
        self.reset_state()

    # -- state -------------------------------------------------------------
    def reset_state(self):
        a = self.args
        with self.lock:
            self.tasks = {}  # (job lower, task lower) -> Task
            self.seq = 0
            # The request log starts again too, so a test counts only its own requests.
            self.requests = deque(maxlen=500)
            self.hold = a.hold
            self.job_missing = False
            self.throttle = None  # {"count", "status", "retry_after"}
            self.nodes = a.nodes
            self.low_priority_nodes = a.low_priority_nodes
            self.slots_per_node = a.slots_per_node
            t = now()
            self.jobs = {}
            for j in a.job_id:
                self.jobs[j.lower()] = {
                    "id": j, "eTag": new_etag(), "lastModified": t, "creationTime": t,
                }
            self.pool_created = t
            self.pool_etag = new_etag()
            self.alloc_changed = t
            self.events = {}  # node -> its Scheduled Events (Azure's documented shape)
            self.incarnation = {}  # node -> DocumentIncarnation
            self.evicted = {}  # node -> time.monotonic() until which it is away
            self.gen = {}  # node slot -> generation (a replaced node gets a new id)
            self.away = {}  # node slot -> time.monotonic() until its replacement joins
            self.faults = {}  # node -> {"state", "since", "code", "message"}
            self.leaving = {}  # node -> nodeDeallocationOption of its removal in progress
            self.removing = 0  # removals in progress (the pool is resizing)
            self.joined = {}  # node -> when it joined the pool
            self.resize_failure = None  # {"code", "message", "max_nodes"}
            self.removals = []  # every accepted Remove Nodes: {"nodes", "option", "states"}
        with self.blob_lock:
            self.blobs = {}  # (container, name) -> {"data", "etag", "last_modified", "content_type", "created"}
            self.containers = {c: now() for c in a.blob_containers}

    def node_id(self, slot):
        gen = self.gen.get(slot, 0)
        return slot[:-2] + (f"r{gen}" if gen else "") + slot[-2:]

    def node_ids(self):
        slots = [f"tvmps_clw{self.instance}{i:03d}_d" for i in range(self.nodes)]
        slots += [f"tvmps_clw{self.instance}{i:03d}_p" for i in range(self.low_priority_nodes)]
        t = time.monotonic()
        if self.hold:
            return []
        ids = [self.node_id(s) for s in slots if self.away.get(s, 0) <= t]
        ids = [n for n in ids if self.evicted.get(n, 0) <= t]
        if self.resize_failure is not None:
            ids = ids[: self.resize_failure["max_nodes"]]
        for n in ids:
            self.joined.setdefault(n, self.pool_created)
        return ids

    def node_state(self, node):
        if node in self.leaving:
            return "leavingpool"
        if node in self.faults:
            return self.faults[node]["state"]
        busy = any(t.node == node and t.json["state"] in ("preparing", "running") for t in self.tasks.values())
        return "running" if busy else "idle"

    def node_json(self, node, base):
        tasks = [t for t in self.tasks.values() if t.node == node]
        running = [t for t in tasks if t.json["state"] in ("preparing", "running")]
        f = self.faults.get(node)
        j = {
            "id": node, "url": f"{base}/pools/{self.args.pool_id}/nodes/{node}",
            "state": self.node_state(node), "schedulingState": "enabled",
            "stateTransitionTime": iso(f["since"] if f else self.joined.get(node, self.pool_created)),
            "lastBootTime": iso(self.joined.get(node, self.pool_created)),
            "allocationTime": iso(self.joined.get(node, self.pool_created)),
            "ipAddress": "10.0.0.%d" % (4 + int(hashlib.sha256(node.encode()).hexdigest()[:2], 16) % 250),
            "affinityId": f"TVM:{node}", "vmSize": "standard_d2s_v3",
            "totalTasksRun": len(tasks), "runningTasksCount": len(running),
            "runningTaskSlotsCount": sum(t.slots for t in running),
            "totalTasksSucceeded": len([t for t in tasks if (t.json.get("executionInfo") or {}).get("result") == "success"]),
            "isDedicated": node.endswith("_d"),
            "nodeAgentInfo": {"version": "1.11.0", "lastUpdateTime": iso(self.pool_created)},
        }
        if f and f["state"] == "unusable":
            j["errors"] = [{"code": f["code"], "message": f["message"], "errorDetails": []}]
        if f and f["state"] == "starttaskfailed":
            j["startTaskInfo"] = {
                "state": "completed", "startTime": iso(f["since"]), "endTime": iso(f["since"]), "exitCode": 1,
                "retryCount": 0, "result": "failure",
                "failureInfo": {"category": "usererror", "code": f["code"], "message": f["message"]},
            }
        return j

    # -- node faults and removal -------------------------------------------
    def set_node_fault(self, spec):
        """Breaks (or heals) a node (caller holds the lock)."""
        ids = self.node_ids()
        target = spec.get("node", "first")
        node = {"first": ids[0] if ids else None, "last": ids[-1] if ids else None}.get(target, target)
        if node not in ids:
            raise ApiError(400, "InvalidRequestBody", f"control: node_state: no such node {target!r}")
        state = spec.get("state")
        if state == "ok":
            self.faults.pop(node, None)
        elif state in ("unusable", "starttaskfailed"):
            default = ("NodeAgentUnreachable", "The node agent stopped reporting to the Batch service") \
                if state == "unusable" else ("FailureExitCode", "The start task exited with an exit code representing a failure")
            self.faults[node] = {"state": state, "since": now(), "code": spec.get("code", default[0]),
                                 "message": spec.get("message", default[1])}
        else:
            raise ApiError(400, "InvalidRequestBody", "control: node_state.state must be unusable, starttaskfailed or ok")
        return node

    def remove_nodes(self, ids, option):
        """Starts a removal (caller holds the lock)."""
        self.removing += 1
        self.alloc_changed = now()
        self.removals.append({"nodes": list(ids), "option": option, "states": [self.node_state(n) for n in ids]})
        for n in ids:
            self.leaving[n] = option
        threading.Thread(target=self._remove, args=(ids, option), daemon=True, name="removenodes").start()

    def _remove(self, ids, option):
        time.sleep(self.args.remove_seconds)
        while True:
            with self.cond:
                victims = [t for t in self.tasks.values() if t.node in ids and t.json["state"] in ("preparing", "running")]
                if option in ("requeue", "terminate") or not victims:
                    for t in victims:
                        if option == "requeue":
                            t.preempted = True
                        else:
                            t.terminate = True
                        t.wake.set()
                    break
            time.sleep(0.5)  # taskcompletion / retaineddata: the tasks end first
        for t in victims:
            self.kill_vm_of(t)
        with self.cond:
            until = time.monotonic() + self.args.replace_seconds
            for n in ids:
                slot = self.slot_of(n)
                self.gen[slot] = self.gen.get(slot, 0) + 1
                self.away[slot] = until
                self.leaving.pop(n, None)
                self.faults.pop(n, None)
                self.joined.pop(n, None)
            self.removing -= 1
            self.alloc_changed = now()
            self.cond.notify_all()
        log(f"removenodes {ids} ({option}): {len(victims)} task(s) on them; replaced in {self.args.replace_seconds:.0f} s")

    def slot_of(self, node):
        base, kind = node[:-2], node[-2:]
        return re.sub(r"r\d+$", "", base) + kind

    def kill_vm_of(self, t):
        """A VM going with everything on it: the task's container and the run containers its
        worker started (labelled with the worker's id), without SIGTERM."""
        m = re.search(r"--id\s+(\S+)", t.json.get("commandLine") or "")
        if m:
            r = subprocess.run([self.args.docker, "ps", "-aq", "--filter", f"label=org.codalab.worker-id={m.group(1)}"],
                               capture_output=True, text=True)
            if r.stdout.split():
                subprocess.run([self.args.docker, "rm", "-f"] + r.stdout.split(), capture_output=True)
        self.kill_now(t)

    # -- Spot eviction -----------------------------------------------------
    def preempt(self, spec):
        """Schedules the eviction of a node (or of every low-priority one); caller holds the lock."""
        target = spec.get("node", "low-priority")
        notice = float(spec.get("notice_seconds", 30))
        down = float(spec.get("down_seconds", 30))
        nodes = [n for n in self.node_ids() if n == target or target == "low-priority" and n.endswith("_p")]
        if not nodes:
            raise ApiError(400, "InvalidRequestBody", f"control: preempt: no such node {target!r}")
        for node in nodes:
            self.incarnation[node] = self.incarnation.get(node, 0) + 1
            self.events.setdefault(node, []).append({
                "EventId": str(uuid.uuid4()).upper(), "EventType": "Preempt", "ResourceType": "VirtualMachine",
                "Resources": [node], "EventStatus": "Scheduled",
                "NotBefore": email.utils.format_datetime(now() + datetime.timedelta(seconds=notice), usegmt=True),
                "Description": "", "EventSource": "Platform", "DurationInSeconds": -1,
            })
            threading.Thread(target=self.evict, args=(node, notice, down), daemon=True, name=f"evict-{node}").start()
        return nodes

    def evict(self, node, notice, down):
        time.sleep(notice)
        with self.cond:
            self.evicted[node] = time.monotonic() + down
            self.alloc_changed = now()
            for e in self.events.get(node, []):
                e["EventStatus"] = "Started"
            self.incarnation[node] = self.incarnation.get(node, 0) + 1
            victims = [t for t in self.tasks.values() if t.node == node and t.json["state"] in ("preparing", "running")]
            for t in victims:
                t.preempted = True
                t.wake.set()
        log(f"evict {node}: {len(victims)} task(s) requeued; away for {down:.0f} s")
        for t in victims:
            self.kill_vm_of(t)
        time.sleep(down)
        with self.cond:
            self.events.pop(node, None)
            self.incarnation[node] = self.incarnation.get(node, 0) + 1
            self.alloc_changed = now()
            self.cond.notify_all()
        log(f"evict {node}: back")

    def requeue(self, t):
        """A task whose node was evicted goes back to the queue (caller holds the lock)."""
        j = t.json
        ei = j.setdefault("executionInfo", {"retryCount": 0, "requeueCount": 0})
        ei["requeueCount"] = ei.get("requeueCount", 0) + 1
        for k in ("startTime", "endTime", "exitCode", "result", "failureInfo", "containerInfo"):
            ei.pop(k, None)
        j.pop("nodeInfo", None)
        t.node = t.container = t.proc = None
        t.preempted = False
        t.wake = threading.Event()
        self.set_state(t, "active")
        self.cond.notify_all()

    def job(self, job_id):
        if self.job_missing:
            return None
        return self.jobs.get(job_id.lower())

    # -- JSON shapes -------------------------------------------------------
    def base_url(self, host):
        return f"http://{host or f'127.0.0.1:{self.args.port}'}"

    def job_json(self, j, base):
        pool = self.args.pool_id
        return {
            "odata.metadata": f"{base}/$metadata#jobs/@Element",
            "id": j["id"], "url": f"{base}/jobs/{j['id']}", "eTag": j["eTag"],
            "lastModified": iso(j["lastModified"]), "creationTime": iso(j["creationTime"]),
            "state": "active", "stateTransitionTime": iso(j["creationTime"]),
            "priority": 0, "maxParallelTasks": -1, "allowTaskPreemption": False, "usesTaskDependencies": False,
            "constraints": {"maxWallClockTime": "P10675199DT2H48M5.4775807S", "maxTaskRetryCount": 0},
            "poolInfo": {"poolId": pool},
            "executionInfo": {"startTime": iso(j["creationTime"]), "poolId": pool},
            "onAllTasksComplete": "noaction", "onTaskFailure": "noaction",
        }

    def pool_json(self, base):
        up = self.node_ids()
        cur_d = len([n for n in up if n.endswith("_d")])
        cur_l = len([n for n in up if n.endswith("_p")])
        return {
            "odata.metadata": f"{base}/$metadata#pools/@Element",
            "id": self.args.pool_id, "url": f"{base}/pools/{self.args.pool_id}", "eTag": self.pool_etag,
            "lastModified": iso(self.alloc_changed), "creationTime": iso(self.pool_created),
            "state": "active", "stateTransitionTime": iso(self.pool_created),
            "allocationState": "resizing" if self.hold or self.removing else "steady",
            "allocationStateTransitionTime": iso(self.alloc_changed),
            "vmSize": "standard_d2s_v3", "resizeTimeout": "PT15M",
            "currentDedicatedNodes": cur_d, "targetDedicatedNodes": self.nodes,
            "currentLowPriorityNodes": cur_l, "targetLowPriorityNodes": self.low_priority_nodes,
            "enableAutoScale": False, "enableInterNodeCommunication": False,
            "taskSlotsPerNode": self.slots_per_node,
            "taskSchedulingPolicy": {"nodeFillType": "Spread"},
            **({"resizeErrors": [{"code": self.resize_failure["code"], "message": self.resize_failure["message"],
                                  "values": []}]} if self.resize_failure else {}),
            "virtualMachineConfiguration": {
                "imageReference": {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"},
                "nodeAgentSKUId": "batch.node.ubuntu 22.04",
                "containerConfiguration": {"type": "dockerCompatible"},
            },
        }

    # -- scheduling --------------------------------------------------------
    def free_slots(self):
        used = {}
        for t in self.tasks.values():
            if t.node and t.json["state"] in ("preparing", "running"):
                used[t.node] = used.get(t.node, 0) + t.slots
        # A node with a scheduled eviction, a broken one or one leaving takes no new task.
        return {n: self.slots_per_node - used.get(n, 0) for n in self.node_ids()
                if not self.events.get(n) and n not in self.faults and n not in self.leaving}

    def scheduler(self):
        while True:
            with self.cond:
                if self.stopping:
                    return
                free = self.free_slots()
                for t in sorted(self.tasks.values(), key=lambda t: t.seq):
                    if t.json["state"] != "active" or t.terminate:
                        continue
                    # spread: the node with the most free slots
                    cands = [n for n, f in free.items() if f >= t.slots]
                    if not cands:
                        continue
                    node = max(cands, key=lambda n: (free[n], -cands.index(n)))
                    free[node] -= t.slots
                    t.node = node
                    self.set_state(t, "preparing")
                    threading.Thread(target=self.run_task, args=(t,), daemon=True, name=f"task-{t.json['id']}").start()
                self.cond.wait(0.5)

    def set_state(self, t, state):
        ts = now()
        j = t.json
        j["previousState"] = j["state"]
        j["previousStateTransitionTime"] = j["stateTransitionTime"]
        j["state"] = state
        j["stateTransitionTime"] = iso(ts)
        self.touch(t)
        log(f"task {t.job_id}/{j['id']}: {j['previousState']} -> {state}")

    def touch(self, t):
        t.json["eTag"] = new_etag()
        t.json["lastModified"] = iso(now())

    # -- running a task ----------------------------------------------------
    def node_root(self, node):
        return os.path.join(os.path.abspath(self.args.state_dir), "nodes", node)

    def task_env(self, t, root, task_dir, wd):
        j = t.json
        admin = ((j.get("userIdentity") or {}).get("autoUser") or {}).get("elevationLevel") == "admin"
        scope = ((j.get("userIdentity") or {}).get("autoUser") or {}).get("scope", "pool")
        env = {
            "AZ_BATCH_ACCOUNT_NAME": self.args.account_name,
            "AZ_BATCH_ACCOUNT_URL": f"http://127.0.0.1:{self.args.port}/",
            "AZ_BATCH_POOL_ID": self.args.pool_id,
            "AZ_BATCH_JOB_ID": t.job_id,
            "AZ_BATCH_TASK_ID": j["id"],
            "AZ_BATCH_NODE_ID": t.node,
            "AZ_BATCH_NODE_IS_DEDICATED": "false" if t.node.endswith("_p") else "true",
            "AZ_BATCH_NODE_ROOT_DIR": root,
            "AZ_BATCH_NODE_SHARED_DIR": os.path.join(root, "shared"),
            "AZ_BATCH_NODE_STARTUP_DIR": os.path.join(root, "startup"),
            "AZ_BATCH_TASK_DIR": task_dir,
            "AZ_BATCH_TASK_WORKING_DIR": wd,
            "AZ_BATCH_TASK_USER": "_azbatch",
            "AZ_BATCH_TASK_USER_IDENTITY": ("PoolAdmin" if admin else "PoolNonAdmin")
            if scope == "pool" else ("TaskAdmin" if admin else "TaskNonAdmin"),
        }
        # The node's instance metadata service (169.254.169.254 on Azure), for
        # `cl-worker --preemption-notice azure`.
        env["CL_WORKER_AZURE_METADATA_ENDPOINT"] = f"http://127.0.0.1:{self.args.port}/_clw/imds/{t.node}"
        for e in j.get("environmentSettings") or []:
            env[e["name"]] = e.get("value") or ""
        return env

    def run_task(self, t):
        try:
            self._run_task(t)
        except Exception:
            log(f"task {t.json['id']}: internal error\n{traceback.format_exc()}")
            with self.cond:
                if t.json["state"] != "completed":
                    self.complete(t, None, "ServerError", "StandinInternalError", "The stand-in failed to run the task (see its log)",
                                  category="servererror")

    def _run_task(self, t):
        j = t.json
        root = self.node_root(t.node)
        task_dir = os.path.join(root, "workitems", t.job_id, "job-1", j["id"])
        wd = os.path.join(task_dir, "wd")
        with self.cond:
            t.task_dir = task_dir
            j["nodeInfo"] = {
                "affinityId": f"TVM:{t.node}",
                "nodeUrl": f"http://127.0.0.1:{self.args.port}/pools/{self.args.pool_id}/nodes/{t.node}",
                "poolId": self.args.pool_id,
                "nodeId": t.node,
                "taskRootDirectory": f"workitems/{t.job_id}/job-1/{j['id']}",
                "taskRootDirectoryUrl": f"http://127.0.0.1:{self.args.port}/pools/{self.args.pool_id}/nodes/{t.node}"
                f"/files/workitems/{t.job_id}/job-1/{j['id']}",
            }
        if os.path.isdir(task_dir):
            shutil.rmtree(task_dir, ignore_errors=True)
        for d in (os.path.join(root, "shared"), os.path.join(root, "startup"), wd):
            os.makedirs(d, exist_ok=True)
        for d in (root, os.path.join(root, "workitems"), task_dir, wd):
            try:
                os.chmod(d, 0o777)
            except OSError:
                pass
        env = self.task_env(t, root, task_dir, wd)
        t.wake.wait(self.args.prepare_seconds)
        with self.cond:
            if t.deleted:
                return
            if t.preempted:
                self.requeue(t)
                return
            if t.terminate:
                self.complete(t, None, "UserError", "TaskEnded", "Task Was Ended by User Request")
                return

        cs = j.get("containerSettings")
        stdout_path = os.path.join(task_dir, "stdout.txt")
        stderr_path = os.path.join(task_dir, "stderr.txt")
        try:
            argv_task = shlex.split(j["commandLine"])
        except ValueError as err:
            with self.cond:
                self.complete(t, None, "UserError", "CommandLineInvalid", f"commandLine cannot be split: {err}")
            return
        popen_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT")}
        envfile = None
        if cs:
            try:
                run_args, notes, has_network = parse_run_options(cs.get("containerRunOptions"), self.ncpus)
            except RunOptionsError as err:
                log(f"task {j['id']}: rejected: {err}")
                with self.cond:
                    self.complete(t, None, "UserError", "ContainerRunOptionsRejected", str(err))
                return
            for n in notes:
                log(f"task {j['id']}: containerRunOptions: {n}")
            t.notes += notes
            image = cs["imageName"]
            if ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
                image += ":latest"
            chk = subprocess.run([self.args.docker, "image", "inspect", "--format", "{{.Id}}", image],
                                 capture_output=True, text=True)
            if chk.returncode != 0:
                with self.cond:
                    self.complete(t, None, "UserError", "ContainerPullImageFailed",
                                  f"The container image {image} is not in the local Docker engine (the stand-in never pulls)",
                                  details=[("Message", chk.stderr.strip()[:500])], started=True)
                return
            t.container = f"clw-az-{self.instance}-{j['id'].lower()}-{t.seq}"
            cidfile = os.path.join(self.args.state_dir, "run", f"{t.container}.cid")
            os.makedirs(os.path.dirname(cidfile), exist_ok=True)
            for f in (cidfile,):
                if os.path.exists(f):
                    os.unlink(f)
            argv = [self.args.docker, "run", "--name", t.container, "--pull", "never", "--cidfile", cidfile,
                    "--label", f"{LABEL}={self.instance}", "--label", f"{LABEL}.task={t.job_id}/{j['id']}",
                    "-v", f"{root}:{root}"]
            if (cs.get("workingDirectory") or "taskWorkingDirectory") == "taskWorkingDirectory":
                argv += ["-w", wd]
            if not has_network and self.args.container_network:
                argv += ["--network", self.args.container_network]
            # Batch's variables first, then containerRunOptions (whose -e win).
            multiline = {k: v for k, v in env.items() if "\n" in v}
            envfile = os.path.join(self.args.state_dir, "run", f"{t.container}.env")
            fd = os.open(envfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                for k, v in env.items():
                    if k not in multiline:
                        f.write(f"{k}={v}\n")
            argv += ["--env-file", envfile]
            for k, v in multiline.items():
                argv += ["-e", f"{k}={v}"]
            argv += run_args
            argv.append(image)
            argv += argv_task
        else:
            cidfile = None
            argv = argv_task
            if not argv:
                with self.cond:
                    self.complete(t, None, "UserError", "CommandLineInvalid", "commandLine is empty")
                return
            popen_env = dict(popen_env, **env)

        log(f"task {j['id']}: run {' '.join(shlex.quote(a) for a in argv)}")
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            with self.cond:
                if t.deleted:
                    return
                try:
                    t.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                              cwd=wd, env=popen_env, start_new_session=True)
                except OSError as e:
                    self.complete(t, None, "UserError", "CommandProgramNotFound", str(e), started=True)
                    return
            cid = None
            if cidfile:
                for _ in range(200):  # the cidfile appears once the container exists
                    if os.path.exists(cidfile) and os.path.getsize(cidfile) > 0 or t.proc.poll() is not None:
                        break
                    time.sleep(0.05)
                if os.path.exists(cidfile):
                    with open(cidfile) as f:
                        cid = f.read().strip() or None
            with self.cond:
                if t.deleted:
                    return
                j["executionInfo"] = {"startTime": iso(now()), "retryCount": 0, "requeueCount": 0}
                if cid:
                    j["executionInfo"]["containerInfo"] = {"containerId": cid, "state": "running", "error": ""}
                self.set_state(t, "running")
                if t.terminate:
                    threading.Thread(target=self.stop_process, args=(t,), daemon=True).start()
            code = t.proc.wait()
        if envfile and os.path.exists(envfile):
            os.unlink(envfile)
        started = True
        cerror = ""
        if cidfile:
            ins = subprocess.run([self.args.docker, "inspect", "--format", "{{.State.StartedAt}}|{{.State.Error}}", t.container],
                                 capture_output=True, text=True)
            if ins.returncode == 0:
                started_at, _, cerror = ins.stdout.strip().partition("|")
                started = not started_at.startswith("0001-")
            else:
                started = os.path.exists(cidfile) and os.path.getsize(cidfile) > 0 and code != 125
            subprocess.run([self.args.docker, "rm", "-f", t.container], capture_output=True)
            if os.path.exists(cidfile):
                os.unlink(cidfile)
        with self.cond:
            if t.deleted:
                return
            if t.preempted:
                self.requeue(t)
                return
            ei = j.setdefault("executionInfo", {"retryCount": 0, "requeueCount": 0})
            if "containerInfo" in ei:
                ei["containerInfo"]["state"] = "exited"
                ei["containerInfo"]["error"] = cerror
        if cidfile and not started:
            with open(stderr_path, "rb") as f:
                msg = f.read().decode("utf-8", "replace").strip()[-500:]
            with self.cond:
                self.complete(t, None, "UserError", "ContainerStartFailed",
                              "The container could not be created or started", details=[("Message", msg)], started=True)
            return
        result = "success" if code == 0 else "failure"
        upload_error = self.upload_outputs(t, env, wd, result)
        with self.cond:
            if t.deleted:
                return
            if t.terminate:
                self.complete(t, code, "UserError", "TaskEnded", "Task Was Ended by User Request", started=True)
            elif code != 0:
                self.complete(t, code, "UserError", "FailureExitCode",
                              "The task exited with an exit code representing a failure",
                              details=[("Message", "The task exited with an exit code representing a failure")], started=True)
            elif upload_error:
                self.complete(t, code, "UserError", upload_error[0], upload_error[1], started=True)
            else:
                self.complete(t, code, None, None, None, started=True)

    def complete(self, t, exit_code, category, code, message, details=None, started=False):
        """Marks t completed (caller holds the lock)."""
        j = t.json
        ei = j.setdefault("executionInfo", {"retryCount": 0, "requeueCount": 0})
        ts = iso(now())
        if started and "startTime" not in ei:
            ei["startTime"] = ts
        ei["endTime"] = ts
        if exit_code is not None:
            ei["exitCode"] = exit_code
        if code:
            ei["result"] = "failure"
            fi = {"category": category.lower(), "code": code, "message": message}
            if details:
                fi["details"] = [{"name": n, "value": v} for n, v in details]
            ei["failureInfo"] = fi
        else:
            ei["result"] = "success"
        t.proc = None
        self.set_state(t, "completed")
        t.wake.set()
        self.cond.notify_all()

    def stop_process(self, t):
        """SIGTERM, then SIGKILL after --kill-after seconds."""
        if t.container:
            # The container may not exist yet right after `docker run` started: retry briefly.
            for _ in range(50):
                r = subprocess.run([self.args.docker, "stop", "-t", str(self.args.kill_after), t.container],
                                   capture_output=True, text=True)
                proc = t.proc
                if r.returncode == 0 or proc is None or proc.poll() is not None:
                    return
                time.sleep(0.1)
            log(f"task {t.json['id']}: docker stop {t.container} failed: {r.stderr.strip()}")
            return
        proc = t.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(self.args.kill_after)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- output files ------------------------------------------------------
    def upload_outputs(self, t, env, wd, result):
        """Uploads outputFiles per uploadCondition; returns (code, message) of the first failure or None."""
        first_error = None

        def expand(s):
            s = re.sub(r"%([A-Za-z_][A-Za-z0-9_]*)%", lambda mt: env.get(mt.group(1), mt.group(0)), s)
            return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda mt: env.get(mt.group(1), mt.group(0)), s)

        for of in t.json.get("outputFiles") or []:
            cond = ((of.get("uploadOptions") or {}).get("uploadCondition") or "taskcompletion").lower()
            if cond == "tasksuccess" and result != "success" or cond == "taskfailure" and result != "failure":
                continue
            dest = ((of.get("destination") or {}).get("container") or {})
            url = dest.get("containerUrl")
            if not url:
                continue
            pattern = expand(of.get("filePattern", ""))
            if not os.path.isabs(pattern):
                pattern = os.path.normpath(os.path.join(wd, pattern))
            wild = any(c in pattern for c in "*?[")
            files = sorted(f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
            prefix_dir = pattern
            if wild:
                parts = pattern.split("/")
                k = next(i for i, p in enumerate(parts) if any(c in p for c in "*?["))
                prefix_dir = "/".join(parts[:k]) or "/"
            for f in files:
                if wild:
                    rel = os.path.relpath(f, prefix_dir)
                    name = f"{dest['path'].rstrip('/')}/{rel}" if dest.get("path") else rel
                else:
                    name = dest.get("path") or os.path.basename(f)
                err = self.put_blob(url, name, f)
                if err:
                    log(f"task {t.json['id']}: upload of {f} as {name} failed: {err[1]}")
                    first_error = first_error or err
                else:
                    log(f"task {t.json['id']}: uploaded {f} as {name}")
        return first_error

    def put_blob(self, container_url, name, path):
        sp = urlsplit(container_url)
        if sp.scheme != "http" or not is_loopback_host(sp.hostname or ""):
            return ("FileUploadMiscError", f"the stand-in uploads only to http:// loopback container URLs, not {sp.scheme}://{sp.hostname}")
        url = f"http://{sp.netloc}{sp.path.rstrip('/')}/{quote(name)}" + (f"?{sp.query}" if sp.query else "")
        with open(path, "rb") as f:
            data = f.read()
        req = urllib.request.Request(url, data=data, method="PUT", headers={
            "x-ms-blob-type": "BlockBlob", "x-ms-version": "2025-01-05", "Content-Type": "text/plain"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
            return None
        except urllib.error.HTTPError as e:
            code = {403: "FileUploadAuthenticationFailed", 404: "FileUploadContainerNotFound"}.get(e.code, "FileUploadMiscError")
            return (code, f"upload of {name} failed: HTTP {e.code} {e.read()[:200]!r}")
        except OSError as e:
            return ("FileUploadMiscError", f"upload of {name} failed: {e}")

    def kill_now(self, t, timeout=20):
        """Kills a deleted task's container or process and waits until `docker run` returned."""
        end = time.monotonic() + timeout
        while True:
            proc = t.proc
            if t.container:
                subprocess.run([self.args.docker, "rm", "-f", t.container], capture_output=True)
            elif proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            # t.deleted is set, so no new process starts (run_task checks it under the lock before Popen)
            if proc is None or proc.poll() is not None:
                return
            if time.monotonic() > end:
                log(f"task {t.json['id']}: could not stop {t.container or proc.pid} within {timeout} s")
                return
            time.sleep(0.1)

    # -- reset / shutdown --------------------------------------------------
    def kill_all_containers(self):
        r = subprocess.run([self.args.docker, "ps", "-aq", "--filter", f"label={LABEL}={self.instance}"],
                           capture_output=True, text=True)
        ids = r.stdout.split()
        if ids:
            subprocess.run([self.args.docker, "rm", "-f"] + ids, capture_output=True)
        return len(ids)

    def reset(self):
        with self.cond:
            for t in self.tasks.values():
                t.deleted = True
                t.wake.set()
                if t.proc is not None and not t.container:
                    try:
                        os.killpg(t.proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        n = self.kill_all_containers()
        shutil.rmtree(os.path.join(self.args.state_dir, "nodes"), ignore_errors=True)
        self.reset_state()
        log(f"reset: tasks, blobs and controls dropped ({n} containers removed)")


# ---------------------------------------------------------------------------
# Batch HTTP handler
# ---------------------------------------------------------------------------
def make_batch_handler(svc):
    a = svc.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "clw-azure-batch-standin"
        sys_version = ""

        def log_message(self, fmt, *args):
            pass

        # -- plumbing --
        def send(self, status, obj=None, headers=None, content_type="application/json;odata=minimalmetadata"):
            body = b"" if obj is None else (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
            self.send_response(status)
            self.send_header("request-id", self.request_id)
            crid = self.headers.get("client-request-id")
            if crid:
                self.send_header("client-request-id", crid)
            self.send_header("DataServiceVersion", "3.0")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if status != 204:
                if body:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)
            self.status = status

        def error(self, e):
            base = svc.base_url(self.headers.get("Host"))
            body = {
                "odata.metadata": f"{base}/$metadata#Microsoft.Azure.Batch.Protocol.Entities.Container.errors/@Element",
                "code": e.code,
                "message": {"lang": "en-US", "value": f"{e.message}\nRequestId:{self.request_id}\nTime:{iso(now())}"},
            }
            if e.values:
                body["values"] = [{"key": k, "value": v} for k, v in e.values]
            self.send(e.status, body, e.headers)

        def handle_one(self):
            self.request_id = str(uuid.uuid4())
            self.status = None
            n = int(self.headers.get("Content-Length") or 0)
            self.raw_body = self.rfile.read(n) if n else b""
            sp = urlsplit(self.path)
            self.raw_path, self.raw_query = sp.path, sp.query
            self.query = {}
            for k, v in parse_qsl(sp.query, keep_blank_values=True):
                self.query.setdefault(k.lower(), v)
            if self.raw_path.startswith("/_clw/"):
                try:
                    self.control()
                except ApiError as e:
                    self.error(e)
                return
            rec = {
                "time": iso(now()), "method": self.command, "path": self.raw_path, "raw_query": self.raw_query,
                "query": sorted([list(p) for p in parse_qsl(sp.query, keep_blank_values=True)]),
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": None, "status": None, "auth": None,
            }
            try:
                rec["body"] = json.loads(self.raw_body) if self.raw_body else None
            except ValueError:
                rec["body"] = self.raw_body.decode("utf-8", "replace")
            try:
                rec["auth"] = self.authenticate()
                self.maybe_throttle()
                self.route()
            except ApiError as e:
                self.error(e)
            except Exception:
                log(f"internal error on {self.command} {self.path}\n{traceback.format_exc()}")
                self.error(ApiError(500, "InternalServerError", "The stand-in failed on this request (see its log)."))
            rec["status"] = self.status
            with svc.lock:
                svc.requests.append(rec)
                # Kept across resets: what the whole suite sent (the credentials scan reads it).
                with open(os.path.join(a.state_dir, "journal.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec, default=str) + "\n")
            log(f"{self.command} {self.path} -> {self.status} ({rec['auth']})")

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = handle_one

        # -- auth --
        def authenticate(self):
            authz = self.headers.get("Authorization") or ""
            if authz.startswith("Bearer "):
                token = None
                if a.token_file and os.path.exists(a.token_file):
                    with open(a.token_file) as f:
                        token = f.read().strip()
                if token and hmac.compare_digest(authz[7:].strip(), token):
                    return "bearer"
                raise ApiError(401, "AuthenticationFailed",
                               "Server failed to authenticate the request. The bearer token is not the configured one.",
                               [("AuthenticationErrorDetail", "The bearer token does not match the stand-in's token file"
                                 if token else "The stand-in has no bearer token configured (--token-file)")],
                               {"WWW-Authenticate": 'Bearer authorization_uri="https://login.microsoftonline.com/common/oauth2/authorize", '
                                                    'error="invalid_token"'})
            if not authz.startswith("SharedKey "):
                raise ApiError(401 if not authz else 403, "AuthenticationFailed",
                               "Server failed to authenticate the request. Make sure the value of Authorization header is "
                               "correctly formed including the signature.",
                               [("AuthenticationErrorDetail", "The Authorization header is missing" if not authz
                                 else "The Authorization header is neither SharedKey nor Bearer")])
            acct, _, sig = authz[10:].strip().partition(":")
            fail = "Server failed to authenticate the request. Make sure the value of Authorization header is correctly formed including the signature."
            if acct != a.account_name:
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", f"The account '{acct}' is not this service's account")])
            date = self.headers.get("ocp-date") or self.headers.get("Date")
            if not date:
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", "The request has neither an ocp-date nor a Date header")])
            try:
                when = email.utils.parsedate_to_datetime(date)
                if when.tzinfo is None:
                    when = when.replace(tzinfo=datetime.timezone.utc)
            except (TypeError, ValueError):
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", f"The date header '{date}' is not an RFC 1123 date")])
            if a.date_skew_minutes >= 0 and abs(now() - when) > datetime.timedelta(minutes=a.date_skew_minutes):
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", f"Request date header too old: '{date}'")])
            headers = {}
            for k, v in self.headers.items():
                headers[k.lower()] = v
            variants = sharedkey.query_variants(self.command, a.account_name, self.raw_path, self.raw_query, headers)
            for v in variants:
                if hmac.compare_digest(sharedkey.sign(a.account_key, v), sig):
                    return "sharedkey"
            raise ApiError(403, "AuthenticationFailed", fail,
                           [("AuthenticationErrorDetail",
                             f"The MAC signature found in the HTTP request '{sig}' is not the same as any computed "
                             f"signature. Server used following string to sign: '{variants[0]}'.")])

        def maybe_throttle(self):
            with svc.lock:
                th = svc.throttle
                if not th or th["count"] <= 0:
                    return
                th["count"] -= 1
                status, ra = th["status"], th.get("retry_after")
                if th["count"] <= 0:
                    svc.throttle = None
            hdr = {"Retry-After": str(ra)} if ra is not None else {}
            if status == 429:
                raise ApiError(429, "TooManyRequests", "The request rate is too high; retry later.", headers=hdr)
            raise ApiError(503, "ServerBusy", "The server is currently unable to receive requests. Please retry your request.",
                           headers=hdr)

        # -- routing --
        def route(self):
            if "api-version" not in self.query:
                raise ApiError(400, "MissingRequiredQueryParameter", "A query parameter that's mandatory for this request is not specified.",
                               [("QueryParameterName", "api-version")])
            if not re.match(r"^\d{4}-\d{2}-\d{2}(\.\d+\.\d+)?$", self.query["api-version"]):
                raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                               [("QueryParameterName", "api-version"), ("QueryParameterValue", self.query["api-version"])])
            parts = [unquote(p) for p in self.raw_path.split("/") if p]
            m, n = self.command, len(parts)
            if n == 2 and parts[0] == "pools" and m == "GET":
                return self.get_pool(parts[1])
            if n == 3 and parts[0] == "pools" and parts[2] == "nodes" and m == "GET":
                return self.list_nodes(parts[1])
            if n == 4 and parts[0] == "pools" and parts[2] == "nodes" and m == "GET":
                return self.get_node(parts[1], parts[3])
            if n == 3 and parts[0] == "pools" and parts[2] == "removenodes" and m == "POST":
                return self.remove_nodes(parts[1])
            if parts and parts[0] == "jobs" and n >= 2:
                if n == 2 and m == "GET":
                    return self.get_job(parts[1])
                if n == 3 and parts[2] == "tasks" and m == "POST":
                    return self.add_task(parts[1])
                if n == 3 and parts[2] == "tasks" and m == "GET":
                    return self.list_tasks(parts[1])
                if n == 4 and parts[2] == "tasks" and m == "GET":
                    return self.get_task(parts[1], parts[3])
                if n == 4 and parts[2] == "tasks" and m == "DELETE":
                    return self.delete_task(parts[1], parts[3])
                if n == 5 and parts[2] == "tasks" and parts[4] == "terminate" and m == "POST":
                    return self.terminate_task(parts[1], parts[3])
            raise ApiError(400 if parts and parts[0] in ("jobs", "pools") else 404, "InvalidUri" if parts and parts[0] in ("jobs", "pools") else "ResourceNotFound",
                           f"The stand-in does not serve {m} {self.raw_path}.")

        def base(self):
            return svc.base_url(self.headers.get("Host"))

        def need_job(self, job_id):
            j = svc.job(job_id)
            if j is None:
                raise ApiError(404, "JobNotFound", "The specified job does not exist.")
            return j

        def need_task(self, job_id, task_id):
            self.need_job(job_id)
            t = svc.tasks.get((job_id.lower(), task_id.lower()))
            if t is None:
                raise ApiError(404, "TaskNotFound", "The specified task does not exist.")
            return t

        def get_pool(self, pool_id):
            with svc.lock:
                if pool_id.lower() != a.pool_id.lower():
                    raise ApiError(404, "PoolNotFound", "The specified pool does not exist.")
                p = svc.pool_json(self.base())
            p = self.select(p)
            self.send(200, p, {"ETag": p.get("eTag", svc.pool_etag), "Last-Modified": rfc1123(svc.alloc_changed)})

        def get_job(self, job_id):
            with svc.lock:
                j = self.need_job(job_id)
                body = svc.job_json(j, self.base())
            self.send(200, self.select(body), {"ETag": j["eTag"], "Last-Modified": rfc1123(j["lastModified"])})

        def select(self, obj):
            sel = self.query.get("$select")
            if not sel:
                return obj
            names = [s.strip() for s in sel.split(",") if s.strip()]
            out = {k: v for k, v in obj.items() if k in names}
            if "odata.metadata" in obj:
                out = dict({"odata.metadata": obj["odata.metadata"]}, **out)
            return out

        def task_view(self, t):
            j = json.loads(json.dumps(t.json))
            j["url"] = f"{self.base()}/jobs/{t.job_id}/tasks/{j['id']}"
            return j

        def add_task(self, job_id):
            try:
                body = json.loads(self.raw_body or b"null")
            except ValueError as err:
                raise ApiError(400, "InvalidRequestBody", f"The specified Request Body is not syntactically valid: {err}")
            if not isinstance(body, dict):
                raise ApiError(400, "InvalidRequestBody", "The specified Request Body is not syntactically valid.")
            for prop in ("id", "commandLine"):
                if not isinstance(body.get(prop), str):
                    raise ApiError(400, "MissingRequiredProperty", "A required property was not specified in the request body.",
                                   [("PropertyName", prop)])
            if not TASK_ID_RE.match(body["id"]):
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "id"), ("PropertyValue", body["id"])])
            cs = body.get("containerSettings")
            if cs is not None and not (isinstance(cs, dict) and isinstance(cs.get("imageName"), str) and cs["imageName"]):
                raise ApiError(400, "MissingRequiredProperty", "A required property was not specified in the request body.",
                               [("PropertyName", "containerSettings.imageName")])
            slots = body.get("requiredSlots", 1)
            if not isinstance(slots, int) or slots < 1:
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "requiredSlots"), ("PropertyValue", str(slots))])
            with svc.cond:
                j = self.need_job(job_id)
                key = (j["id"].lower(), body["id"].lower())
                if key in svc.tasks:
                    raise ApiError(409, "TaskExists", "The specified task already exists.")
                svc.seq += 1
                t = Task(j["id"], body, svc.seq)
                t.slots = slots
                ts = iso(now())
                rest = {"id": body["id"]}
                if body.get("displayName"):
                    rest["displayName"] = body["displayName"]
                rest.update({"eTag": new_etag(), "creationTime": ts, "lastModified": ts, "state": "active",
                             "stateTransitionTime": ts, "commandLine": body["commandLine"]})
                for k in ("containerSettings", "resourceFiles", "outputFiles", "environmentSettings", "affinityInfo",
                          "userIdentity", "dependsOn", "exitConditions", "applicationPackageReferences"):
                    if body.get(k) is not None:
                        rest[k] = body[k]
                if cs is not None:
                    rest["containerSettings"] = dict({"workingDirectory": "taskWorkingDirectory"}, **cs)
                cons = dict(body.get("constraints") or {})
                cons.setdefault("maxWallClockTime", "P10675199DT2H48M5.4775807S")
                cons.setdefault("retentionTime", "P7D")
                cons.setdefault("maxTaskRetryCount", 0)
                rest["constraints"] = cons
                rest["requiredSlots"] = slots
                rest["executionInfo"] = {"retryCount": 0, "requeueCount": 0}
                t.json = rest
                svc.tasks[key] = t
                svc.cond.notify_all()
                log(f"task {j['id']}/{body['id']}: added (active)")
                url = f"{self.base()}/jobs/{j['id']}/tasks/{body['id']}"
                etag, lm = rest["eTag"], rfc1123(now())
            self.send(201, None, {"ETag": etag, "Last-Modified": lm, "DataServiceId": url, "Location": url})

        def get_task(self, job_id, task_id):
            with svc.lock:
                t = self.need_task(job_id, task_id)
                body = dict({"odata.metadata": f"{self.base()}/$metadata#tasks/@Element"}, **self.task_view(t))
            body = self.select(body)
            self.send(200, body, {"ETag": t.json["eTag"], "Last-Modified": rfc1123(now())})

        def list_page(self, collect, path):
            """One page of a listing: `collect(after)` gives (seq, view) pairs under the lock."""
            q = self.query
            maxr = 1000
            if "maxresults" in q:
                try:
                    maxr = int(q["maxresults"])
                    if not 1 <= maxr <= 1000:
                        raise ValueError
                except ValueError:
                    raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                                   [("QueryParameterName", "maxresults"), ("QueryParameterValue", q["maxresults"]),
                                    ("Reason", "must be an integer from 1 to 1000")])
            flt = None
            if q.get("$filter"):
                try:
                    flt = parse_filter(q["$filter"])
                except FilterError as err:
                    raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                                   [("QueryParameterName", "$filter"), ("QueryParameterValue", q["$filter"]), ("Reason", str(err))])
            after = 0
            if q.get("$skiptoken"):
                try:
                    after = int(json.loads(base64.urlsafe_b64decode(q["$skiptoken"] + "==").decode())["after"])
                except Exception:
                    raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                                   [("QueryParameterName", "$skiptoken"), ("QueryParameterValue", q["$skiptoken"])])
            with svc.lock:
                views = collect(after)
            if flt is not None:
                views = [(s, v) for s, v in views if eval_filter(flt, v)]
            page, more = views[:maxr], len(views) > maxr
            kind = path.rsplit("/", 1)[-1]
            out = {"odata.metadata": f"{self.base()}/$metadata#{kind}", "value": [self.select(v) for _, v in page]}
            if more:
                tok = base64.urlsafe_b64encode(json.dumps({"after": page[-1][0]}).encode()).decode().rstrip("=")
                params = [("api-version", q["api-version"]), ("maxresults", str(maxr))]
                for k in ("$filter", "$select", "$expand"):
                    if q.get(k):
                        params.append((k, q[k]))
                params.append(("$skiptoken", tok))
                qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in params)
                out["odata.nextLink"] = f"{self.base()}{path}?{qs}"
            self.send(200, out)

        def list_tasks(self, job_id):
            def collect(after):
                j = self.need_job(job_id)
                tasks = sorted((t for t in svc.tasks.values() if t.job_id == j["id"] and t.seq > after), key=lambda t: t.seq)
                return [(t.seq, self.task_view(t)) for t in tasks]
            with svc.lock:
                job = self.need_job(job_id)["id"]
            self.list_page(collect, f"/jobs/{job}/tasks")

        def need_pool(self, pool_id):
            if pool_id.lower() != a.pool_id.lower():
                raise ApiError(404, "PoolNotFound", "The specified pool does not exist.")

        def list_nodes(self, pool_id):
            self.need_pool(pool_id)
            def collect(after):
                ids = svc.node_ids()
                return [(i + 1, svc.node_json(n, self.base())) for i, n in enumerate(ids) if i + 1 > after]
            self.list_page(collect, f"/pools/{a.pool_id}/nodes")

        def get_node(self, pool_id, node_id):
            self.need_pool(pool_id)
            with svc.lock:
                if node_id not in svc.node_ids():
                    raise ApiError(404, "NodeNotFound", "The specified node does not exist.")
                body = svc.node_json(node_id, self.base())
            self.send(200, self.select(body))

        def remove_nodes(self, pool_id):
            self.need_pool(pool_id)
            try:
                body = json.loads(self.raw_body or b"")
                assert isinstance(body, dict)
            except (ValueError, AssertionError):
                raise ApiError(400, "InvalidRequestBody", "The specified Request Body is not syntactically valid.")
            ids = body.get("nodeList")
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                raise ApiError(400, "MissingRequiredProperty", "A required property was not specified in the request body.",
                               [("PropertyName", "nodeList")])
            if len(ids) > 100:
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "nodeList"), ("Reason", "at most 100 nodes per request")])
            option = body.get("nodeDeallocationOption", "requeue")
            if option not in ("requeue", "terminate", "taskcompletion", "retaineddata"):
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "nodeDeallocationOption"), ("PropertyValue", str(option))])
            rt = body.get("resizeTimeout")
            if rt is not None:
                mt = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?", str(rt))
                secs = mt and (int(mt.group(1) or 0) * 3600 + int(mt.group(2) or 0) * 60 + float(mt.group(3) or 0))
                if not mt or secs < 300:
                    raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                                   [("PropertyName", "resizeTimeout"), ("PropertyValue", str(rt)), ("Reason", "at least 5 minutes")])
            with svc.cond:
                if svc.hold or svc.removing:
                    raise ApiError(409, "OperationInvalidForCurrentState",
                                   "The specified operation is not valid for the current state of the resource.",
                                   [("Reason", "the pool's allocation state is not steady")])
                present = svc.node_ids()
                missing = [i for i in ids if i not in present]
                if missing:
                    raise ApiError(404, "NodeNotFound", "The specified node does not exist.", [("NodeId", missing[0])])
                svc.remove_nodes(ids, option)
                svc.cond.notify_all()
            log(f"removenodes {ids} ({option}) accepted")
            self.send(202, None, {"DataServiceId": f"{self.base()}/pools/{a.pool_id}/removenodes"})

        def terminate_task(self, job_id, task_id):
            with svc.cond:
                t = self.need_task(job_id, task_id)
                state = t.json["state"]
                if state == "completed":
                    raise ApiError(409, "TaskCompleted", "The specified task is already completed.")
                if t.terminate:
                    pass
                elif state == "active":
                    t.terminate = True
                    svc.complete(t, None, "UserError", "TaskEnded", "Task Was Ended by User Request")
                else:
                    t.terminate = True
                    t.wake.set()
                    if state == "running":
                        threading.Thread(target=svc.stop_process, args=(t,), daemon=True).start()
                log(f"task {t.job_id}/{t.json['id']}: terminate requested in state {state}")
            self.send(204)

        def delete_task(self, job_id, task_id):
            with svc.cond:
                t = self.need_task(job_id, task_id)
                t.deleted = True
                t.wake.set()
                del svc.tasks[(t.job_id.lower(), t.json["id"].lower())]
                running = t.json["state"] in ("preparing", "running")
                svc.cond.notify_all()
            if running:
                svc.kill_now(t)
            if t.task_dir:
                shutil.rmtree(t.task_dir, ignore_errors=True)
            log(f"task {t.job_id}/{t.json['id']}: deleted")
            self.send(200)

        # -- control --
        def control(self):
            path = self.raw_path
            if path == "/_clw/state" and self.command == "GET":
                with svc.lock:
                    st = {
                        "account_name": a.account_name, "pool_id": a.pool_id, "jobs": [j["id"] for j in svc.jobs.values()],
                        "nodes": svc.nodes, "low_priority_nodes": svc.low_priority_nodes,
                        "node_states": {n: svc.node_state(n) for n in svc.node_ids()}, "removals": svc.removals,
                        "slots_per_node": svc.slots_per_node, "hold": svc.hold, "job_missing": svc.job_missing,
                        "throttle": svc.throttle, "instance": svc.instance, "free_slots": svc.free_slots(),
                        "tasks": [
                            {"job": t.job_id, "id": t.json["id"], "state": t.json["state"], "node": t.node,
                             "container": t.container, "task_dir": t.task_dir, "notes": t.notes,
                             "exit_code": (t.json.get("executionInfo") or {}).get("exitCode"),
                             "failure_code": ((t.json.get("executionInfo") or {}).get("failureInfo") or {}).get("code")}
                            for t in sorted(svc.tasks.values(), key=lambda t: t.seq)
                        ],
                    }
                return self.send(200, st, content_type="application/json")
            if path.startswith("/_clw/imds/") and self.command == "GET":
                parts = path.split("/")
                node, rest = parts[3], "/".join(parts[4:])
                if self.headers.get("Metadata") != "true":
                    return self.send(400, {"error": "Bad request. Required metadata header not specified"},
                                     content_type="application/json")
                with svc.lock:
                    if rest == "metadata/scheduledevents":
                        return self.send(200, {"DocumentIncarnation": svc.incarnation.get(node, 0),
                                               "Events": svc.events.get(node, [])}, content_type="application/json")
                    if rest == "metadata/instance/compute/name":
                        return self.send(200, node.encode(), content_type="text/plain")
                    if rest == "metadata/instance":
                        return self.send(200, {"compute": {"name": node, "priority": "Spot" if node.endswith("_p") else "Regular",
                                                           "vmSize": "Standard_D2s_v3"}}, content_type="application/json")
                return self.send(404, {"error": "Not found"}, content_type="application/json")
            if path == "/_clw/requests" and self.command == "GET":
                with svc.lock:
                    return self.send(200, list(svc.requests), content_type="application/json")
            if path == "/_clw/reset" and self.command == "POST":
                svc.reset()
                return self.send(200, {"reset": True}, content_type="application/json")
            if path == "/_clw/control" and self.command == "POST":
                try:
                    c = json.loads(self.raw_body or b"{}")
                    assert isinstance(c, dict)
                except (ValueError, AssertionError):
                    raise ApiError(400, "InvalidRequestBody", "control: the body must be a JSON object")
                with svc.cond:
                    for k in c:
                        if k not in ("hold", "nodes", "low_priority_nodes", "slots_per_node", "job_missing", "throttle", "preempt",
                                     "node_state", "resize_failure"):
                            raise ApiError(400, "InvalidRequestBody", f"control: unknown key {k!r}")
                    if "hold" in c:
                        svc.hold = bool(c["hold"])
                        svc.alloc_changed = now()
                    for k in ("nodes", "low_priority_nodes", "slots_per_node"):
                        if k in c:
                            if not isinstance(c[k], int) or c[k] < 0 or k == "slots_per_node" and c[k] < 1:
                                raise ApiError(400, "InvalidRequestBody", f"control: {k} must be a non-negative integer")
                            setattr(svc, k, c[k])
                            svc.alloc_changed = now()
                    if "job_missing" in c:
                        svc.job_missing = bool(c["job_missing"])
                    preempted = svc.preempt(c["preempt"]) if "preempt" in c else None
                    broken = svc.set_node_fault(c["node_state"]) if "node_state" in c else None
                    if "resize_failure" in c:
                        rf = c["resize_failure"]
                        if rf is not None and (not isinstance(rf, dict) or not isinstance(rf.get("max_nodes", 0), int)):
                            raise ApiError(400, "InvalidRequestBody", "control: resize_failure must be an object or null")
                        svc.resize_failure = None if rf is None else {
                            "code": rf.get("code", "AccountCoreQuotaReached"),
                            "message": rf.get("message", "The specified account has reached VM core quota limit."),
                            "max_nodes": int(rf.get("max_nodes", 0)),
                        }
                        svc.alloc_changed = now()
                    if "throttle" in c:
                        th = c["throttle"]
                        if th is None:
                            svc.throttle = None
                        else:
                            status = int(th.get("status", 429))
                            if status not in (429, 503):
                                raise ApiError(400, "InvalidRequestBody", "control: throttle.status must be 429 or 503")
                            svc.throttle = {"count": int(th.get("count", 1)), "status": status,
                                            "retry_after": th.get("retry_after", 1 if status == 429 else None)}
                    svc.cond.notify_all()
                    log(f"control: {c}")
                    st = {"hold": svc.hold, "nodes": svc.nodes, "low_priority_nodes": svc.low_priority_nodes,
                          "slots_per_node": svc.slots_per_node, "job_missing": svc.job_missing, "throttle": svc.throttle}
                    if preempted is not None:
                        st["preempted"] = preempted
                    if broken is not None:
                        st["node"] = broken
                return self.send(200, st, content_type="application/json")
            raise ApiError(404, "ResourceNotFound", f"no control endpoint {self.command} {path}")

    return Handler


# ---------------------------------------------------------------------------
# Blob service
# ---------------------------------------------------------------------------
def make_blob_handler(svc):
    a = svc.args
    sas = dict(parse_qsl(a.sas_token.lstrip("?"), keep_blank_values=True))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "clw-blob-standin"
        sys_version = ""

        def log_message(self, fmt, *args):
            pass

        def send(self, status, body=b"", headers=None, content_type=None):
            self.send_response(status)
            self.send_header("x-ms-request-id", str(uuid.uuid4()))
            self.send_header("x-ms-version", self.headers.get("x-ms-version") or "2025-01-05")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)
            self.status = status

        def fail(self, status, code, message, extra=None):
            xml = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
                   f"<Message>{xml_escape(message)}\nRequestId:{uuid.uuid4()}\nTime:{iso(now())}</Message></Error>").encode()
            self.send(status, xml if self.command != "HEAD" else b"", dict({"x-ms-error-code": code}, **(extra or {})), "application/xml")

        def handle_one(self):
            self.status = None
            n = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(n) if n else b""
            sp = urlsplit(self.path)
            q = dict(parse_qsl(sp.query, keep_blank_values=True))
            try:
                if sp.path == "/_clw/blobs" and self.command == "GET":
                    with svc.blob_lock:
                        out = [{"container": c, "name": nme, "size": len(b["data"]), "etag": b["etag"],
                                "last_modified": iso(b["last_modified"]), "url": f"http://127.0.0.1:{a.blob_port}/{c}/{quote(nme)}"}
                               for (c, nme), b in sorted(svc.blobs.items())]
                    return self.send(200, json.dumps(out).encode(), content_type="application/json")
                if not all(hmac.compare_digest(q.get(k, ""), v) for k, v in sas.items()):
                    return self.fail(403, "AuthenticationFailed",
                                     "Server failed to authenticate the request. Make sure the value of Authorization header is formed correctly including the signature.")
                parts = sp.path.lstrip("/").split("/", 1)
                container = unquote(parts[0])
                blob = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
                if not container:
                    return self.fail(400, "InvalidUri", "The requested URI does not represent any resource on the server.")
                with svc.blob_lock:
                    exists = container in svc.containers
                    if blob is None:
                        if self.command == "PUT" and q.get("restype") == "container":
                            if exists:
                                return self.fail(409, "ContainerAlreadyExists", "The specified container already exists.")
                            svc.containers[container] = now()
                            return self.send(201, headers={"ETag": f'"{new_etag()}"', "Last-Modified": rfc1123(now())})
                        if not exists:
                            return self.fail(404, "ContainerNotFound", "The specified container does not exist.")
                        if self.command in ("GET", "HEAD") and q.get("restype") == "container" and q.get("comp") == "list":
                            return self.list_blobs(container, q)
                        if self.command in ("GET", "HEAD") and q.get("restype") == "container":
                            return self.send(200, headers={"ETag": '"0x1"', "Last-Modified": rfc1123(svc.containers[container])})
                        return self.fail(400, "UnsupportedHttpVerb", "The resource doesn't support the specified HTTP verb or query.")
                    if not exists:
                        return self.fail(404, "ContainerNotFound", "The specified container does not exist.")
                    key = (container, blob)
                    if self.command == "PUT":
                        if q.get("comp"):
                            return self.fail(400, "UnsupportedQueryParameter", f"the stand-in only does Put Blob, not comp={q['comp']}")
                        btype = self.headers.get("x-ms-blob-type")
                        if btype is None:
                            return self.fail(400, "MissingRequiredHeader", "An HTTP header that's mandatory for this request is not specified: x-ms-blob-type.")
                        if btype != "BlockBlob":
                            return self.fail(400, "InvalidHeaderValue", f"the stand-in stores only BlockBlob, not {btype}")
                        t = now()
                        old = svc.blobs.get(key)
                        etag = f'"{new_etag()}"'
                        svc.blobs[key] = {"data": data, "etag": etag, "last_modified": t,
                                          "created": old["created"] if old else t,
                                          "content_type": self.headers.get("x-ms-blob-content-type") or self.headers.get("Content-Type") or "application/octet-stream"}
                        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
                        log(f"blob: put {container}/{blob} ({len(data)} bytes)")
                        return self.send(201, headers={"ETag": etag, "Last-Modified": rfc1123(t), "Content-MD5": md5,
                                                       "x-ms-request-server-encrypted": "true"})
                    b = svc.blobs.get(key)
                    if b is None:
                        return self.fail(404, "BlobNotFound", "The specified blob does not exist.")
                    if self.command in ("GET", "HEAD"):
                        hdr = {"ETag": b["etag"], "Last-Modified": rfc1123(b["last_modified"]),
                               "x-ms-blob-type": "BlockBlob", "x-ms-creation-time": rfc1123(b["created"]),
                               "Accept-Ranges": "bytes", "x-ms-server-encrypted": "true"}
                        data, total = b["data"], len(b["data"])
                        rng = self.headers.get("x-ms-range") or self.headers.get("Range")
                        mt = re.match(r"^bytes=(\d+)-(\d*)$", rng or "")
                        if rng and not mt:
                            return self.fail(400, "InvalidRange", f"the stand-in does not understand the range {rng!r}")
                        if mt:
                            first = int(mt.group(1))
                            last = min(int(mt.group(2)) if mt.group(2) else total - 1, total - 1)
                            if first >= total:
                                return self.fail(416, "InvalidRange", "The range specified is invalid for the current size of the resource.",
                                                 {"Content-Range": f"bytes */{total}"})
                            hdr["Content-Range"] = f"bytes {first}-{last}/{total}"
                            return self.send(206, data[first:last + 1], hdr, b["content_type"])
                        return self.send(200, data, hdr, b["content_type"])
                    if self.command == "DELETE":
                        del svc.blobs[key]
                        return self.send(202, headers={"x-ms-delete-type-permanent": "true"})
                    return self.fail(400, "UnsupportedHttpVerb", "The resource doesn't support the specified HTTP verb.")
            finally:
                if not sp.path.startswith("/_clw/"):
                    log(f"blob: {self.command} {sp.path} -> {self.status}")

        def list_blobs(self, container, q):
            prefix = q.get("prefix", "")
            items = sorted((nme, b) for (c, nme), b in svc.blobs.items() if c == container and nme.startswith(prefix))
            x = ['<?xml version="1.0" encoding="utf-8"?>',
                 f'<EnumerationResults ServiceEndpoint="http://127.0.0.1:{a.blob_port}/" ContainerName="{xml_escape(container)}">']
            if prefix:
                x.append(f"<Prefix>{xml_escape(prefix)}</Prefix>")
            x.append("<Blobs>")
            for nme, b in items:
                x.append(
                    f"<Blob><Name>{xml_escape(nme)}</Name><Properties>"
                    f"<Creation-Time>{rfc1123(b['created'])}</Creation-Time>"
                    f"<Last-Modified>{rfc1123(b['last_modified'])}</Last-Modified><Etag>{b['etag']}</Etag>"
                    f"<Content-Length>{len(b['data'])}</Content-Length><Content-Type>{xml_escape(b['content_type'])}</Content-Type>"
                    f"<BlobType>BlockBlob</BlobType><AccessTier>Hot</AccessTier><AccessTierInferred>true</AccessTierInferred>"
                    f"<LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState>"
                    f"<ServerEncrypted>true</ServerEncrypted></Properties></Blob>")
            x.append("</Blobs><NextMarker /></EnumerationResults>")
            self.send(200, "".join(x).encode(), content_type="application/xml")

        do_GET = do_PUT = do_DELETE = do_HEAD = do_POST = handle_one

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=10100)
    ap.add_argument("--blob-port", type=int, default=10101)
    ap.add_argument("--account-name", default="clwtestacct")
    ap.add_argument("--account-key", default=None, help="base64 key (default: --account-key-file, else a fixed test key)")
    ap.add_argument("--account-key-file")
    ap.add_argument("--token-file", help="bearer token accepted instead of SharedKey (read on every request)")
    ap.add_argument("--job-id", action="append", help="job(s) that exist at start (default codalab-job)")
    ap.add_argument("--pool-id", default="codalab-pool")
    ap.add_argument("--nodes", type=int, default=1, help="dedicated nodes")
    ap.add_argument("--low-priority-nodes", type=int, default=0)
    ap.add_argument("--slots-per-node", type=int, default=1)
    ap.add_argument("--hold", action="store_true", help="start with no nodes (tasks stay active)")
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--sas-token", default="sv=2022-11-02&sp=rcwl&sig=clw-test-sas",
                    help="query parameters every Blob request must carry")
    ap.add_argument("--blob-container", action="append", dest="blob_containers", help="containers that exist at start (default worker-logs)")
    ap.add_argument("--container-network", default="host", help="docker --network when containerRunOptions gives none ('' = Docker's default)")
    ap.add_argument("--prepare-seconds", type=float, default=0.2)
    ap.add_argument("--kill-after", type=int, default=5, help="seconds between SIGTERM and SIGKILL on terminate")
    ap.add_argument("--remove-seconds", type=float, default=1.0, help="seconds a Remove Nodes keeps the pool resizing")
    ap.add_argument("--replace-seconds", type=float, default=3.0, help="seconds until a removed node's replacement joins")
    ap.add_argument("--date-skew-minutes", type=float, default=15, help="max ocp-date skew (negative: no check)")
    ap.add_argument("--docker", default="docker")
    args = ap.parse_args()
    if not is_loopback_host(args.host):
        ap.error("--host must be a loopback address")
    args.job_id = args.job_id or ["codalab-job"]
    args.blob_containers = args.blob_containers or ["worker-logs"]
    if args.account_key is None:
        if args.account_key_file:
            with open(args.account_key_file) as f:
                args.account_key = f.read().strip()
        else:
            args.account_key = "Y2wtd29ya2VyIHRlc3Qga2V5IC0gbm90IGEgc2VjcmV0IQ=="
    base64.b64decode(args.account_key, validate=True)
    os.makedirs(args.state_dir, exist_ok=True)

    svc = Service(args)
    n = svc.kill_all_containers()
    if n:
        log(f"removed {n} leftover task containers of this instance")
    batch = Server((args.host, args.port), make_batch_handler(svc))
    blob = Server((args.host, args.blob_port), make_blob_handler(svc))
    threading.Thread(target=svc.scheduler, daemon=True, name="scheduler").start()
    threading.Thread(target=blob.serve_forever, daemon=True, name="blob").start()

    def on_signal(signum, frame):
        log(f"signal {signum}: stopping")
        threading.Thread(target=batch.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"Batch stand-in on http://{args.host}:{args.port} (account {args.account_name}, pool {args.pool_id}, "
        f"jobs {args.job_id}, {args.nodes}+{args.low_priority_nodes} nodes x {args.slots_per_node} slots), "
        f"Blob on http://{args.host}:{args.blob_port} (containers {args.blob_containers}), instance {svc.instance}")
    batch.serve_forever()
    with svc.cond:
        svc.stopping = True
        svc.cond.notify_all()
    n = svc.kill_all_containers()
    log(f"stopped ({n} task containers removed)")


if __name__ == "__main__":
    main()
