#!/usr/bin/env python3
"""Which modules of a crate import which, and the loops among them.

    tests/structure/imports.py SRC_DIR [--depth N] [--tests]

(--depth 1: only the crate's top-level modules.)

Reads every `.rs` file under SRC_DIR (a crate's `src/`), finds the paths
it names (`use crate::a::b`, `super::x`, `self::y`, and `crate::...` paths
written inline), resolves each to a module, and prints the edges between
sibling modules (`core::route` -> `core::parts` inside the folder `core/`;
`replica::server` -> `effects` counts as `replica` -> `effects` at the top),
then
every import loop (strongly connected set of two or more modules). Names
re-exported by lib.rs (`pub use x::{A, B}`) resolve to their module.
Test code (files named tests.rs or *_tests.rs, and what follows
`#[cfg(test)] mod tests {` in a file) is left out unless --tests.

Exit status 1 when a loop exists, so CI can hold the line.
"""
import os
import re
import sys


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main"):
        return []
    if rel[-1] == "mod":
        rel = rel[:-1]
    return rel


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def product_part(text):
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    return text[: cut.start()] if cut else text


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(r"\bas\w+", "", tree.replace("as", " as ")) if " as " in tree else tree
    out = []

    def walk(prefix, s):
        i = s.find("{")
        if i < 0:
            for part in s.split(","):
                if part:
                    out.append(prefix + part)
            return
        head = s[:i]
        depth, j = 0, i
        for j in range(i, len(s)):
            depth += s[j] == "{"
            depth -= s[j] == "}"
            if depth == 0:
                break
        inner, rest = s[i + 1 : j], s[j + 1 :]
        pieces, depth, start = [], 0, 0
        for k, ch in enumerate(inner):
            depth += ch == "{"
            depth -= ch == "}"
            if ch == "," and depth == 0:
                pieces.append(inner[start:k])
                start = k + 1
        pieces.append(inner[start:])
        for p in pieces:
            if p:
                walk(prefix + head, p)
        if rest.startswith(","):
            walk(prefix, rest[1:])

    walk("", tree)
    return out


def resolve(here, path, reexports, modules):
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = [], parts[1:]
    elif parts[0] in ("super", "self"):
        base = list(here)
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
    else:
        return None
    full = base + [p for p in parts if p not in ("*", "self")]
    if not base and full and full[0] in reexports and tuple(full[:1]) not in modules:
        full = reexports[full[0]] + full[1:]
    # The longest prefix that is a module of this crate.
    while full and tuple(full) not in modules:
        full = full[:-1]
    return tuple(full) if full else None


def main():
    args = sys.argv[1:]
    depth = 0
    with_tests = "--tests" in args
    args = [a for a in args if a != "--tests"]
    if "--depth" in args:
        i = args.index("--depth")
        depth = int(args[i + 1])
        del args[i : i + 2]
    src = args[0]
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if not n.endswith(".rs"):
                continue
            if not with_tests and (n == "tests.rs" or n.endswith("_tests.rs")):
                continue
            p = os.path.join(root, n)
            files[p] = tuple(module_of(src, p))
    modules = set(files.values())
    for m in list(modules):
        for i in range(1, len(m)):
            modules.add(m[:i])
    # lib.rs re-exports: pub use a::{B, C};
    reexports = {}
    lib = os.path.join(src, "lib.rs")
    if os.path.exists(lib):
        text = strip_comments(open(lib).read())
        for m in re.finditer(r"pub\s+use\s+([^;]+);", text):
            for p in expand_use(m.group(1)):
                segs = p.split("::")
                if segs[0] == "crate":
                    segs = segs[1:]
                if segs and (segs[0],) in modules:
                    reexports[segs[-1]] = segs[:-1]
    edges = {}
    for path, here in files.items():
        text = strip_comments(open(path).read())
        if not with_tests:
            text = product_part(text)
        found = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            found += expand_use(m.group(1))
        found += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", text)
        for p in found:
            target = resolve(here, p, reexports, modules)
            if target is None:
                continue
            k = 0
            while k < min(len(here), len(target)) and here[k] == target[k]:
                k += 1
            if k >= len(here) or k >= len(target):
                continue  # a module naming itself, its parent or its child
            if depth and k >= depth:
                continue
            # The edge between the two siblings under the common parent.
            a, b = here[: k + 1], target[: k + 1]
            edges.setdefault(a, {}).setdefault(b, set()).add(os.path.relpath(path, src))
    print("edges (module -> what it imports):")
    for a in sorted(edges):
        print("  %s -> %s" % ("::".join(a), ", ".join("::".join(b) for b in sorted(edges[a]))))
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    nodes = sorted(set(edges) | {b for a in edges for b in edges[a]})

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            strong(v)
    if not sccs:
        print("%s: no import loops among %d modules" % (src, len(nodes)))
        return 0
    for scc in sccs:
        names = {"::".join(m) for m in scc}
        print("LOOP: " + ", ".join(sorted(names)))
        for a in scc:
            for b in sorted(edges.get(a, {})):
                if b in scc:
                    print("  %s -> %s  (%s)" % ("::".join(a), "::".join(b), ", ".join(sorted(edges[a][b]))))
    return 1


if __name__ == "__main__":
    sys.exit(main())
