#!/usr/bin/env python3
"""Runs the workspace's test binaries in lanes: first the head (one at a time, alone: the faults
that stop what every lane shares, and what would crowd the engine's networks), then the binaries
of one lane one after another (each with --test-threads=1), the lanes at the same time, then the
serial tail (the rest of the fault suite, which loads the whole machine, and the credentials
scan, which reads what the whole suite left). Binaries are grouped into lanes by the peers they
use, so that lanes running together do not contend for one (one Slurm node, one moto, one
Kubernetes node) while the CodaLab server and the Docker engine, which serve many workers at
once by design, are shared.

    scripts/lanes.py run [--log-dir DIR] [--lanes A,B] [--no-serial] [--phase head|rest]
                         [CARGO_TEST_ARGS...]                   build, run the lanes, report
    scripts/lanes.py list                                       every test name, one per line

`--phase head` runs only the head, `--phase rest` the lanes and the tail (scripts/test.sh starts
the Kubernetes stand-in between the two, built meanwhile). Every test binary Cargo builds is
run: one that no lane names goes to the `other` lane, never
skipped. Each binary's output is printed whole when it ends, under a header naming its lane and
its time; the report at the end has one row per binary (docs/testing.md).
Standard library only.
"""

import json
import os
import subprocess
import sys
import threading
import time

# (package, test target) -> lane. A target can be split by test-name filters: ("hostile",
# "podman") runs only the tests whose names hold "podman", and the unfiltered entry of the same
# target then skips every filter named elsewhere.
LANES = {
    # The worker against the CodaLab server and Docker.
    "worker": [
        ("codalab-worker", "e2e"),
        ("codalab-worker", "e2e_runs"),
        ("codalab-worker", "e2e_read"),
        ("codalab-worker", "e2e_metrics"),
        # What works with CodaLab's worker: checkpoints, the disk quota, absolute dependencies.
        ("codalab-worker", "parity"),
        # Workers that start warm: prefetched images and dependencies, the shared cache (and
        # the private registry).
        ("codalab-worker", "prefetch"),
        ("codalab-worker", "logs"),
        # A fault that touches no shared peer: the work dir is a small file system of its own.
        ("codalab-worker", "faults", "work_dir_file_system_full"),
    ],
    # The hostile-bundle suite under Docker, the dependency cache, and the manager's `local`
    # backend (workers as processes of this machine): the CodaLab server and Docker only.
    "docker": [
        ("codalab-worker", "hostile"),
        ("codalab-worker", "hostile_generated"),
        ("codalab-worker", "run_as_user"),
        ("codalab-worker", "runtime_conformance"),
        ("codalab-worker", "e2e_cache"),
        ("codalab-worker-manager", "e2e_local"),
        ("codalab-worker-manager", "e2e_status"),
        ("codalab-worker-manager", "logs"),
    ],
    # The Kubernetes stand-in (one node agent, nodes node-a and node-b).
    "k8s": [
        ("codalab-worker", "runtime_conformance", "kubernetes"),
        ("codalab-worker", "e2e_k8s_runtime"),
        ("codalab-worker", "hostile", "kubernetes"),
        ("codalab-worker", "hostile_generated", "kubernetes"),
        ("codalab-worker", "parity", "kubernetes"),
        ("codalab-worker-manager", "e2e_k8s"),
    ],
    # Podman's service (only this lane uses it).
    "podman": [
        ("codalab-worker", "e2e_podman"),
        ("codalab-worker", "runtime_conformance", "podman"),
        ("codalab-worker", "hostile", "podman"),
        ("codalab-worker", "hostile_generated", "podman"),
        ("codalab-worker", "run_as_user", "podman"),
        ("codalab-worker", "parity", "podman"),
    ],
    # The one Slurm node: the backend's conformance run, the end-to-end tests, and slurmctld
    # restarted mid-submit (only this lane uses Slurm).
    "slurm": [
        ("codalab-worker-backends", "conformance", "slurm"),
        ("codalab-worker-manager", "e2e_slurm"),
        ("codalab-worker-manager", "faults", "slurmctld"),
    ],
    # moto's AWS Batch: the other backends' conformance runs, the end-to-end tests, and moto
    # restarted mid-tick (only this lane uses moto).
    "cloud": [
        ("codalab-worker-backends", "conformance"),
        ("codalab-worker-manager", "e2e_aws"),
        ("codalab-worker-manager", "faults"),
    ],
    # The Azure Batch stand-in, whose tests reset it: they all run here, one after another;
    # then resource exhaustion (reads, images and dependencies: the CodaLab server and Docker
    # only), which balances the lanes (the `worker` lane was the longest by five minutes).
    "azure": [
        ("codalab-worker-backends", "conformance", "azure"),
        ("codalab-worker-backends", "azure_standin"),
        ("codalab-worker-manager", "e2e_azure"),
        ("codalab-worker", "hostile_bounds"),
    ],
    # No shared peer, or only read-only use of one.
    "light": [
        ("*", "unit"),
        ("codalab-worker", "agent"),
        ("codalab-worker", "resume"),
        ("codalab-worker", "restage"),
        ("codalab-worker", "malformed"),
        ("codalab-worker-manager", "props"),
        ("codalab-worker-manager", "rules"),
        ("codalab-worker-manager", "control_loop"),
        ("codalab-worker-manager", "tier_props"),
        ("codalab-worker-manager", "tiers_loop"),
        ("codalab-worker-manager", "alerts"),
        ("codalab-worker-manager", "deploy"),
        ("codalab-worker-manager", "e2e_images"),
        ("codalab-worker-backends", "azure_golden"),
        ("codalab-worker-backends", "local_backend"),
    ],
}

# Before every lane, one at a time: the faults that stop or restart what every lane shares (the
# CodaLab server and MariaDB, the Docker engine), and Slurm and moto in one manager (up to three
# workers of three Docker networks each, which beside the lanes would crowd the engine's address
# pools: about 30 networks). None needs the Kubernetes stand-in or much CPU (they mostly wait),
# so the stand-in is built meanwhile (scripts/test.sh).
HEAD = [
    ("codalab-worker", "faults", "rest_server_down"),
    ("codalab-worker", "faults", "docker_engine_restarted"),
    ("codalab-worker-manager", "e2e_tiers"),
]

# After every lane, one at a time, in this order: the faults that load the whole machine (100
# runs at once; the unfiltered entry runs every fault that no filter names), then the
# credentials scan.
SERIAL = [
    ("codalab-worker", "faults"),
    ("codalab-worker-manager", "credentials_scan"),
]

# The test the credentials scan runs after the whole suite (skipped everywhere else).
AFTER_THE_WHOLE_SUITE = "after_the_whole_suite"


def build(cargo_args):
    """Builds every test binary once; returns [(package, target, kind, executable, dir)].
    With CLW_TEST_BINARIES, reads that file instead: the JSON messages of the same cargo call,
    made earlier (`.ci/run`, so that the tests need no cargo call, and never wait for the target
    dir's lock, while the Kubernetes stand-in builds there)."""
    cached = os.environ.get("CLW_TEST_BINARIES")
    if cached:
        with open(cached) as f:
            stdout = f.read()
    else:
        cmd = ["cargo", "test", "--workspace", "--all-targets", "--no-run",
               "--message-format=json-render-diagnostics"] + cargo_args
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.exit(f"lanes: {' '.join(cmd)} failed ({proc.returncode})")
        stdout = proc.stdout
    found = []
    for line in stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test"):
            continue
        exe = msg.get("executable")
        if not exe:
            continue
        target = msg["target"]
        package = msg["package_id"]
        name = package_name(package)
        kind = target["kind"][0]
        found.append((name, target["name"], kind, exe,
                      os.path.dirname(msg["manifest_path"])))
    return found


def package_name(package_id):
    # "path+file:///work/main/worker#codalab-worker@0.1.0" or "codalab-worker 0.1.0 (path+…)".
    if "#" in package_id:
        tail = package_id.split("#", 1)[1]
        return tail.split("@", 1)[0] if "@" in tail else os.path.basename(package_id.split("#")[0])
    return package_id.split(" ", 1)[0]


def plan(binaries):
    """The head, the lanes (of (label, executable, dir, extra args)) and the serial tail; the
    binaries no lane, head or tail names go to the `other` lane."""
    by_key = {}
    for name, target, kind, exe, d in binaries:
        key = (name, "unit" if kind in ("lib", "bin", "proc-macro") else target)
        by_key.setdefault(key, []).append((f"{name}/{target}" + ("" if key[1] != "unit" else f" ({kind})"), exe, d))
    filters = {}
    for entries in list(LANES.values()) + [HEAD]:
        for e in entries:
            if len(e) == 3:
                filters.setdefault((e[0], e[1]), []).append(e[2])
    used = set()
    lanes = {}
    for lane, entries in LANES.items():
        runs = []
        for e in entries:
            pkg, target = e[0], e[1]
            keys = [k for k in by_key if k[1] == target and (pkg == "*" or k[0] == pkg)]
            if not keys:
                sys.exit(f"lanes: lane {lane} names {pkg}/{target}, which is no test binary: "
                         "a lane entry that runs nothing")
            for k in keys:
                used.add(k)
                for label, exe, d in by_key[k]:
                    if len(e) == 3:
                        runs.append((f"{label} [{e[2]}]", exe, d, [e[2]]))
                    else:
                        skips = []
                        for f in filters.get(k, []):
                            skips += ["--skip", f]
                        runs.append((label, exe, d, skips))
        lanes[lane] = runs
    head = []
    for e in HEAD + [(pkg, target) for pkg, target in SERIAL]:
        if (e[0], e[1]) not in by_key:
            sys.exit(f"lanes: {e[0]}/{e[1]} is no test binary: an entry that runs nothing")
    for e in HEAD:
        k = (e[0], e[1])
        used.add(k)
        for label, exe, d in by_key.get(k, []):
            if len(e) == 3:
                head.append((f"{label} [{e[2]}]", exe, d, [e[2]]))
            else:
                head.append((label, exe, d, []))
    tail = []
    for pkg, target in SERIAL:
        k = (pkg, target)
        used.add(k)
        skips = []
        for f in filters.get(k, []):
            skips += ["--skip", f]
        for label, exe, d in by_key.get(k, []):
            tail.append((label, exe, d, skips))
    other = [(label, exe, d, []) for k, v in by_key.items() if k not in used for label, exe, d in v]
    if other:
        lanes["other"] = other
    return head, lanes, tail


PRINT = threading.Lock()
# Each failed binary's failing tests with the first lines of their panics, printed again at the
# very end (and written to failures.txt), where a log's tail shows them.
FAILURES = []


def why_failed(out):
    """The `---- name stdout ----` sections' panic lines (a few lines each), or the output's
    last lines when a binary failed without one (a crash, a build error)."""
    lines = out.splitlines()
    picked = []
    name = None
    for i, line in enumerate(lines):
        if line.startswith("---- ") and line.endswith(" stdout ----"):
            name = line[5:-len(" stdout ----")]
        elif name and " panicked at " in line:
            msg = []
            for l in lines[i:i + 8]:
                if l.startswith(("stack backtrace", "note: ")) or (msg and not l.strip()):
                    break
                msg.append(l.strip())
            text = " | ".join(msg)
            picked.append(f"  {name}: " + (text if len(text) <= 1200 else text[:1200] + " …"))
            name = None
    return "\n".join(picked) if picked else "\n".join("  " + l for l in lines[-15:])


def listed(exe, d, args):
    """The number of tests the binary would run with these filters (`--list`)."""
    proc = subprocess.run([exe, "--list", "--format", "terse"] + args, cwd=d,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if proc.returncode != 0:
        return None
    return sum(1 for l in proc.stdout.decode("utf-8", "replace").splitlines() if l.endswith(": test"))


def count_check(label, args, expected, passed, failed, ignored):
    """Why a binary's run does not count: a filter that names no test, or fewer tests run
    than it lists (a test that never ran cannot have passed). `None` when it counts."""
    if expected is None:
        return "its test list could not be read (--list failed)"
    filters = [a for i, a in enumerate(args) if a != "--skip" and (i == 0 or args[i - 1] != "--skip")]
    if expected == 0 and filters:
        return f"no test matches the filter {' '.join(filters)}: a lane entry that runs nothing"
    if passed + failed + ignored != expected:
        return (f"{expected} tests listed, {passed + failed + ignored} run "
                f"({passed} passed, {failed} failed, {ignored} ignored)")
    return None


def run_binary(lane, label, exe, d, args, log):
    args = list(args)
    if "credentials_scan" not in label:
        args += ["--skip", AFTER_THE_WHOLE_SUITE]
    argv = [exe, "--test-threads=1"] + args
    expected = listed(exe, d, args)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    secs = time.monotonic() - t0
    out = proc.stdout.decode("utf-8", "replace")
    passed = failed = ignored = 0
    for line in out.splitlines():
        if line.startswith("test result:"):
            parts = line.replace(";", "").split()
            passed += int(parts[parts.index("passed") - 1])
            failed += int(parts[parts.index("failed") - 1])
            ignored += int(parts[parts.index("ignored") - 1])
    why = count_check(label, args, expected, passed, failed, ignored)
    if why and proc.returncode == 0:
        out += f"\nlanes: {label}: {why}\n"
        proc.returncode = 97
    if proc.returncode != 0:
        with PRINT:
            FAILURES.append(f"{lane} {label} (exit {proc.returncode}):\n" + why_failed(out))
    with PRINT:
        header = f"== [{lane}] {label}: {secs:.0f} s, exit {proc.returncode}"
        print(header, flush=True)
        print(out, flush=True)
        if log:
            with open(log, "a") as f:
                f.write(header + "\n" + out + "\n")
    return (lane, label, secs, passed, failed, proc.returncode)


def run(argv):
    log_dir = None
    only = None
    serial = True
    phase = None
    while argv[:1] and argv[0] in ("--log-dir", "--lanes", "--no-serial", "--phase"):
        if argv[0] == "--phase":
            phase, argv = argv[1], argv[2:]
            if phase not in ("head", "rest"):
                sys.exit(f"lanes: --phase is head or rest, not {phase!r}")
        elif argv[0] == "--log-dir":
            log_dir, argv = argv[1], argv[2:]
            os.makedirs(log_dir, exist_ok=True)
        elif argv[0] == "--lanes":
            only, argv = set(argv[1].split(",")), argv[2:]
        else:
            serial, argv = False, argv[1:]
    binaries = build(argv)
    head, lanes, tail = plan(binaries)
    if only is not None:
        lanes = {k: v for k, v in lanes.items() if k in only}
    if not serial:
        head, tail = [], []
    if phase == "head":
        lanes, tail = {}, []
    elif phase == "rest":
        head = []
    results = []
    t0 = time.monotonic()
    log = os.path.join(log_dir, "head.log") if log_dir else None
    for label, exe, d, args in head:
        results.append(run_binary("head", label, exe, d, args, log))
    head_secs = time.monotonic() - t0

    def lane_thread(lane, runs):
        log = os.path.join(log_dir, f"{lane}.log") if log_dir else None
        for label, exe, d, args in runs:
            results.append(run_binary(lane, label, exe, d, args, log))

    threads = [threading.Thread(target=lane_thread, args=(lane, runs))
               for lane, runs in lanes.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lanes_secs = time.monotonic() - t0 - head_secs
    log = os.path.join(log_dir, "serial.log") if log_dir else None
    for label, exe, d, args in tail:
        results.append(run_binary("serial", label, exe, d, args, log))
    total = time.monotonic() - t0
    print("== test binaries (lane, binary, seconds, passed, failed)")
    for lane, label, secs, passed, failed, code in sorted(results):
        mark = "" if code == 0 else "  <-- FAILED"
        print(f"{lane:11} {label:58} {secs:7.1f} {passed:4} {failed:4}{mark}")
    n_pass = sum(r[3] for r in results)
    n_fail = sum(r[4] for r in results)
    bad = [r for r in results if r[5] != 0]
    print(f"== {n_pass} passed, {n_fail} failed; head {head_secs:.0f} s, "
          f"lanes {lanes_secs:.0f} s, in all {total:.0f} s")
    if FAILURES:
        text = "== failures\n" + "\n".join(FAILURES) + "\n"
        print(text, end="")
        if log_dir:
            with open(os.path.join(log_dir, "failures.txt"), "a") as f:
                f.write(text)
    return 1 if bad else 0


def list_tests(argv):
    names = []
    for name, target, kind, exe, d in build(argv):
        out = subprocess.run([exe, "--list", "--format", "terse"], cwd=d,
                             stdout=subprocess.PIPE, text=True).stdout
        label = f"{name}/{target}" + (f" ({kind})" if kind in ("lib", "bin") else "")
        for line in out.splitlines():
            if line.endswith(": test"):
                names.append(f"{label}::{line[:-len(': test')]}")
    for n in sorted(names):
        print(n)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "list"):
        sys.exit(__doc__)
    sys.exit(run(sys.argv[2:]) if sys.argv[1] == "run" else list_tests(sys.argv[2:]))
