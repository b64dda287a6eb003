"""The Batch pool and node operations of the HTTP handler (a mixin made for one
Service): get pool, list nodes, get node, remove nodes."""

import json
import re

from .common import ApiError, log, rfc1123


def make_pool_routes(svc):
    a = svc.args

    class PoolRoutes:
        def need_pool(self, pool_id):
            if pool_id.lower() != a.pool_id.lower():
                raise ApiError(404, "PoolNotFound", "The specified pool does not exist.")

        def get_pool(self, pool_id):
            with svc.lock:
                if pool_id.lower() != a.pool_id.lower():
                    raise ApiError(404, "PoolNotFound", "The specified pool does not exist.")
                p = svc.pool_json(self.base())
            p = self.select(p)
            self.send(200, p, {"ETag": p.get("eTag", svc.pool_etag), "Last-Modified": rfc1123(svc.alloc_changed)})

        def list_nodes(self, pool_id):
            self.need_pool(pool_id)
            def collect(after):
                ids = svc.node_ids()
                return [(i + 1, svc.node_json(n, self.base())) for i, n in enumerate(ids) if i + 1 > after]
            self.list_page(collect, f"/pools/{a.pool_id}/nodes")

        def get_node(self, pool_id, node_id):
            self.need_pool(pool_id)
            with svc.lock:
                if node_id not in svc.node_ids():
                    raise ApiError(404, "NodeNotFound", "The specified node does not exist.")
                body = svc.node_json(node_id, self.base())
            self.send(200, self.select(body))

        def remove_nodes(self, pool_id):
            self.need_pool(pool_id)
            try:
                body = json.loads(self.raw_body or b"")
                assert isinstance(body, dict)
            except (ValueError, AssertionError):
                raise ApiError(400, "InvalidRequestBody", "The specified Request Body is not syntactically valid.")
            ids = body.get("nodeList")
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                raise ApiError(400, "MissingRequiredProperty", "A required property was not specified in the request body.",
                               [("PropertyName", "nodeList")])
            if len(ids) > 100:
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "nodeList"), ("Reason", "at most 100 nodes per request")])
            option = body.get("nodeDeallocationOption", "requeue")
            if option not in ("requeue", "terminate", "taskcompletion", "retaineddata"):
                raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                               [("PropertyName", "nodeDeallocationOption"), ("PropertyValue", str(option))])
            rt = body.get("resizeTimeout")
            if rt is not None:
                mt = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?", str(rt))
                secs = mt and (int(mt.group(1) or 0) * 3600 + int(mt.group(2) or 0) * 60 + float(mt.group(3) or 0))
                if not mt or secs < 300:
                    raise ApiError(400, "InvalidPropertyValue", "The value provided for one of the properties in the request body is invalid.",
                                   [("PropertyName", "resizeTimeout"), ("PropertyValue", str(rt)), ("Reason", "at least 5 minutes")])
            with svc.cond:
                if svc.hold or svc.removing:
                    raise ApiError(409, "OperationInvalidForCurrentState",
                                   "The specified operation is not valid for the current state of the resource.",
                                   [("Reason", "the pool's allocation state is not steady")])
                present = svc.node_ids()
                missing = [i for i in ids if i not in present]
                if missing:
                    raise ApiError(404, "NodeNotFound", "The specified node does not exist.", [("NodeId", missing[0])])
                svc.remove_nodes(ids, option)
                svc.cond.notify_all()
            log(f"removenodes {ids} ({option}) accepted")
            self.send(202, None, {"DataServiceId": f"{self.base()}/pools/{a.pool_id}/removenodes"})

    return PoolRoutes
