"""The `sim` part: our manager at a large installation, by simulation
(manager/examples/scale_sim.rs).
"""
import json
import subprocess

from .common import ENV, log


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
