"""The minimal Blob service for task output files: create container, Put Blob (block
blobs), Get Blob (ranges), Delete Blob, List Blobs; the SAS token checked on every
request; GET /_clw/blobs lists every blob without auth."""

import base64
import hashlib
import hmac
import json
import re
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, quote, unquote, urlsplit
from xml.sax.saxutils import escape as xml_escape

from .common import iso, log, new_etag, now, rfc1123


# ---------------------------------------------------------------------------
# Blob service
# ---------------------------------------------------------------------------
def make_blob_handler(svc):
    a = svc.args
    sas = dict(parse_qsl(a.sas_token.lstrip("?"), keep_blank_values=True))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "clw-blob-standin"
        sys_version = ""

        def log_message(self, fmt, *args):
            pass

        def send(self, status, body=b"", headers=None, content_type=None):
            self.send_response(status)
            self.send_header("x-ms-request-id", str(uuid.uuid4()))
            self.send_header("x-ms-version", self.headers.get("x-ms-version") or "2025-01-05")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)
            self.status = status

        def fail(self, status, code, message, extra=None):
            xml = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
                   f"<Message>{xml_escape(message)}\nRequestId:{uuid.uuid4()}\nTime:{iso(now())}</Message></Error>").encode()
            self.send(status, xml if self.command != "HEAD" else b"", dict({"x-ms-error-code": code}, **(extra or {})), "application/xml")

        def handle_one(self):
            self.status = None
            n = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(n) if n else b""
            sp = urlsplit(self.path)
            q = dict(parse_qsl(sp.query, keep_blank_values=True))
            try:
                if sp.path == "/_clw/blobs" and self.command == "GET":
                    with svc.blob_lock:
                        out = [{"container": c, "name": nme, "size": len(b["data"]), "etag": b["etag"],
                                "last_modified": iso(b["last_modified"]), "url": f"http://127.0.0.1:{a.blob_port}/{c}/{quote(nme)}"}
                               for (c, nme), b in sorted(svc.blobs.items())]
                    return self.send(200, json.dumps(out).encode(), content_type="application/json")
                if not all(hmac.compare_digest(q.get(k, ""), v) for k, v in sas.items()):
                    return self.fail(403, "AuthenticationFailed",
                                     "Server failed to authenticate the request. Make sure the value of Authorization header is formed correctly including the signature.")
                parts = sp.path.lstrip("/").split("/", 1)
                container = unquote(parts[0])
                blob = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
                if not container:
                    return self.fail(400, "InvalidUri", "The requested URI does not represent any resource on the server.")
                with svc.blob_lock:
                    exists = container in svc.containers
                    if blob is None:
                        if self.command == "PUT" and q.get("restype") == "container":
                            if exists:
                                return self.fail(409, "ContainerAlreadyExists", "The specified container already exists.")
                            svc.containers[container] = now()
                            return self.send(201, headers={"ETag": f'"{new_etag()}"', "Last-Modified": rfc1123(now())})
                        if not exists:
                            return self.fail(404, "ContainerNotFound", "The specified container does not exist.")
                        if self.command in ("GET", "HEAD") and q.get("restype") == "container" and q.get("comp") == "list":
                            return self.list_blobs(container, q)
                        if self.command in ("GET", "HEAD") and q.get("restype") == "container":
                            return self.send(200, headers={"ETag": '"0x1"', "Last-Modified": rfc1123(svc.containers[container])})
                        return self.fail(400, "UnsupportedHttpVerb", "The resource doesn't support the specified HTTP verb or query.")
                    if not exists:
                        return self.fail(404, "ContainerNotFound", "The specified container does not exist.")
                    key = (container, blob)
                    if self.command == "PUT":
                        if q.get("comp"):
                            return self.fail(400, "UnsupportedQueryParameter", f"the stand-in only does Put Blob, not comp={q['comp']}")
                        btype = self.headers.get("x-ms-blob-type")
                        if btype is None:
                            return self.fail(400, "MissingRequiredHeader", "An HTTP header that's mandatory for this request is not specified: x-ms-blob-type.")
                        if btype != "BlockBlob":
                            return self.fail(400, "InvalidHeaderValue", f"the stand-in stores only BlockBlob, not {btype}")
                        t = now()
                        old = svc.blobs.get(key)
                        etag = f'"{new_etag()}"'
                        svc.blobs[key] = {"data": data, "etag": etag, "last_modified": t,
                                          "created": old["created"] if old else t,
                                          "content_type": self.headers.get("x-ms-blob-content-type") or self.headers.get("Content-Type") or "application/octet-stream"}
                        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
                        log(f"blob: put {container}/{blob} ({len(data)} bytes)")
                        return self.send(201, headers={"ETag": etag, "Last-Modified": rfc1123(t), "Content-MD5": md5,
                                                       "x-ms-request-server-encrypted": "true"})
                    b = svc.blobs.get(key)
                    if b is None:
                        return self.fail(404, "BlobNotFound", "The specified blob does not exist.")
                    if self.command in ("GET", "HEAD"):
                        hdr = {"ETag": b["etag"], "Last-Modified": rfc1123(b["last_modified"]),
                               "x-ms-blob-type": "BlockBlob", "x-ms-creation-time": rfc1123(b["created"]),
                               "Accept-Ranges": "bytes", "x-ms-server-encrypted": "true"}
                        data, total = b["data"], len(b["data"])
                        rng = self.headers.get("x-ms-range") or self.headers.get("Range")
                        mt = re.match(r"^bytes=(\d+)-(\d*)$", rng or "")
                        if rng and not mt:
                            return self.fail(400, "InvalidRange", f"the stand-in does not understand the range {rng!r}")
                        if mt:
                            first = int(mt.group(1))
                            last = min(int(mt.group(2)) if mt.group(2) else total - 1, total - 1)
                            if first >= total:
                                return self.fail(416, "InvalidRange", "The range specified is invalid for the current size of the resource.",
                                                 {"Content-Range": f"bytes */{total}"})
                            hdr["Content-Range"] = f"bytes {first}-{last}/{total}"
                            return self.send(206, data[first:last + 1], hdr, b["content_type"])
                        return self.send(200, data, hdr, b["content_type"])
                    if self.command == "DELETE":
                        del svc.blobs[key]
                        return self.send(202, headers={"x-ms-delete-type-permanent": "true"})
                    return self.fail(400, "UnsupportedHttpVerb", "The resource doesn't support the specified HTTP verb.")
            finally:
                if not sp.path.startswith("/_clw/"):
                    log(f"blob: {self.command} {sp.path} -> {self.status}")

        def list_blobs(self, container, q):
            prefix = q.get("prefix", "")
            items = sorted((nme, b) for (c, nme), b in svc.blobs.items() if c == container and nme.startswith(prefix))
            x = ['<?xml version="1.0" encoding="utf-8"?>',
                 f'<EnumerationResults ServiceEndpoint="http://127.0.0.1:{a.blob_port}/" ContainerName="{xml_escape(container)}">']
            if prefix:
                x.append(f"<Prefix>{xml_escape(prefix)}</Prefix>")
            x.append("<Blobs>")
            for nme, b in items:
                x.append(
                    f"<Blob><Name>{xml_escape(nme)}</Name><Properties>"
                    f"<Creation-Time>{rfc1123(b['created'])}</Creation-Time>"
                    f"<Last-Modified>{rfc1123(b['last_modified'])}</Last-Modified><Etag>{b['etag']}</Etag>"
                    f"<Content-Length>{len(b['data'])}</Content-Length><Content-Type>{xml_escape(b['content_type'])}</Content-Type>"
                    f"<BlobType>BlockBlob</BlobType><AccessTier>Hot</AccessTier><AccessTierInferred>true</AccessTierInferred>"
                    f"<LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState>"
                    f"<ServerEncrypted>true</ServerEncrypted></Properties></Blob>")
            x.append("</Blobs><NextMarker /></EnumerationResults>")
            self.send(200, "".join(x).encode(), content_type="application/xml")

        do_GET = do_PUT = do_DELETE = do_HEAD = do_POST = handle_one

    return Handler
