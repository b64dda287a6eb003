"""Azure Batch SharedKey signing, as the Batch service documents it.

Used by golden.py (to print the string-to-sign next to each recorded request
and to check that the SDK's Authorization header is the HMAC of it) and by
the stand-in's request handler (standin/batch_api.py: to verify every request).

String-to-sign (every line ends with "\\n" except the last):

    VERB
    Content-Encoding
    Content-Language
    Content-Length       ("0" for a body-less request that is not GET/HEAD)
    Content-MD5
    Content-Type
    Date                 (empty: the Batch clients send ocp-date instead)
    If-Modified-Since
    If-Match
    If-None-Match
    If-Unmodified-Since
    Range
    ocp-date:<value>     (every header whose lower-cased name contains "ocp-",
                          lower-cased name, sorted, one line each)
    /<account><path>     (the URL path as sent, still percent-encoded)
    <name>:<value>       (one line per query parameter, sorted by name, value
                          percent-decoded; empty values are left out)

Signature = base64(HMAC-SHA256(key = base64-decoded account key, utf-8 bytes)).
Header: "Authorization: SharedKey <account>:<signature>".

Query names: the service documentation lower-cases them; the official SDK
(azure-batch 15.1.0) signs them as sent and uses only the first value of a
repeated name. Every parameter the project's client sends is already
lower-case and single-valued (api-version, maxresults, $filter, $select,
$skiptoken), so both forms give the same string; `query_variants` below lets
the stand-in accept either.
"""

import base64
import hashlib
import hmac
from urllib.parse import parse_qsl

STANDARD_HEADERS = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)


def _query_lines(raw_query, lower_names, first_only):
    values = {}
    order = []
    for name, value in parse_qsl(raw_query, keep_blank_values=True):
        key = name.lower() if lower_names else name
        if key not in values:
            values[key] = []
            order.append(key)
        values[key].append(value)
    lines = []
    for key in sorted(order):
        vals = [v for v in values[key] if v]
        if not vals:
            continue
        value = vals[0] if first_only else ",".join(sorted(vals))
        lines.append(f"{key}:{value}")
    return lines


def string_to_sign(method, account, raw_path, raw_query, headers, *, sdk_query=True):
    """headers: mapping of header name -> value (any case; last one wins).

    sdk_query=True signs query names as sent with the first value (the SDK's
    form); False lower-cases names and joins repeated values with commas (the
    documented form)."""
    method = method.upper()
    h = {}
    for name, value in headers.items():
        if value is None or value == "":
            continue
        h[name.lower()] = str(value)
    if method not in ("GET", "HEAD") and "content-length" not in h:
        h["content-length"] = "0"
    lines = [method]
    lines += [h.get(name, "") for name in STANDARD_HEADERS]
    out = "\n".join(lines) + "\n"
    for name in sorted(n for n in h if "ocp-" in n):
        out += f"{name}:{h[name]}\n"
    out += f"/{account}{raw_path}"
    for line in _query_lines(raw_query or "", lower_names=not sdk_query, first_only=sdk_query):
        out += "\n" + line
    return out


def sign(key_b64, text):
    key = base64.b64decode(key_b64)
    digest = hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def authorization(account, key_b64, text):
    return f"SharedKey {account}:{sign(key_b64, text)}"


def query_variants(method, account, raw_path, raw_query, headers):
    """The distinct strings-to-sign a request may have been signed with:
    the documented form first, then the SDK's form if it differs."""
    a = string_to_sign(method, account, raw_path, raw_query, headers, sdk_query=False)
    b = string_to_sign(method, account, raw_path, raw_query, headers, sdk_query=True)
    return [a] if a == b else [a, b]
