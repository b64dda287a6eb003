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
import os
import signal
import sys
import threading
from http.server import ThreadingHTTPServer

# The service's code is the package standin/ beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from standin.batch_api import make_batch_handler  # noqa: E402
from standin.blob import make_blob_handler  # noqa: E402
from standin.common import is_loopback_host, log  # noqa: E402
from standin.service import Service  # noqa: E402


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
