"""The stand-in's own endpoints under /_clw/ (no auth, loopback only) of the Batch HTTP
handler (a mixin made for one Service): state, requests, reset, control, and each node's
instance metadata service (Scheduled Events)."""

import json

from .common import ApiError, log, now


def make_control_routes(svc):
    a = svc.args

    class ControlRoutes:
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

    return ControlRoutes
