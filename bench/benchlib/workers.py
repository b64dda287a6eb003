"""The `worker` and `floor` parts: one worker of each system on a tag of the bench's own, its
staged->ready, throughput, peak RSS, results upload and dependency download rows, curl's
figures for the same transfers, and the `docker run --rm` floor.
"""
import os
import resource
import shutil
import statistics
import subprocess
import time

from .common import (CREATED, FINAL, MIB, NET_PREFIX, REST, RUN_ID, WS, create_dataset,
                     create_runs, cred_env, curl_auth_header, delete_bundles, kill_bundles, log,
                     staged_at, wait_states)
from .instruments import Sampler, spawn, stop_process, tree_usage


# ---------------------------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------------------------
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
