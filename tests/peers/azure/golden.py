#!/usr/bin/env python3
"""Golden requests: what the official azure-batch SDK sends for the operations
the cl-worker-manager's azure-batch backend uses.

    tests/peers/azure-batch.sh golden [--inputs FILE|-] [--ops add_task,list_tasks,...]
                                      [--auth sharedkey|bearer]
    tests/peers/azure-batch.sh golden --print-default-inputs

The SDK (BatchClient with AzureNamedKeyCredential, or a static bearer token)
talks to a capture server: a stdlib HTTP server on 127.0.0.1 (random port)
that records each request and answers with canned JSON from fixtures/ (the
task list's first page carries an "odata.nextLink" to a second page on the
same server, which the SDK follows). One JSON object per request is printed
on stdout, in operation order (list_tasks gives two: page 1 and
"list_tasks_next"). Exit status 0 iff every operation succeeded and every
SharedKey header equals the HMAC of the string-to-sign printed next to it.

Fixed date: every Batch operation takes an `ocp_date` keyword and the SDK's
SharedKey policy only stamps the current time into `ocp-date` when the request
has none. The harness passes `ocp_date` to each call and adds a per-call
pipeline policy that sets the same `ocp-date` on requests that do not carry
it (the follow-up page request built from odata.nextLink). No clock is
patched. The client-request-id is fixed with the client's `request_id`
option (the SDK's RequestIdPolicy would otherwise send a fresh uuid1).

Inputs (JSON; every key optional, defaults from --print-default-inputs):
  account_name, account_key (base64), ocp_date (RFC 1123, "GMT"),
  client_request_id, bearer_token (for --auth bearer), job_id, pool_id,
  task: {id, display_name, command_line, image_name, container_run_options,
         working_directory, max_task_retry_count, max_wall_clock_time
         (ISO 8601 duration), required_slots, environment ([[name, value]...]),
         user_identity ({"auto_user": {"scope", "elevation_level"}} or
         {"username": ...}),
         output_files: [{file_pattern, container_url, path, upload_condition}]},
  list: {filter, select ([names]), max_results,
         next_link (path and query of page 2; the capture server prefixes
         its own http://127.0.0.1:PORT)},
  get_task_id, terminate_task_id, delete_task_id,
  nodes: {filter, select ([names]), max_results} (list_nodes: one page),
  remove: {node_ids, node_deallocation_option} (remove_nodes: begin_remove_nodes,
          whose poll of the pool is left out of the records).
A null value leaves the SDK argument out.

Output object (keys sorted):
  op            add_task | list_tasks | list_tasks_next | get_task |
                terminate_task | delete_task | get_pool | get_job |
                list_nodes | remove_nodes
  method        "POST", "GET", "DELETE"
  path          URL path as sent (percent-encoded)
  raw_query     query string as sent
  query         [[name, value], ...] percent-decoded, sorted
  headers       {accept, authorization, client-request-id, content-length,
                 content-type, date, ocp-date, user-agent, x-ms-date,
                 x-ms-version}: value as sent or null
  body          parsed JSON body or null
  body_text     the body exactly as sent (str) or null
  auth_scheme   "SharedKey" | "Bearer"
  string_to_sign  SharedKey only (else null): see sharedkey.py
  status        the status the capture server answered
  sdk_result    on the last record of an operation: what the SDK returned
                (task ids for list_tasks, a few fields for get_*), else null
"""

import argparse
import datetime
import email.utils
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sharedkey  # noqa: E402

from azure.batch import BatchClient  # noqa: E402
from azure.batch import models as m  # noqa: E402
from azure.core.credentials import AccessToken, AzureNamedKeyCredential  # noqa: E402
from azure.core.pipeline.policies import SansIOHTTPPolicy  # noqa: E402

FIXTURES = os.path.join(HERE, "fixtures")
OPS = ["add_task", "list_tasks", "get_task", "terminate_task", "delete_task", "get_pool", "get_job", "list_nodes",
       "remove_nodes"]
DEFAULT_OPS = ["add_task", "list_tasks", "terminate_task", "delete_task", "get_pool", "get_job"]
HEADERS = [
    "accept",
    "authorization",
    "client-request-id",
    "content-length",
    "content-type",
    "date",
    "ocp-date",
    "user-agent",
    "x-ms-date",
    "x-ms-version",
]

DEFAULT_INPUTS = {
    "account_name": "clwtestacct",
    # base64 of 32 fixed bytes; any base64 string works
    "account_key": "Y2wtd29ya2VyIHRlc3Qga2V5IC0gbm90IGEgc2VjcmV0IQ==",
    "ocp_date": "Tue, 01 Dec 2026 10:00:00 GMT",
    "client_request_id": "00000000-0000-4000-8000-000000000001",
    "bearer_token": "clw-test-entra-token",
    "job_id": "codalab-job",
    "pool_id": "codalab-pool",
    "task": {
        "id": "cl_worker_0123456789abcdef0123456789abcdef",
        "command_line": "/bin/sh -c 'exec cl-worker --server http://127.0.0.1:2900 --verbose --exit-when-idle "
        "--idle-seconds 600 --work-dir /mnt/work --id host-0123456789abcdef0123456789abcdef "
        "--network-prefix cl_worker_0123456789abcdef0123456789abcdef_network'",
        "image_name": "codalab/worker:1.7.5",
        "container_run_options": "--cpus 2 --memory 4096m --user 0:0 -v /var/run/docker.sock:/var/run/docker.sock "
        "-v /mnt/work:/mnt/work",
        "working_directory": None,
        "max_task_retry_count": 0,
        "max_wall_clock_time": None,
        "required_slots": None,
        "environment": [["CODALAB_USERNAME", "codalab"], ["CODALAB_PASSWORD", "codalab"]],
        "user_identity": {"auto_user": {"scope": "pool", "elevation_level": "admin"}},
        "output_files": [
            {
                "file_pattern": "$AZ_BATCH_TASK_DIR/std*.txt",
                "container_url": "http://127.0.0.1:10101/worker-logs?sv=2022-11-02&sp=rcwl&sig=clw-test-sas",
                "path": "cl_worker_0123456789abcdef0123456789abcdef",
                "upload_condition": "taskcompletion",
            }
        ],
    },
    "list": {
        "filter": "startswith(id,'cl_worker_') and (state eq 'active' or state eq 'preparing' or state eq 'running')",
        "select": ["id", "state", "executionInfo"],
        "max_results": 3,
        "next_link": "/jobs/codalab-job/tasks?api-version=2025-06-01&maxresults=3"
        "&%24filter=startswith%28id%2C%27cl_worker_%27%29&%24select=id%2Cstate%2CexecutionInfo"
        "&%24skiptoken=clw-page-2",
    },
    "get_task_id": "cl_worker_0123456789abcdef0123456789abcdef",
    "terminate_task_id": "cl_worker_0123456789abcdef0123456789abcdef",
    "delete_task_id": "cl_worker_0123456789abcdef0123456789abcdef",
    "nodes": {
        "filter": "state eq 'unusable' or state eq 'starttaskfailed'",
        "select": ["id", "state", "stateTransitionTime", "errors", "startTaskInfo"],
        "max_results": 1000,
    },
    "remove": {
        "node_ids": ["tvmps_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef_d"],
        "node_deallocation_option": "terminate",
    },
}


def merged_inputs(user):
    out = json.loads(json.dumps(DEFAULT_INPUTS))
    for k, v in user.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


def load_fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# capture server
# ---------------------------------------------------------------------------
class Capture:
    def __init__(self, inputs):
        self.inputs = inputs
        self.records = []
        self.lock = threading.Lock()
        self.port = None


def make_handler(cap):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _reply(self, status, obj=None, extra=None):
            body = b"" if obj is None else json.dumps(obj).encode()
            # Record before answering: the SDK call returns as soon as the answer is read.
            self.rec["status"] = status
            with cap.lock:
                cap.records.append(self.rec)
            self.send_response(status)
            self.send_header("request-id", "11111111-2222-4333-8444-555555555555")
            if self.headers.get("client-request-id"):
                self.send_header("client-request-id", self.headers["client-request-id"])
            self.send_header("DataServiceVersion", "3.0")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            if obj is not None:
                self.send_header("Content-Type", "application/json;odata=minimalmetadata")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)
            return status

        def _route(self, method, path, query, body):
            inp = cap.inputs
            base = f"http://127.0.0.1:{cap.port}"
            parts = [p for p in path.split("/") if p]
            if method == "POST" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "tasks":
                tid = (body or {}).get("id", "task")
                url = f"{base}/jobs/{parts[1]}/tasks/{tid}"
                return self._reply(201, None, {
                    "ETag": "0x8DE11F0A2B3C4D5",
                    "Last-Modified": "Tue, 01 Dec 2026 10:00:00 GMT",
                    "DataServiceId": url,
                    "Location": url,
                })
            if method == "GET" and len(parts) == 3 and parts[0] == "jobs" and parts[2] == "tasks":
                value = load_fixture("tasks-list.json")["value"]
                if "$skiptoken" in dict(query):
                    return self._reply(200, {"odata.metadata": f"{base}/$metadata#tasks", "value": value[3:]})
                page = {"odata.metadata": f"{base}/$metadata#tasks", "value": value[:3]}
                if inp["list"].get("next_link"):
                    page["odata.nextLink"] = base + inp["list"]["next_link"]
                return self._reply(200, page)
            if len(parts) == 4 and parts[0] == "jobs" and parts[2] == "tasks":
                if method == "GET":
                    t = load_fixture("task-completed-failure.json")
                    t["id"] = parts[3]
                    return self._reply(200, t)
                if method == "DELETE":
                    return self._reply(200)
            if method == "POST" and len(parts) == 5 and parts[2] == "tasks" and parts[4] == "terminate":
                return self._reply(204)
            if method == "GET" and len(parts) == 3 and parts[0] == "pools" and parts[2] == "nodes":
                return self._reply(200, load_fixture("nodes-list.json"))
            if method == "POST" and len(parts) == 3 and parts[0] == "pools" and parts[2] == "removenodes":
                return self._reply(202, None, {"DataServiceId": f"{base}/pools/{parts[1]}/removenodes"})
            if method == "GET" and len(parts) == 2 and parts[0] == "pools":
                return self._reply(200, dict(load_fixture("pool.json"), id=parts[1]))
            if method == "GET" and len(parts) == 2 and parts[0] == "jobs":
                return self._reply(200, dict(load_fixture("job.json"), id=parts[1]))
            return self._reply(404, load_fixture("error-job-not-found.json"))

        def _handle(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            split = urlsplit(self.path)
            query = parse_qsl(split.query, keep_blank_values=True)
            text = raw.decode("utf-8") if raw else None
            try:
                body = json.loads(text) if text else None
            except ValueError:
                body = None
            rec = {
                "method": self.command,
                "path": split.path,
                "raw_query": split.query,
                "query": sorted([list(p) for p in query]),
                "headers": {h: self.headers.get(h) for h in HEADERS},
                "all_headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
                "body_text": text,
            }
            self.rec = rec
            self._route(self.command, split.path, query, body)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle

    return Handler


# ---------------------------------------------------------------------------
# SDK side
# ---------------------------------------------------------------------------
class FixedOcpDate(SansIOHTTPPolicy):
    """Sets ocp-date on requests that have none (runs before the auth policy)."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def on_request(self, request):
        if not request.http_request.headers.get("ocp-date"):
            request.http_request.headers["ocp-date"] = self.value


class StaticToken:
    """A TokenCredential that always returns the same token."""

    def __init__(self, token):
        self.token = token
        self.scopes = []

    def get_token(self, *scopes, **kwargs):
        self.scopes.append(list(scopes))
        return AccessToken(self.token, 4102444800)  # 2100-01-01


def build_task(t):
    kw = {"id": t["id"]}
    if t.get("display_name") is not None:
        kw["display_name"] = t["display_name"]
    kw["command_line"] = t["command_line"]
    if t.get("image_name") is not None:
        cs = {"image_name": t["image_name"]}
        if t.get("container_run_options") is not None:
            cs["container_run_options"] = t["container_run_options"]
        if t.get("working_directory") is not None:
            cs["working_directory"] = t["working_directory"]
        kw["container_settings"] = m.BatchTaskContainerSettings(**cs)
    cons = {}
    if t.get("max_task_retry_count") is not None:
        cons["max_task_retry_count"] = t["max_task_retry_count"]
    if t.get("max_wall_clock_time") is not None:
        import isodate

        cons["max_wall_clock_time"] = isodate.parse_duration(t["max_wall_clock_time"])
    if cons:
        kw["constraints"] = m.BatchTaskConstraints(**cons)
    if t.get("required_slots") is not None:
        kw["required_slots"] = t["required_slots"]
    if t.get("environment"):
        kw["environment_settings"] = [m.EnvironmentSetting(name=n, value=v) for n, v in t["environment"]]
    ui = t.get("user_identity")
    if ui:
        if "auto_user" in ui:
            au = ui["auto_user"]
            # Keyword order is body order: scope first, as the project's client writes it.
            kw["user_identity"] = m.UserIdentity(auto_user=m.AutoUserSpecification(
                **{k: au[k] for k in ("scope", "elevation_level") if k in au}))
        else:
            kw["user_identity"] = m.UserIdentity(username=ui["username"])
    if t.get("output_files"):
        kw["output_files"] = [
            m.OutputFile(
                file_pattern=o["file_pattern"],
                destination=m.OutputFileDestination(
                    container=m.OutputFileBlobContainerDestination(
                        container_url=o["container_url"], **({"path": o["path"]} if o.get("path") else {})
                    )
                ),
                upload_options=m.OutputFileUploadConfiguration(upload_condition=o.get("upload_condition", "taskcompletion")),
            )
            for o in t["output_files"]
        ]
    return m.BatchTaskCreateOptions(**kw)


def _s(v):
    return getattr(v, "value", v)


def run(inputs, ops, auth):
    cap = Capture(inputs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(cap))
    cap.port = server.server_port
    threading.Thread(target=server.serve_forever, daemon=True).start()

    dt = email.utils.parsedate_to_datetime(inputs["ocp_date"]).astimezone(datetime.timezone.utc)
    common = {
        "request_id": inputs["client_request_id"],
        "per_call_policies": [FixedOcpDate(inputs["ocp_date"])],
        "retry_total": 0,
    }
    token = None
    if auth == "bearer":
        token = StaticToken(inputs["bearer_token"])
        client = BatchClient(f"http://127.0.0.1:{cap.port}", token, **common)
    else:
        cred = AzureNamedKeyCredential(inputs["account_name"], inputs["account_key"])
        client = BatchClient(f"http://127.0.0.1:{cap.port}", cred, **common)
    call = {"ocp_date": dt}
    if auth == "bearer":
        call["enforce_https"] = False  # the bearer policy refuses plain http otherwise

    job, pool = inputs["job_id"], inputs["pool_id"]
    out = []
    ok = True
    for op in ops:
        start = len(cap.records)
        result = None
        try:
            if op == "add_task":
                client.create_task(job, build_task(inputs["task"]), **call)
            elif op == "list_tasks":
                li = inputs["list"]
                kw = dict(call)
                if li.get("filter") is not None:
                    kw["filter"] = li["filter"]
                if li.get("select") is not None:
                    kw["select"] = li["select"]
                if li.get("max_results") is not None:
                    kw["max_results"] = li["max_results"]
                result = [t.id for t in client.list_tasks(job, **kw)]
            elif op == "get_task":
                t = client.get_task(job, inputs["get_task_id"], **call)
                ei = t.execution_info
                result = {"id": t.id, "state": _s(t.state), "exit_code": ei.exit_code if ei else None}
            elif op == "terminate_task":
                client.terminate_task(job, inputs["terminate_task_id"], **call)
            elif op == "delete_task":
                client.delete_task(job, inputs["delete_task_id"], **call)
            elif op == "get_pool":
                p = client.get_pool(pool, **call)
                result = {
                    "id": p.id,
                    "allocation_state": _s(p.allocation_state),
                    "current_dedicated_nodes": p.current_dedicated_nodes,
                    "target_dedicated_nodes": p.target_dedicated_nodes,
                }
            elif op == "list_nodes":
                li = inputs["nodes"]
                kw = dict(call)
                for k in ("filter", "select", "max_results"):
                    if li.get(k) is not None:
                        kw[k] = li[k]
                result = [{"id": n.id, "state": _s(n.state)} for n in client.list_nodes(pool, **kw)]
            elif op == "remove_nodes":
                r = inputs["remove"]
                opts = {"node_ids": r["node_ids"]}
                if r.get("node_deallocation_option") is not None:
                    opts["node_deallocation_option"] = r["node_deallocation_option"]
                # The SDK's poller reads the pool until it is steady (the fixture's pool is).
                client.begin_remove_nodes(pool, m.BatchNodeRemoveOptions(**opts), polling_interval=0, **call).result()
            elif op == "get_job":
                j = client.get_job(job, **call)
                result = {"id": j.id, "state": _s(j.state), "pool_id": j.pool_info.pool_id}
        except Exception as err:  # report and go on with the other operations
            ok = False
            print(f"golden.py: {op} failed: {type(err).__name__}: {err}", file=sys.stderr)
        recs = cap.records[start:]
        if op == "remove_nodes":
            recs = [r for r in recs if r["path"].endswith("/removenodes")]
        if not recs:
            ok = False
            print(f"golden.py: {op} sent no request", file=sys.stderr)
        for i, rec in enumerate(recs):
            rec = dict(rec)
            all_headers = rec.pop("all_headers")
            rec["op"] = op if i == 0 else f"{op}_next"
            rec["sdk_result"] = result if i == len(recs) - 1 else None
            authz = all_headers.get("authorization", "")
            if authz.startswith("SharedKey "):
                rec["auth_scheme"] = "SharedKey"
                sts = sharedkey.string_to_sign(rec["method"], inputs["account_name"], rec["path"], rec["raw_query"], all_headers)
                rec["string_to_sign"] = sts
                want = sharedkey.authorization(inputs["account_name"], inputs["account_key"], sts)
                if want != authz:
                    ok = False
                    print(f"golden.py: {rec['op']}: SDK sent {authz!r}, HMAC of the string-to-sign is {want!r}", file=sys.stderr)
            else:
                rec["auth_scheme"] = "Bearer" if authz.startswith("Bearer ") else None
                rec["string_to_sign"] = None
            out.append(rec)
    server.shutdown()
    if token is not None:
        print(f"golden.py: bearer token scopes requested: {token.scopes[:1]}", file=sys.stderr)
    return out, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", help="JSON file with inputs ('-' = stdin); missing keys take the defaults")
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument("--auth", choices=["sharedkey", "bearer"], default="sharedkey")
    ap.add_argument("--print-default-inputs", action="store_true")
    ap.add_argument("--pretty", action="store_true", help="indent the JSON (not one object per line)")
    a = ap.parse_args()
    if a.print_default_inputs:
        print(json.dumps(DEFAULT_INPUTS, indent=2))
        return 0
    user = {}
    if a.inputs:
        user = json.load(sys.stdin if a.inputs == "-" else open(a.inputs))
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"unknown ops {bad}; known: {OPS}")
    records, ok = run(merged_inputs(user), ops, a.auth)
    for rec in records:
        print(json.dumps(rec, sort_keys=True, indent=2 if a.pretty else None))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
