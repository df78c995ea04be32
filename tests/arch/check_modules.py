#!/usr/bin/env python3
"""Checks the module boundaries of src/ (docs/architecture.md, "Rules").

A unit is one source stem of one folder: src/lua/tensor.c and
src/lua/tensor.h are the unit lua/tensor. Unit A depends on unit B when a
file of A includes a header of B, or when A's object file uses a function
or variable that B's object file defines (read with nm from the build tree,
so a call through a shared header such as lua_int.h still counts).

Rules, each a failure when broken:
  1. No include cycle between units of different folders.
  2. No dependency cycle (includes and symbols) larger than MAX_CIRCLE
     units inside one folder.
  3. Headers of src/common include nothing of src/ outside src/common.
  4. Only src/lua includes the Lua headers; src/cli includes nothing of
     src/ outside src/cli and src/common (stcli uses the public client API
     and the self-contained helpers of src/common only).
  5. The folder graph (folder A -> folder B when a unit of A includes or
     calls a unit of B) has no cycle and equals the table that follows
     the line "<!-- arch_modules: folder graph -->" in
     docs/architecture.md: a new edge between folders fails until that
     table names it, and so does an edge the table names that is gone.

Usage: check_modules.py SRC_DIR BUILD_DIR [--verbose]
(CTest runs it as arch_modules after the build.)
Prints each circle it finds and exits 1 when a rule is broken.
"""
import os
import re
import subprocess
import sys

MAX_CIRCLE = 3
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def unit_of(path, src):
    rel = os.path.relpath(path, src)
    folder, name = os.path.split(rel)
    return folder + "/" + name.split(".")[0]


def source_files(src):
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith((".c", ".h", ".cu")):
                yield os.path.join(root, f)


def include_edges(src):
    edges = {}
    for path in source_files(src):
        u = unit_of(path, src)
        edges.setdefault(u, set())
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for inc in INCLUDE_RE.findall(text):
            target = os.path.join(src, inc)
            if not os.path.exists(target):
                target = os.path.join(os.path.dirname(path), inc)
            if os.path.exists(target) and os.path.commonpath([src, target]) == src:
                v = unit_of(target, src)
                if v != u:
                    edges[u].add(v)
    return edges


def object_files(build):
    """Maps each unit to one object file built from it (the st_* static
    libraries and executables; a source compiled twice counts once)."""
    objs = {}
    for root, _, files in os.walk(build):
        if "CMakeFiles" not in root or "/tests/" in root or "/bench/" in root:
            continue
        for f in files:
            if not f.endswith((".c.o", ".cu.o")):
                continue
            rel = root.split(".dir", 1)
            if len(rel) != 2:
                continue
            sub = rel[1].strip("/")
            src_rel = os.path.join(sub, f[:-2]) if sub else f[:-2]
            objs.setdefault(src_rel, os.path.join(root, f))
    return objs


def nm_symbols(objs):
    """Defined and undefined symbols of each object file, with one nm run."""
    out = subprocess.run(["nm", "-A"] + objs, capture_output=True, text=True,
                         check=True).stdout
    table = {o: (set(), set()) for o in objs}
    for line in out.splitlines():
        obj, _, rest = line.partition(": ")
        if obj not in table:
            obj, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[0] == "U":
            table[obj][1].add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRC":
            table[obj][0].add(parts[2])
    return table


def symbol_edges(src, build):
    objs = {k: v for k, v in object_files(build).items()
            if os.path.exists(os.path.join(src, k))}
    table = nm_symbols(sorted(objs.values())) if objs else {}
    definer, uses = {}, {}
    for src_rel, obj in objs.items():
        u = unit_of(os.path.join(src, src_rel), src)
        d, us = table[obj]
        for s in d:
            definer.setdefault(s, u)
        uses.setdefault(u, set()).update(us)
    edges = {}
    for u, us in uses.items():
        for s in us:
            v = definer.get(s)
            if v and v != u:
                edges.setdefault(u, set()).add(v)
    return edges, len(objs)


def circles(edges):
    """Strongly connected components with more than one unit (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    nodes = set(edges) | {v for vs in edges.values() for v in vs}
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def folder(u):
    return u.split("/")[0]


GRAPH_MARK = "<!-- arch_modules: folder graph -->"


def documented_graph(doc):
    """The folder table of docs/architecture.md: rows "| `a` | b, c |"
    after GRAPH_MARK, up to the first line that is not a table row. A
    second cell of "nothing" is no edge; text in parentheses and
    backquotes are ignored. Returns {folder: set of folders} or None when
    the mark is missing."""
    with open(doc, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    if GRAPH_MARK not in lines:
        return None
    graph = {}
    for line in lines[lines.index(GRAPH_MARK) + 1:]:
        line = line.strip()
        if not line:
            if graph:
                break
            continue
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: ") or cells[0] == "folder":
            continue
        deps = re.sub(r"\([^)]*\)", "", cells[1]).replace("`", "")
        graph[cells[0].strip("`")] = {d.strip() for d in deps.split(",")
                                      if d.strip() and d.strip() != "nothing"}
    return graph


def folder_graph(both):
    """Edges between folders, each with one unit pair that makes it."""
    graph = {}
    for u, vs in both.items():
        for v in vs:
            if folder(u) != folder(v):
                graph.setdefault(folder(u), {}).setdefault(folder(v), (u, v))
    return graph


def check_folder_graph(both, doc):
    """Rule 5; prints each difference and returns 1 when there is one."""
    measured = folder_graph(both)
    failed = 0
    for comp in circles({a: set(bs) for a, bs in measured.items()}):
        print("FAIL folder cycle: " + " -> ".join(comp))
        failed = 1
    table = documented_graph(doc)
    if table is None:
        print("FAIL %s has no folder table (the line %s)" % (doc, GRAPH_MARK))
        return 1
    folders = sorted(set(measured) | set(table) |
                     {b for bs in measured.values() for b in bs})
    for a in folders:
        have, said = set(measured.get(a, {})), table.get(a)
        if said is None:
            print("FAIL folder %s/ is missing from the table in %s" % (a, doc))
            failed = 1
            continue
        for b in sorted(have - said):
            u, v = measured[a][b]
            print("FAIL %s/ -> %s/ (%s uses %s) is not in the table in %s"
                  % (a, b, u, v, doc))
            failed = 1
        for b in sorted(said - have):
            print("FAIL the table in %s says %s/ -> %s/, which nothing uses"
                  % (doc, a, b))
            failed = 1
    return failed


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    src, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    verbose = "--verbose" in sys.argv
    inc = include_edges(src)
    sym, nobj = symbol_edges(src, build)
    if nobj == 0:
        print("no object files under %s: build first" % build)
        return 1
    failed = 0

    for comp in circles(inc):
        if len({folder(u) for u in comp}) > 1:
            print("FAIL include cycle across folders: " + " ".join(comp))
            failed = 1

    for u, vs in sorted(inc.items()):
        if folder(u) == "common":
            bad = sorted(v for v in vs if folder(v) != "common")
            if bad:
                print("FAIL %s includes %s (common/ includes nothing above it)"
                      % (u, ", ".join(bad)))
                failed = 1

    lua_re = re.compile(r'^\s*#\s*include\s+<(lua|lauxlib|lualib|luajit)\.h>', re.M)
    for path in source_files(src):
        u = unit_of(path, src)
        with open(path, encoding="utf-8", errors="replace") as fh:
            if folder(u) != "lua" and lua_re.search(fh.read()):
                print("FAIL %s includes a Lua header (only src/lua may)" % u)
                failed = 1
        if folder(u) == "cli":
            bad = sorted(v for v in inc.get(u, ()) if folder(v) not in ("cli", "common"))
            if bad:
                print("FAIL %s includes %s (stcli uses the public client API and src/common only)"
                      % (u, ", ".join(bad)))
                failed = 1

    both = {u: set(inc.get(u, ())) | set(sym.get(u, ())) for u in set(inc) | set(sym)}
    for f in sorted({folder(u) for u in both}):
        local = {u: {v for v in vs if folder(v) == f}
                 for u, vs in both.items() if folder(u) == f}
        for comp in circles(local):
            tag = "FAIL" if len(comp) > MAX_CIRCLE else "ok  "
            if len(comp) > MAX_CIRCLE:
                failed = 1
            if verbose or len(comp) > MAX_CIRCLE:
                print("%s circle of %d units in %s/: %s"
                      % (tag, len(comp), f, " ".join(u.split("/", 1)[1] for u in comp)))
    doc = os.path.join(os.path.dirname(src), "docs", "architecture.md")
    failed |= check_folder_graph(both, doc)
    nunits = len(both)
    print("%d units, %d object files: %s" % (nunits, nobj, "FAILED" if failed else "passed"))
    return failed


if __name__ == "__main__":
    sys.exit(main())
