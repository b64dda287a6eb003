"""A task's state (Task) and running it (Runner, a mixin of Service): its directories
and environment, `docker run` (or a process without containerSettings), its end and
failureInfo, terminate (SIGTERM, then SIGKILL), output-file upload and killing it."""

import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
import traceback
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit

from .common import LABEL, is_loopback_host, iso, log, now
from .run_options import RunOptionsError, parse_run_options


class Task:
    def __init__(self, job_id, body, seq):
        self.job_id = job_id
        self.seq = seq
        self.body = body
        self.json = None  # the REST representation (built by the service)
        self.node = None
        self.slots = 1
        self.proc = None
        self.container = None
        self.terminate = False  # terminate requested
        self.deleted = False
        self.notes = []
        self.task_dir = None
        self.wake = threading.Event()
        self.preempted = False  # its node was evicted under it: requeue, do not complete


class Runner:
    # -- running a task ----------------------------------------------------
    def node_root(self, node):
        return os.path.join(os.path.abspath(self.args.state_dir), "nodes", node)

    def task_env(self, t, root, task_dir, wd):
        j = t.json
        admin = ((j.get("userIdentity") or {}).get("autoUser") or {}).get("elevationLevel") == "admin"
        scope = ((j.get("userIdentity") or {}).get("autoUser") or {}).get("scope", "pool")
        env = {
            "AZ_BATCH_ACCOUNT_NAME": self.args.account_name,
            "AZ_BATCH_ACCOUNT_URL": f"http://127.0.0.1:{self.args.port}/",
            "AZ_BATCH_POOL_ID": self.args.pool_id,
            "AZ_BATCH_JOB_ID": t.job_id,
            "AZ_BATCH_TASK_ID": j["id"],
            "AZ_BATCH_NODE_ID": t.node,
            "AZ_BATCH_NODE_IS_DEDICATED": "false" if t.node.endswith("_p") else "true",
            "AZ_BATCH_NODE_ROOT_DIR": root,
            "AZ_BATCH_NODE_SHARED_DIR": os.path.join(root, "shared"),
            "AZ_BATCH_NODE_STARTUP_DIR": os.path.join(root, "startup"),
            "AZ_BATCH_TASK_DIR": task_dir,
            "AZ_BATCH_TASK_WORKING_DIR": wd,
            "AZ_BATCH_TASK_USER": "_azbatch",
            "AZ_BATCH_TASK_USER_IDENTITY": ("PoolAdmin" if admin else "PoolNonAdmin")
            if scope == "pool" else ("TaskAdmin" if admin else "TaskNonAdmin"),
        }
        # The node's instance metadata service (169.254.169.254 on Azure), for
        # `cl-worker --preemption-notice azure`.
        env["CL_WORKER_AZURE_METADATA_ENDPOINT"] = f"http://127.0.0.1:{self.args.port}/_clw/imds/{t.node}"
        for e in j.get("environmentSettings") or []:
            env[e["name"]] = e.get("value") or ""
        return env

    def run_task(self, t):
        try:
            self._run_task(t)
        except Exception:
            log(f"task {t.json['id']}: internal error\n{traceback.format_exc()}")
            with self.cond:
                if t.json["state"] != "completed":
                    self.complete(t, None, "ServerError", "StandinInternalError", "The stand-in failed to run the task (see its log)",
                                  category="servererror")

    def _run_task(self, t):
        j = t.json
        root = self.node_root(t.node)
        task_dir = os.path.join(root, "workitems", t.job_id, "job-1", j["id"])
        wd = os.path.join(task_dir, "wd")
        with self.cond:
            t.task_dir = task_dir
            j["nodeInfo"] = {
                "affinityId": f"TVM:{t.node}",
                "nodeUrl": f"http://127.0.0.1:{self.args.port}/pools/{self.args.pool_id}/nodes/{t.node}",
                "poolId": self.args.pool_id,
                "nodeId": t.node,
                "taskRootDirectory": f"workitems/{t.job_id}/job-1/{j['id']}",
                "taskRootDirectoryUrl": f"http://127.0.0.1:{self.args.port}/pools/{self.args.pool_id}/nodes/{t.node}"
                f"/files/workitems/{t.job_id}/job-1/{j['id']}",
            }
        if os.path.isdir(task_dir):
            shutil.rmtree(task_dir, ignore_errors=True)
        for d in (os.path.join(root, "shared"), os.path.join(root, "startup"), wd):
            os.makedirs(d, exist_ok=True)
        for d in (root, os.path.join(root, "workitems"), task_dir, wd):
            try:
                os.chmod(d, 0o777)
            except OSError:
                pass
        env = self.task_env(t, root, task_dir, wd)
        t.wake.wait(self.args.prepare_seconds)
        with self.cond:
            if t.deleted:
                return
            if t.preempted:
                self.requeue(t)
                return
            if t.terminate:
                self.complete(t, None, "UserError", "TaskEnded", "Task Was Ended by User Request")
                return

        cs = j.get("containerSettings")
        stdout_path = os.path.join(task_dir, "stdout.txt")
        stderr_path = os.path.join(task_dir, "stderr.txt")
        try:
            argv_task = shlex.split(j["commandLine"])
        except ValueError as err:
            with self.cond:
                self.complete(t, None, "UserError", "CommandLineInvalid", f"commandLine cannot be split: {err}")
            return
        popen_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT")}
        envfile = None
        if cs:
            try:
                run_args, notes, has_network = parse_run_options(cs.get("containerRunOptions"), self.ncpus)
            except RunOptionsError as err:
                log(f"task {j['id']}: rejected: {err}")
                with self.cond:
                    self.complete(t, None, "UserError", "ContainerRunOptionsRejected", str(err))
                return
            for n in notes:
                log(f"task {j['id']}: containerRunOptions: {n}")
            t.notes += notes
            image = cs["imageName"]
            if ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
                image += ":latest"
            chk = subprocess.run([self.args.docker, "image", "inspect", "--format", "{{.Id}}", image],
                                 capture_output=True, text=True)
            if chk.returncode != 0:
                with self.cond:
                    self.complete(t, None, "UserError", "ContainerPullImageFailed",
                                  f"The container image {image} is not in the local Docker engine (the stand-in never pulls)",
                                  details=[("Message", chk.stderr.strip()[:500])], started=True)
                return
            t.container = f"clw-az-{self.instance}-{j['id'].lower()}-{t.seq}"
            cidfile = os.path.join(self.args.state_dir, "run", f"{t.container}.cid")
            os.makedirs(os.path.dirname(cidfile), exist_ok=True)
            for f in (cidfile,):
                if os.path.exists(f):
                    os.unlink(f)
            argv = [self.args.docker, "run", "--name", t.container, "--pull", "never", "--cidfile", cidfile,
                    "--label", f"{LABEL}={self.instance}", "--label", f"{LABEL}.task={t.job_id}/{j['id']}",
                    "-v", f"{root}:{root}"]
            if (cs.get("workingDirectory") or "taskWorkingDirectory") == "taskWorkingDirectory":
                argv += ["-w", wd]
            if not has_network and self.args.container_network:
                argv += ["--network", self.args.container_network]
            # Batch's variables first, then containerRunOptions (whose -e win).
            multiline = {k: v for k, v in env.items() if "\n" in v}
            envfile = os.path.join(self.args.state_dir, "run", f"{t.container}.env")
            fd = os.open(envfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                for k, v in env.items():
                    if k not in multiline:
                        f.write(f"{k}={v}\n")
            argv += ["--env-file", envfile]
            for k, v in multiline.items():
                argv += ["-e", f"{k}={v}"]
            argv += run_args
            argv.append(image)
            argv += argv_task
        else:
            cidfile = None
            argv = argv_task
            if not argv:
                with self.cond:
                    self.complete(t, None, "UserError", "CommandLineInvalid", "commandLine is empty")
                return
            popen_env = dict(popen_env, **env)

        log(f"task {j['id']}: run {' '.join(shlex.quote(a) for a in argv)}")
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            with self.cond:
                if t.deleted:
                    return
                try:
                    t.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                              cwd=wd, env=popen_env, start_new_session=True)
                except OSError as e:
                    self.complete(t, None, "UserError", "CommandProgramNotFound", str(e), started=True)
                    return
            cid = None
            if cidfile:
                for _ in range(200):  # the cidfile appears once the container exists
                    if os.path.exists(cidfile) and os.path.getsize(cidfile) > 0 or t.proc.poll() is not None:
                        break
                    time.sleep(0.05)
                if os.path.exists(cidfile):
                    with open(cidfile) as f:
                        cid = f.read().strip() or None
            with self.cond:
                if t.deleted:
                    return
                j["executionInfo"] = {"startTime": iso(now()), "retryCount": 0, "requeueCount": 0}
                if cid:
                    j["executionInfo"]["containerInfo"] = {"containerId": cid, "state": "running", "error": ""}
                self.set_state(t, "running")
                if t.terminate:
                    threading.Thread(target=self.stop_process, args=(t,), daemon=True).start()
            code = t.proc.wait()
        if envfile and os.path.exists(envfile):
            os.unlink(envfile)
        started = True
        cerror = ""
        if cidfile:
            ins = subprocess.run([self.args.docker, "inspect", "--format", "{{.State.StartedAt}}|{{.State.Error}}", t.container],
                                 capture_output=True, text=True)
            if ins.returncode == 0:
                started_at, _, cerror = ins.stdout.strip().partition("|")
                started = not started_at.startswith("0001-")
            else:
                started = os.path.exists(cidfile) and os.path.getsize(cidfile) > 0 and code != 125
            subprocess.run([self.args.docker, "rm", "-f", t.container], capture_output=True)
            if os.path.exists(cidfile):
                os.unlink(cidfile)
        with self.cond:
            if t.deleted:
                return
            if t.preempted:
                self.requeue(t)
                return
            ei = j.setdefault("executionInfo", {"retryCount": 0, "requeueCount": 0})
            if "containerInfo" in ei:
                ei["containerInfo"]["state"] = "exited"
                ei["containerInfo"]["error"] = cerror
        if cidfile and not started:
            with open(stderr_path, "rb") as f:
                msg = f.read().decode("utf-8", "replace").strip()[-500:]
            with self.cond:
                self.complete(t, None, "UserError", "ContainerStartFailed",
                              "The container could not be created or started", details=[("Message", msg)], started=True)
            return
        result = "success" if code == 0 else "failure"
        upload_error = self.upload_outputs(t, env, wd, result)
        with self.cond:
            if t.deleted:
                return
            if t.terminate:
                self.complete(t, code, "UserError", "TaskEnded", "Task Was Ended by User Request", started=True)
            elif code != 0:
                self.complete(t, code, "UserError", "FailureExitCode",
                              "The task exited with an exit code representing a failure",
                              details=[("Message", "The task exited with an exit code representing a failure")], started=True)
            elif upload_error:
                self.complete(t, code, "UserError", upload_error[0], upload_error[1], started=True)
            else:
                self.complete(t, code, None, None, None, started=True)

    def complete(self, t, exit_code, category, code, message, details=None, started=False):
        """Marks t completed (caller holds the lock)."""
        j = t.json
        ei = j.setdefault("executionInfo", {"retryCount": 0, "requeueCount": 0})
        ts = iso(now())
        if started and "startTime" not in ei:
            ei["startTime"] = ts
        ei["endTime"] = ts
        if exit_code is not None:
            ei["exitCode"] = exit_code
        if code:
            ei["result"] = "failure"
            fi = {"category": category.lower(), "code": code, "message": message}
            if details:
                fi["details"] = [{"name": n, "value": v} for n, v in details]
            ei["failureInfo"] = fi
        else:
            ei["result"] = "success"
        t.proc = None
        self.set_state(t, "completed")
        t.wake.set()
        self.cond.notify_all()

    def stop_process(self, t):
        """SIGTERM, then SIGKILL after --kill-after seconds."""
        if t.container:
            # The container may not exist yet right after `docker run` started: retry briefly.
            for _ in range(50):
                r = subprocess.run([self.args.docker, "stop", "-t", str(self.args.kill_after), t.container],
                                   capture_output=True, text=True)
                proc = t.proc
                if r.returncode == 0 or proc is None or proc.poll() is not None:
                    return
                time.sleep(0.1)
            log(f"task {t.json['id']}: docker stop {t.container} failed: {r.stderr.strip()}")
            return
        proc = t.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(self.args.kill_after)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- output files ------------------------------------------------------
    def upload_outputs(self, t, env, wd, result):
        """Uploads outputFiles per uploadCondition; returns (code, message) of the first failure or None."""
        first_error = None

        def expand(s):
            s = re.sub(r"%([A-Za-z_][A-Za-z0-9_]*)%", lambda mt: env.get(mt.group(1), mt.group(0)), s)
            return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda mt: env.get(mt.group(1), mt.group(0)), s)

        for of in t.json.get("outputFiles") or []:
            cond = ((of.get("uploadOptions") or {}).get("uploadCondition") or "taskcompletion").lower()
            if cond == "tasksuccess" and result != "success" or cond == "taskfailure" and result != "failure":
                continue
            dest = ((of.get("destination") or {}).get("container") or {})
            url = dest.get("containerUrl")
            if not url:
                continue
            pattern = expand(of.get("filePattern", ""))
            if not os.path.isabs(pattern):
                pattern = os.path.normpath(os.path.join(wd, pattern))
            wild = any(c in pattern for c in "*?[")
            files = sorted(f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
            prefix_dir = pattern
            if wild:
                parts = pattern.split("/")
                k = next(i for i, p in enumerate(parts) if any(c in p for c in "*?["))
                prefix_dir = "/".join(parts[:k]) or "/"
            for f in files:
                if wild:
                    rel = os.path.relpath(f, prefix_dir)
                    name = f"{dest['path'].rstrip('/')}/{rel}" if dest.get("path") else rel
                else:
                    name = dest.get("path") or os.path.basename(f)
                err = self.put_blob(url, name, f)
                if err:
                    log(f"task {t.json['id']}: upload of {f} as {name} failed: {err[1]}")
                    first_error = first_error or err
                else:
                    log(f"task {t.json['id']}: uploaded {f} as {name}")
        return first_error

    def put_blob(self, container_url, name, path):
        sp = urlsplit(container_url)
        if sp.scheme != "http" or not is_loopback_host(sp.hostname or ""):
            return ("FileUploadMiscError", f"the stand-in uploads only to http:// loopback container URLs, not {sp.scheme}://{sp.hostname}")
        url = f"http://{sp.netloc}{sp.path.rstrip('/')}/{quote(name)}" + (f"?{sp.query}" if sp.query else "")
        with open(path, "rb") as f:
            data = f.read()
        req = urllib.request.Request(url, data=data, method="PUT", headers={
            "x-ms-blob-type": "BlockBlob", "x-ms-version": "2025-01-05", "Content-Type": "text/plain"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
            return None
        except urllib.error.HTTPError as e:
            code = {403: "FileUploadAuthenticationFailed", 404: "FileUploadContainerNotFound"}.get(e.code, "FileUploadMiscError")
            return (code, f"upload of {name} failed: HTTP {e.code} {e.read()[:200]!r}")
        except OSError as e:
            return ("FileUploadMiscError", f"upload of {name} failed: {e}")

    def kill_now(self, t, timeout=20):
        """Kills a deleted task's container or process and waits until `docker run` returned."""
        end = time.monotonic() + timeout
        while True:
            proc = t.proc
            if t.container:
                subprocess.run([self.args.docker, "rm", "-f", t.container], capture_output=True)
            elif proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            # t.deleted is set, so no new process starts (run_task checks it under the lock before Popen)
            if proc is None or proc.poll() is not None:
                return
            if time.monotonic() > end:
                log(f"task {t.json['id']}: could not stop {t.container or proc.pid} within {timeout} s")
                return
            time.sleep(0.1)
