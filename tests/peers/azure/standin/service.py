"""The stand-in's state (Service): jobs, the pool, tasks, blobs, controls and the
request log; the REST shapes of a job and of the pool; the scheduler that puts active
tasks on free node slots; reset and the removal of task containers. Nodes and the
running of tasks are its mixins (nodes.py, tasks.py)."""

import hashlib
import os
import shutil
import signal
import subprocess
import threading
from collections import deque

from .common import LABEL, iso, log, new_etag, now
from .nodes import Nodes
from .tasks import Runner


class Service(Nodes, Runner):
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
