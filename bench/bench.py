#!/usr/bin/env python3
"""Side-by-side benchmark: our cl-worker / cl-worker-manager against CodaLab 1.7.5's Python ones,
measured in the same run, on the same CodaLab server, Docker engine, Slurm, moto and machine.

Run it through bench/run.sh, which builds our binaries, starts the peers and sets the
environment (CLW_* of tests/peers/*.sh env, BENCH_* below). Standard library only.
The parts are the modules of bench/benchlib/ beside this file, the entry point.

How each figure is taken (every one for both systems, the same way):
- The workers talk to the server through a TCP pass-through proxy of the bench, which records
  the request line, the start, the first response byte and the last byte of every HTTP request;
  `docker events` gives the run containers' create/start/die times; the REST API is polled for
  bundle states. So a run's time is split without either worker's cooperation.
- Process-tree CPU and RSS are read from /proc (the worker and all its descendants).
- Slurm calls are counted by logging shims on the managers' PATH; AWS calls by the same proxy in
  front of moto. A "tick" is a burst of calls separated from the next by the managers' sleep.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.parse

from benchlib.common import (CLEANUP, CREATED, ENV, MIB, RUN_ID, SERVER, delete_bundles,
                             learn_run_metadata, log, on_signal)
from benchlib.instruments import DockerEvents, Proxy
from benchlib.workers import (SEGMENTS, curl_download, curl_upload, docker_floor, make_tree,
                              upload_dependency, worker_rows)
from benchlib.managers import Slurm
from benchlib.slurm_parts import manager_cpu, scale_up, slurm_calls
from benchlib.aws import moto_batch, moto_queue
from benchlib.tiers import tiers_part
from benchlib.sim import sim_part
from benchlib.cold import cold_part
from benchlib.report import Table, fmt, machine, pct
# upload_pairs.py reads these (and SERVER, Proxy, delete_bundles) through `bench`
from benchlib.common import create_dataset, cred_env, curl_auth_header  # noqa: F401


# ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--only", default="worker,floor,scale,calls,aws,cpu,tiers,sim,cold",
                    help="comma-separated parts (worker,floor,scale,calls,aws,cpu,tiers,sim,cold; "
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
    cfg.cold_image_mb = 100 if q else 300
    cfg.cold_dep_mib = 64 if q else 256
    cfg.cold_reps = 1 if q else 3
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
        if parts & {"scale", "calls", "cpu", "tiers", "cold"}:
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
        if "cold" in parts:
            cold_part(cfg, slurm, proxy, tmp, table, results)
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
