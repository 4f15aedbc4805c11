#!/usr/bin/env python3
"""Fail when the source files of a library call each other in a circle.

    tools/check-file-cycles.py OBJECT...

Reads each object's symbol table (nm): a file that uses a function another
file defines depends on that file. Shared utilities belong in leaf files,
so the dependency graph must have no cycle; each cycle found is printed
with the symbols that close it, and the exit status is 1.
"""
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", obj], check=True, capture_output=True, text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRVW":
            defined.add(parts[2])
    return defined, used


def name(obj):
    base = os.path.basename(obj)
    return base[:-2] if base.endswith(".o") else base


def cycles(graph):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(objs):
    if not objs:
        print("usage: check-file-cycles.py OBJECT...", file=sys.stderr)
        return 2
    syms = {name(o): symbols(o) for o in objs}
    owner = {s: f for f, (d, _) in syms.items() for s in d}
    edges = {f: {} for f in syms}
    for f, (_, used) in syms.items():
        for s in used:
            g = owner.get(s)
            if g and g != f:
                edges[f].setdefault(g, set()).add(s)
    found = cycles({f: set(e) for f, e in edges.items()})
    for comp in found:
        print("FAIL: these files call each other in a circle:", " ".join(comp))
        for f in comp:
            for g in sorted(edges[f]):
                if g in comp:
                    print(f"  {f} -> {g}: {' '.join(sorted(edges[f][g]))}")
    if not found:
        print(f"file cycles: none among {len(objs)} objects")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
