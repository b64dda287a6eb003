"""The `tiers` part: our manager with the private Slurm cluster as tier 1 and moto's AWS Batch as
tier 2, beside the same bundles on the Slurm tier alone (ours only).
"""
import collections
import os
import re
import socket
import subprocess
import time
import urllib.request

from .common import ENV, FINAL, PASSWORD, REST, RUN_ID, SERVER, USER, create_runs, log, wait_states
from .instruments import spawn, stop_process
from .aws import moto_active, moto_queue


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
