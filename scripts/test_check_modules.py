"""Tests of scripts/check-modules.py: the import cycles it must see (through `use …::{self}`
groups, names they bring in, and a child named from its parent) and the ARCHITECTURE.md paths.

    python3 -m unittest discover -s scripts -p 'test_*.py'
"""

import importlib.util
import os
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("check_modules", os.path.join(HERE, "check-modules.py"))
cm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cm)


def crate(files):
    """A crate in a temporary directory: {relative path under src/: code}."""
    d = tempfile.mkdtemp()
    for rel, code in files.items():
        path = os.path.join(d, "src", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(code))
    return d


class Cycles(unittest.TestCase):
    def test_a_circle_through_a_self_import_and_a_child_named_by_its_parent(self):
        # config -> runtime::docker (a `{self}` import) -> docker::args (named from its parent
        # through the imported name) -> config.
        d = crate({
            "lib.rs": "pub mod config;\npub mod runtime;\n",
            "config.rs": "use crate::runtime::docker::{self, DockerConfig};\n"
                         "pub fn f() { docker::args::config(); }\n",
            "runtime/mod.rs": "pub mod docker;\n",
            "runtime/docker/mod.rs": "pub mod args;\npub struct DockerConfig;\n",
            "runtime/docker/args.rs": "use crate::config::f;\npub fn config() { f() }\n",
        })
        comps = cm.cycles(cm.graph(d))
        self.assertEqual(comps, [["config", "runtime::docker::args"]])

    def test_nested_groups_and_super_groups(self):
        d = crate({
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a/mod.rs": "pub mod x;\n",
            "a/x.rs": "use super::super::{b::{self as bee}};\npub fn g() { bee::h() }\n",
            "b.rs": "use crate::{a::{x}};\npub fn h() { x::g() }\n",
        })
        self.assertEqual(cm.cycles(cm.graph(d)), [["a::x", "b"]])

    def test_no_cycle_when_a_child_uses_its_parent(self):
        d = crate({
            "lib.rs": "pub mod a;\n",
            "a/mod.rs": "pub mod x;\npub fn top() {}\n",
            "a/x.rs": "use super::top;\npub fn g() { top() }\n",
        })
        self.assertEqual(cm.cycles(cm.graph(d)), [])


class ArchitecturePaths(unittest.TestCase):
    def test_a_missing_path_is_named_and_crate_relative_ones_are_found(self):
        root = tempfile.mkdtemp()
        os.makedirs(os.path.join(root, "docs"))
        os.makedirs(os.path.join(root, "worker", "src", "run"))
        open(os.path.join(root, "worker", "src", "run", "state.rs"), "w").close()
        with open(os.path.join(root, "docs", "ARCHITECTURE.md"), "w") as f:
            f.write("`worker/src/run/state.rs`, `run/state.rs`, `run/{state,gone}.rs`, "
                    "`protocol/src/client.rs`, `target/x/y`, `https://x/y`\n")
        self.assertEqual(cm.missing_architecture_paths(root),
                         ["protocol/src/client.rs", "run/gone.rs"])


if __name__ == "__main__":
    unittest.main()
