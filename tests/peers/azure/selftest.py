#!/usr/bin/env python3
"""The official azure-batch SDK (and azure-storage-blob) against the running
Azure Batch stand-in: `tests/peers/azure-batch.sh selftest`.

Resets the stand-in first and again at the end. Every step prints "ok" or
"FAIL"; the exit status is 1 if any step failed. Settings come from the
environment that azure-batch.sh passes (CLW_AZBATCH_*).
"""

import json
import os
import subprocess
import sys
import time
import traceback
import urllib.request

from azure.batch import BatchClient
from azure.batch import models as m
from azure.core.credentials import AccessToken, AzureNamedKeyCredential
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import ContainerClient

E = os.environ
URL = E["CLW_AZBATCH_URL"]
ACCOUNT, KEY, TOKEN = E["CLW_AZBATCH_ACCOUNT"], E["CLW_AZBATCH_KEY"], E["CLW_AZBATCH_TOKEN"]
JOB, POOL = E["CLW_AZBATCH_JOB"], E["CLW_AZBATCH_POOL"]
BLOB, CONTAINER, SAS = E["CLW_AZBATCH_BLOB_URL"], E["CLW_AZBATCH_CONTAINER"], E["CLW_AZBATCH_SAS"]
CONTAINER_URL = f"{BLOB}/{CONTAINER}?{SAS}"
IMAGE = E.get("CLW_AZBATCH_IMAGE", "cl-worker-test/base:latest")
NODES, SLOTS = int(E.get("CLW_AZBATCH_NODES", "1")), int(E.get("CLW_AZBATCH_SLOTS", "1"))

client = BatchClient(URL, AzureNamedKeyCredential(ACCOUNT, KEY))
passed, failed = [], []


def ctl(path, body=None):
    req = urllib.request.Request(f"{URL}/_clw/{path}", method="POST" if body is not None or path == "reset" else "GET",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


class Fail(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Fail(msg)


def step(name):
    def deco(fn):
        t0 = time.monotonic()
        try:
            fn()
            passed.append(name)
            print(f"ok   {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception as err:
            failed.append(name)
            print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
            if not isinstance(err, Fail):
                traceback.print_exc(limit=3)
        return fn

    return deco


def task(tid, shell, *, run_options="--cpus 1 --memory 256m", env=None, upload="taskcompletion", image=IMAGE):
    return m.BatchTaskCreateOptions(
        id=tid,
        command_line=f"/bin/sh -c '{shell}'",
        container_settings=m.BatchTaskContainerSettings(image_name=image, container_run_options=run_options),
        environment_settings=[m.EnvironmentSetting(name=k, value=v) for k, v in (env or {}).items()],
        constraints=m.BatchTaskConstraints(max_task_retry_count=0),
        output_files=[m.OutputFile(
            file_pattern="$AZ_BATCH_TASK_DIR/std*.txt",
            destination=m.OutputFileDestination(container=m.OutputFileBlobContainerDestination(path=tid, container_url=CONTAINER_URL)),
            upload_options=m.OutputFileUploadConfiguration(upload_condition=upload))],
        user_identity=m.UserIdentity(auto_user=m.AutoUserSpecification(scope="pool", elevation_level="admin")),
    )


def wait_state(tid, states, timeout=60):
    end = time.monotonic() + timeout
    while True:
        t = client.get_task(JOB, tid)
        if t.state in states:
            return t
        if time.monotonic() > end:
            raise Fail(f"task {tid} still {t.state} after {timeout} s (wanted {states})")
        time.sleep(0.2)


def blob_text(name):
    cc = ContainerClient.from_container_url(CONTAINER_URL)
    return cc.download_blob(name).readall().decode()


def _s(v):
    return getattr(v, "value", v)


def err_code(exc):
    return getattr(getattr(exc, "error", None), "code", None)


ctl("reset")
ctl("control", {"nodes": max(NODES, 2), "slots_per_node": max(SLOTS, 2)})
print(f"selftest: stand-in {URL}, job {JOB}, pool {POOL}, image {IMAGE}, blob {BLOB}/{CONTAINER}", flush=True)


@step("get job")
def _():
    j = client.get_job(JOB)
    expect(j.id == JOB and j.pool_info.pool_id == POOL and j.state == "active", f"job {j.as_dict()}")


@step("get missing job -> 404 JobNotFound")
def _():
    try:
        client.get_job("no-such-job")
    except ResourceNotFoundError as e:
        expect(err_code(e) == "JobNotFound", f"code {err_code(e)}")
        return
    raise Fail("no error")


@step("get pool")
def _():
    p = client.get_pool(POOL)
    n = max(NODES, 2)
    expect(p.allocation_state == "steady", f"allocationState {p.allocation_state}")
    expect(p.current_dedicated_nodes == n and p.target_dedicated_nodes == n, f"dedicated {p.current_dedicated_nodes}/{p.target_dedicated_nodes}")
    expect(p.current_low_priority_nodes == 0 and p.task_slots_per_node == max(SLOTS, 2), "low-priority nodes / slots")


@step("add task (exit 3) -> 201 with ETag, Last-Modified, DataServiceId")
def _():
    headers = client.create_task(JOB, task("st-exit3", 'echo hi; echo "task=$AZ_BATCH_TASK_ID job=$AZ_BATCH_JOB_ID foo=$FOO env=$CLW_SELFTEST '
                                             'wd=$(pwd)"; echo oops >&2; exit 3',
                                 run_options="--cpus 1 --memory 256m --user 0:0 -e FOO=bar --rm",
                                 env={"CLW_SELFTEST": "yes"}), cls=lambda resp, body, hdrs: hdrs)
    expect(headers["ETag"] and headers["ETag"].startswith("0x"), f"ETag {headers['ETag']}")
    expect(headers["Last-Modified"] is not None, "Last-Modified")
    expect(headers["DataServiceId"] == f"{URL}/jobs/{JOB}/tasks/st-exit3", f"DataServiceId {headers['DataServiceId']}")
    expect(headers["request-id"], "request-id")


@step("duplicate add -> 409 TaskExists")
def _():
    try:
        client.create_task(JOB, task("st-exit3", "true"))
    except ResourceExistsError as e:
        expect(e.status_code == 409 and err_code(e) == "TaskExists", f"{e.status_code} {err_code(e)}")
        return
    raise Fail("no error")


@step("completed with exit code 3 and failureInfo FailureExitCode")
def _():
    t = wait_state("st-exit3", ["completed"])
    ei = t.execution_info
    expect(ei.exit_code == 3, f"exitCode {ei.exit_code}")
    expect(ei.result == "failure", f"result {ei.result}")
    expect(ei.failure_info and ei.failure_info.code == "FailureExitCode" and ei.failure_info.category == "usererror",
           f"failureInfo {ei.failure_info}")
    expect(ei.start_time and ei.end_time and ei.end_time >= ei.start_time, "start/end times")
    expect(t.previous_state == "running" and t.node_info and t.node_info.node_id, "previousState / nodeInfo")


@step("stdout/stderr uploaded under <task id>/ (azure-storage-blob)")
def _():
    cc = ContainerClient.from_container_url(CONTAINER_URL)
    names = sorted(b.name for b in cc.list_blobs(name_starts_with="st-exit3/"))
    expect(names == ["st-exit3/stderr.txt", "st-exit3/stdout.txt"], f"blobs {names}")
    out = blob_text("st-exit3/stdout.txt")
    expect(out.startswith("hi\n"), f"stdout {out!r}")
    expect("task=st-exit3 job=%s foo=bar env=yes wd=/" % JOB in out and out.rstrip().endswith("/st-exit3/wd"), f"stdout {out!r}")
    expect(blob_text("st-exit3/stderr.txt") == "oops\n", "stderr")


@step("blob service refuses a wrong SAS -> 403")
def _():
    cc = ContainerClient.from_container_url(f"{BLOB}/{CONTAINER}?sv=2022-11-02&sp=rl&sig=wrong")
    try:
        list(cc.list_blobs())
    except HttpResponseError as e:
        expect(e.status_code == 403, f"status {e.status_code}")
        return
    raise Fail("no error")


@step("list with $filter/$select/maxresults follows odata.nextLink")
def _():
    for i in range(5):
        client.create_task(JOB, task(f"st-page-{i}", f"echo page {i}"))
    pages = list(client.list_tasks(JOB, filter="startswith(id,'st-page-')", select=["id", "state"], max_results=2).by_page())
    items = [t for p in pages for t in p]
    expect(len(pages) == 3, f"{len(pages)} pages")
    expect(sorted(t.id for t in items) == [f"st-page-{i}" for i in range(5)], f"ids {[t.id for t in items]}")
    expect(all(t.state is not None and t.command_line is None for t in items), "$select not applied")


@step("list with state filter and or/and")
def _():
    end = time.monotonic() + 60
    while True:
        done = [t.id for t in client.list_tasks(JOB, filter="startswith(id,'st-page-') and state eq 'completed'")]
        if len(done) == 5:
            break
        expect(time.monotonic() < end, f"only {done} completed")
        time.sleep(0.3)
    f = "(startswith(id,'st-page-') or startswith(id,'st-exit')) and (state eq 'active' or state eq 'completed')"
    got = sorted(t.id for t in client.list_tasks(JOB, filter=f))
    expect(got == ["st-exit3"] + [f"st-page-{i}" for i in range(5)], f"ids {got}")
    ok = [t.id for t in client.list_tasks(JOB, filter="state eq 'completed' and executionInfo/exitCode eq 0")]
    expect(sorted(ok) == [f"st-page-{i}" for i in range(5)], f"exitCode filter {ok}")


@step("bad $filter -> 400 InvalidQueryParameterValue")
def _():
    try:
        list(client.list_tasks(JOB, filter="startswith(id,"))
    except HttpResponseError as e:
        expect(e.status_code == 400 and err_code(e) == "InvalidQueryParameterValue", f"{e.status_code} {err_code(e)}")
        return
    raise Fail("no error")


@step("terminate a running task: SIGTERM, completed with TaskEnded")
def _():
    client.create_task(JOB, task("st-long", 'trap "echo got TERM; exit 143" TERM; echo started; while :; do sleep 0.1; done'))
    wait_state("st-long", ["running"])
    time.sleep(0.5)
    client.terminate_task(JOB, "st-long")
    t = wait_state("st-long", ["completed"], timeout=30)
    ei = t.execution_info
    expect(ei.failure_info and ei.failure_info.code == "TaskEnded", f"failureInfo {ei.failure_info}")
    expect(ei.result == "failure" and ei.exit_code == 143, f"result {ei.result} exitCode {ei.exit_code}")
    out = blob_text("st-long/stdout.txt")
    expect(out == "started\ngot TERM\n", f"stdout {out!r}")


@step("terminate a completed task -> 409 TaskCompleted")
def _():
    try:
        client.terminate_task(JOB, "st-long")
    except ResourceExistsError as e:
        expect(err_code(e) == "TaskCompleted", f"code {err_code(e)}")
        return
    raise Fail("no error")


@step("hold: no nodes, task stays active; terminate while active")
def _():
    ctl("control", {"hold": True})
    try:
        p = client.get_pool(POOL)
        expect(p.current_dedicated_nodes == 0 and p.allocation_state == "resizing", "pool under hold")
        client.create_task(JOB, task("st-held", "echo never"))
        time.sleep(1.5)
        expect(client.get_task(JOB, "st-held").state == "active", "not active under hold")
        client.terminate_task(JOB, "st-held")
        t = client.get_task(JOB, "st-held")
        expect(t.state == "completed" and t.execution_info.failure_info.code == "TaskEnded", "terminated active task")
        expect(t.execution_info.exit_code is None, "an ended active task has no exit code")
    finally:
        ctl("control", {"hold": False})


@step("delete tasks (completed and running) -> 200, then 404 TaskNotFound")
def _():
    client.delete_task(JOB, "st-page-0")
    client.create_task(JOB, task("st-del", "sleep 300"))
    wait_state("st-del", ["running"])
    client.delete_task(JOB, "st-del")
    for tid in ("st-page-0", "st-del"):
        try:
            client.get_task(JOB, tid)
            raise Fail(f"{tid} still there")
        except ResourceNotFoundError as e:
            expect(err_code(e) == "TaskNotFound", f"code {err_code(e)}")
    names = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    expect("-st-del-" not in names, "container of the deleted task still exists")


@step("capacity: with 1 node x 1 slot a second task waits (active) until the first ends")
def _():
    ctl("control", {"nodes": 1, "slots_per_node": 1})
    try:
        client.create_task(JOB, task("st-cap-1", "sleep 300"))
        client.create_task(JOB, task("st-cap-2", "echo second"))
        wait_state("st-cap-1", ["running"])
        time.sleep(1.0)
        expect(client.get_task(JOB, "st-cap-2").state == "active", "second task left active")
        p = client.get_pool(POOL)
        expect(p.current_dedicated_nodes == 1, "one node")
        client.terminate_task(JOB, "st-cap-1")
        t = wait_state("st-cap-2", ["completed"], timeout=60)
        expect(t.execution_info.exit_code == 0 and t.execution_info.result == "success", "second task ran")
        ei = client.get_task(JOB, "st-cap-1").execution_info
        # sleep is the container's pid 1 and ignores SIGTERM: SIGKILL after --kill-after
        expect(ei.failure_info.code == "TaskEnded" and ei.exit_code == 137, f"first task: {ei.failure_info} {ei.exit_code}")
    finally:
        ctl("control", {"nodes": max(NODES, 2), "slots_per_node": max(SLOTS, 2)})


@step("rejected containerRunOptions -> completed with failureInfo")
def _():
    client.create_task(JOB, task("st-badopt", "true", run_options="--cpus 1 --no-such-option"))
    t = wait_state("st-badopt", ["completed"])
    fi = t.execution_info.failure_info
    expect(fi and fi.code == "ContainerRunOptionsRejected" and "--no-such-option" in fi.message, f"failureInfo {fi}")


@step("throttling: 429 with Retry-After is retried by the SDK")
def _():
    ctl("control", {"throttle": {"count": 2, "status": 429, "retry_after": 1}})
    t0 = time.monotonic()
    j = client.get_job(JOB)
    dt = time.monotonic() - t0
    expect(j.id == JOB and dt >= 1.8, f"took {dt:.1f} s")
    ctl("control", {"throttle": {"count": 1, "status": 429, "retry_after": 1}})
    no_retry = BatchClient(URL, AzureNamedKeyCredential(ACCOUNT, KEY), retry_total=0)
    try:
        no_retry.get_job(JOB)
        raise Fail("throttle not applied")
    except HttpResponseError as e:
        expect(e.status_code == 429 and e.response.headers.get("Retry-After") == "1", f"{e.status_code}")


@step("throttling: 503 ServerBusy is retried by the SDK")
def _():
    ctl("control", {"throttle": {"count": 1, "status": 503, "retry_after": 1}})
    expect(len(list(client.list_tasks(JOB, filter="startswith(id,'st-page-')"))) == 4, "list after 503")
    expect(ctl("state")["throttle"] is None, "throttle not consumed")


@step("job missing -> list fails with 404 JobNotFound")
def _():
    ctl("control", {"job_missing": True})
    try:
        list(client.list_tasks(JOB))
        raise Fail("no error")
    except ResourceNotFoundError as e:
        expect(err_code(e) == "JobNotFound", f"code {err_code(e)}")
    finally:
        ctl("control", {"job_missing": False})


@step("wrong account key -> 403 AuthenticationFailed")
def _():
    bad = BatchClient(URL, AzureNamedKeyCredential(ACCOUNT, "d3Jvbmcga2V5IHdyb25nIGtleQ=="), retry_total=0)
    try:
        bad.get_job(JOB)
        raise Fail("no error")
    except HttpResponseError as e:
        expect(e.status_code == 403 and err_code(e) == "AuthenticationFailed", f"{e.status_code} {err_code(e)}")
        detail = dict((d.code, d.message) for d in (e.error.details or []))
        expect("string to sign" in detail.get("AuthenticationErrorDetail", ""), f"detail {detail}")


@step("broken nodes: listed with the SDK's filter, removed with begin_remove_nodes, replaced")
def _():
    ids = [n.id for n in client.list_nodes(POOL)]
    expect(len(ids) >= 2, f"nodes {ids}")
    broken = ctl("control", {"node_state": {"node": "first", "state": "unusable", "code": "DiskFull"}})["node"]
    ctl("control", {"node_state": {"node": "last", "state": "starttaskfailed"}})
    bad = list(client.list_nodes(POOL, filter="state eq 'unusable' or state eq 'starttaskfailed'",
                                 select=["id", "state", "stateTransitionTime", "errors", "startTaskInfo"]))
    expect(sorted(_s(n.state) for n in bad) == ["starttaskfailed", "unusable"], f"states {[n.as_dict() for n in bad]}")
    un = [n for n in bad if n.id == broken][0]
    expect(un.errors and un.errors[0].code == "DiskFull", f"errors {un.as_dict()}")
    st = [n for n in bad if n.id != broken][0]
    expect(st.start_task_info.failure_info.code == "FailureExitCode", f"startTaskInfo {st.as_dict()}")
    # The SDK's poller reads the pool until it is steady again.
    client.begin_remove_nodes(POOL, m.BatchNodeRemoveOptions(node_ids=[n.id for n in bad], node_deallocation_option="terminate"),
                              polling_interval=1).result()
    expect(ctl("state")["removals"][-1]["option"] == "terminate", "removal recorded")
    left = [n.id for n in client.list_nodes(POOL)]
    expect(not set(left) & {n.id for n in bad}, f"removed nodes still listed: {left}")
    deadline = time.time() + 20
    while len(list(client.list_nodes(POOL))) < len(ids):
        expect(time.time() < deadline, "no replacement node joined")
        time.sleep(0.5)


@step("a resize failure: resizeErrors, at most max_nodes nodes")
def _():
    ctl("control", {"resize_failure": {"code": "AccountCoreQuotaReached", "max_nodes": 1}})
    p = client.get_pool(POOL)
    expect(p.resize_errors and p.resize_errors[0].code == "AccountCoreQuotaReached", f"resizeErrors {p.as_dict()}")
    expect(p.current_dedicated_nodes == 1 and p.allocation_state == "steady", f"pool {p.current_dedicated_nodes} {p.allocation_state}")
    ctl("control", {"resize_failure": None})
    expect(not client.get_pool(POOL).resize_errors, "resizeErrors not cleared")


class StaticToken:
    def __init__(self, token):
        self.token = token

    def get_token(self, *scopes, **kwargs):
        return AccessToken(self.token, int(time.time()) + 3600)


@step("bearer token (Entra ID) accepted; a wrong one -> 401")
def _():
    good = BatchClient(URL, StaticToken(TOKEN))
    expect(good.get_job(JOB, enforce_https=False).id == JOB, "bearer get_job")
    bad = BatchClient(URL, StaticToken("not-the-token"), retry_total=0)
    try:
        bad.get_job(JOB, enforce_https=False)
        raise Fail("no error")
    except ClientAuthenticationError as e:
        expect(e.status_code == 401, f"status {e.status_code}")


ctl("reset")
print(f"azure-batch selftest: {len(passed)} passed, {len(failed)} failed", flush=True)
if failed:
    print("FAILED: " + "; ".join(failed), file=sys.stderr)
    sys.exit(1)
