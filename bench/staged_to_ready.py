#!/usr/bin/env python3
"""Staged-to-ready latency and idle memory: our cl-worker against CodaLab's Python cl-worker,
on the same real CodaLab server, Docker engine and machine.

Run through bench/staged_to_ready.sh (it starts the server and builds both workers' inputs).
For each worker: start it with a tag of its own, submit N `cl run true` bundles one after the
other, and time each from the moment the REST API first shows it `staged` (or later) to the
moment it shows `ready` (polled every 50 ms). Prints medians, p90s and the ratios.
"""
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SERVER = os.environ["CLW_SERVER_URL"]
WS = os.environ["CLW_WS_URL"]
USER = os.environ["CLW_ROOT_USER"]
PASSWORD = os.environ["CLW_ROOT_PASSWORD"]
N = int(os.environ.get("BENCH_RUNS", "10"))


def token():
    body = urllib.parse.urlencode(
        {"grant_type": "password", "username": USER, "password": PASSWORD}
    ).encode()
    req = urllib.request.Request(SERVER + "/rest/oauth2/token", data=body)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"codalab_worker_client:").decode())
    req.add_header("X-Requested-With", "XMLHttpRequest")
    return json.load(urllib.request.urlopen(req))["access_token"]


TOKEN = token()


def state(uuid):
    req = urllib.request.Request(SERVER + "/rest/bundles/" + uuid)
    req.add_header("Authorization", "Bearer " + TOKEN)
    req.add_header("X-Requested-With", "XMLHttpRequest")
    return json.load(urllib.request.urlopen(req))["data"]["attributes"]["state"]


def cl(env, *args):
    return subprocess.run(["cl", *args], env=env, check=True, capture_output=True, text=True).stdout


def rss_kib(pid):
    total = 0
    pids = [str(pid)]
    # the worker and its children (the Python worker forks helpers)
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    pids += out
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


def bench(name, argv, tag, cl_env):
    work = tempfile.mkdtemp(prefix=f"bench-{name}-")
    log = open(os.path.join(work, "worker.log"), "w")
    env = dict(os.environ, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD)
    args = argv + [
        "--server", SERVER, "--ws-server", WS, "--work-dir", os.path.join(work, "wd"),
        "--id", f"bench-{name}-{os.getpid()}", "--tag", tag, "--tag-exclusive",
        "--network-prefix", "cl_bench_network",
    ]
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # warm-up run (first checkin, networks, image inspection)
        times = []
        for i in range(N + 1):
            uuid = cl(cl_env, "run", "--request-queue", tag, "true").split()[-1]
            t_staged = None
            deadline = time.time() + 300
            while time.time() < deadline:
                s = state(uuid)
                now = time.time()
                if t_staged is None and s not in ("created", "uploading", "making"):
                    t_staged = now
                if s in ("ready", "failed", "killed", "worker_offline"):
                    break
                time.sleep(0.05)
            if s != "ready":
                raise SystemExit(f"{name}: bundle {uuid} ended {s}; see {log.name}")
            if i > 0:
                times.append(now - t_staged)
        time.sleep(5)
        rss = rss_kib(proc.pid)
        return times, rss
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def summary(times):
    times = sorted(times)
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main():
    rust_bin, py_bin = sys.argv[1], sys.argv[2]
    cl_env = dict(os.environ, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD,
                  CODALAB_STATE=tempfile.mktemp(suffix=".json"), CODALAB_SESSION=f"bench-{os.getpid()}")
    cl(cl_env, "work")
    results = {}
    for name, argv in (("rust", [rust_bin]), ("python", [py_bin])):
        tag = f"bench-{name}-{os.getpid()}"
        results[name] = bench(name, argv, tag, cl_env)
    print(f"cl run true, staged -> ready, {N} runs each (same server, Docker, machine):")
    for name, (times, rss) in results.items():
        med, p90 = summary(times)
        print(f"  {name:7s} median {med:6.2f} s   p90 {p90:6.2f} s   idle RSS {rss / 1024:7.1f} MiB")
    (rt, rr), (pt, pr) = results["rust"], results["python"]
    print(f"  ratio python/rust: median latency {summary(pt)[0] / summary(rt)[0]:.1f}x, "
          f"idle RSS {pr / rr:.1f}x")


if __name__ == "__main__":
    main()
