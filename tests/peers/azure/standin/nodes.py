"""The pool's nodes (a mixin of Service): their ids and states and their REST shape,
faults set by the control endpoint, Remove Nodes, and Spot (low-priority) eviction with
its Scheduled Events. Methods marked so expect the caller to hold the lock."""

import datetime
import email.utils
import hashlib
import re
import subprocess
import threading
import time
import uuid

from .common import ApiError, iso, log, now


class Nodes:
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
