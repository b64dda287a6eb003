"""What the manager parts share: the managers' environment and command lines, logging shims
of the Slurm commands, the private Slurm cluster, and the counting of calls per tick.
"""
import collections
import os
import re
import shutil
import socket
import statistics
import subprocess
import time

from .common import CLEANUP, ENV, RUN_ID, SERVER
from .instruments import spawn, stop_process


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
