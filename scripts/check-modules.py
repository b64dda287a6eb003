#!/usr/bin/env python3
"""Fails when the modules of one crate import each other in a cycle, or when a Rust source file
of the repository is longer than 800 lines (a file that long holds more than one concern).

    scripts/check-modules.py [CRATE_DIR ...]     (default: every crate, the stand-in included)

A module is a file under the crate's `src/` (`a/mod.rs` is module `a`). A module depends on
another when its code (not its comments, not its `#[cfg(test)] mod tests`) names it through
`crate::…` or `super::…`; a module naming its own ancestor is not counted (a child uses its
parent's items by design). Every strongly connected set of two or more modules is printed, and
every file over the limit; the exit status is 1 if there is either. Standard library only.
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
    lines = [l for l in open(path, encoding="utf-8").read().split("\n")
             if not l.strip().startswith("//")]
    text = "\n".join(lines)
    cuts = [i for i in (text.find("#[cfg(test)]\nmod tests"),
                        text.find("#[cfg(test)]\npub mod tests")) if i >= 0]
    return text[:min(cuts)] if cuts else text


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
        names = [n.split("::") for n in re.findall(r"\bcrate::((?:\w+::)*\w+)", text)]
        parent = list(m[:-1])
        names += [parent + n.split("::") for n in re.findall(r"\bsuper::((?:\w+::)*\w+)", text)]
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
        dirs[:] = [d for d in dirs if d not in ("target", ".git")]
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(top, f)
                with open(path, encoding="utf-8") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    print(f"{os.path.relpath(path, root)}: {n} lines (at most {MAX_LINES})")
                    long += 1
    if not bad and not long:
        print(f"no import cycle in {len(crates)} crates; no Rust file over {MAX_LINES} lines")
    return 1 if bad or long else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
