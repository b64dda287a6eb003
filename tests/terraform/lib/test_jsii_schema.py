"""Unit test of the jsii -> provider schema conversion on a small hand-made package.

    python3 -m unittest discover -s tests/terraform/lib -p 'test_*.py'
"""

from __future__ import annotations

import io
import json
import tarfile
import unittest

import jsii_schema

DOCS = "https://registry.terraform.io/providers/acme/example/1.2.3/docs"
NS = "@cdktf/provider-example.widget"


def prop(name, tf, typ, optional=False, cls="Widget"):
    p = {
        "name": name,
        "docs": {"summary": f"Docs at Terraform Registry: {{@link {DOCS}/resources/widget#{tf} {cls}#{tf}}}."},
        "type": typ,
        "immutable": True,
        "abstract": True,
    }
    if optional:
        p["optional"] = True
    return p


def union(t):
    return {"union": {"types": [{"fqn": "cdktf.IResolvable"}, t]}}


def loc(module):
    return {"filename": f"src/{module}/index.ts", "line": 1}


ASSEMBLY = {
    "name": "@cdktf/provider-example",
    "types": {
        "@cdktf/provider-example.provider.ExampleProvider": {
            "kind": "class", "base": "cdktf.TerraformProvider", "name": "ExampleProvider",
            "docs": {"summary": f"Represents a {{@link {DOCS} example}}."},
            "locationInModule": loc("provider"),
            "initializer": {"parameters": [{"name": "config", "type": {"fqn": "@cdktf/provider-example.provider.ExampleProviderConfig"}}]},
        },
        "@cdktf/provider-example.provider.ExampleProviderConfig": {
            "kind": "interface", "datatype": True, "name": "ExampleProviderConfig",
            "locationInModule": loc("provider"),
            "properties": [
                prop("alias", "alias", {"primitive": "string"}, True, "ExampleProvider"),
                prop("endpoint", "endpoint", {"primitive": "string"}, True, "ExampleProvider"),
            ],
        },
        f"{NS}.Widget": {
            "kind": "class", "base": "cdktf.TerraformResource", "name": "Widget",
            "docs": {"summary": f"Represents a {{@link {DOCS}/resources/widget example_widget}}."},
            "locationInModule": loc("widget"),
            "initializer": {"parameters": [{"name": "config", "type": {"fqn": f"{NS}.WidgetConfig"}}]},
            "properties": [
                {"name": "tfResourceType", "static": True, "const": True, "immutable": True, "type": {"primitive": "string"}},
                {"name": "arn", "immutable": True, "type": {"primitive": "string"}},
                {"name": "statusList", "immutable": True, "type": {"fqn": f"{NS}.WidgetStatusListList"}},
                {"name": "nameInput", "immutable": True, "optional": True, "type": {"primitive": "string"}},
                {"name": "name", "type": {"primitive": "string"}},
            ],
        },
        f"{NS}.WidgetConfig": {
            "kind": "interface", "datatype": True, "name": "WidgetConfig",
            "interfaces": ["cdktf.TerraformMetaArguments"],
            "locationInModule": loc("widget"),
            "properties": [
                prop("name", "name", {"primitive": "string"}),
                prop("size", "size", {"primitive": "number"}, True),
                prop("labels", "labels", {"collection": {"kind": "array", "elementtype": {"primitive": "string"}}}, True),
                prop("tags", "tags", {"collection": {"kind": "map", "elementtype": {"primitive": "string"}}}, True),
                prop("tokenWo", "token_wo", {"primitive": "string"}, True),
                prop("rule", "rule", union({"collection": {"kind": "array", "elementtype": {"fqn": f"{NS}.WidgetRule"}}})),
                prop("spec", "spec", {"fqn": f"{NS}.WidgetSpec"}, True),
                prop("timeouts", "timeouts", {"fqn": f"{NS}.WidgetTimeouts"}, True),
            ],
        },
        f"{NS}.WidgetRule": {
            "kind": "interface", "datatype": True, "name": "WidgetRule", "locationInModule": loc("widget"),
            "properties": [prop("port", "port", {"primitive": "number"}), prop("open", "open", union({"primitive": "boolean"}), True)],
        },
        f"{NS}.WidgetSpec": {
            "kind": "interface", "datatype": True, "name": "WidgetSpec", "locationInModule": loc("widget"),
            "properties": [prop("image", "image", {"primitive": "string"})],
        },
        f"{NS}.WidgetTimeouts": {
            "kind": "interface", "datatype": True, "name": "WidgetTimeouts", "locationInModule": loc("widget"),
            "properties": [prop("create", "create", {"primitive": "string"}, True)],
        },
        f"{NS}.WidgetStatusListList": {
            "kind": "class", "base": "cdktf.ComplexList", "name": "WidgetStatusListList", "locationInModule": loc("widget"),
            "methods": [{"name": "get", "returns": {"type": {"fqn": f"{NS}.WidgetStatusListOutputReference"}}}],
        },
        f"{NS}.WidgetStatusListOutputReference": {
            "kind": "class", "base": "cdktf.ComplexObject", "name": "WidgetStatusListOutputReference",
            "locationInModule": loc("widget"),
            "properties": [{"name": "code", "immutable": True, "type": {"primitive": "number"}}],
        },
    },
}


def entry(name, is_block, typ, storage):
    return (f"        {name}: {{\n            value: x,\n            isBlock: {str(is_block).lower()},\n"
            f"            type: \"{typ}\",\n            storageClassType: \"{storage}\",\n        }},\n")


JS_WIDGET = (
    "function widgetRuleToHclTerraform(struct) {\n    const attrs = {\n"
    + entry("open", False, "simple", "boolean") + entry("port", False, "simple", "number")
    + "    };\n}\n"
    "function widgetSpecToHclTerraform(struct) {\n    const attrs = {\n"
    + entry("image", False, "simple", "string") + "    };\n}\n"
    "class WidgetStatusListOutputReference extends cdktf.ComplexObject {\n"
    "    get code() {\n        return this.getNumberAttribute('code');\n    }\n}\n"
    "class WidgetStatusListList extends cdktf.ComplexList {\n}\n"
    "class Widget extends cdktf.TerraformResource {\n"
    "    constructor(scope, id, config) {\n"
    "        this._statusList = new WidgetStatusListList(this, \"status_list\", false);\n    }\n"
    "    get arn() {\n        return this.getStringAttribute('arn');\n    }\n"
    "    get statusList() {\n        return this._statusList;\n    }\n"
    "    synthesizeHclAttributes() {\n        const attrs = {\n"
    + entry("name", False, "simple", "string") + entry("size", False, "simple", "number")
    + entry("labels", False, "set", "stringList") + entry("tags", False, "map", "stringMap")
    + entry("token_wo", False, "simple", "string") + entry("rule", True, "list", "WidgetRuleList")
    + entry("spec", True, "list", "WidgetSpecOutputReference")
    + entry("timeouts", True, "struct", "WidgetTimeouts")
    + "        };\n    }\n}\n"
)
JS_PROVIDER = "class ExampleProvider extends cdktf.TerraformProvider {\n}\n"


def tarball() -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("package/.jsii", json.dumps(ASSEMBLY).encode()),
                           ("package/lib/widget/index.js", JS_WIDGET.encode()),
                           ("package/lib/provider/index.js", JS_PROVIDER.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


class ConversionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        assembly, js = jsii_schema.read_tarball(tarball())
        cls.schema = jsii_schema.Converter(assembly, js).convert()
        cls.ps = cls.schema["provider_schemas"]["registry.terraform.io/acme/example"]
        cls.widget = cls.ps["resource_schemas"]["example_widget"]["block"]

    def test_identity(self):
        self.assertEqual(self.schema["provider_versions"], {"registry.terraform.io/acme/example": "1.2.3"})

    def test_provider_drops_alias(self):
        attrs = self.ps["provider"]["block"]["attributes"]
        self.assertEqual(sorted(attrs), ["endpoint"])

    def test_attributes(self):
        a = self.widget["attributes"]
        self.assertEqual(a["name"], {"type": "string", "required": True})
        self.assertEqual(a["size"], {"type": "number", "optional": True, "computed": True})
        self.assertEqual(a["labels"]["type"], ["set", "string"])
        self.assertEqual(a["tags"]["type"], ["map", "string"])
        self.assertEqual(a["token_wo"], {"type": "string", "optional": True, "write_only": True})
        self.assertEqual(a["id"], {"type": "string", "optional": True, "computed": True})

    def test_computed(self):
        a = self.widget["attributes"]
        self.assertEqual(a["arn"], {"type": "string", "computed": True})
        self.assertEqual(a["status_list"], {"type": ["list", ["object", {"code": "number"}]], "computed": True})

    def test_blocks(self):
        b = self.widget["block_types"]
        self.assertEqual(b["rule"]["nesting_mode"], "list")
        self.assertEqual(b["rule"]["min_items"], 1)
        self.assertNotIn("max_items", b["rule"])
        self.assertEqual(b["rule"]["block"]["attributes"]["open"]["type"], "bool")
        self.assertEqual(b["spec"]["nesting_mode"], "list")
        self.assertEqual(b["spec"]["max_items"], 1)
        self.assertNotIn("min_items", b["spec"])
        self.assertEqual(b["timeouts"]["nesting_mode"], "single")

    def test_no_meta_arguments(self):
        for meta in ("count", "provider", "depends_on", "lifecycle", "for_each"):
            self.assertNotIn(meta, self.widget["attributes"])


if __name__ == "__main__":
    unittest.main()
