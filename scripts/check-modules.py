#!/usr/bin/env python3
"""Fails when the modules of one crate import each other in a cycle, when a source file of the
repository (Rust, Python or shell) is longer than 800 lines (a file that long holds more than
one concern), or when docs/ARCHITECTURE.md names a path that does not exist.

    scripts/check-modules.py [CRATE_DIR ...]     (default: every crate, the stand-in included)

A module is a file under the crate's `src/` (`a/mod.rs` is module `a`). A module depends on
another when its code (not its comments, not its `#[cfg(test)] mod tests`) names it: through
`crate::…`, `super::…` or `self::…`, `use` groups expanded (`use crate::a::{self, b}` names `a`
and `a::b`), through a name such a `use` brought in (`docker::args::config(…)` after
`use crate::runtime::docker::{self}`), or a child module by its relative name
(`args::config(…)` in the child's parent). A module naming its own ancestor is not counted (a
child uses its parent's items by design). Every strongly connected set of two or more modules
is printed, every file over the limit and every missing path; the exit status is 1 if there is
any. A path in ARCHITECTURE.md is a backquoted name with a `/` (braces expand:
`status/{fetch,table}.rs`), looked up from the repository's root, from each crate and from each
crate's `src/` and its folders (the document names files relative to the crate it describes);
build outputs (`target/`) are not checked. Standard library only; `scripts/test_check_modules.py`
tests it.
"""

import os
import re
import sys

CRATES = ["common", "protocol", "backends", "worker", "manager", "testkit",
          "tests/peers/kube-standin"]
MAX_LINES = 800


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(path):
    with open(path, encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if not l.strip().startswith("//")]
    text = "\n".join(lines)
    cuts = [i for i in (text.find("#[cfg(test)]\nmod tests"),
                        text.find("#[cfg(test)]\npub mod tests")) if i >= 0]
    return text[:min(cuts)] if cuts else text


def paths_named(text):
    """Every `crate::…`, `super::…` and `self::…` path the code names, with `use` groups
    expanded (`crate::a::{self, b::{c, d}}` names `a`, `a::b::c` and `a::b::d`), as lists of
    segments starting with `crate`, `super` (one per level) or `self`."""
    out = []
    for m in re.finditer(r"\b(crate|super|self)((?:::(?:super|\w+))*)::(\{)?", text):
        head = [m.group(1)] + [p for p in m.group(2).split("::") if p]
        if m.group(3):
            out += [head + tail for tail in group_paths(text, m.end())]
        else:
            rest = re.match(r"\w+(?:::\w+)*", text[m.end():])
            if rest:
                out.append(head + rest.group(0).split("::"))
            elif head[-1] != "self":
                out.append(head)
    return out


def group_paths(text, i):
    """The paths of the `{…}` group whose body starts at `i`, nested groups expanded; `self`
    names the group's own prefix (an empty tail)."""
    paths, depth, j, start = [], 1, i, i
    while j < len(text) and depth:
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        j += 1
    body = text[start:j - 1]
    # Split at the top level's commas.
    items, depth, cur = [], 0, ""
    for c in body:
        if c == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += (c == "{") - (c == "}")
        cur += c
    items.append(cur)
    for item in items:
        item = re.sub(r"\s+as\s+\w+\s*$", "", item.strip())
        if not item:
            continue
        if item == "self":
            paths.append([])
        elif "{" in item:
            prefix = [p for p in item[:item.index("{")].split("::") if p]
            paths += [prefix + t for t in group_paths(item, item.index("{") + 1)]
        elif re.fullmatch(r"\w+(?:::\w+)*|\*", item):
            paths.append([] if item == "*" else item.split("::"))
    return paths


def resolve(m, segments):
    """A path's segments as a module path from the crate root (`None` for an external one)."""
    if not segments:
        return None
    if segments[0] == "crate":
        return segments[1:]
    base = list(m)
    k = 0
    while k < len(segments) and segments[k] in ("super", "self"):
        if segments[k] == "super":
            if not base:
                return None
            base = base[:-1]
        k += 1
    return base + segments[k:]


def graph(crate):
    src = os.path.join(crate, "src")
    modules = {}
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(root, f)
                modules[module_of(src, path)] = path
    edges = {m: set() for m in modules}
    for m, path in modules.items():
        text = code_of(path)
        names = [r for r in (resolve(m, p) for p in paths_named(text)) if r is not None]
        # A module imported by name (`use crate::runtime::docker::{self}`, `use super::gpus`)
        # and then named through it (`docker::args::config(…)`).
        for path in [n for n in names if tuple(n) in modules and n]:
            pattern = r"(?<![\w:])" + re.escape(path[-1]) + r"((?:::\w+)+)"
            for rest in re.findall(pattern, text):
                names.append(path + [p for p in rest.split("::") if p])
        # A child module named by a relative path (`args::config(…)`, `pub use args::x`).
        for child in (c for c in modules if len(c) == len(m) + 1 and c[:len(m)] == m):
            if re.search(r"(?<![\w:])" + re.escape(child[-1]) + r"::", text):
                names.append(list(child))
        for parts in names:
            for k in range(len(parts), 0, -1):
                target = tuple(parts[:k])
                if target in modules:
                    break
            else:
                continue
            if target != m and target != m[:len(target)]:
                edges[m].add(target)
    return edges


def cycles(edges):
    """Tarjan's strongly connected components of two or more nodes."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(n):
        index[n] = low[n] = counter[0]
        counter[0] += 1
        stack.append(n)
        on.add(n)
        for w in edges[n]:
            if w not in index:
                visit(w)
                low[n] = min(low[n], low[w])
            elif w in on:
                low[n] = min(low[n], index[w])
        if low[n] == index[n]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == n:
                    break
            if len(comp) > 1:
                out.append(sorted("::".join(c) or "(root)" for c in comp))

    sys.setrecursionlimit(10000)
    for n in edges:
        if n not in index:
            visit(n)
    return out


def expand_braces(p):
    m = re.search(r"\{([^{}]*)\}", p)
    if not m:
        return [p]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(p[:m.start()] + alt + p[m.end():])
    return out


def missing_architecture_paths(root, doc="docs/ARCHITECTURE.md"):
    """The paths `doc` names that exist nowhere it may mean them."""
    with open(os.path.join(root, doc), encoding="utf-8") as f:
        text = f.read()
    bases = [root] + [os.path.join(root, c) for c in CRATES]
    for c in CRATES:
        src = os.path.join(root, c, "src")
        bases.append(src)
        for top, dirs, _ in os.walk(src):
            bases += [os.path.join(top, d) for d in dirs]
    missing = []
    for name in sorted(set(re.findall(r"`([^`\s]+)`", text))):
        if "/" not in name or "://" in name or name.startswith(("/", "$", "~", "target/")):
            continue
        if not re.fullmatch(r"[\w.\-/{},*<>]+", name) or "<" in name or "*" in name:
            continue
        for p in expand_braces(name):
            if not any(os.path.exists(os.path.join(b, p)) for b in bases):
                missing.append(p)
    return missing


def main(argv):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    crates = argv or [os.path.join(root, c) for c in CRATES]
    bad = 0
    for crate in crates:
        for comp in cycles(graph(crate)):
            print(f"import cycle in {os.path.basename(os.path.normpath(crate))}: "
                  + " -> ".join(comp))
            bad += 1
    long = 0
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("target", ".git", "node_modules", "__pycache__")]
        for f in files:
            if f.endswith((".rs", ".py", ".sh")):
                path = os.path.join(top, f)
                with open(path, encoding="utf-8") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    print(f"{os.path.relpath(path, root)}: {n} lines (at most {MAX_LINES})")
                    long += 1
    missing = missing_architecture_paths(root)
    for p in missing:
        print(f"docs/ARCHITECTURE.md names {p}, which does not exist")
    if not bad and not long and not missing:
        print(f"no import cycle in {len(crates)} crates; no source file over {MAX_LINES} lines; "
              "every path docs/ARCHITECTURE.md names exists")
    return 1 if bad or long or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
