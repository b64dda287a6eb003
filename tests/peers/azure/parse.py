#!/usr/bin/env python3
"""What the official azure-batch SDK makes of a recorded Batch response.

    tests/peers/azure-batch.sh parse [--kind KIND] < RESPONSE.json
    (or: $VENV/bin/python tests/peers/azure/parse.py [--kind KIND] < RESPONSE.json)

KIND is tasks (a list page: {"value": [...], "odata.nextLink": ...}), task,
pool, job or error; without --kind it is guessed from the keys. The response
is deserialized with the SDK's own models (the same code path its
list/get operations use) and one JSON object is printed:

  tasks: {"kind": "tasks", "next_link": str|null, "tasks": [TASK, ...]}
  task:  {"kind": "task", "task": TASK}
     TASK = {"id", "state", "previous_state", "state_transition_time",
             "exit_code", "result", "start_time", "end_time", "node_id",
             "failure_info": null | {"category", "code", "message",
                                     "details": [[name, value], ...]}}
  pool:  {"kind": "pool", "id", "state", "allocation_state",
          "current_dedicated_nodes", "current_low_priority_nodes",
          "target_dedicated_nodes", "target_low_priority_nodes",
          "task_slots_per_node", "enable_auto_scale", "vm_size"}
  job:   {"kind": "job", "id", "state", "pool_id"}
  error: {"kind": "error", "code", "message", "details": [[key, value], ...]}

Enums are printed as their REST strings ("completed", "failure",
"usererror", "steady"); datetimes as ISO 8601 in UTC with microseconds
("2026-12-01T10:00:14.001234+00:00": the SDK keeps 6 of the service's 7
fractional digits); a field the response lacks is null.
"""

import argparse
import enum
import json
import sys

from azure.batch import models as m
from azure.batch._utils.model_base import _deserialize  # the SDK's own response path


def _s(v):
    if v is None:
        return None
    if isinstance(v, enum.Enum):
        return v.value
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def task_fields(t):
    ei = t.execution_info
    fi = ei.failure_info if ei is not None else None
    return {
        "id": t.id,
        "state": _s(t.state),
        "previous_state": _s(t.previous_state),
        "state_transition_time": _s(t.state_transition_time),
        "exit_code": ei.exit_code if ei is not None else None,
        "result": _s(ei.result) if ei is not None else None,
        "start_time": _s(ei.start_time) if ei is not None else None,
        "end_time": _s(ei.end_time) if ei is not None else None,
        "node_id": t.node_info.node_id if t.node_info is not None else None,
        "failure_info": None
        if fi is None
        else {
            "category": _s(fi.category),
            "code": fi.code,
            "message": fi.message,
            "details": [[d.name, d.value] for d in (fi.details or [])],
        },
    }


def guess(obj):
    if "value" in obj and isinstance(obj["value"], list):
        return "tasks"
    if "code" in obj and "message" in obj:
        return "error"
    if "allocationState" in obj or "vmSize" in obj or "targetDedicatedNodes" in obj:
        return "pool"
    if "poolInfo" in obj:
        return "job"
    if "commandLine" in obj or "executionInfo" in obj or "state" in obj:
        return "task"
    sys.exit("parse.py: cannot tell what kind of response this is; pass --kind")


def parse(obj, kind=None):
    kind = kind or guess(obj)
    if kind == "tasks":
        tasks = _deserialize(list[m.BatchTask], obj.get("value", []))
        return {"kind": "tasks", "next_link": obj.get("odata.nextLink"), "tasks": [task_fields(t) for t in tasks]}
    if kind == "task":
        return {"kind": "task", "task": task_fields(_deserialize(m.BatchTask, obj))}
    if kind == "pool":
        p = _deserialize(m.BatchPool, obj)
        return {
            "kind": "pool",
            "id": p.id,
            "state": _s(p.state),
            "allocation_state": _s(p.allocation_state),
            "current_dedicated_nodes": p.current_dedicated_nodes,
            "current_low_priority_nodes": p.current_low_priority_nodes,
            "target_dedicated_nodes": p.target_dedicated_nodes,
            "target_low_priority_nodes": p.target_low_priority_nodes,
            "task_slots_per_node": p.task_slots_per_node,
            "enable_auto_scale": p.enable_auto_scale,
            "vm_size": p.vm_size,
        }
    if kind == "job":
        j = _deserialize(m.BatchJob, obj)
        return {"kind": "job", "id": j.id, "state": _s(j.state), "pool_id": j.pool_info.pool_id if j.pool_info else None}
    if kind == "error":
        e = _deserialize(m.BatchError, obj)
        return {
            "kind": "error",
            "code": e.code,
            "message": e.message.value if e.message is not None else None,
            "details": [[d.key, d.value] for d in (e.error_values or [])],
        }
    sys.exit(f"parse.py: unknown kind {kind!r} (tasks, task, pool, job, error)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=["tasks", "task", "pool", "job", "error"])
    ap.add_argument("file", nargs="?", help="response JSON (default: stdin)")
    a = ap.parse_args()
    text = open(a.file).read() if a.file else sys.stdin.read()
    print(json.dumps(parse(json.loads(text), a.kind), sort_keys=True))


if __name__ == "__main__":
    main()
