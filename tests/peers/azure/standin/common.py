"""Helpers shared by the Azure Batch stand-in's modules: the log, Batch's time and ETag
formats, the loopback check, and ApiError (an error the Batch API answers with)."""

import datetime
import email.utils
import ipaddress
import re
import threading
import time

API_VERSION = "2025-06-01"
LABEL = "org.cl-worker-test.azure-batch"
TASK_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DATE_SKEW = datetime.timedelta(minutes=15)


def log(msg):
    ts = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
    print(f"{ts} {msg}", flush=True)


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def iso(dt):
    """Batch's time format: 7 fractional digits and Z."""
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f") + "0Z"


def rfc1123(dt):
    return email.utils.format_datetime(dt.astimezone(datetime.timezone.utc), usegmt=True)


_etag_lock = threading.Lock()
_etag_last = [0]


def new_etag():
    # Like the service's: 0x + hex of a growing 100 ns counter.
    with _etag_lock:
        v = max(time.time_ns() // 100 + 116444736000000000, _etag_last[0] + 1)
        _etag_last[0] = v
    return "0x%X" % v


def is_loopback_host(host):
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiError(Exception):
    def __init__(self, status, code, message, values=None, headers=None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.values = values or []
        self.headers = headers or {}
