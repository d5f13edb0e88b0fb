#!/usr/bin/env python3
"""The module map, checked (issue 54): no import circle, no arrow from a lower module to a higher one.

Reads every `.rs` file under src/ (the library from src/lib.rs, the binary from src/main.rs: their
module names do not overlap, so `crate::`/`ipybox::` paths resolve in one namespace), takes the
module paths the code names (`use crate::...`, `crate::a::b` in expressions, `super::`, `self::`,
`ipybox::` in the binary's modules, a mod.rs naming its own child `child::x`), with comments,
string literals and `#[cfg(test)]` items left out (a test may compose what production keeps
apart), and builds two graphs:

- packages (`src/<name>.rs` or `src/<name>/`): every arrow must point to a package on a lower
  layer or the same layer, per the "Layers" block of docs/architecture.md, and the graph must
  have no circle;
- files inside one package: no circle among them. A package's `mod.rs` is its floor (shared
  types, errors, names its files use): its files may use it; a `mod.rs` using one of its own
  files (beyond declaring and re-exporting it with `pub use`) is an arrow like any other.

Also: every integration test module (tests/integration/main.rs) is named in the map.

Prints every offending arrow with the files and the names that make it, and exits 1; prints a
one-line summary and exits 0 when the map holds. `--graph` prints the package arrows (for the
docs), `--files` the file arrows too.
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
DOC = os.path.join(ROOT, "docs", "architecture.md")


def module_of(path):
    """src/a/b.rs -> ('a','b'); src/a/mod.rs -> ('a',); src/lib.rs, src/main.rs -> ()."""
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel in (["lib"], ["main"]):
        return ()
    return tuple(rel)


def strip_code(text):
    """Comments and string/char literals out; newlines kept so line numbers hold."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 260]) if c in "br" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j + 1))
            i = j + 1
            continue
        if c == "'":
            # a char literal ('a', '\n', '\u{..}'), not a lifetime ('a)
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def drop_test_items(code):
    """`#[cfg(test)]` (and `#[cfg(all(test, ...))]`) items removed: a `mod tests { ... }`, a fn, a use."""
    out, i = [], 0
    pat = re.compile(r"#\[cfg\((?:all\()?test\b[^\]]*\]")
    while True:
        m = pat.search(code, i)
        if not m:
            out.append(code[i:])
            break
        out.append(code[i:m.start()])
        j = m.end()
        # the item: up to a `;` before any `{`, or a balanced `{...}`
        depth = 0
        while j < len(code):
            ch = code[j]
            if ch == ";" and depth == 0:
                j += 1
                break
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            j += 1
        out.append("\n" * code.count("\n", m.start(), j))
        i = j
    return "".join(out)


def expand_use_tree(tree):
    """'crate::{a::b, c::{d, e}}' -> ['crate::a::b', 'crate::c::d', 'crate::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    res = []

    def walk(prefix, s):
        # split s at top-level commas
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            k = p.find("{")
            if k >= 0:
                walk(prefix + p[:k], p[k + 1:p.rfind("}")])
            else:
                res.append(prefix + re.sub(r"\bas\w+$", "", p.split(" as ")[0]))

    walk("", tree)
    return res


PATH = re.compile(r"(?<![\w:])((?:crate|super|self|ipybox)(?:::(?:super|\w+))+)")


def references(path, code, modules, children):
    """(target module, named path, line) for every module path the code names."""
    me = module_of(path)
    here = me  # what `self::` names; `super::` its parent
    found = []
    uses = []
    for m in re.finditer(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", code):
        line = code.count("\n", 0, m.start()) + 1
        for p in expand_use_tree(m.group(2)):
            uses.append((p, line, bool(m.group(1))))
    spans = [m.span() for m in re.finditer(r"\buse\s+[^;]+;", code)]
    for m in PATH.finditer(code):
        if any(a <= m.start() < b for a, b in spans):
            continue
        uses.append((m.group(1), code.count("\n", 0, m.start()) + 1, False))
    # a mod.rs (or lib/main) naming its own child module bare: `limits::x`, `use limits::X`
    kids = children.get(me, set())
    for m in re.finditer(r"(?<![\w:])(\w+)::\w+", code):
        if m.group(1) in kids and not any(a <= m.start() < b for a, b in spans):
            uses.append(("self::" + m.group(0), code.count("\n", 0, m.start()) + 1, False))
    for p, line, public in uses:
        segs = [s for s in p.split("::") if s]
        if not segs:
            continue
        if segs[0] in ("crate", "ipybox"):
            absolute = segs[1:]
        elif segs[0] in ("self", "super"):
            base = list(here)
            while segs and segs[0] in ("self", "super"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
            absolute = base + segs
        elif segs[0] in kids:
            absolute = list(me) + segs
        else:
            continue
        target = None
        for k in range(len(absolute), 0, -1):
            if tuple(absolute[:k]) in modules:
                target = tuple(absolute[:k])
                break
        if target is None or target == me:
            continue
        found.append((target, p, line, public))
    return found


def read_layers():
    """The ```layers block of docs/architecture.md: one line per layer, highest first,
    `name: pkg pkg ...`; `debt: a -> b` lines name arrows known to be wrong (warned about, not
    failed on, until they are gone: a debt line for an arrow that no longer exists fails)."""
    text = open(DOC, encoding="utf-8").read()
    m = re.search(r"```layers\n(.*?)```", text, re.S)
    if not m:
        sys.exit("arch-check: docs/architecture.md has no ```layers block (the layering to check)")
    layers, debt = {}, set()
    rows = []
    for r in m.group(1).splitlines():
        r = r.strip()
        if not r or r.startswith("#"):
            continue
        if r.startswith("debt:"):
            a, _, b = r[5:].partition("->")
            debt.add((node(a.strip()), node(b.strip())))
        else:
            rows.append(r)
    for rank, row in enumerate(reversed(rows)):
        _, _, names = row.partition(":")
        for name in names.split():
            layers[name] = rank
    return layers, debt


def node(name):
    """`confine` (a package) or `mcp_server::session` (a file module, as a tuple)."""
    return tuple(name.split("::")) if "::" in name else name


def main():
    files = []
    for d, _, fs in os.walk(SRC):
        for f in fs:
            if f.endswith(".rs"):
                files.append(os.path.join(d, f))
    modules = {module_of(f): f for f in files}
    children = defaultdict(set)
    for mod in modules:
        if mod:
            children[mod[:-1]].add(mod[-1])
    pkg_edges = defaultdict(list)  # (a, b) -> [(file, path, line)]
    file_edges = defaultdict(list)
    for f in sorted(files):
        code = drop_test_items(strip_code(open(f, encoding="utf-8").read()))
        me = module_of(f)
        if not me:
            continue
        for target, p, line, public in references(f, code, modules, children):
            rel = os.path.relpath(f, ROOT)
            if target[0] != me[0]:
                pkg_edges[(me[0], target[0])].append((rel, p, line))
            else:
                # inside a package: the floor (an ancestor's mod.rs) may be used by its files;
                # a mod.rs re-exporting its own files (`pub use`) is its facade, not an arrow
                if target == me[:len(target)]:
                    continue
                if me == target[:len(me)] and public:
                    continue
                file_edges[(me, target)].append((rel, p, line))
    layers, debt = read_layers()
    problems, warnings = [], []
    for a, b in sorted(debt, key=str):
        edges = pkg_edges if isinstance(a, str) else file_edges
        if (a, b) not in edges:
            problems.append(f"debt line `{label(a)} -> {label(b)}`: no such arrow any more; take the line out")
    pkgs = sorted({m[0] for m in modules if m})
    for p in pkgs:
        if p not in layers:
            problems.append(f"package `{p}` is on no layer of docs/architecture.md's ```layers block")
    for (a, b), why in sorted(pkg_edges.items()):
        if a in layers and b in layers and layers[a] < layers[b]:
            (warnings if (a, b) in debt else problems).append(f"upward arrow {a} -> {b} (layer {layers[a]} -> {layers[b]}): " + describe(why))
    for name, edges in (("package", pkg_edges), ("file", file_edges)):
        for cycle in circles(edges):
            arrows = [(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))]
            text = " -> ".join(label(n) for n in cycle + [cycle[0]])
            detail = "; ".join(f"{label(a)} -> {label(b)}: {describe(edges[(a, b)])}" for a, b in arrows)
            excused = any(arrow in debt for arrow in arrows)
            (warnings if excused else problems).append(f"{name} circle {text}\n    {detail}")
    # The map names every integration test module (`mod x;` in tests/integration/main.rs).
    doc = open(DOC, encoding="utf-8").read()
    main_rs = os.path.join(ROOT, "tests", "integration", "main.rs")
    if os.path.exists(main_rs):
        for name in re.findall(r"^\s*mod (\w+);", open(main_rs, encoding="utf-8").read(), re.M):
            if f"`{name}`" not in doc and f"{name}.rs" not in doc:
                problems.append(f"integration test module `{name}` is not in docs/architecture.md's test list")
    if "--graph" in sys.argv or "--files" in sys.argv:
        for (a, b) in sorted(pkg_edges):
            print(f"{a} -> {b}")
        if "--files" in sys.argv:
            for (a, b) in sorted(file_edges):
                print(f"  {'::'.join(a)} -> {'::'.join(b)}")
    for w in warnings:
        print("arch-check: known (a debt line in docs/architecture.md): " + w)
    if problems:
        for p in problems:
            print("arch-check: " + p)
        print(f"arch-check: {len(problems)} problem(s); the map is docs/architecture.md (Dependencies, layers)")
        return 1
    print(f"arch-check: {len(pkgs)} packages, {len(pkg_edges)} package arrows, {len(file_edges)} file arrows; "
          "no circle, no arrow up")
    return 0


def label(n):
    return n if isinstance(n, str) else "::".join(n)


def describe(why):
    shown = ", ".join(f"{f}:{line} {p}" for f, p, line in why[:3])
    return shown + (f" (+{len(why) - 3} more)" if len(why) > 3 else "")


def circles(edges):
    """One shortest circle per strongly connected component with more than one node."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    nodes = set(graph) | {b for s in graph.values() for b in s}
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v], key=str):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(nodes, key=str):
        if v not in index:
            strong(v)
    result = []
    for comp in comps:
        inside = set(comp)
        # every circle through the component's members, shortest first, one per arrow pair
        seen = set()
        for start in sorted(comp, key=str):
            prev, frontier, found = {start: None}, [start], None
            while frontier and not found:
                nxt = []
                for v in frontier:
                    for w in sorted(graph[v] & inside, key=str):
                        if w == start:
                            found = v
                            break
                        if w not in prev:
                            prev[w] = v
                            nxt.append(w)
                    if found:
                        break
                frontier = nxt
            if found:
                path, v = [], found
                while v is not None:
                    path.append(v)
                    v = prev[v]
                path.reverse()
                key = frozenset(path)
                if key not in seen:
                    seen.add(key)
                    result.append(path)
    return result


if __name__ == "__main__":
    sys.exit(main())
