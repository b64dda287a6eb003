"""Measuring instruments: the HTTP-aware TCP pass-through proxy, `docker events`, process-tree
CPU seconds and RSS from /proc; and the processes the bench starts and stops.
"""
import collections
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

from .common import CLEANUP, CLK, ENV, PAGE_KIB


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
# Processes
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
