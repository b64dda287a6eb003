"""The `cold` part: a bundle whose image (in the private registry, absent from the engine) and
dependency are not on the machine, staged with no worker; staged -> ready with each manager and
its workers on the private Slurm cluster (Python has no `local` backend; both managers share one
Slurm, one server, one engine and one registry). Then a second bundle needing the same
dependency after the first worker left: its staged -> ready and the bytes its worker downloaded
(counted at the proxy between the workers and the server). Beside them the floor: `docker pull`
of an image of the same size and curl of the same dependency. Three rounds (one in quick mode),
the systems in turn in each: the table gives medians, the JSON every round.
"""
import os
import statistics
import subprocess
import time

from .common import CLEANUP, FINAL, MIB, PASSWORD, RUN_ID, USER, create_runs, log, wait_states
from .instruments import spawn, stop_process
from .managers import manager_argv, python_manager_env, slurm_backend
from .slurm_parts import worker_wrapper
from .workers import curl_download, upload_dependency


def registry():
    """The private registry on 127.0.0.1:80, so that its images' names carry no port: CodaLab
    1.7.5's worker splits an image name at each ':' ("too many values to unpack") and fails
    every image of `127.0.0.1:5000`. The engine reaches it as any loopback registry (HTTPS on
    443 refused, then plain HTTP on 80)."""
    env = dict(os.environ, CLW_REGISTRY_PORT="80")
    subprocess.run(["bash", "tests/peers/registry.sh", "start"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    CLEANUP.add("registry on :80", lambda: subprocess.run(
        ["bash", "tests/peers/registry.sh", "stop"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL))
    out = subprocess.run(["bash", "tests/peers/registry.sh", "env"], check=True, env=env,
                         capture_output=True, text=True).stdout
    return out.split("CLW_REGISTRY=")[1].split()[0].strip("'\"")


def image_in_registry_only(reg, name, mb):
    """The run image with `mb` MB of random bytes on top, pushed and removed from the engine:
    each system gets an image of its own (no layer of it on the engine)."""
    remote = f"{reg}/clw-bench-cold-{name}:{RUN_ID}"
    box = f"clw-bench-cold-{name}-{RUN_ID}"
    subprocess.run(["docker", "run", "--name", box, "--network", "none",
                    "codalab/default-cpu:latest", "bash", "-c",
                    f"head -c {mb}M /dev/urandom > /blob"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["docker", "commit", box, remote], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["docker", "rm", box], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["docker", "push", "-q", remote], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["docker", "rmi", remote], check=True, stdout=subprocess.DEVNULL)
    CLEANUP.add(f"image {remote}", lambda: subprocess.run(
        ["docker", "rmi", "-f", remote], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return remote


def blob_bytes(proxy, dep, after):
    return sum(r["down"] for r in proxy.find(f"/bundles/{dep}/contents/blob/", "GET", after=after))


def staged_to_ready(uuid, timeout):
    """Seconds from the moment the bundle was seen staged to ready."""
    seen, st = wait_states([uuid], lambda s: s[uuid] in FINAL, timeout)
    if st[uuid] != "ready":
        raise RuntimeError(f"cold bundle {uuid} ended {st[uuid]}")
    return seen[uuid]["ready"] - seen[uuid].get("staged", seen[uuid]["ready"])


def one_system(system, cfg, slurm, proxy, tmp, image, dep, prefetch=True, rnd=0):
    tag = f"bench-cold-{system}{'' if prefetch else '-noprefetch'}-{rnd}-{RUN_ID}"
    work = os.path.join(tmp, tag)
    os.makedirs(work)
    deps = [{"parent_uuid": dep, "parent_path": "", "child_path": "dep"}]
    cmd = "du -sb dep"
    meta = dict(request_memory="512m", request_docker_image=image,
                request_disk=f"{4 * cfg.cold_dep_mib}m")
    first = create_runs(cmd, tag, 1, deps=deps, **meta)[0]
    wait_states([first], lambda st: st[first] == "staged", 300)
    binary = cfg.ours_worker if system == "ours" else cfg.py_worker
    g = ["--min-workers", "0", "--max-workers", "1", "--sleep-time", "2",
         "--min-seconds-between-workers", "0", "--worker-idle-seconds", "5",
         "--worker-work-dir-prefix", work, "--worker-executable",
         worker_wrapper(tmp, system, binary)]
    if not prefetch:
        g.append("--no-worker-prefetch")
    argv = manager_argv(system, cfg, tag, g, slurm_backend(system, slurm, work))
    argv[argv.index("--server") + 1] = proxy.url
    env = dict(slurm.env, CODALAB_USERNAME=USER, CODALAB_PASSWORD=PASSWORD)
    if system == "python":
        env["PYTHONPATH"] = python_manager_env(tmp)
    t0 = time.time()
    mgr = spawn(argv, os.path.join(work, "manager.log"), env, cwd=work)
    try:
        _, st = wait_states([first], lambda s: s[first] in FINAL, 1800)
        if st[first] != "ready":
            raise RuntimeError(f"{system}: cold bundle ended {st[first]}; see {work}")
        cold = time.time() - t0
        first_bytes = blob_bytes(proxy, dep, t0)
        # The first worker leaves (idle), then the second bundle comes.
        end = time.time() + 300
        while slurm.run("squeue", "-h", "-o", "%A").strip():
            if time.time() > end:
                raise RuntimeError(f"{system}: the first worker did not leave; see {work}")
            time.sleep(1)
        t1 = time.time()
        second = create_runs(cmd, tag, 1, deps=deps, **meta)[0]
        warm = staged_to_ready(second, 1800)
        second_bytes = blob_bytes(proxy, dep, t1)
    finally:
        stop_process(mgr)
        slurm.cancel_all()
    return {"cold_s": cold, "first_dependency_bytes": first_bytes,
            "second_s": warm, "second_dependency_bytes": second_bytes}


def cold_part(cfg, slurm, proxy, tmp, table, results):
    reg = registry()
    mb = cfg.cold_image_mb
    reps = cfg.cold_reps
    log(f"cold: images of {mb} MB in the registry, dependencies of {cfg.cold_dep_mib} MiB, "
        f"{reps} rounds")
    runs = {"ours": [], "python": [], "ours_no_prefetch": [], "floor": []}
    # Rounds, each system once per round in turn, each time with an image and a dependency of
    # its own: a slow minute of the machine falls on every system alike.
    for rnd in range(reps):
        for key, system, prefetch in (("ours", "ours", True), ("python", "python", True),
                                      ("ours_no_prefetch", "ours", False)):
            image = image_in_registry_only(reg, f"{key.replace('_', '-')}-{rnd}", mb)
            dep = upload_dependency(tmp, cfg.cold_dep_mib * MIB, proxy)
            log(f"cold: round {rnd + 1}: {key}")
            try:
                r = one_system(system, cfg, slurm, proxy, tmp, image, dep, prefetch=prefetch,
                               rnd=rnd)
            except RuntimeError as e:
                # Python's bundle can still fail (its worker's own errors); the row says so.
                if system != "python":
                    raise
                r = {"error": str(e)}
            runs[key].append(r)
            log(f"  {r}")
        # The floor: the pull alone, the download alone.
        image = image_in_registry_only(reg, f"floor-{rnd}", mb)
        t0 = time.time()
        subprocess.run(["docker", "pull", "-q", image], check=True, stdout=subprocess.DEVNULL)
        pull = time.time() - t0
        dep = upload_dependency(tmp, cfg.cold_dep_mib * MIB, proxy)
        download = curl_download(tmp, dep, cfg.cold_dep_mib * MIB, proxy)["seconds"]
        runs["floor"].append({"pull_s": pull, "download_s": download})
        log(f"  floor {runs['floor'][-1]}")
    results["cold"] = runs

    def med(key, field):
        xs = [r[field] for r in runs[key] if "error" not in r]
        return statistics.median(xs) if xs and len(xs) == len(runs[key]) else None

    def spread(key, field):
        xs = [r[field] for r in runs[key] if "error" not in r]
        return f"{min(xs):.1f}-{max(xs):.1f}" if len(xs) > 1 else ""

    errors = [r["error"] for r in runs["python"] if "error" in r]
    note = f"Python's run failed: {errors[0]}" if errors else ""

    def both(field):
        return f"ours {spread('ours', field)}, Python {spread('python', field)}" if reps > 1 \
            else ""

    label = f"{mb} MB image + {cfg.cold_dep_mib} MiB dependency"
    table.add(f"cold worker, {label}: manager start -> ready", med("ours", "cold_s"),
              med("python", "cold_s"), "s", note=note or both("cold_s"))
    n = med("ours_no_prefetch", "cold_s")
    table.add("  ours with --no-worker-prefetch (fetched after the assignment)", n, n, "s",
              note=spread("ours_no_prefetch", "cold_s"))
    pull, download = med("floor", "pull_s"), med("floor", "download_s")
    table.add(f"  floor: `docker pull` of a {mb} MB image alone", pull, pull, "s",
              note="same registry, same engine")
    table.add(f"  floor: curl of a {cfg.cold_dep_mib} MiB dependency alone", download, download,
              "s")
    table.add("second bundle after the first worker left: staged -> ready", med("ours", "second_s"),
              med("python", "second_s"), "s", note=note or both("second_s"))
    mib = {k: med(k, "second_dependency_bytes") for k in ("ours", "python")}
    table.add("  dependency bytes the second worker downloaded",
              mib["ours"] / MIB if mib["ours"] is not None else None,
              mib["python"] / MIB if mib["python"] is not None else None, "MiB", note=note)
