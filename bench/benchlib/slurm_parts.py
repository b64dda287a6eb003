"""The manager parts on the private Slurm cluster: `scale` (scale-up), `calls` (Slurm calls per
tick) and `cpu` (manager CPU per tick with many staged bundles).
"""
import collections
import json
import os
import random
import subprocess
import time

from .common import (FINAL, NET_PREFIX, PASSWORD, REST, RUN_ID, USER, create_runs, delete_bundles,
                     log, wait_states)
from .instruments import Sampler, spawn, stop_process
from .managers import (bursts, count_ticks, manager_argv, python_manager_env, read_calls, shims,
                       slurm_backend)


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
