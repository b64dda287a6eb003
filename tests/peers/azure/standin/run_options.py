"""containerRunOptions: the `docker run` options a task's containerSettings may give,
passed on, clamped or ignored (with a note), and the rest refused."""

import shlex

# options passed on to `docker run` (they take a value)
VALUE_OPTS = {
    "--cpus": "--cpus", "--memory": "--memory", "-m": "--memory", "--memory-swap": "--memory-swap",
    "--memory-reservation": "--memory-reservation", "--user": "--user", "-u": "--user",
    "--volume": "--volume", "-v": "--volume", "--mount": "--mount", "--network": "--network",
    "--net": "--network", "--env": "--env", "-e": "--env", "--workdir": "--workdir", "-w": "--workdir",
    "--entrypoint": "--entrypoint", "--shm-size": "--shm-size", "--ulimit": "--ulimit", "--label": "--label",
    "-l": "--label", "--add-host": "--add-host", "--hostname": "--hostname", "-h": "--hostname",
    "--ipc": "--ipc", "--pids-limit": "--pids-limit", "--cpu-shares": "--cpu-shares", "-c": "--cpu-shares",
    "--cpuset-cpus": "--cpuset-cpus", "--group-add": "--group-add", "--tmpfs": "--tmpfs",
    "--stop-signal": "--stop-signal", "--dns": "--dns", "--security-opt": "--security-opt",
    "--cap-add": "--cap-add", "--cap-drop": "--cap-drop", "--device": "--device",
}
# flags passed on
FLAG_OPTS = {"--init", "--read-only", "--privileged"}
# accepted but not used (value-taking ones first); logged
IGNORED_VALUE_OPTS = {"--name", "--gpus", "--restart", "--pull", "--platform", "--stop-timeout", "--cidfile"}
IGNORED_FLAGS = {"--rm", "-d", "--detach", "-i", "--interactive", "-t", "--tty", "-it", "-ti"}


class RunOptionsError(Exception):
    pass


def parse_run_options(text, ncpus):
    """Returns (docker args, notes, network given?) or raises RunOptionsError."""
    try:
        words = shlex.split(text or "")
    except ValueError as err:
        raise RunOptionsError(f"containerRunOptions cannot be split like a shell: {err}")
    args, notes, network = [], [], False
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, inline = w.partition("=") if w.startswith("--") else (w, "", "")
        if not eq:
            name, inline = w, None
        if name in IGNORED_FLAGS and inline is None:
            notes.append(f"ignored {w} (the stand-in runs and removes containers itself)")
            i += 1
            continue
        if name in FLAG_OPTS and inline is None:
            args.append(name)
            i += 1
            continue
        if name in VALUE_OPTS or name in IGNORED_VALUE_OPTS:
            if inline is None:
                if i + 1 >= len(words):
                    raise RunOptionsError(f"option {w} needs a value")
                value = words[i + 1]
                i += 2
            else:
                value = inline
                i += 1
            if name in IGNORED_VALUE_OPTS:
                notes.append(f"ignored {name} {value}")
                continue
            canon = VALUE_OPTS[name]
            if canon == "--cpus":
                try:
                    cpus = float(value)
                except ValueError:
                    raise RunOptionsError(f"--cpus {value!r} is not a number")
                if cpus > ncpus:
                    notes.append(f"--cpus {value} clamped to {ncpus} (this machine's CPUs)")
                    value = str(ncpus)
            if canon == "--network":
                network = True
            args += [canon, value]
            continue
        raise RunOptionsError(
            f"containerRunOptions: {w!r} is not an option the stand-in accepts "
            "(see tests/peers/README.md, Azure Batch stand-in)"
        )
    return args, notes, network
