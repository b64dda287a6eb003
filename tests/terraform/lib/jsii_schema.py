"""Rebuild a Terraform provider schema from a cdktf provider package.

A `cdktf-cdktf-provider-<name>` wheel carries `<pkg>/_jsii/<name>@<version>.jsii.tgz`, an npm
tarball with the jsii assembly (`package/.jsii`, JSON) and the generated JavaScript
(`package/lib/<resource>/index.js`). Together they hold what `terraform validate` needs:

- the assembly: every resource, data source and the provider as a class, its configuration as
  a datatype interface whose properties carry the argument's type, whether it is optional, and
  its Terraform name (in the registry link of the property's docs, `...#<name> ...}`);
- the JavaScript: for every argument whether it is a block or an attribute and whether it is a
  list, a set, a map or a single object (`isBlock`/`type` in the `...ToHclTerraform`
  functions), and the Terraform names of the computed attributes (`getStringAttribute('arn')`,
  `new XList(this, "name", wrapsSet)`).

The result is the `terraform providers schema -json` format (`provider_schemas` ->
`provider`, `resource_schemas`, `data_source_schemas`), which `stub_provider.py` serves.

Known limits (what the generated code does not carry): optional+computed is indistinguishable
from optional (every optional argument is served as optional+computed), sensitive and
deprecated marks, min/max item
counts other than "required" (min 1) and "single object" (max 1), enum and range checks, and
ephemeral resources. Arguments whose name ends in `_wo` are served as write-only.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
import zipfile
from typing import Any

# ---------------------------------------------------------------------------------------------
# Reading the package

_ANCHOR = re.compile(r"#([A-Za-z0-9_]+) [A-Za-z0-9_]+#[A-Za-z0-9_]+\}")
_VERSION = re.compile(r"registry\.terraform\.io/providers/([^/]+)/([^/]+)/([^/]+)/docs")


def read_wheel(path: str) -> tuple[dict, dict[str, str]]:
    """The assembly and the JavaScript files ({"lib/x/index.js": text}) of a cdktf wheel."""
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
        if len(names) != 1:
            raise ValueError(f"{path}: expected one _jsii/*.jsii.tgz, found {names}")
        blob = z.read(names[0])
    return read_tarball(io.BytesIO(blob))


def read_tarball(fileobj) -> tuple[dict, dict[str, str]]:
    assembly_bytes = None
    gz_bytes = None
    js: dict[str, str] = {}
    with tarfile.open(fileobj=fileobj, mode="r:gz") as tar:
        for m in tar:
            if not m.isfile():
                continue
            name = m.name[len("package/"):] if m.name.startswith("package/") else m.name
            if name == ".jsii":
                assembly_bytes = tar.extractfile(m).read()
            elif name == ".jsii.gz":
                gz_bytes = tar.extractfile(m).read()
            elif name.startswith("lib/") and name.endswith(".js"):
                js[name] = tar.extractfile(m).read().decode("utf-8")
    if assembly_bytes is None:
        raise ValueError("no package/.jsii in the tarball")
    assembly = json.loads(assembly_bytes)
    if assembly.get("schema") == "jsii/file-redirect":
        if gz_bytes is None:
            raise ValueError("the .jsii redirects to a compressed file that is missing")
        assembly = json.loads(gzip.decompress(gz_bytes))
    return assembly, js


# ---------------------------------------------------------------------------------------------
# The JavaScript: block/attribute kinds and computed attribute names


class JsModule:
    """What one generated `lib/<module>/index.js` says about its types."""

    _HCL_HEAD = re.compile(
        r"^function (\w+)ToHclTerraform\(struct\) \{|^    synthesizeHclAttributes\(\) \{", re.M
    )
    _HCL_ENTRY = re.compile(
        r"^\s+(\w+): \{\n\s+value: .*\n\s+isBlock: (true|false),\n\s+type: \"(\w+)\",\n"
        r"\s+storageClassType: \"([^\"]+)\",",
        re.M,
    )
    _CLASS = re.compile(r"^class (\w+) extends ([\w.]+) \{", re.M)
    _GET_SIMPLE = re.compile(
        r"^    get (\w+)\(\) \{\n\s+return this\.get(\w+)Attribute\('([^']+)'\);", re.M
    )
    _NEW_FIELD = re.compile(r"this\._(\w+) = new ([\w.]+)\(this, \"([^\"]+)\"(?:, (true|false))?\)")
    _GET_FIELD = re.compile(r"^    get (\w+)\(\) \{\n\s+return this\._(\w+);\n", re.M)

    def __init__(self, text: str):
        self.classes: dict[str, str] = {}  # class name -> base
        # HCL kinds: struct/class name -> {tf name: (is_block, type, storage class)}
        self.hcl: dict[str, dict[str, tuple[bool, str, str]]] = {}
        # getters: class name -> {js getter: (tf name, kind)}; kind is "String", "Number", ...
        # or ("class", ClassName, wraps_set)
        self.getters: dict[str, dict[str, tuple[str, Any]]] = {}

        class_spans = [(m.start(), m.group(1), m.group(2)) for m in self._CLASS.finditer(text)]
        for _, name, base in class_spans:
            self.classes[name] = base
        bounds = [s for s, _, _ in class_spans] + [len(text)]
        for i, (start, name, _) in enumerate(class_spans):
            body = text[start:bounds[i + 1]]
            fields = {
                m.group(1): (m.group(3), ("class", m.group(2), m.group(4) == "true"))
                for m in self._NEW_FIELD.finditer(body)
            }
            g: dict[str, tuple[str, Any]] = {}
            for m in self._GET_SIMPLE.finditer(body):
                g[m.group(1)] = (m.group(3), m.group(2))
            for m in self._GET_FIELD.finditer(body):
                if m.group(2) in fields and m.group(1) not in g:
                    g[m.group(1)] = fields[m.group(2)]
            self.getters[name] = g

        heads = list(self._HCL_HEAD.finditer(text))
        for i, h in enumerate(heads):
            end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
            if h.group(1):
                owner = h.group(1)[0].upper() + h.group(1)[1:]
            else:
                owner = None
                for s, name, _ in class_spans:
                    if s < h.start():
                        owner = name
            entries = {
                m.group(1): (m.group(2) == "true", m.group(3), m.group(4))
                for m in self._HCL_ENTRY.finditer(text, h.start(), end)
            }
            if owner:
                self.hcl[owner] = entries


# ---------------------------------------------------------------------------------------------
# Conversion


def _strip_union(t: dict) -> dict:
    """`IResolvable | X` -> X (the token alternative every argument has)."""
    if "union" in t:
        rest = [u for u in t["union"]["types"] if u.get("fqn") != "cdktf.IResolvable"]
        if len(rest) == 1:
            return _strip_union(rest[0])
        prims = [u.get("primitive") for u in rest]
        if prims and all(prims):
            return {"primitive": "any"}
        return rest[0] if rest else {"primitive": "any"}
    return t


def _tf_name(prop: dict) -> str | None:
    docs = prop.get("docs", {})
    for field in ("remarks", "summary"):
        m = _ANCHOR.search(docs.get(field, ""))
        if m:
            return m.group(1)
    return None


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


_PRIMS = {"string": "string", "number": "number", "boolean": "bool", "any": "dynamic", "json": "dynamic"}
_SIMPLE_KINDS = {
    "String": "string",
    "Number": "number",
    "Boolean": "bool",
    "List": ["list", "string"],
    "NumberList": ["list", "number"],
    "StringMap": ["map", "string"],
    "NumberMap": ["map", "number"],
    "BooleanMap": ["map", "bool"],
    "AnyMap": ["map", "dynamic"],
}
_CDKTF_CLASSES = {
    "cdktf.StringMap": ["map", "string"],
    "cdktf.NumberMap": ["map", "number"],
    "cdktf.BooleanMap": ["map", "bool"],
    "cdktf.AnyMap": ["map", "dynamic"],
    "cdktf.StringMapList": ["list", ["map", "string"]],
    "cdktf.NumberMapList": ["list", ["map", "number"]],
    "cdktf.BooleanMapList": ["list", ["map", "bool"]],
    "cdktf.AnyMapList": ["list", ["map", "dynamic"]],
    "cdktf.StringListList": ["list", ["list", "string"]],
    "cdktf.NumberListList": ["list", ["list", "number"]],
}


class Converter:
    def __init__(self, assembly: dict, js: dict[str, str]):
        self.types: dict[str, dict] = assembly["types"]
        self.assembly_name: str = assembly["name"]
        self._js_text = js
        self._js: dict[str, JsModule] = {}
        self.namespace, self.provider_name, self.version = self._provider_identity()

    # -- lookups

    def _provider_identity(self) -> tuple[str, str, str]:
        for t in self.types.values():
            if t.get("kind") == "class" and t.get("base") == "cdktf.TerraformProvider":
                m = _VERSION.search(json.dumps(t.get("docs", {})))
                if m:
                    return m.group(1), m.group(2), m.group(3)
        raise ValueError(f"{self.assembly_name}: no provider class with a registry link")

    def js_for(self, fqn: str) -> JsModule | None:
        t = self.types.get(fqn)
        if not t:
            return None
        fname = t.get("locationInModule", {}).get("filename", "")
        # src/<resource>/index.ts, or for large resources the structs split out of it,
        # src/<resource>/index-structs/structsN.ts.
        m = re.match(r"src/(.+)\.ts$", fname)
        if not m:
            return None
        key = f"lib/{m.group(1)}.js"
        if key not in self._js:
            text = self._js_text.get(key)
            if text is None:
                return None
            self._js[key] = JsModule(text)
        return self._js[key]

    def _props(self, fqn: str) -> list[dict]:
        """Properties of an interface, with those of the interfaces it extends."""
        t = self.types[fqn]
        out = list(t.get("properties", []))
        for parent in t.get("interfaces", []):
            if parent in self.types:
                out += self._props(parent)
        return out

    # -- types

    def _value_type(self, t: dict, hcl_type: str | None = None) -> Any:
        """A cty type (JSON form) for a jsii type used as an attribute."""
        t = _strip_union(t)
        if "primitive" in t:
            return _PRIMS.get(t["primitive"], "dynamic")
        if "collection" in t:
            c = t["collection"]
            elem = self._value_type(c["elementtype"])
            if c["kind"] == "map":
                return ["map", elem]
            return ["set" if hcl_type == "set" else "list", elem]
        fqn = t.get("fqn", "")
        if fqn in self.types and self.types[fqn].get("datatype"):
            return ["object", {a: v["type"] for a, v in self._struct_block(fqn)["attributes"].items()}]
        return "dynamic"

    def _class_type(self, cls_fqn: str, wraps_set: bool, seen: frozenset = frozenset()) -> Any:
        """A cty type for a computed attribute held by a generated class (List/Map/OutputReference)."""
        if cls_fqn in _CDKTF_CLASSES:
            return _CDKTF_CLASSES[cls_fqn]
        full = cls_fqn if "." in cls_fqn and cls_fqn in self.types else None
        if full is None:
            return "dynamic"
        if full in seen:
            return "dynamic"
        t = self.types[full]
        base = t.get("base", "")
        if base in ("cdktf.ComplexList", "cdktf.ComplexMap"):
            ref = None
            for m in t.get("methods", []):
                if m.get("name") == "get":
                    ref = m.get("returns", {}).get("type", {}).get("fqn")
            if not ref:
                return "dynamic"
            elem = self._class_type(ref, False, seen | {full})
            if base == "cdktf.ComplexMap":
                return ["map", elem]
            return ["set" if wraps_set else "list", elem]
        if base == "cdktf.ComplexObject":
            attrs = {}
            for name, a in self._computed_getters(full, set(), seen | {full}).items():
                attrs[name] = a["type"]
            return ["object", attrs]
        return "dynamic"

    def _computed_getters(self, cls_fqn: str, config_names: set[str], seen: frozenset = frozenset()) -> dict:
        """Attributes of a class that are read-only getters and not configuration."""
        js = self.js_for(cls_fqn)
        t = self.types.get(cls_fqn, {})
        if js is None:
            return {}
        short = t["name"]
        getters = js.getters.get(short, {})
        ns = cls_fqn.rsplit(".", 1)[0]
        out: dict[str, dict] = {}
        for p in t.get("properties", []):
            if p.get("static") or not p.get("immutable") or p["name"].endswith("Input"):
                continue
            if p["name"] in ("internalValue", "fqn", "terraformResourceType"):
                continue
            g = getters.get(p["name"])
            if g is None:
                continue
            tf_name, kind = g
            if tf_name in config_names:
                continue
            if isinstance(kind, tuple):
                cls = kind[1]
                cls_full = cls if cls.startswith("cdktf.") else f"{ns}.{cls}"
                ty = self._class_type(cls_full, kind[2], seen)
            else:
                ty = _SIMPLE_KINDS.get(kind, "dynamic")
            out[tf_name] = {"type": ty, "computed": True}
        return out

    # -- blocks

    def _struct_block(self, fqn: str, owner_cls: str | None = None, drop: tuple = ()) -> dict:
        """The block schema of a configuration struct (datatype interface)."""
        t = self.types[fqn]
        js = self.js_for(fqn)
        short = t["name"]
        hcl_key = owner_cls or short
        hcl = js.hcl.get(hcl_key, {}) if js else {}
        attributes: dict[str, dict] = {}
        block_types: dict[str, dict] = {}
        for p in self._props(fqn):
            if p.get("static"):
                continue
            tf = _tf_name(p)
            if tf is None:
                # Meta-arguments (count, provider, ...) come from cdktf's own interfaces.
                continue
            if tf in drop:
                continue
            optional = bool(p.get("optional"))
            is_block, hcl_type, _storage = hcl.get(tf, (None, None, None))
            ptype = _strip_union(p["type"])
            struct_fqn = self._struct_of(ptype)
            if struct_fqn and is_block is not False:
                single = "fqn" in ptype
                if hcl_type == "struct":
                    nesting, max_items = "single", None
                elif single:
                    nesting, max_items = "list", 1
                elif hcl_type == "map":
                    nesting, max_items = "map", None
                else:
                    nesting, max_items = ("set" if hcl_type == "set" else "list"), None
                bt: dict[str, Any] = {
                    "nesting_mode": nesting,
                    "block": self._struct_block(struct_fqn),
                }
                if not optional and nesting in ("list", "set"):
                    bt["min_items"] = 1
                if max_items:
                    bt["max_items"] = max_items
                block_types[tf] = bt
                continue
            if struct_fqn:
                # A nested attribute (`name = { ... }`).
                inner = self._struct_block(struct_fqn)
                if inner["block_types"]:
                    ty = self._value_type(ptype, hcl_type)
                    attr = {"type": ty}
                else:
                    mode = {"struct": "single", "set": "set", "map": "map"}.get(hcl_type or "", "list")
                    if "fqn" in ptype:
                        mode = "single"
                    attr = {"nested_type": {"attributes": inner["attributes"], "nesting_mode": mode}}
            else:
                attr = {"type": self._value_type(ptype, hcl_type)}
            if optional:
                # The generated code does not tell optional from optional+computed; served as
                # both, so that a mock provider fills an unset value and a reference to it
                # (e.g. `data.aws_region.current.region`) is never null in `terraform test`.
                attr["optional"] = True
                attr["computed"] = True
            else:
                attr["required"] = True
            if tf == "id":
                attr["optional"] = True
                attr["computed"] = True
                attr.pop("required", None)
            if tf.endswith("_wo"):
                # Write-only (Terraform >= 1.11): never stored, never computed.
                attr["write_only"] = True
                attr.pop("computed", None)
            attributes[tf] = attr
        # Computed-only attributes of a block (its OutputReference getters).
        ref = f"{fqn}OutputReference"
        if ref in self.types:
            for name, a in self._computed_getters(ref, set(attributes) | set(block_types)).items():
                attributes.setdefault(name, a)
        return {"attributes": attributes, "block_types": block_types}

    def _struct_of(self, t: dict) -> str | None:
        if "fqn" in t and self.types.get(t["fqn"], {}).get("datatype"):
            return t["fqn"]
        if "collection" in t:
            e = _strip_union(t["collection"]["elementtype"])
            if "fqn" in e and self.types.get(e["fqn"], {}).get("datatype"):
                return e["fqn"]
        return None

    def _config_fqn(self, cls: dict) -> str | None:
        for p in cls.get("initializer", {}).get("parameters", []):
            if p["name"] == "config":
                return p["type"].get("fqn")
        return None

    def _class_schema(self, fqn: str, drop: tuple = ()) -> dict:
        cls = self.types[fqn]
        cfg = self._config_fqn(cls)
        block = self._struct_block(cfg, owner_cls=cls["name"], drop=drop) if cfg else {
            "attributes": {}, "block_types": {}}
        for name, a in self._computed_getters(fqn, set(block["attributes"]) | set(block["block_types"])).items():
            if name in drop:
                continue
            block["attributes"].setdefault(name, a)
        if "id" not in block["attributes"] and cls.get("base") != "cdktf.TerraformProvider":
            block["attributes"]["id"] = {"type": "string", "optional": True, "computed": True}
        return {"version": 0, "block": _clean(block)}

    @staticmethod
    def _tf_type_name(cls: dict) -> str | None:
        m = re.search(r"\{@link \S+ ([a-z0-9_]+)\}", cls.get("docs", {}).get("summary", ""))
        return m.group(1) if m else None

    def convert(self) -> dict:
        provider = None
        resources: dict[str, dict] = {}
        data_sources: dict[str, dict] = {}
        for fqn, t in sorted(self.types.items()):
            if t.get("kind") != "class":
                continue
            base = t.get("base")
            if base == "cdktf.TerraformProvider":
                provider = self._class_schema(fqn, drop=("alias",))
            elif base in ("cdktf.TerraformResource", "cdktf.TerraformDataSource"):
                name = self._tf_type_name(t)
                if not name:
                    continue
                target = resources if base == "cdktf.TerraformResource" else data_sources
                target[name] = self._class_schema(fqn)
        if provider is None:
            raise ValueError("no provider class")
        source = f"registry.terraform.io/{self.namespace}/{self.provider_name}"
        return {
            "format_version": "1.0",
            "provider_versions": {source: self.version},
            "provider_schemas": {
                source: {
                    "provider": provider,
                    "resource_schemas": resources,
                    "data_source_schemas": data_sources,
                }
            },
        }


def _has_dynamic(block: dict) -> bool:
    if any("dynamic" in json.dumps(a.get("type", "")) for a in block.get("attributes", {}).values()):
        return True
    return any(_has_dynamic(b["block"]) for b in block.get("block_types", {}).values())


def _clean(block: dict) -> dict:
    out: dict[str, Any] = {}
    if block["attributes"]:
        out["attributes"] = dict(sorted(block["attributes"].items()))
    if block["block_types"]:
        out["block_types"] = {}
        for k, v in sorted(block["block_types"].items()):
            inner = _clean(v["block"])
            v = {**v, "block": inner}
            # Terraform refuses set blocks holding values of unknown type ("dynamic"), which
            # the generated code uses where the real schema recurses too deeply (e.g. WAFv2
            # `statement`): served as a list, which accepts the same configurations.
            if v["nesting_mode"] == "set" and _has_dynamic(inner):
                v["nesting_mode"] = "list"
            out["block_types"][k] = v
    return out


def convert_wheel(path: str) -> dict:
    assembly, js = read_wheel(path)
    return Converter(assembly, js).convert()


def main(argv: list[str]) -> int:
    import sys

    if len(argv) != 2:
        print("usage: jsii_schema.py WHEEL OUT.json", file=sys.stderr)
        return 2
    schema = convert_wheel(argv[0])
    with open(argv[1], "w") as f:
        json.dump(schema, f, separators=(",", ":"), sort_keys=True)
    (source, version), = schema["provider_versions"].items()
    s = schema["provider_schemas"][source]
    print(f"{source} {version}: {len(s['resource_schemas'])} resources, "
          f"{len(s['data_source_schemas'])} data sources")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
