"""The Batch service's HTTP handler: the response and error shapes, the request log and
journal, SharedKey and bearer-token (Entra ID) authentication, throttling, routing, and
what every operation shares ($select, paged listings with $filter and odata.nextLink).
The operations are in pool_api.py and task_api.py, the /_clw/ endpoints in
control_api.py."""

import base64
import datetime
import email.utils
import hmac
import json
import os
import re
import traceback
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import sharedkey

from .common import ApiError, iso, log, now
from .control_api import make_control_routes
from .odata import FilterError, eval_filter, parse_filter
from .pool_api import make_pool_routes
from .task_api import make_task_routes


# ---------------------------------------------------------------------------
# Batch HTTP handler
# ---------------------------------------------------------------------------
def make_batch_handler(svc):
    a = svc.args

    class Handler(make_control_routes(svc), make_task_routes(svc), make_pool_routes(svc), BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "clw-azure-batch-standin"
        sys_version = ""

        def log_message(self, fmt, *args):
            pass

        # -- plumbing --
        def send(self, status, obj=None, headers=None, content_type="application/json;odata=minimalmetadata"):
            body = b"" if obj is None else (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
            self.send_response(status)
            self.send_header("request-id", self.request_id)
            crid = self.headers.get("client-request-id")
            if crid:
                self.send_header("client-request-id", crid)
            self.send_header("DataServiceVersion", "3.0")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if status != 204:
                if body:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)
            self.status = status

        def error(self, e):
            base = svc.base_url(self.headers.get("Host"))
            body = {
                "odata.metadata": f"{base}/$metadata#Microsoft.Azure.Batch.Protocol.Entities.Container.errors/@Element",
                "code": e.code,
                "message": {"lang": "en-US", "value": f"{e.message}\nRequestId:{self.request_id}\nTime:{iso(now())}"},
            }
            if e.values:
                body["values"] = [{"key": k, "value": v} for k, v in e.values]
            self.send(e.status, body, e.headers)

        def handle_one(self):
            self.request_id = str(uuid.uuid4())
            self.status = None
            n = int(self.headers.get("Content-Length") or 0)
            self.raw_body = self.rfile.read(n) if n else b""
            sp = urlsplit(self.path)
            self.raw_path, self.raw_query = sp.path, sp.query
            self.query = {}
            for k, v in parse_qsl(sp.query, keep_blank_values=True):
                self.query.setdefault(k.lower(), v)
            if self.raw_path.startswith("/_clw/"):
                try:
                    self.control()
                except ApiError as e:
                    self.error(e)
                return
            rec = {
                "time": iso(now()), "method": self.command, "path": self.raw_path, "raw_query": self.raw_query,
                "query": sorted([list(p) for p in parse_qsl(sp.query, keep_blank_values=True)]),
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": None, "status": None, "auth": None,
            }
            try:
                rec["body"] = json.loads(self.raw_body) if self.raw_body else None
            except ValueError:
                rec["body"] = self.raw_body.decode("utf-8", "replace")
            try:
                rec["auth"] = self.authenticate()
                self.maybe_throttle()
                self.route()
            except ApiError as e:
                self.error(e)
            except Exception:
                log(f"internal error on {self.command} {self.path}\n{traceback.format_exc()}")
                self.error(ApiError(500, "InternalServerError", "The stand-in failed on this request (see its log)."))
            rec["status"] = self.status
            with svc.lock:
                svc.requests.append(rec)
                # Kept across resets: what the whole suite sent (the credentials scan reads it).
                with open(os.path.join(a.state_dir, "journal.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps(rec, default=str) + "\n")
            log(f"{self.command} {self.path} -> {self.status} ({rec['auth']})")

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = handle_one

        # -- auth --
        def authenticate(self):
            authz = self.headers.get("Authorization") or ""
            if authz.startswith("Bearer "):
                token = None
                if a.token_file and os.path.exists(a.token_file):
                    with open(a.token_file) as f:
                        token = f.read().strip()
                if token and hmac.compare_digest(authz[7:].strip(), token):
                    return "bearer"
                raise ApiError(401, "AuthenticationFailed",
                               "Server failed to authenticate the request. The bearer token is not the configured one.",
                               [("AuthenticationErrorDetail", "The bearer token does not match the stand-in's token file"
                                 if token else "The stand-in has no bearer token configured (--token-file)")],
                               {"WWW-Authenticate": 'Bearer authorization_uri="https://login.microsoftonline.com/common/oauth2/authorize", '
                                                    'error="invalid_token"'})
            if not authz.startswith("SharedKey "):
                raise ApiError(401 if not authz else 403, "AuthenticationFailed",
                               "Server failed to authenticate the request. Make sure the value of Authorization header is "
                               "correctly formed including the signature.",
                               [("AuthenticationErrorDetail", "The Authorization header is missing" if not authz
                                 else "The Authorization header is neither SharedKey nor Bearer")])
            acct, _, sig = authz[10:].strip().partition(":")
            fail = "Server failed to authenticate the request. Make sure the value of Authorization header is correctly formed including the signature."
            if acct != a.account_name:
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", f"The account '{acct}' is not this service's account")])
            date = self.headers.get("ocp-date") or self.headers.get("Date")
            if not date:
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", "The request has neither an ocp-date nor a Date header")])
            try:
                when = email.utils.parsedate_to_datetime(date)
                if when.tzinfo is None:
                    when = when.replace(tzinfo=datetime.timezone.utc)
            except (TypeError, ValueError):
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", f"The date header '{date}' is not an RFC 1123 date")])
            if a.date_skew_minutes >= 0 and abs(now() - when) > datetime.timedelta(minutes=a.date_skew_minutes):
                raise ApiError(403, "AuthenticationFailed", fail,
                               [("AuthenticationErrorDetail", f"Request date header too old: '{date}'")])
            headers = {}
            for k, v in self.headers.items():
                headers[k.lower()] = v
            variants = sharedkey.query_variants(self.command, a.account_name, self.raw_path, self.raw_query, headers)
            for v in variants:
                if hmac.compare_digest(sharedkey.sign(a.account_key, v), sig):
                    return "sharedkey"
            raise ApiError(403, "AuthenticationFailed", fail,
                           [("AuthenticationErrorDetail",
                             f"The MAC signature found in the HTTP request '{sig}' is not the same as any computed "
                             f"signature. Server used following string to sign: '{variants[0]}'.")])

        def maybe_throttle(self):
            with svc.lock:
                th = svc.throttle
                if not th or th["count"] <= 0:
                    return
                th["count"] -= 1
                status, ra = th["status"], th.get("retry_after")
                if th["count"] <= 0:
                    svc.throttle = None
            hdr = {"Retry-After": str(ra)} if ra is not None else {}
            if status == 429:
                raise ApiError(429, "TooManyRequests", "The request rate is too high; retry later.", headers=hdr)
            raise ApiError(503, "ServerBusy", "The server is currently unable to receive requests. Please retry your request.",
                           headers=hdr)

        # -- routing --
        def route(self):
            if "api-version" not in self.query:
                raise ApiError(400, "MissingRequiredQueryParameter", "A query parameter that's mandatory for this request is not specified.",
                               [("QueryParameterName", "api-version")])
            if not re.match(r"^\d{4}-\d{2}-\d{2}(\.\d+\.\d+)?$", self.query["api-version"]):
                raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                               [("QueryParameterName", "api-version"), ("QueryParameterValue", self.query["api-version"])])
            parts = [unquote(p) for p in self.raw_path.split("/") if p]
            m, n = self.command, len(parts)
            if n == 2 and parts[0] == "pools" and m == "GET":
                return self.get_pool(parts[1])
            if n == 3 and parts[0] == "pools" and parts[2] == "nodes" and m == "GET":
                return self.list_nodes(parts[1])
            if n == 4 and parts[0] == "pools" and parts[2] == "nodes" and m == "GET":
                return self.get_node(parts[1], parts[3])
            if n == 3 and parts[0] == "pools" and parts[2] == "removenodes" and m == "POST":
                return self.remove_nodes(parts[1])
            if parts and parts[0] == "jobs" and n >= 2:
                if n == 2 and m == "GET":
                    return self.get_job(parts[1])
                if n == 3 and parts[2] == "tasks" and m == "POST":
                    return self.add_task(parts[1])
                if n == 3 and parts[2] == "tasks" and m == "GET":
                    return self.list_tasks(parts[1])
                if n == 4 and parts[2] == "tasks" and m == "GET":
                    return self.get_task(parts[1], parts[3])
                if n == 4 and parts[2] == "tasks" and m == "DELETE":
                    return self.delete_task(parts[1], parts[3])
                if n == 5 and parts[2] == "tasks" and parts[4] == "terminate" and m == "POST":
                    return self.terminate_task(parts[1], parts[3])
            raise ApiError(400 if parts and parts[0] in ("jobs", "pools") else 404, "InvalidUri" if parts and parts[0] in ("jobs", "pools") else "ResourceNotFound",
                           f"The stand-in does not serve {m} {self.raw_path}.")

        def base(self):
            return svc.base_url(self.headers.get("Host"))

        def select(self, obj):
            sel = self.query.get("$select")
            if not sel:
                return obj
            names = [s.strip() for s in sel.split(",") if s.strip()]
            out = {k: v for k, v in obj.items() if k in names}
            if "odata.metadata" in obj:
                out = dict({"odata.metadata": obj["odata.metadata"]}, **out)
            return out

        def list_page(self, collect, path):
            """One page of a listing: `collect(after)` gives (seq, view) pairs under the lock."""
            q = self.query
            maxr = 1000
            if "maxresults" in q:
                try:
                    maxr = int(q["maxresults"])
                    if not 1 <= maxr <= 1000:
                        raise ValueError
                except ValueError:
                    raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                                   [("QueryParameterName", "maxresults"), ("QueryParameterValue", q["maxresults"]),
                                    ("Reason", "must be an integer from 1 to 1000")])
            flt = None
            if q.get("$filter"):
                try:
                    flt = parse_filter(q["$filter"])
                except FilterError as err:
                    raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                                   [("QueryParameterName", "$filter"), ("QueryParameterValue", q["$filter"]), ("Reason", str(err))])
            after = 0
            if q.get("$skiptoken"):
                try:
                    after = int(json.loads(base64.urlsafe_b64decode(q["$skiptoken"] + "==").decode())["after"])
                except Exception:
                    raise ApiError(400, "InvalidQueryParameterValue", "Value for one of the query parameters specified in the request URI is invalid.",
                                   [("QueryParameterName", "$skiptoken"), ("QueryParameterValue", q["$skiptoken"])])
            with svc.lock:
                views = collect(after)
            if flt is not None:
                views = [(s, v) for s, v in views if eval_filter(flt, v)]
            page, more = views[:maxr], len(views) > maxr
            kind = path.rsplit("/", 1)[-1]
            out = {"odata.metadata": f"{self.base()}/$metadata#{kind}", "value": [self.select(v) for _, v in page]}
            if more:
                tok = base64.urlsafe_b64encode(json.dumps({"after": page[-1][0]}).encode()).decode().rstrip("=")
                params = [("api-version", q["api-version"]), ("maxresults", str(maxr))]
                for k in ("$filter", "$select", "$expand"):
                    if q.get(k):
                        params.append((k, q[k]))
                params.append(("$skiptoken", tok))
                qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in params)
                out["odata.nextLink"] = f"{self.base()}{path}?{qs}"
            self.send(200, out)

    return Handler
