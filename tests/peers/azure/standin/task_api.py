"""The Batch job and task operations of the HTTP handler (a mixin made for one
Service): get job, add, list, get, terminate and delete task."""

import json
import shutil
import threading

from .common import TASK_ID_RE, ApiError, iso, log, new_etag, now, rfc1123
from .tasks import Task


def make_task_routes(svc):
    class TaskRoutes:
        def need_job(self, job_id):
            j = svc.job(job_id)
            if j is None:
                raise ApiError(404, "JobNotFound", "The specified job does not exist.")
            return j

        def need_task(self, job_id, task_id):
            self.need_job(job_id)
            t = svc.tasks.get((job_id.lower(), task_id.lower()))
            if t is None:
                raise ApiError(404, "TaskNotFound", "The specified task does not exist.")
            return t

        def get_job(self, job_id):
            with svc.lock:
                j = self.need_job(job_id)
                body = svc.job_json(j, self.base())
            self.send(200, self.select(body), {"ETag": j["eTag"], "Last-Modified": rfc1123(j["lastModified"])})

        def task_view(self, t):
            j = json.loads(json.dumps(t.json))
            j["url"] = f"{self.base()}/jobs/{t.job_id}/tasks/{j['id']}"
            return j

        def add_task(self, job_id):
            try:
                body = json.loads(self.raw_body or b"null")
            except ValueError as err:
                raise ApiError(400, "InvalidRequestBody", f"The specified Request Body is not syntactically valid: {err}")
            if not isinstance(body, dict):
                raise ApiError(400, "InvalidRequestBody", "The specified Request Body is not syntactically valid.")
            for prop in ("id", "commandLine"):
                if not isinstance(body.get(prop), str):
                    raise ApiError(400, "MissingRequiredProperty", "A required property was not specified in the request body.",
                                   [("PropertyName", prop)])
            if not TASK_ID_RE.match(body["id"]):
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "id"), ("PropertyValue", body["id"])])
            cs = body.get("containerSettings")
            if cs is not None and not (isinstance(cs, dict) and isinstance(cs.get("imageName"), str) and cs["imageName"]):
                raise ApiError(400, "MissingRequiredProperty", "A required property was not specified in the request body.",
                               [("PropertyName", "containerSettings.imageName")])
            slots = body.get("requiredSlots", 1)
            if not isinstance(slots, int) or slots < 1:
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "requiredSlots"), ("PropertyValue", str(slots))])
            with svc.cond:
                j = self.need_job(job_id)
                key = (j["id"].lower(), body["id"].lower())
                if key in svc.tasks:
                    raise ApiError(409, "TaskExists", "The specified task already exists.")
                svc.seq += 1
                t = Task(j["id"], body, svc.seq)
                t.slots = slots
                ts = iso(now())
                rest = {"id": body["id"]}
                if body.get("displayName"):
                    rest["displayName"] = body["displayName"]
                rest.update({"eTag": new_etag(), "creationTime": ts, "lastModified": ts, "state": "active",
                             "stateTransitionTime": ts, "commandLine": body["commandLine"]})
                for k in ("containerSettings", "resourceFiles", "outputFiles", "environmentSettings", "affinityInfo",
                          "userIdentity", "dependsOn", "exitConditions", "applicationPackageReferences"):
                    if body.get(k) is not None:
                        rest[k] = body[k]
                if cs is not None:
                    rest["containerSettings"] = dict({"workingDirectory": "taskWorkingDirectory"}, **cs)
                cons = dict(body.get("constraints") or {})
                cons.setdefault("maxWallClockTime", "P10675199DT2H48M5.4775807S")
                cons.setdefault("retentionTime", "P7D")
                cons.setdefault("maxTaskRetryCount", 0)
                rest["constraints"] = cons
                rest["requiredSlots"] = slots
                rest["executionInfo"] = {"retryCount": 0, "requeueCount": 0}
                t.json = rest
                svc.tasks[key] = t
                svc.cond.notify_all()
                log(f"task {j['id']}/{body['id']}: added (active)")
                url = f"{self.base()}/jobs/{j['id']}/tasks/{body['id']}"
                etag, lm = rest["eTag"], rfc1123(now())
            self.send(201, None, {"ETag": etag, "Last-Modified": lm, "DataServiceId": url, "Location": url})

        def get_task(self, job_id, task_id):
            with svc.lock:
                t = self.need_task(job_id, task_id)
                body = dict({"odata.metadata": f"{self.base()}/$metadata#tasks/@Element"}, **self.task_view(t))
            body = self.select(body)
            self.send(200, body, {"ETag": t.json["eTag"], "Last-Modified": rfc1123(now())})

        def list_tasks(self, job_id):
            def collect(after):
                j = self.need_job(job_id)
                tasks = sorted((t for t in svc.tasks.values() if t.job_id == j["id"] and t.seq > after), key=lambda t: t.seq)
                return [(t.seq, self.task_view(t)) for t in tasks]
            with svc.lock:
                job = self.need_job(job_id)["id"]
            self.list_page(collect, f"/jobs/{job}/tasks")

        def terminate_task(self, job_id, task_id):
            with svc.cond:
                t = self.need_task(job_id, task_id)
                state = t.json["state"]
                if state == "completed":
                    raise ApiError(409, "TaskCompleted", "The specified task is already completed.")
                if t.terminate:
                    pass
                elif state == "active":
                    t.terminate = True
                    svc.complete(t, None, "UserError", "TaskEnded", "Task Was Ended by User Request")
                else:
                    t.terminate = True
                    t.wake.set()
                    if state == "running":
                        threading.Thread(target=svc.stop_process, args=(t,), daemon=True).start()
                log(f"task {t.job_id}/{t.json['id']}: terminate requested in state {state}")
            self.send(204)

        def delete_task(self, job_id, task_id):
            with svc.cond:
                t = self.need_task(job_id, task_id)
                t.deleted = True
                t.wake.set()
                del svc.tasks[(t.job_id.lower(), t.json["id"].lower())]
                running = t.json["state"] in ("preparing", "running")
                svc.cond.notify_all()
            if running:
                svc.kill_now(t)
            if t.task_dir:
                shutil.rmtree(t.task_dir, ignore_errors=True)
            log(f"task {t.job_id}/{t.json['id']}: deleted")
            self.send(200)

    return TaskRoutes
