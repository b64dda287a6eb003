#!/usr/bin/env python3
"""Side-by-side benchmark: our cl-worker / cl-worker-manager against CodaLab 1.7.5's Python ones,
measured in the same run, on the same CodaLab server, Docker engine, Slurm, moto and machine.

Run it through bench/run.sh, which builds our binaries, starts the peers and sets the
environment (CLW_* of tests/peers/*.sh env, BENCH_* below). Standard library only.

How each figure is taken (every one for both systems, the same way):
- The workers talk to the server through a TCP pass-through proxy of this script, which records
  the request line, the start, the first response byte and the last byte of every HTTP request;
  `docker events` gives the run containers' create/start/die times; the REST API is polled for
  bundle states. So a run's time is split without either worker's cooperation.
- Process-tree CPU and RSS are read from /proc (the worker and all its descendants).
- Slurm calls are counted by logging shims on the managers' PATH; AWS calls by the same proxy in
  front of moto. A "tick" is a burst of calls separated from the next by the managers' sleep.
"""
import argparse
import base64
import collections
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
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


# ---------------------------------------------------------------------------------------------
# Measuring instruments: HTTP-aware TCP proxy, docker events, /proc
# ---------------------------------------------------------------------------------------------
REQ_RE = re.compile(rb"^(GET|PUT|POST|DELETE|PATCH|HEAD|OPTIONS) (\S+) HTTP/1\.[01]\r\n")


class Proxy:
    """TCP pass-through to 127.0.0.1:port recording every HTTP request on it: request line,
    time of its first and last byte up, of the first and last byte of its answer."""

    def __init__(self, port):
        self.target = ("127.0.0.1", port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.requests = []
        threading.Thread(target=self._accept, daemon=True).start()
        CLEANUP.add("proxy", self.sock.close)

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        try:
            s = socket.create_connection(self.target)
        except OSError:
            c.close()
            return
        for x in (c, s):
            x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = {"cur": None}
        t = threading.Thread(target=self._pump, args=(s, c, state, False), daemon=True)
        t.start()
        self._pump(c, s, state, True)
        t.join()
        c.close()
        s.close()

    def _pump(self, src, dst, state, up):
        while True:
            try:
                data = src.recv(1 << 18)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            now = time.time()
            if up:
                m = REQ_RE.match(data)
                if m:
                    rec = {"t": now, "method": m.group(1).decode(), "path": m.group(2).decode(),
                           "up": 0, "t_up_end": now, "t_resp": None, "t_end": None, "down": 0}
                    with self.lock:
                        self.requests.append(rec)
                    state["cur"] = rec
                rec = state["cur"]
                if rec is not None:
                    rec["up"] += len(data)
                    rec["t_up_end"] = now
            else:
                rec = state["cur"]
                if rec is not None:
                    if rec["t_resp"] is None:
                        rec["t_resp"] = now
                    rec["down"] += len(data)
                    rec["t_end"] = now
            try:
                dst.sendall(data)
            except OSError:
                for x in (src, dst):
                    try:
                        x.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return

    def find(self, pattern, method=None, after=0.0):
        rx = re.compile(pattern)
        with self.lock:
            reqs = list(self.requests)
        return [r for r in reqs if r["t"] >= after and rx.search(r["path"])
                and (method is None or r["method"] == method)]


class DockerEvents:
    def __init__(self):
        self.events = []
        self.proc = subprocess.Popen(
            ["docker", "events", "--format", "{{json .}}", "--filter", "type=container"],
            stdout=subprocess.PIPE, text=True)
        CLEANUP.add("docker events", self.proc.terminate)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                e = json.loads(line)
                name = e.get("Actor", {}).get("Attributes", {}).get("name", "")
                self.events.append((e["timeNano"] / 1e9, e.get("Action") or e.get("status"), name))
            except (ValueError, KeyError):
                pass

    def time_of(self, uuid, action):
        ts = [t for t, a, n in list(self.events) if a == action and uuid in n]
        return min(ts) if ts else None


def proc_stats():
    """{pid: (ppid, cpu seconds incl. reaped children, rss KiB)} of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rindex(")") + 2:].split()
        cpu = sum(int(x) for x in rest[11:15]) / CLK
        out[int(d)] = (int(rest[1]), cpu, int(rest[21]) * PAGE_KIB)
    return out


def tree(root, stats=None):
    stats = stats or proc_stats()
    kids = collections.defaultdict(list)
    for p, (pp, _, _) in stats.items():
        kids[pp].append(p)
    todo, seen = [root], []
    while todo:
        p = todo.pop()
        if p in stats:
            seen.append(p)
            todo.extend(kids[p])
    return seen, stats


def tree_usage(root):
    pids, stats = tree(root)
    return sum(stats[p][1] for p in pids), sum(stats[p][2] for p in pids)


class Sampler:
    """Samples a process tree's CPU seconds and RSS every `period` seconds."""

    def __init__(self, root, period=0.2):
        self.root, self.period, self.samples = root, period, []
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop_ev.is_set():
            cpu, rss = tree_usage(self.root)
            self.samples.append((time.time(), cpu, rss))
            self.stop_ev.wait(self.period)

    def stop(self):
        self.stop_ev.set()
        self.thread.join()

    def cpu_at(self, t):
        before = [s for s in self.samples if s[0] <= t]
        after = [s for s in self.samples if s[0] >= t]
        if not before:
            return after[0][1]
        if not after:
            return before[-1][1]
        (t0, c0, _), (t1, c1, _) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    def cpu_between(self, t0, t1):
        return self.cpu_at(t1) - self.cpu_at(t0)

    def peak_rss(self, t0=0, t1=1e20):
        return max((s[2] for s in self.samples if t0 <= s[0] <= t1), default=0)


# ---------------------------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------------------------
def spawn(argv, log_path, env=None, cwd=None):
    logf = open(log_path, "w")
    p = subprocess.Popen(argv, env=env or ENV, stdout=logf, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
    CLEANUP.add(f"process {argv[0]}", lambda: stop_process(p))
    return p


def stop_process(p, grace=30):
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def cred_env():
    return dict(ENV, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD)


class Worker:
    def __init__(self, system, binary, server, work):
        self.system = system
        self.tag = f"bench-{system}-{RUN_ID}"
        self.id = f"bench-{system}-{RUN_ID}"
        self.log = os.path.join(work, f"worker-{system}.log")
        cpuset = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        self.argv = [binary, "--server", server, "--ws-server", WS,
                     "--work-dir", os.path.join(work, f"wd-{system}"), "--id", self.id,
                     "--tag", self.tag, "--tag-exclusive", "--network-prefix", NET_PREFIX,
                     "--cpuset", cpuset]
        self.proc = spawn(self.argv, self.log, cred_env())
        self.sampler = Sampler(self.proc.pid)

    def alive(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.system} worker exited {self.proc.returncode}; see {self.log}")

    def stop(self):
        """Kills the bench's unfinished runs first: a worker stopped by SIGTERM leaves its runs
        to be resumed, which the bench must not leave behind."""
        try:
            live = [u for u, s in REST.states(list(CREATED)).items() if s not in FINAL]
            if live and self.proc.poll() is None:
                kill_bundles(live)
                wait_states(live, lambda st: all(s in FINAL for s in st.values()), 120)
        except Exception as e:
            log(f"{self.system}: killing unfinished runs: {e}")
        self.sampler.stop()
        stop_process(self.proc)


# ---------------------------------------------------------------------------------------------
# Worker rows
# ---------------------------------------------------------------------------------------------
def poll_one(uuid, timeout=600, period=0.05, worker=None):
    first = {}
    end = time.time() + timeout
    while True:
        s = REST.bundle(uuid)["state"]
        now = time.time()
        first.setdefault(s, now)
        if s in FINAL:
            return first, s
        if now > end:
            raise RuntimeError(f"bundle {uuid} still {s} after {timeout} s")
        if worker:
            worker.alive()
        time.sleep(period)


def latency_row(w, n, proxy, events):
    runs = []
    for i in range(n + 1):
        uuid = create_runs("true", w.tag, 1)[0]
        first, s = poll_one(uuid, worker=w)
        if s != "ready":
            raise RuntimeError(f"{w.system}: `true` ended {s}; see {w.log}")
        if i == 0:
            continue  # warm-up: first checkin, networks, image inspection
        runs.append({"uuid": uuid, "states": first, "staged": staged_at(first),
                     "ready": first["ready"]})
    time.sleep(2)  # let the last checkins and container removals land in the records
    for r in runs:
        r["breakdown"] = breakdown(r, w, proxy, events)
    return runs


def breakdown(r, w, proxy, events):
    """Where a run's staged->ready time goes, from the proxy's and Docker's records."""
    u = r["uuid"]
    sb = proxy.find(f"/workers/[^/]+/start_bundle/{u}")
    put = proxy.find(f"/bundles/{u}/contents/blob/", "PUT")
    t = {"staged": r["staged"],
         "start_bundle": sb[0]["t"] if sb else None,
         "container_create": events.time_of(u, "create"),
         "container_start": events.time_of(u, "start"),
         "container_die": events.time_of(u, "die"),
         "upload_start": put[0]["t"] if put else None,
         "upload_done": put[0]["t_resp"] if put else None}
    after = t["upload_done"] or t["container_die"] or r["staged"]
    ck = [c for c in proxy.find(r"/workers/[^/]+/checkin$", "POST") if c["t"] >= after]
    t["finalizing_checkin"] = ck[0]["t"] if ck else None
    t["ready"] = r["ready"]
    # the checkin that carried the run message: the last one started before start_bundle
    if t["start_bundle"]:
        carried = [c for c in proxy.find(r"/workers/[^/]+/checkin$", "POST")
                   if c["t"] < t["start_bundle"]]
        t["run_checkin"] = carried[-1]["t"] if carried else None
        t["run_checkin_answered"] = carried[-1]["t_resp"] if carried else None
    return t


SEGMENTS = [
    ("staged -> start_bundle call", "staged", "start_bundle"),
    ("start_bundle -> container created", "start_bundle", "container_create"),
    ("container created -> started", "container_create", "container_start"),
    ("container runs `true`", "container_start", "container_die"),
    ("container exit -> upload starts", "container_die", "upload_start"),
    ("upload (PUT contents/blob)", "upload_start", "upload_done"),
    ("upload done -> next checkin", "upload_done", "finalizing_checkin"),
    ("that checkin -> ready", "finalizing_checkin", "ready"),
]


def segment_medians(runs):
    out = {}
    for name, a, b in SEGMENTS:
        vals = [r["breakdown"][b] - r["breakdown"][a] for r in runs
                if r["breakdown"].get(a) and r["breakdown"].get(b)]
        out[name] = statistics.median(vals) if vals else None
    return out


def idle_rss(w):
    time.sleep(5)
    vals = []
    for _ in range(5):
        vals.append(tree_usage(w.proc.pid)[1])
        time.sleep(1)
    return statistics.median(vals)


def throughput_row(w, n):
    uuids = create_runs("sleep 1", w.tag, n)
    seen, st = wait_states(uuids, lambda st: all(s in FINAL for s in st.values()), 1800)
    bad = [u for u, s in st.items() if s != "ready"]
    if bad:
        raise RuntimeError(f"{w.system}: {len(bad)} `sleep 1` runs not ready; see {w.log}")
    t0 = min(staged_at(seen[u]) for u in uuids)
    t1 = max(seen[u]["ready"] for u in uuids)
    return n / (t1 - t0) * 60, t1 - t0


def concurrent_row(w, n):
    """Peak process-tree RSS from the moment n runs are submitted at once until all are ready.
    The server books at least one CPU per run (`--request-cpus 0` is scheduled as 1), so a
    worker on this 2-core machine holds at most 2 of them in flight; the rest wait as staged."""
    uuids = create_runs("sleep 5", w.tag, n, request_memory="32m")
    t0 = time.time()
    _, st = wait_states(uuids, lambda st: all(s in FINAL for s in st.values()), 1800)
    if any(s != "ready" for s in st.values()):
        raise RuntimeError(f"{w.system}: a `sleep 5` run did not end ready; see {w.log}")
    return w.sampler.peak_rss(t0, time.time()), time.time() - t0


def make_payload_cmd(kind, size):
    # `sync`: the payload is on disk before the run exits, as curl's tar.gz is before its
    # upload, so that the upload does not share the disk with the payload's own writeback.
    if kind == "random":
        return f"head -c {size} /dev/urandom > out.bin && sync"
    return f"yes 'codalab compressible line of text 0123456789' | head -c {size} > out.txt && sync"


def wait_for_answer(proxy, path, method, uuid, w, timeout=1800):
    """Waits until the proxy has seen the answer to `method path`, reading the bundle's state
    every 10 s until the request starts (to stop on a failed run). The bench's state queries
    go to the same single-process REST server that unpacks the upload: polled 4 times a second
    during one system's upload and not during curl's, they would slow only that one."""
    end = time.time() + timeout
    last = 0.0
    while True:
        put = proxy.find(path, method)
        if put and put[-1]["t_resp"]:
            return
        now = time.time()
        if not put and now - last > 10:
            last = now
            s = REST.bundle(uuid)["state"]
            if s in FINAL:
                return
        if now > end:
            raise RuntimeError(f"no answer to {method} {path} after {timeout} s")
        w.alive()
        time.sleep(0.05)


def upload_row(w, kind, size, proxy, events):
    # Memory for the run's output to stay in the page cache, as curl's tar.gz does: the page
    # cache a run writes is charged to its container, and under a 512 MiB limit half of a
    # 1 GiB output is written back and dropped before the worker reads it.
    uuid = create_runs(make_payload_cmd(kind, size), w.tag, 1,
                       request_disk=f"{2 * size // MIB}m",
                       request_memory=f"{2 * size // MIB}m")[0]
    wait_for_answer(proxy, f"/bundles/{uuid}/contents/blob/", "PUT", uuid, w)
    first, s = poll_one(uuid, timeout=1800, period=0.25, worker=w)
    if s != "ready":
        raise RuntimeError(f"{w.system}: upload run ended {s}; see {w.log}")
    time.sleep(1)
    put = proxy.find(f"/bundles/{uuid}/contents/blob/", "PUT")
    die = events.time_of(uuid, "die")
    if not put or not die or not put[-1]["t_resp"]:
        raise RuntimeError(f"{w.system}: upload of {uuid} not seen (put {bool(put)}, die {die})")
    end = put[-1]["t_resp"]
    return {"seconds": end - die, "mb_s": size / 1e6 / (end - die),
            "cpu_s": w.sampler.cpu_between(die, end), "wire_bytes": put[-1]["up"],
            "put_seconds": end - put[-1]["t"]}


def dependency_row(w, dep, size, proxy, events):
    deps = [{"parent_uuid": dep, "parent_path": "", "child_path": "dep"}]
    uuid = create_runs("true", w.tag, 1, deps=deps, request_memory="512m",
                       request_disk=f"{2 * size // MIB}m")[0]
    t_created = time.time()
    first, s = poll_one(uuid, timeout=1800, period=0.25, worker=w)
    if s != "ready":
        raise RuntimeError(f"{w.system}: dependency run ended {s}; see {w.log}")
    gets = proxy.find(f"/bundles/{dep}/contents/blob/", "GET", after=t_created)
    create = events.time_of(uuid, "create")
    if not gets or not create:
        raise RuntimeError(f"{w.system}: dependency download not seen")
    t0 = gets[0]["t"]
    return {"seconds": create - t0, "mb_s": size / 1e6 / (create - t0),
            "cpu_s": w.sampler.cpu_between(t0, create),
            "transfer_seconds": gets[0]["t_end"] - t0, "wire_bytes": gets[0]["down"]}


def make_tree(tmp, kind, size):
    d = os.path.join(tmp, f"payload-{kind}")
    os.makedirs(d, exist_ok=True)
    cmd = make_payload_cmd(kind, size)
    subprocess.run(["bash", "-c", cmd], cwd=d, check=True)
    tgz = os.path.join(tmp, f"payload-{kind}.tar.gz")
    subprocess.run(["tar", "czf", tgz, "-C", d, "."], check=True)
    shutil.rmtree(d)
    os.sync()
    return tgz


def timed_child(argv, stdin_path=None):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with open(stdin_path or os.devnull, "rb") as stdin:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stdin=stdin)
    t1 = time.time()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def curl_upload(tmp, tgz, size, proxy):
    uuid = create_dataset("bench-curl-upload")
    hdr = curl_auth_header(tmp)
    url = (f"{proxy.url}/rest/bundles/{uuid}/contents/blob/?"
           "filename=bundle.tar.gz&finalize_on_success=0")
    # `-T -`: a chunked body from stdin, as the workers send (and no file name appended)
    secs, cpu = timed_child(["curl", "-sS", "--fail", "-H", f"@{hdr}", "-T", "-", url], tgz)
    delete_bundles([uuid])
    return {"seconds": secs, "mb_s": size / 1e6 / secs, "cpu_s": cpu,
            "wire_bytes": os.path.getsize(tgz)}


def upload_dependency(tmp, size, proxy):
    tgz = make_tree(tmp, "random", size)
    uuid = create_dataset("bench-dependency")
    hdr = curl_auth_header(tmp)
    url = f"{proxy.url}/rest/bundles/{uuid}/contents/blob/?filename=dep.tar.gz&finalize_on_success=1"
    timed_child(["curl", "-sS", "--fail", "-H", f"@{hdr}", "-T", "-", url], tgz)
    os.remove(tgz)
    if REST.bundle(uuid)["state"] != "ready":
        raise RuntimeError("dependency bundle not ready after upload")
    return uuid


def curl_download(tmp, dep, size, proxy):
    hdr = curl_auth_header(tmp)
    out = os.path.join(tmp, "curl-download")
    secs, cpu = timed_child(["curl", "-sS", "--fail", "-H", f"@{hdr}", "-H",
                             "Accept-Encoding: gzip", "-o", out,
                             f"{proxy.url}/rest/bundles/{dep}/contents/blob/?support_redirect=1"])
    wire = os.path.getsize(out)
    os.remove(out)
    return {"seconds": secs, "mb_s": size / 1e6 / secs, "cpu_s": cpu, "wire_bytes": wire}


def docker_floor(image, n):
    subprocess.run(["docker", "run", "--rm", image, "true"], check=True)  # warm
    times = []
    for _ in range(n):
        t0 = time.time()
        subprocess.run(["docker", "run", "--rm", image, "true"], check=True)
        times.append(time.time() - t0)
    return times


def worker_rows(system, binary, cfg, proxy, events, tmp, dep):
    log(f"{system} worker: start")
    w = Worker(system, binary, proxy.url, tmp)
    res = {}
    try:
        log(f"{system}: staged->ready of `true`, {cfg.lat_n} runs (+1 warm-up)")
        runs = latency_row(w, cfg.lat_n, proxy, events)
        lat = [r["ready"] - r["staged"] for r in runs]
        res["latency"] = lat
        res["latency_runs"] = runs
        res["segments"] = segment_medians(runs)
        res["idle_rss_kib"] = idle_rss(w)
        log(f"{system}: median {statistics.median(lat):.2f} s; idle RSS "
            f"{res['idle_rss_kib'] / 1024:.1f} MiB")
        if not cfg.all_worker_rows:
            # --only latency,upload: the staged->ready segments and the results upload.
            res["upload_random"] = upload_row(w, "random", cfg.size, proxy, events)
            log(f"{system}: {res['upload_random']}")
            return res
        log(f"{system}: throughput, {cfg.tp_n} x `sleep 1`")
        res["throughput"], res["throughput_s"] = throughput_row(w, cfg.tp_n)
        log(f"{system}: {res['throughput']:.1f} runs/min")
        log(f"{system}: {cfg.conc_n} runs submitted at once")
        res["peak_rss_kib"], res["all_running_s"] = concurrent_row(w, cfg.conc_n)
        log(f"{system}: peak RSS {res['peak_rss_kib'] / 1024:.1f} MiB "
            f"(all ready after {res['all_running_s']:.0f} s)")
        for kind in ("random", "compressible"):
            log(f"{system}: results upload, {kind}, {cfg.size // MIB} MiB")
            res[f"upload_{kind}"] = upload_row(w, kind, cfg.size, proxy, events)
            log(f"{system}: {res[f'upload_{kind}']}")
        log(f"{system}: dependency download, {cfg.size // MIB} MiB")
        res["dependency"] = dependency_row(w, dep, cfg.size, proxy, events)
        log(f"{system}: {res['dependency']}")
    finally:
        w.stop()
    return res


# ---------------------------------------------------------------------------------------------
# Managers
# ---------------------------------------------------------------------------------------------
def python_manager_env(tmp, aws=False):
    """PYTHONPATH for Python's manager. It imports every cloud SDK at start-up, whichever backend
    runs: placeholder modules stand in for the Azure Batch and Kubernetes SDKs (never used on
    the Slurm and AWS code paths). For aws-batch it also needs boto3, which CodaLab's server venv
    lacks: boto3 1.35 (the last line for its Python 3.9) is installed once into a cache dir and
    only boto3, botocore, jmespath and s3transfer are put on the path."""
    stubs = os.path.join(tmp, "py-stubs")
    if not os.path.isdir(stubs):
        for mod in ("azure/batch/__init__", "azure/batch/batch_auth",
                    "azure/batch/_batch_service_client", "azure/batch/models",
                    "kubernetes/__init__", "kubernetes/utils/__init__",
                    "kubernetes/utils/create_from_yaml"):
            os.makedirs(os.path.join(stubs, os.path.dirname(mod)), exist_ok=True)
            with open(os.path.join(stubs, mod + ".py"), "w") as f:
                f.write("def __getattr__(name):\n    return type(name, (Exception,), {})\n")
        with open(os.path.join(stubs, "azure/__init__.py"), "w") as f:
            f.write("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")
    if not aws:
        return stubs
    boto = os.path.join(tmp, "py-boto")
    if not os.path.isdir(boto):
        cache = os.path.expanduser("~/.cache/clw-bench/boto3-py39")
        if not os.path.isdir(os.path.join(cache, "boto3")):
            python = os.path.join(os.path.dirname(os.path.realpath(shutil.which("cl-worker-manager"))), "python")
            python = python if os.path.exists(python) else os.path.join(
                os.path.dirname(shutil.which("cl-worker-manager")), "python")
            subprocess.run([python, "-m", "pip", "install", "-q", "--target", cache,
                            "boto3>=1.35,<1.36"], check=True, capture_output=True)
        os.makedirs(boto)
        for pkg in ("boto3", "botocore", "jmespath", "s3transfer"):
            os.symlink(os.path.join(cache, pkg), os.path.join(boto, pkg))
    return stubs + ":" + boto


def shims(tmp, log_path):
    """Slurm commands on PATH that log `<time> <command> <args>` and run the real one."""
    d = os.path.join(tmp, "shims-" + os.path.basename(log_path))
    os.makedirs(d, exist_ok=True)
    for cmd in ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo", "srun"):
        real = shutil.which(cmd)
        with open(os.path.join(d, cmd), "w") as f:
            f.write(f'#!/bin/sh\necho "$(date +%s.%N) {cmd} $*" >> "{log_path}"\nexec {real} "$@"\n')
        os.chmod(os.path.join(d, cmd), 0o755)
    return d


def bursts(times, gap):
    """Groups sorted times into bursts separated by more than `gap` seconds."""
    out = []
    for t in sorted(times):
        if out and t - out[-1][-1] <= gap:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def read_calls(path):
    calls = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                t, cmd = line.split()[:2]
                calls.append((float(t), cmd))
    return calls


class Slurm:
    """A private Slurm cluster of tests/peers/slurm.sh (own base dir and ports), declared with
    enough CPUs that 20 one-CPU workers (and 200 placeholder jobs) run at once."""

    def __init__(self, tmp, root):
        base = f"/tmp/clwb-slurm-{RUN_ID}"
        port = 7117
        while any(port_open(p) for p in (port, port + 1, port + 2)):
            port += 10
        self.env = dict(ENV, CLW_SLURM_BASE=base, CLW_SLURM_PORT_BASE=str(port),
                        CLW_SLURM_CPUS="256", CLW_SLURM_MEMORY_MB="262144", CLW_SLURM_GPUS="0",
                        CLW_SLURM_ACCT="0", CLW_SLURM_MIN_JOB_AGE="30")
        self.script = os.path.join(root, "tests/peers/slurm.sh")
        CLEANUP.add("private slurm", lambda: self._purge())
        subprocess.run(["bash", self.script, "start"], env=self.env, check=True,
                       stdout=subprocess.DEVNULL)
        out = subprocess.run(["bash", self.script, "env"], env=self.env, check=True,
                             capture_output=True, text=True).stdout
        for k, v in re.findall(r"^export (\w+)=(.*)$", out, re.M):
            self.env[k] = v.strip("'\"")
        self.partition = self.env.get("CLW_SLURM_PARTITION", "debug")

    def _purge(self):
        subprocess.run(["bash", self.script, "purge"], env=self.env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def run(self, *argv):
        return subprocess.run(list(argv), env=self.env, check=True, capture_output=True,
                              text=True).stdout

    def cancel_all(self):
        subprocess.run(["scancel", "--user", "root"], env=self.env, capture_output=True)
        end = time.time() + 60
        while time.time() < end and self.run("squeue", "-h", "-o", "%A").strip():
            time.sleep(1)


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def manager_argv(system, cfg, tag, globals_, backend):
    if system == "ours":
        argv = [cfg.ours_manager, "--server", SERVER]
    else:
        argv = [cfg.py_manager, "--server", SERVER]
    return argv + ["--worker-tag", tag, "--worker-tag-exclusive"] + globals_ + backend


def slurm_backend(system, slurm, work):
    b = ["slurm-batch", "--partition", slurm.partition, "--user", "root",
         "--slurm-work-dir", os.path.join(work, "slurm-scratch"), "--cpus", "1", "--gpus", "0",
         "--memory-mb", "1024"]
    return b


def worker_wrapper(tmp, system, binary):
    """The workers of both managers get one shared --network-prefix: on this one machine all
    Slurm jobs share one Docker engine, whose address pools hold ~30 networks, not 20 workers'
    own sets (on a real cluster each job has its own node)."""
    path = os.path.join(tmp, f"cl-worker-{system}")
    with open(path, "w") as f:
        # PYTHONPATH: the manager's placeholder modules must not reach the worker
        f.write("#!/bin/bash\nunset PYTHONPATH\nargs=()\nwhile (($#)); do\n"
                "  if [[ $1 == --network-prefix ]]; then args+=(\"$1\" " + NET_PREFIX + "); shift 2\n"
                "  else args+=(\"$1\"); shift; fi\ndone\n"
                f"exec {binary} \"${{args[@]}}\"\n")
    os.chmod(path, 0o755)
    return path


def scale_up(system, cfg, slurm, tmp, n, throttle):
    """n staged `true` bundles; each worker exits after one run (--worker-exit-after-num-runs 1,
    both managers), so each bundle needs a worker of its own: time until the n-th worker job
    runs, and until all n bundles are ready."""
    tag = f"bench-scale-{system}-{'default' if throttle is None else throttle}-{RUN_ID}"
    work = os.path.join(tmp, tag)
    os.makedirs(work)
    uuids = create_runs("true", tag, n, request_memory="256m")
    wait_states(uuids, lambda st: all(s == "staged" for s in st.values()), 300)
    binary = cfg.ours_worker if system == "ours" else cfg.py_worker
    g = ["--min-workers", "0", "--max-workers", str(n), "--worker-exit-after-num-runs", "1",
         "--worker-work-dir-prefix", work, "--worker-executable",
         worker_wrapper(tmp, system, binary)]
    if throttle is not None:
        g += ["--min-seconds-between-workers", str(throttle)]
    argv = manager_argv(system, cfg, tag, g, slurm_backend(system, slurm, work))
    env = dict(slurm.env, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD)
    if system == "python":
        env["PYTHONPATH"] = python_manager_env(tmp)
    t0 = time.time()
    mgr = spawn(argv, os.path.join(work, "manager.log"), env, cwd=work)
    running_jobs, t_n_running, t_ready = set(), None, None
    seen = {u: {} for u in uuids}
    end = t0 + cfg.scale_timeout
    try:
        while time.time() < end:
            if mgr.poll() is not None:
                raise RuntimeError(f"{system} manager exited; see {work}/manager.log")
            out = slurm.run("squeue", "-h", "-t", "R", "-o", "%A %j")
            running_jobs.update(l.split()[0] for l in out.splitlines() if l.strip())
            if t_n_running is None and len(running_jobs) >= n:
                t_n_running = time.time()
            st = REST.states(uuids)
            now = time.time()
            for u, s in st.items():
                seen[u].setdefault(s, now)
            # A bundle that ends other than `ready` (e.g. `worker_offline`) is a figure of the
            # row (bundles lost), not a failure of the bench: wait until every bundle is final.
            if all(s in FINAL for s in st.values()):
                t_ready = now
                break
            time.sleep(0.5)
        if t_ready is None:
            raise RuntimeError(f"{system} scale-up: not all final after {cfg.scale_timeout} s: "
                               f"{collections.Counter(REST.states(uuids).values())}")
    finally:
        stop_process(mgr)
        slurm.cancel_all()
    lost = {u: s for u, s in st.items() if s != "ready"}  # st: the states that ended the loop
    if lost:
        log(f"{system}: {len(lost)} bundle(s) not ready: {collections.Counter(lost.values())}")
    # each bundle's wait from staged to ready; the n-th worker job start
    return {"workers_running_s": (t_n_running - t0) if t_n_running else None,
            "all_ready_s": (t_ready - t0) if not lost else None,
            "all_final_s": t_ready - t0, "lost": len(lost),
            "lost_states": dict(collections.Counter(lost.values())),
            "jobs_seen_running": len(running_jobs)}


def slurm_calls(system, cfg, slurm, tmp, n):
    """Slurm calls per tick with n tracked (running) worker jobs."""
    tag = f"bench-calls-{RUN_ID}"
    job_name = f"clwb{RUN_ID}"
    for _ in range(n):
        slurm.run("sbatch", "--parsable", "--job-name", f"root-{job_name}-{random.getrandbits(64):016x}",
                  "--comment", "clwm:default", "--mem", "1", "--cpus-per-task", "1",
                  "--output", "/dev/null", "--wrap", "sleep 3600")
    end = time.time() + 120
    while len(slurm.run("squeue", "-h", "-t", "R", "-o", "%A").split()) < n:
        if time.time() > end:
            raise RuntimeError("placeholder jobs do not run")
        time.sleep(1)
    counts = {}
    try:
        for sysname in ("ours", "python"):
            work = os.path.join(tmp, f"calls-{sysname}-{n}")
            os.makedirs(work)
            calls_log = os.path.join(work, "calls.log")
            env = dict(slurm.env, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD)
            env["PATH"] = shims(work, calls_log) + ":" + env["PATH"]
            if sysname == "python":
                env["PYTHONPATH"] = python_manager_env(tmp)
            backend = slurm_backend(sysname, slurm, work)
            backend += ["--job-name", job_name]
            g = ["--min-workers", "0", "--sleep-time", "3"]
            argv = manager_argv(sysname, cfg, tag, g, backend)
            if sysname == "ours":
                counts[sysname] = once_tick(argv, env, work, lambda: read_calls(calls_log),
                                            tick=lambda c: c != "sinfo")
            else:
                counts[sysname] = count_ticks(argv, env, work, lambda: read_calls(calls_log))
    finally:
        slurm.cancel_all()
    return counts


def once_tick(argv, env, work, calls, tick):
    """Our manager with --once: one tick (listing and plan), nothing submitted or cancelled.
    Our manager counts a job as running only once its worker has checked in, so in a loop it
    would cancel placeholder jobs as unneeded pending ones; --once measures the same tick
    without acting. `tick` tells the tick's calls from the start-up checks."""
    with open(os.path.join(work, "plan.json"), "w") as out, \
            open(os.path.join(work, "manager.log"), "w") as err:
        r = subprocess.run(argv[:1] + ["--once"] + argv[1:], env=env, cwd=work, stdout=out,
                           stderr=err, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"manager --once exited {r.returncode}; see {work}/manager.log")
    with open(os.path.join(work, "plan.json")) as f:
        tracked = json.load(f).get("total_jobs")
    one = collections.Counter(c for _, c in calls() if tick(c))
    return {"per_tick": sum(one.values()), "ticks": [sum(one.values())], "one_tick": dict(one),
            "tracked_jobs": tracked}


def count_ticks(argv, env, work, calls, startup=(), ticks=3, timeout=120):
    """Runs a manager until `ticks` full ticks after the first were seen; returns the median
    number of calls per tick (the first burst, which holds start-up calls, is left out)."""
    mgr = spawn(argv, os.path.join(work, "manager.log"), env, cwd=work)
    end = time.time() + timeout
    try:
        while time.time() < end:
            if mgr.poll() is not None:
                raise RuntimeError(f"manager exited; see {work}/manager.log")
            b = bursts([t for t, c in calls() if c not in startup], 1.5)
            if len(b) >= ticks + 2:  # the last may still be growing
                sizes = [len(x) for x in b[1:ticks + 1]]
                by_cmd = collections.Counter(c for t, c in calls()
                                             if b[1][0] <= t <= b[1][-1] and c not in startup)
                return {"per_tick": statistics.median(sizes), "ticks": sizes,
                        "one_tick": dict(by_cmd)}
            time.sleep(0.5)
        raise RuntimeError(f"fewer than {ticks} ticks seen in {timeout} s; see {work}/manager.log")
    finally:
        stop_process(mgr)


def moto_batch(cfg, tmp, n, queue_env):
    """AWS calls per tick with n of the manager's jobs RUNNING in moto (hold mode)."""
    proxy = Proxy(int(urllib.parse.urlparse(ENV["AWS_ENDPOINT_URL"]).port or 5055))
    q = queue_env["CLW_MOTO_JOB_QUEUE_ARN"]
    definition = f"clwb-{RUN_ID}-{n}"
    boto(f"""
d = b.register_job_definition(jobDefinitionName={definition!r}, type='container',
    containerProperties={{'image': 'codalab/default-cpu:latest', 'vcpus': 1, 'memory': 128,
                          'command': ['true']}})
ids = [b.submit_job(jobName={definition!r} + '-' + '%016x' % i, jobQueue={q!r},
                    jobDefinition=d['jobDefinitionArn'])['jobId'] for i in range({n})]
print(json.dumps(ids))
""")
    # all RUNNING (hold mode steps through the states every 0.1 s)
    end = time.time() + 120
    while boto(f"""
n = 0
for p in b.get_paginator('list_jobs').paginate(jobQueue={q!r}, jobStatus='RUNNING'):
    n += len(p['jobSummaryList'])
print(n)""") < n:
        if time.time() > end:
            raise RuntimeError("moto jobs do not reach RUNNING")
        time.sleep(1)
    counts = {}
    tag = f"bench-aws-{RUN_ID}"
    try:
        for sysname in ("ours", "python"):
            work = os.path.join(tmp, f"aws-{sysname}-{n}")
            os.makedirs(work)
            env = dict(ENV, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD,
                       AWS_ENDPOINT_URL=proxy.url, AWS_ENDPOINT_URL_BATCH=proxy.url)
            if sysname == "python":
                env["PYTHONPATH"] = python_manager_env(tmp, aws=True)
            backend = ["aws-batch", "--job-queue", q, "--job-definition-name", definition,
                       "--cpus", "1", "--memory-mb", "1024", "--region", ENV.get("AWS_REGION", "us-east-1")]
            if sysname == "ours":
                backend += ["--worker-image", "codalab/worker:bench", "--password-secret-arn",
                            queue_env["CLW_MOTO_SECRET_ARN"], "--execution-role-arn",
                            queue_env["CLW_MOTO_EXECUTION_ROLE_ARN"]]
            # Ours counts a job as a running worker only once its worker checked in: with
            # --min-workers n the n placeholders are its floor, neither cancelled nor added to.
            g = ["--min-workers", str(n) if sysname == "ours" else "0", "--sleep-time", "3"]
            if sysname == "ours":
                g += ["--max-workers", str(n)]
            argv = manager_argv(sysname, cfg, tag, g, backend)
            t_start = time.time()
            calls = lambda: [(r["t"], r["method"] + " " + r["path"].split("?")[0])
                             for r in proxy.find("", after=t_start)]
            # Both in their loop; ticks 2-4 (the first holds the start-up checks and, for ours,
            # one DescribeJobs per 100 adopted jobs).
            counts[sysname] = count_ticks(argv, env, work, calls)
    finally:
        boto(f"""
for s in ('SUBMITTED', 'PENDING', 'RUNNABLE', 'STARTING', 'RUNNING'):
    for p in b.get_paginator('list_jobs').paginate(jobQueue={q!r}, jobStatus=s):
        for j in p['jobSummaryList']:
            b.terminate_job(jobId=j['jobId'], reason='bench done')
print(0)""")
    return counts


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric_by_label(text, name, label):
    """Sums of a Prometheus series by one label's value."""
    out = collections.Counter()
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels, value = line.rsplit(" ", 1)
        m = re.search(label + r'="([^"]*)"', labels)
        out[m.group(1) if m else ""] += float(value)
    return dict(out)


def moto_active(queue):
    return boto(f"""
n = 0
for s in ('SUBMITTED', 'PENDING', 'RUNNABLE', 'STARTING', 'RUNNING'):
    for p in b.get_paginator('list_jobs').paginate(jobQueue={queue!r}, jobStatus=s):
        n += len(p['jobSummaryList'])
print(n)""")


def tiers_run(cfg, slurm, tmp, qenv, image, with_cloud):
    """Our manager with `--config tiers.toml`: the private Slurm cluster as tier 1 (cap 2) and,
    with_cloud, moto's AWS Batch in docker mode as tier 2 (cap 4, after `overflow-after` 30 s);
    cfg.tiers_n staged `sleep` bundles. Time from the manager's start until all are ready, the
    first cloud launch, and worker-seconds per tier (its /metrics, read once every worker has
    exited)."""
    kind = "tiers" if with_cloud else "slurm-only"
    tag = f"bench-{kind}-{RUN_ID}"
    work = os.path.join(tmp, tag)
    prefix = os.path.join(work, "workers")  # moto's job containers mount it at the same path
    os.makedirs(prefix)
    job_name = f"clwt{RUN_ID}{'c' if with_cloud else 's'}"
    q = qenv["CLW_MOTO_JOB_QUEUE_ARN"]
    config = f"""
[[tier]]
name = "campus"
backend = "slurm-batch"
max-workers = 2
overflow-after = {cfg.tiers_overflow}
[tier.flags]
partition = "{slurm.partition}"
user = "root"
job-name = "{job_name}"
slurm-work-dir = "{os.path.join(work, 'slurm-scratch')}"
cpus = 1
memory-mb = 1024
"""
    if with_cloud:
        config += f"""
[[tier]]
name = "cloud"
backend = "aws-batch"
max-workers = 4
price-per-hour = 1.0
[tier.flags]
job-queue = "{q}"
job-definition-name = "clwb-tiers-{RUN_ID}"
worker-image = "{image}"
password-secret-arn = "{qenv['CLW_MOTO_SECRET_ARN']}"
cpus = 1
memory-mb = 1024
"""
    path = os.path.join(work, "tiers.toml")
    with open(path, "w") as f:
        f.write(config)
    uuids = create_runs(f"sleep {cfg.tiers_sleep}", tag, cfg.tiers_n, request_memory="256m")
    wait_states(uuids, lambda st: all(s == "staged" for s in st.values()), 300)
    port = free_port()
    argv = [cfg.ours_manager, "--server", SERVER, "--min-workers", "0", "--max-workers", "6",
            "--sleep-time", "2", "--worker-tag", tag, "--worker-tag-exclusive",
            "--worker-idle-seconds", "5", "--worker-work-dir-prefix", prefix,
            "--metrics-addr", f"127.0.0.1:{port}", "--config", path]
    env = dict(slurm.env, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD, CODALAB_HOME=work)
    # The Slurm jobs run `cl-worker` from the submitting environment's PATH: ours, release.
    env["PATH"] = os.path.dirname(cfg.ours_worker) + ":" + env["PATH"]
    env.pop("PYTHONPATH", None)
    t0 = time.time()
    mgr = spawn(argv, os.path.join(work, "manager.log"), env, cwd=work)
    t_cloud, t_ready, st = None, None, {}
    try:
        end = t0 + cfg.scale_timeout
        while time.time() < end:
            if mgr.poll() is not None:
                raise RuntimeError(f"tiers manager exited; see {work}/manager.log")
            if with_cloud and t_cloud is None and moto_active(q) > 0:
                t_cloud = time.time()
            st = REST.states(uuids)
            if all(s in FINAL for s in st.values()):
                t_ready = time.time()
                break
            time.sleep(0.5)
        if t_ready is None:
            raise RuntimeError(f"{kind}: not all final after {cfg.scale_timeout} s: "
                               f"{collections.Counter(st.values())}")
        # The workers exit after 5 idle seconds; their seconds are counted until then.
        end = time.time() + 120
        while time.time() < end:
            left = len([l for l in slurm.run("squeue", "-h", "-o", "%j").split()
                        if job_name in l])
            if with_cloud:
                left += moto_active(q)
            if not left:
                break
            time.sleep(1)
        time.sleep(3)  # one more tick: the last listing that saw them go
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        stop_process(mgr)
        slurm.cancel_all()
    lost = {u: s for u, s in st.items() if s != "ready"}
    if lost:
        log(f"{kind}: {len(lost)} bundle(s) not ready: {collections.Counter(lost.values())}")
    seconds = metric_by_label(metrics, "cl_worker_manager_worker_seconds_total", "tier")
    return {"all_ready_s": (t_ready - t0) if not lost else None, "all_final_s": t_ready - t0,
            "lost": len(lost), "first_cloud_launch_s": (t_cloud - t0) if t_cloud else None,
            "worker_seconds": seconds,
            "cost": metric_by_label(metrics, "cl_worker_manager_cost_total", "tier")}


def tiers_part(cfg, slurm, tmp, root, table, results):
    image = "cl-worker-bench/worker:latest"
    log(f"worker image {image} of our release binaries (moto's docker mode runs it)")
    subprocess.run(["bash", os.path.join(root, "tests/peers/images.sh"), "build", "worker"],
                   env=dict(ENV, CLW_IMAGE_BINARIES=os.path.dirname(cfg.ours_worker),
                            CLW_WORKER_IMAGE_TAG=image), check=True, stdout=subprocess.DEVNULL)
    qenv = moto_queue(root, f"clwbt{RUN_ID}")
    moto_sh = os.path.join(root, "tests/peers/moto.sh")
    subprocess.run(["bash", moto_sh, "mode", "docker"], check=True, stdout=subprocess.DEVNULL)
    try:
        out = {}
        for with_cloud in (True, False):
            key = "tiers" if with_cloud else "slurm_only"
            log(f"tiers: {cfg.tiers_n} x `sleep {cfg.tiers_sleep}`, Slurm cap 2"
                + (f", cloud (moto, cap 4) after {cfg.tiers_overflow} s" if with_cloud else " alone"))
            out[key] = tiers_run(cfg, slurm, tmp, qenv, image, with_cloud)
            log(f"  {out[key]}")
    finally:
        subprocess.run(["bash", moto_sh, "mode", "hold"], stdout=subprocess.DEVNULL)
    results["tiers"] = out
    t, s = out["tiers"], out["slurm_only"]
    label = (f"tiers, {cfg.tiers_n} x `sleep {cfg.tiers_sleep}`, Slurm cap 2, "
             f"cloud after {cfg.tiers_overflow:.0f} s")
    none = "Python 1.7.5 has no tiers (two managers launch for the same bundles)"
    table.add(f"{label}: all ready", t["all_ready_s"], None, "s", note=none)
    table.add("  the same on Slurm alone (cap 2), ours", s["all_ready_s"], None, "s")
    table.add(f"{label}: first cloud launch", t["first_cloud_launch_s"], None, "s",
              note="never before overflow-after")
    for tier in ("campus", "cloud"):
        table.add(f"{label}: worker-seconds, {tier}", t["worker_seconds"].get(tier, 0.0), None,
                  "worker-s")
    table.add("  Slurm alone: worker-seconds", s["worker_seconds"].get("campus", 0.0), None,
              "worker-s")


def moto_queue(root, name):
    """A job queue, compute environment and credentials secret of moto (tests/peers/moto.sh
    setup-batch): their names and ARNs, as CLW_MOTO_* keys."""
    return dict(re.findall(r"^export (\w+)=['\"]?([^'\"\n]*)", subprocess.run(
        ["bash", os.path.join(root, "tests/peers/moto.sh"), "setup-batch", name],
        env=dict(ENV, CLW_MOTO_CODALAB_PASSWORD=PASSWORD), check=True, capture_output=True,
        text=True).stdout, re.M))


def boto(code):
    script = "import boto3, json\nb = boto3.client('batch')\n" + code
    out = subprocess.run([ENV["CLW_MOTO_PYTHON"], "-c", script], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def manager_cpu(cfg, slurm, tmp, n):
    """CPU per tick of each manager with n staged bundles it is asked to serve (a request queue
    no worker serves; --max-workers 0, so nothing is launched)."""
    tag = f"bench-10k-{RUN_ID}"
    t0 = time.time()
    uuids = create_runs("true", tag, n)
    log(f"{n} bundles created in {time.time() - t0:.0f} s; waiting until staged")
    wait_states(uuids, lambda st: all(s == "staged" for s in st.values()), 1800, period=5)
    log(f"{n} bundles staged after {time.time() - t0:.0f} s")
    out = {}
    try:
        for sysname in ("ours", "python"):
            work = os.path.join(tmp, f"cpu-{sysname}")
            os.makedirs(work)
            calls_log = os.path.join(work, "calls.log")
            env = dict(slurm.env, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD)
            env["PATH"] = shims(work, calls_log) + ":" + env["PATH"]
            if sysname == "python":
                env["PYTHONPATH"] = python_manager_env(tmp)
            g = ["--min-workers", "0", "--max-workers", "0", "--sleep-time", "3"]
            argv = manager_argv(sysname, cfg, tag, g, slurm_backend(sysname, slurm, work))
            mgr = spawn(argv, os.path.join(work, "manager.log"), env, cwd=work)
            sampler = Sampler(mgr.pid, 0.1)
            try:
                end = time.time() + 300
                while time.time() < end:
                    if mgr.poll() is not None:
                        raise RuntimeError(f"{sysname} manager exited; see {work}/manager.log")
                    b = bursts([t for t, c in read_calls(calls_log) if c == "squeue"], 1.5)
                    if len(b) >= cfg.cpu_ticks + 2:
                        break
                    time.sleep(0.5)
                else:
                    raise RuntimeError(f"{sysname}: too few ticks; see {work}/manager.log")
                ticks = cfg.cpu_ticks
                cpu = sampler.cpu_between(b[1][0] - 0.05, b[1 + ticks][0] - 0.05)
                out[sysname] = {"cpu_per_tick_s": cpu / ticks, "ticks": ticks,
                                "tick_period_s": (b[1 + ticks][0] - b[1][0]) / ticks}
            finally:
                sampler.stop()
                stop_process(mgr)
            log(f"{sysname}: {out[sysname]}")
    finally:
        t0 = time.time()
        delete_bundles(uuids)
        log(f"{n} bundles deleted in {time.time() - t0:.0f} s")
    return out


# ---------------------------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------------------------
def pct(vals, q):
    s = sorted(vals)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    a = abs(v)
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3f}"


def sim_part(cfg, table, results):
    """The manager at a large installation, by simulation (manager/examples/scale_sim.rs): ours
    only, since Python's manager has no in-process form to drive."""
    out = {}
    for n in (200, 500, 1000, 2000):
        log(f"manager simulation: {n} workers, {10 * n} staged bundles, 5 shapes")
        r = subprocess.run([ENV["BENCH_SCALE_SIM"], str(n)], capture_output=True, text=True,
                           check=True, timeout=600)
        out[n] = json.loads(r.stdout)
        log(f"  {out[n]}")
    results["manager_sim"] = out
    for n, r in out.items():
        label = f"manager sim, {n} workers, {r['staged']} staged, {r['shapes']} shapes"
        table.add(f"{label}: CPU per tick", r["tick_cpu_s"] * 1000, None, "CPU ms",
                  note="first page read, the rest counted")
        table.add(f"{label}: CPU per tick, all staged read", r["tick_all_read_cpu_s"] * 1000, None,
                  "CPU ms")
        table.add(f"{label}: growth from 0, CPU of {r['growth_ticks']} ticks",
                  r["growth_cpu_s"] * 1000, None, "CPU ms")
        table.add(f"{label}: RSS (the server's bodies {r['server_bodies_mib']:.0f} MiB of it)",
                  r["rss_mib"], None, "MiB")


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, ours, python, unit, better="lower", note=""):
        ratio = None
        if isinstance(ours, (int, float)) and isinstance(python, (int, float)) and ours and python:
            ratio = python / ours if better == "lower" else ours / python
        self.rows.append({"row": name, "ours": ours, "python": python, "ratio": ratio,
                          "unit": unit, "better": better, "note": note})

    def render(self):
        head = ("row", "ours", "Python 1.7.5", "ratio", "unit")
        lines = [(r["row"], fmt(r["ours"]), fmt(r["python"]),
                  (fmt(r["ratio"]) + "x") if r["ratio"] else "-", r["unit"]) for r in self.rows]
        w = [max(len(x[i]) for x in lines + [head]) for i in range(5)]
        out = ["  ".join(h.ljust(w[i]) if i in (0, 4) else h.rjust(w[i])
                         for i, h in enumerate(head)), "  ".join("-" * x for x in w)]
        for x in lines:
            out.append("  ".join(c.ljust(w[i]) if i in (0, 4) else c.rjust(w[i])
                                 for i, c in enumerate(x)))
        return "\n".join(out)


def machine():
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / (1 << 20)
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    docker = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                            capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "ram_gib": round(mem, 1), "kernel": platform.release(),
            "cpu": model, "docker": docker}


# ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--only", default="worker,floor,scale,calls,aws,cpu,tiers,sim",
                    help="comma-separated parts (worker,floor,scale,calls,aws,cpu,tiers,sim; "
                         "latency and upload: the worker part's staged->ready and random upload "
                         "rows only)")
    cfg = ap.parse_args()
    parts = set(cfg.only.split(","))
    # `latency` (with `upload`): the worker part's staged->ready runs and its 1 GiB random
    # upload beside curl's, without the throughput, peak RSS and dependency rows.
    cfg.all_worker_rows = "worker" in parts
    if parts & {"latency", "upload"}:
        parts.add("worker")
    cfg.ours_worker, cfg.ours_manager = ENV["BENCH_OURS_WORKER"], ENV["BENCH_OURS_MANAGER"]
    cfg.py_worker, cfg.py_manager = shutil.which("cl-worker"), shutil.which("cl-worker-manager")
    q = cfg.quick
    cfg.lat_n = 3 if q else 10
    cfg.tp_n = 5 if q else 50
    cfg.conc_n = 5 if q else 20
    cfg.size = (128 if q else 1024) * MIB
    cfg.scale_n = 2 if q else 20
    cfg.scale_timeout = 1800 if not q else 600
    cfg.cpu_n = 1000 if q else 10000
    cfg.cpu_ticks = 3
    cfg.tiers_n = 10
    cfg.tiers_sleep = 10 if q else 30
    cfg.tiers_overflow = 30.0
    mode = "quick" if q else "full"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    date = time.strftime("%Y-%m-%d %H:%M:%S %z")
    json_path = cfg.json_path or os.path.join(
        root, "bench", "results", time.strftime("%Y%m%d-%H%M%S") + f"-{mode}.json")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tmp = tempfile.mkdtemp(prefix=f"clw-bench-{RUN_ID}-", dir="/var/tmp")
    t_start = time.time()
    results = {"date": date, "mode": mode, "commit": commit, "machine": machine(),
               "sizes": {"latency_runs": cfg.lat_n, "throughput_runs": cfg.tp_n,
                         "concurrent_runs": cfg.conc_n, "payload_mib": cfg.size // MIB,
                         "scale_up_bundles": cfg.scale_n, "cpu_staged_bundles": cfg.cpu_n}}
    table = Table()
    ok = False
    try:
        CLEANUP.add("bench bundles", lambda: delete_bundles(list(CREATED)))
        CLEANUP.add("temp dir", lambda: shutil.rmtree(tmp, ignore_errors=True) if ok
                    else log(f"kept for inspection: {tmp}"))
        learn_run_metadata()
        proxy = Proxy(urllib.parse.urlparse(SERVER).port)
        events = DockerEvents()
        image = "codalab/default-cpu:latest"
        if "floor" in parts or "worker" in parts:
            log(f"floor: docker run --rm {image} true")
            results["floor"] = docker_floor(image, cfg.lat_n)
        sysres = results["worker_raw"] = {}
        if "worker" in parts:
            log(f"dependency bundle: {cfg.size // MIB} MiB of random bytes")
            dep = upload_dependency(tmp, cfg.size, proxy) if cfg.all_worker_rows else None
            for system, binary in (("ours", cfg.ours_worker), ("python", cfg.py_worker)):
                sysres[system] = worker_rows(system, binary, cfg, proxy, events, tmp, dep)
            curl = {}
            for kind in ("random", "compressible") if cfg.all_worker_rows else ("random",):
                tgz = make_tree(tmp, kind, cfg.size)
                curl[f"upload_{kind}"] = curl_upload(tmp, tgz, cfg.size, proxy)
                os.remove(tgz)
            if cfg.all_worker_rows:
                curl["dependency"] = curl_download(tmp, dep, cfg.size, proxy)
            results["curl"] = curl
            results["workers"] = {s: {k: v for k, v in r.items() if k != "latency_runs"}
                                  for s, r in sysres.items()}
            results["latency_runs"] = {s: r["latency_runs"] for s, r in sysres.items()}
            o, p = sysres["ours"], sysres["python"]
            floor = statistics.median(results["floor"])
            n = cfg.lat_n
            table.add(f"staged->ready `cl run true`, median of {n}", statistics.median(o["latency"]),
                      statistics.median(p["latency"]), "s")
            table.add(f"staged->ready `cl run true`, p90 of {n}", pct(o["latency"], 0.9),
                      pct(p["latency"], 0.9), "s")
            table.add(f"  floor: `docker run --rm` (median of {n})", floor, floor, "s", note="same image, same engine")
            table.add("  latency as a multiple of the floor", statistics.median(o["latency"]) / floor,
                      statistics.median(p["latency"]) / floor, "x floor")
            if cfg.all_worker_rows:
                table.add(f"throughput, {cfg.tp_n} x `sleep 1`, one worker on all {os.cpu_count()} cores",
                          o["throughput"], p["throughput"], "runs/min", better="higher")
            table.add("worker idle RSS", o["idle_rss_kib"] / 1024, p["idle_rss_kib"] / 1024, "MiB")
            if cfg.all_worker_rows:
                table.add(f"worker peak RSS, {cfg.conc_n} runs submitted at once", o["peak_rss_kib"] / 1024,
                          p["peak_rss_kib"] / 1024, "MiB")
            mib = cfg.size // MIB
            for kind in ("random", "compressible") if cfg.all_worker_rows else ("random",):
                k = f"upload_{kind}"
                table.add(f"results upload {mib} MiB {kind}: rate", o[k]["mb_s"], p[k]["mb_s"],
                          "MB/s", better="higher")
                table.add(f"  curl -T of its tar.gz, same endpoint", curl[k]["mb_s"], curl[k]["mb_s"], "MB/s",
                          better="higher")
                table.add(f"results upload {mib} MiB {kind}: CPU", o[k]["cpu_s"], p[k]["cpu_s"], "CPU s")
                table.add("  curl -T: CPU", curl[k]["cpu_s"], curl[k]["cpu_s"], "CPU s")
                table.add(f"results upload {mib} MiB {kind}: rate as a share of curl's",
                          o[k]["mb_s"] / curl[k]["mb_s"], p[k]["mb_s"] / curl[k]["mb_s"], "x curl",
                          better="higher")
            d = "dependency"
            if not cfg.all_worker_rows:
                d = None
        if "worker" in parts and d:
            table.add(f"dependency {mib} MiB download+unpack: rate", o[d]["mb_s"], p[d]["mb_s"], "MB/s",
                      better="higher")
            table.add("  curl of the same blob", curl[d]["mb_s"], curl[d]["mb_s"], "MB/s", better="higher")
            table.add(f"dependency {mib} MiB download+unpack: CPU", o[d]["cpu_s"], p[d]["cpu_s"], "CPU s")
            table.add("  curl: CPU", curl[d]["cpu_s"], curl[d]["cpu_s"], "CPU s")
        slurm = None
        if parts & {"scale", "calls", "cpu", "tiers"}:
            log("private Slurm cluster (tests/peers/slurm.sh, own base dir and ports)")
            slurm = Slurm(tmp, root)
        if "scale" in parts:
            sc = {}
            for throttle in (None, 0):
                for system in ("ours", "python"):
                    log(f"scale-up on Slurm: {system}, {cfg.scale_n} bundles, "
                        f"{'default throttle' if throttle is None else '--min-seconds-between-workers 0'}")
                    sc[f"{system}-{throttle}"] = scale_up(system, cfg, slurm, tmp, cfg.scale_n, throttle)
                    log(f"  {sc[f'{system}-{throttle}']}")
                label = "defaults" if throttle is None else "--min-seconds-between-workers 0"
                o, p = sc[f"ours-{throttle}"], sc[f"python-{throttle}"]
                table.add(f"Slurm scale-up, {cfg.scale_n} bundles, {label}: {cfg.scale_n} workers running",
                          o["workers_running_s"], p["workers_running_s"], "s")
                table.add(f"Slurm scale-up, {cfg.scale_n} bundles, {label}: all ready",
                          o["all_ready_s"], p["all_ready_s"], "s")
                table.add(f"Slurm scale-up, {cfg.scale_n} bundles, {label}: worker jobs run",
                          o["jobs_seen_running"], p["jobs_seen_running"], "jobs")
                if o["lost"] or p["lost"]:
                    table.add(f"Slurm scale-up, {cfg.scale_n} bundles, {label}: bundles not ready",
                              o["lost"], p["lost"], "bundles",
                              note=f"ours {o['lost_states']}, Python {p['lost_states']}")
            results["scale_up"] = sc
        if "calls" in parts:
            calls = {}
            for n in (20, 200):
                log(f"Slurm calls per tick, {n} jobs")
                calls[n] = slurm_calls(None, cfg, slurm, tmp, n)
                log(f"  {calls[n]}")
                table.add(f"Slurm calls per tick, {n} jobs", calls[n]["ours"]["per_tick"],
                          calls[n]["python"]["per_tick"], "calls")
            results["slurm_calls"] = calls
        if "aws" in parts:
            qenv = moto_queue(root, f"clwb-{RUN_ID}")
            aws = {}
            for n in (20, 200):
                log(f"AWS calls per tick, {n} jobs")
                aws[n] = moto_batch(cfg, tmp, n, qenv)
                log(f"  {aws[n]}")
                table.add(f"AWS Batch calls per tick, {n} jobs", aws[n]["ours"]["per_tick"],
                          aws[n]["python"]["per_tick"], "calls")
            results["aws_calls"] = aws
        if "tiers" in parts:
            tiers_part(cfg, slurm, tmp, root, table, results)
        if "sim" in parts:
            sim_part(cfg, table, results)
        if "cpu" in parts:
            log(f"manager CPU per tick, {cfg.cpu_n} staged bundles")
            cpu = manager_cpu(cfg, slurm, tmp, cfg.cpu_n)
            results["manager_cpu"] = cpu
            table.add(f"manager CPU per tick, {cfg.cpu_n} staged bundles",
                      cpu["ours"]["cpu_per_tick_s"] * 1000, cpu["python"]["cpu_per_tick_s"] * 1000,
                      "CPU ms")
        ok = True
    finally:
        CLEANUP.run()
        # written also when a part failed: what was measured until then, marked incomplete
        results["complete"] = ok
        results["rows"] = table.rows
        results["wall_seconds"] = round(time.time() - t_start, 1)
        os.makedirs(os.path.dirname(json_path), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1, default=str)
        log(f"JSON: {json_path}")
    print(f"CodaLab worker system benchmark, {mode} mode, {date}, commit {commit}")
    m = results["machine"]
    print(f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, Linux {m['kernel']}, "
          f"Docker {m['docker']}; ratio > 1: ours better")
    print(table.render())
    if "workers" in results:
        print("\nstaged->ready of `cl run true`, median per segment (s):")
        print(f"  {'segment':40s} {'ours':>7s} {'Python':>7s}")
        for name, _, _ in SEGMENTS:
            o = results["workers"]["ours"]["segments"][name]
            p = results["workers"]["python"]["segments"][name]
            print(f"  {name:40s} {fmt(o):>7s} {fmt(p):>7s}")
    print(f"\nwall time {results['wall_seconds']:.0f} s; JSON: {json_path}")


if __name__ == "__main__":
    main()
