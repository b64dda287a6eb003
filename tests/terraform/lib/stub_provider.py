"""A schema-only Terraform provider (plugin protocol 6) for offline `terraform validate`.

Terraform starts this program as `terraform-provider-<name>` (through a wrapper in the checker's
filesystem mirror) and talks to it over gRPC. It

- prints go-plugin's handshake line `1|6|tcp|127.0.0.1:<port>|grpc|<server cert>` and serves
  TLS with a fresh self-signed certificate when Terraform asks for it (`PLUGIN_CLIENT_CERT`);
- answers GetProviderSchema and GetMetadata from a schema in the `terraform providers schema
  -json` format (built by `jsii_schema.py`); the encoded answer is cached next to the schema;
- accepts every Validate* call (Terraform core itself checks the configuration against the
  schema: argument names, required arguments, block counts, types);
- refuses ConfigureProvider, plan, apply, read, import and functions with an error
  diagnostic: it has no cloud behind it. `terraform test` uses `mock_provider`, which never
  calls them.

Usage (by the wrapper): stub_provider.py --schema aws-6.25.0.json
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import signal
import sys
import threading
from concurrent import futures

MAGIC_COOKIE_KEY = "TF_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2"
SERVICE = "tfplugin6.Provider"


# ---------------------------------------------------------------------------------------------
# Protocol messages: tfplugin6 from the `tf` package, with `Schema.Attribute.write_only` (field
# 11 of protocol 6.8+) added, since that package's copy of the protocol predates it.


def _messages():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from tf.gen import tfplugin_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    tfplugin_pb2.DESCRIPTOR.CopyToProto(fdp)
    for m in fdp.message_type:
        if m.name == "Schema":
            for n in m.nested_type:
                if n.name == "Attribute" and not any(f.number == 11 for f in n.field):
                    n.field.add(
                        name="write_only",
                        number=11,
                        type=descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
                        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                        json_name="writeOnly",
                    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tfplugin6.{name}"))

    return cls


# ---------------------------------------------------------------------------------------------
# JSON schema -> protobuf


def _block(msg, js: dict) -> None:
    msg.version = 0
    for name, a in sorted(js.get("attributes", {}).items()):
        _attribute(msg.attributes.add(), name, a)
    for name, b in sorted(js.get("block_types", {}).items()):
        nb = msg.block_types.add()
        nb.type_name = name
        nb.nesting = {"single": 1, "list": 2, "set": 3, "map": 4, "group": 5}[b["nesting_mode"]]
        nb.min_items = b.get("min_items", 0)
        nb.max_items = b.get("max_items", 0)
        _block(nb.block, b.get("block", {}))


def _attribute(msg, name: str, a: dict) -> None:
    msg.name = name
    if "nested_type" in a:
        nt = a["nested_type"]
        msg.nested_type.nesting = {"single": 1, "list": 2, "set": 3, "map": 4}[nt["nesting_mode"]]
        for n, inner in sorted(nt.get("attributes", {}).items()):
            _attribute(msg.nested_type.attributes.add(), n, inner)
    else:
        msg.type = json.dumps(a["type"], separators=(",", ":")).encode()
    msg.required = bool(a.get("required"))
    msg.optional = bool(a.get("optional"))
    msg.computed = bool(a.get("computed"))
    msg.sensitive = bool(a.get("sensitive"))
    if a.get("write_only"):
        msg.write_only = True


def build_responses(schema_path: str) -> tuple[bytes, bytes, str]:
    """(GetProviderSchema response, GetMetadata response, "source version"), cached on disk."""
    cache_schema = schema_path + ".schema.pb"
    cache_meta = schema_path + ".meta.pb"
    cache_id = schema_path + ".id"
    try:
        if all(os.path.getmtime(p) >= os.path.getmtime(schema_path)
               for p in (cache_schema, cache_meta, cache_id)):
            with open(cache_schema, "rb") as f1, open(cache_meta, "rb") as f2, open(cache_id) as f3:
                return f1.read(), f2.read(), f3.read()
    except OSError:
        pass
    cls = _messages()
    with open(schema_path) as f:
        js = json.load(f)
    (source, ps), = js["provider_schemas"].items()
    version = js.get("provider_versions", {}).get(source, "")
    resp = cls("GetProviderSchema.Response")()
    _block(resp.provider.block, ps["provider"]["block"])
    for name, s in ps.get("resource_schemas", {}).items():
        _block(resp.resource_schemas[name].block, s["block"])
    for name, s in ps.get("data_source_schemas", {}).items():
        _block(resp.data_source_schemas[name].block, s["block"])
    meta = cls("GetMetadata.Response")()
    for name in sorted(ps.get("resource_schemas", {})):
        meta.resources.add().type_name = name
    for name in sorted(ps.get("data_source_schemas", {})):
        meta.data_sources.add().type_name = name
    out = (resp.SerializeToString(), meta.SerializeToString(), f"{source} {version}")
    for p, data in ((cache_schema, out[0]), (cache_meta, out[1])):
        tmp = f"{p}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    tmp = f"{cache_id}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(out[2])
    os.replace(tmp, cache_id)
    return out


def refusal(method: str, identity: str, diag_field: int) -> bytes:
    """A response with one error diagnostic in field `diag_field`, encoded by hand."""

    def ld(field: int, payload: bytes) -> bytes:
        return _varint(field << 3 | 2) + _varint(len(payload)) + payload

    summary = f"{method} is not available offline"
    detail = (f"This {identity} is a schema-only stub for offline checks (tests/terraform): it "
              "validates configurations but cannot configure, plan, apply or read. In "
              "`terraform test`, use `mock_provider`.")
    diag = _varint(1 << 3 | 0) + _varint(1) + ld(2, summary.encode()) + ld(3, detail.encode())
    return ld(diag_field, diag)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# Methods refused, with the field number of their response's diagnostics.
REFUSED = {
    "ConfigureProvider": 1,
    "PlanResourceChange": 4,
    "ApplyResourceChange": 3,
    "ReadResource": 2,
    "ReadDataSource": 2,
    "ImportResourceState": 2,
    "UpgradeResourceState": 2,
    "MoveResourceState": 2,
}
# Methods answered with an empty response (all fields unset).
ACCEPTED = [
    "ValidateProviderConfig",
    "ValidateResourceConfig",
    "ValidateDataResourceConfig",
    "ValidateEphemeralResourceConfig",
    "ValidateListResourceConfig",
    "ValidateActionConfig",
    "GetResourceIdentitySchemas",
    "GetFunctions",
    "StopProvider",
]


# ---------------------------------------------------------------------------------------------
# TLS: a fresh self-signed certificate per run, as go-plugin's AutoMTLS expects


def _certificate() -> tuple[bytes, bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "HashiCorp"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=30))
        .not_valid_after(now + datetime.timedelta(hours=24))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                     key_encipherment=True, data_encipherment=False,
                                     key_agreement=True, key_cert_sign=True, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return (cert.public_bytes(serialization.Encoding.PEM), key_pem,
            cert.public_bytes(serialization.Encoding.DER))


# ---------------------------------------------------------------------------------------------


def serve(schema_path: str) -> int:
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        print("This is a Terraform provider plugin (a schema-only stub); Terraform starts it.",
              file=sys.stderr)
        return 1
    versions = os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "6").split(",")
    if "6" not in versions:
        print(f"plugin protocol 6 not offered (PLUGIN_PROTOCOL_VERSIONS={versions})",
              file=sys.stderr)
        return 1

    import grpc

    schema_bytes, meta_bytes, identity = build_responses(schema_path)
    identity = f"provider {identity}"
    done = threading.Event()

    def unary(fn):
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=lambda b: b, response_serializer=lambda b: b)

    handlers = {
        "GetProviderSchema": unary(lambda req, ctx: schema_bytes),
        "GetMetadata": unary(lambda req, ctx: meta_bytes),
    }
    for m in ACCEPTED:
        handlers[m] = unary(lambda req, ctx: b"")
    for m, field in REFUSED.items():
        answer = refusal(m, identity, field)
        handlers[m] = unary(lambda req, ctx, answer=answer: answer)

    def call_function(req, ctx):
        err = f"functions are not available offline ({identity} is a schema-only stub)"
        payload = _varint(1 << 3 | 2) + _varint(len(err.encode())) + err.encode()
        return _varint(2 << 3 | 2) + _varint(len(payload)) + payload

    handlers["CallFunction"] = unary(call_function)

    def shutdown(req, ctx):
        done.set()
        return b""

    def stdio(req, ctx):
        return iter(())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(SERVICE, handlers),
        grpc.method_handlers_generic_handler("plugin.GRPCController", {"Shutdown": unary(shutdown)}),
        grpc.method_handlers_generic_handler("plugin.GRPCStdio", {
            "StreamStdio": grpc.unary_stream_rpc_method_handler(
                stdio, request_deserializer=lambda b: b, response_serializer=lambda b: b)}),
        grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            # SERVING (status = 1)
            "Check": unary(lambda req, ctx: b"\x08\x01")}),
    ))

    client_cert = os.environ.get("PLUGIN_CLIENT_CERT", "").encode()
    cert_der = b""
    if client_cert:
        cert_pem, key_pem, cert_der = _certificate()
        # Terraform's client certificate is ECDSA P-521, which gRPC's TLS stack does not offer
        # for client authentication; the server certificate is still checked by Terraform. The
        # port is on loopback and serves nothing but a public schema.
        creds = grpc.ssl_server_credentials([(key_pem, cert_pem)], require_client_auth=False)
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    line = f"1|6|tcp|127.0.0.1:{port}|grpc"
    if cert_der:
        line += "|" + base64.b64encode(cert_der).decode().rstrip("=")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Terraform forwards ^C; it ends us itself
    # Terraform stops the plugin when done; if Terraform itself dies, stop too.
    parent = os.getppid()
    while not done.wait(1.0):
        if os.getppid() != parent:
            break
    server.stop(grace=0.2)
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schema", default=os.environ.get("TFCHECK_SCHEMA"), required=False)
    ap.add_argument("--build-only", action="store_true",
                    help="encode the schema (cache it) and exit")
    args = ap.parse_args(argv)
    if not args.schema:
        ap.error("--schema is required")
    if args.build_only:
        _, _, identity = build_responses(args.schema)
        print(identity)
        return 0
    return serve(args.schema)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
