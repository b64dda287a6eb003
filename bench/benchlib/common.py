"""What every part of the benchmark shares: the settings from the environment (CLW_*), the
log, the clean-up on exit, and the CodaLab REST API (run bundles created, polled, killed and
deleted).
"""
import base64
import collections
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


ENV = os.environ
SERVER = ENV.get("CLW_SERVER_URL", "")
WS = ENV.get("CLW_WS_URL", "")
USER = ENV.get("CLW_ROOT_USER", "")
PASSWORD = ENV.get("CLW_ROOT_PASSWORD", "")
RUN_ID = "%d%04x" % (os.getpid(), random.getrandbits(16))
CLK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
NET_PREFIX = "clw_test_network"  # shared with the test workers: Docker has few address pools
FINAL = {"ready", "failed", "killed", "worker_offline"}
MIB = 1 << 20


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Clean-up: everything started or created is undone on exit, whatever ends the run.
# ---------------------------------------------------------------------------------------------
class Cleanup:
    def __init__(self):
        self.actions = []

    def add(self, what, fn):
        self.actions.append((what, fn))
        return fn

    def run(self):
        while self.actions:
            what, fn = self.actions.pop()
            try:
                fn()
            except Exception as e:  # clean-up goes on
                log(f"clean-up of {what}: {e}")


CLEANUP = Cleanup()


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


# ---------------------------------------------------------------------------------------------
# REST
# ---------------------------------------------------------------------------------------------
class Rest:
    def __init__(self, base):
        self.base = base.rstrip("/")
        self._token, self._exp = None, 0

    def token(self):
        if self._token is None or time.time() > self._exp:
            body = urllib.parse.urlencode(
                {"grant_type": "password", "username": USER, "password": PASSWORD}).encode()
            req = urllib.request.Request(self.base + "/rest/oauth2/token", data=body)
            req.add_header("Authorization",
                           "Basic " + base64.b64encode(b"codalab_cli_client:").decode())
            req.add_header("X-Requested-With", "XMLHttpRequest")
            tok = json.load(urllib.request.urlopen(req, timeout=60))
            self._token = tok["access_token"]
            self._exp = time.time() + min(int(tok.get("expires_in", 3600)), 3600) - 600
        return self._token

    def call(self, method, path, query=None, body=None, timeout=300):
        url = self.base + "/rest" + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token())
        req.add_header("X-Requested-With", "XMLHttpRequest")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read()[:300]!r}") from None
        return json.loads(raw) if raw else None

    def bundle(self, uuid):
        return self.call("GET", "/bundles/" + uuid)["data"]["attributes"]

    def states(self, uuids):
        """{uuid: state} of many bundles, 80 per request (gunicorn's request line limit)."""
        out = {}
        for i in range(0, len(uuids), 80):
            doc = self.call("GET", "/bundles", {"specs": uuids[i:i + 80]})
            for d in doc["data"]:
                out[d["id"]] = d["attributes"]["state"]
        return out


REST = Rest(SERVER) if SERVER else None
CREATED = []  # every bundle this run created, deleted at the end
RUN_TEMPLATE = {}


def learn_run_metadata():
    """The metadata `cl run` gives a run bundle (read back from one real `cl run`)."""
    env = dict(ENV, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD,
               CODALAB_SESSION=f"bench-{RUN_ID}")
    queue = f"bench-nobody-{RUN_ID}"
    subprocess.run(["cl", "work"], env=env, check=True, capture_output=True)
    out = subprocess.run(["cl", "run", "--request-queue", queue, "true"], env=env, check=True,
                         capture_output=True, text=True).stdout.split()[-1]
    CREATED.append(out)
    meta = REST.bundle(out)["metadata"]
    delete_bundles([out])
    keep = {k: v for k, v in meta.items()
            if k.startswith("request_") or k in ("name", "description", "tags", "exclude_patterns",
                                                 "allow_failed_dependencies", "store")}
    RUN_TEMPLATE.update(keep)
    log(f"cl run metadata: {sorted(keep)}")


def create_runs(command, queue, n, deps=None, **meta):
    """n run bundles, as `cl run --request-queue queue [--request-X v] command` creates them."""
    m = dict(RUN_TEMPLATE, request_queue=queue, name="bench")
    m.update(meta)
    uuids = []
    for i in range(0, n, 500):
        k = min(500, n - i)
        body = {"data": [{"type": "bundles", "attributes": {
            "bundle_type": "run", "command": command, "metadata": m,
            "dependencies": deps or []}} for _ in range(k)]}
        doc = REST.call("POST", "/bundles", {"detached": "1"}, body)
        got = [d["id"] for d in doc["data"]]
        CREATED.extend(got)
        uuids.extend(got)
    return uuids


def create_dataset(name):
    body = {"data": [{"type": "bundles", "attributes": {
        "bundle_type": "dataset", "metadata": {
            "name": name, "description": "", "tags": [], "license": "", "source_url": ""}}}]}
    uuid = REST.call("POST", "/bundles", {"detached": "1"}, body)["data"][0]["id"]
    CREATED.append(uuid)
    return uuid


def delete_bundles(uuids):
    for i in range(0, len(uuids), 500):
        chunk = uuids[i:i + 500]
        body = {"data": [{"type": "bundles", "id": u} for u in chunk]}
        try:
            REST.call("DELETE", "/bundles", {"force": "1"}, body)
        except RuntimeError:
            for u in chunk:  # one at a time: a running one may refuse
                try:
                    REST.call("DELETE", "/bundles", {"force": "1"},
                              {"data": [{"type": "bundles", "id": u}]})
                except RuntimeError:
                    pass
    done = set(uuids)
    CREATED[:] = [u for u in CREATED if u not in done]


def kill_bundles(uuids):
    if uuids:
        REST.call("POST", "/bundle-actions", None,
                  {"data": [{"type": "bundle-actions", "attributes": {"type": "kill", "uuid": u}}
                            for u in uuids]})


def wait_states(uuids, done, timeout, period=0.25):
    """Polls until done(states) holds; returns {uuid: {state: first time seen}}."""
    seen = {u: {} for u in uuids}
    end = time.time() + timeout
    while True:
        st = REST.states(uuids)
        now = time.time()
        for u, s in st.items():
            seen[u].setdefault(s, now)
        if done(st):
            return seen, st
        if now > end:
            raise RuntimeError(f"timed out; states: {collections.Counter(st.values())}")
        time.sleep(period)


def staged_at(first):
    """When a bundle was first seen past `created` (staged or later)."""
    return min(t for s, t in first.items() if s not in ("created", "uploading", "making"))


def curl_auth_header(tmp):
    """A header file for curl (mode 600): the token never reaches argv."""
    path = os.path.join(tmp, "auth-header")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"Authorization: Bearer {REST.token()}\nX-Requested-With: XMLHttpRequest\n")
    return path


def cred_env():
    return dict(ENV, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD)
