#!/usr/bin/env python3
"""circles.py - file circles among the project's C and CUDA sources (docs/development.md, "Layers").

File A uses file B when A's object calls a function (or reads a variable) that B's object
defines. A circle is a set of files that all reach each other through such uses (a strongly
connected component of more than one file): none of them can be read, tested or replaced without
the others, and a change to one is a change to all. Read off the built objects with nm, so it
sees what the linker sees, through whatever header declared it.

    mk/circles.py [BUILD]      BUILD: the build folder (default build/rel); prints each circle
                               with the symbols that close it, exits 1 if there is any

The programs' main.c files, tests, benchmarks and fuzz targets are left out (they use everything
and nothing uses them).
"""
import glob
import os
import subprocess
import sys

SKIP = ("tests/", "bench/", "fuzz/", "gen/")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def objects(build):
    out = []
    for o in glob.glob(os.path.join(build, "**", "*.o"), recursive=True):
        rel = os.path.relpath(o, build)
        if rel.startswith(SKIP) or rel.startswith("cuda/") or os.path.basename(rel) == "main.o":
            continue
        src = rel[:-2] if rel.endswith(".cu.o") else rel[:-2] + ".c"
        if not os.path.exists(os.path.join(ROOT, src)):  # left over from a file since moved or deleted
            continue
        out.append((rel[:-2], o))  # "worker/devices/cuda_device.cu" for a .cu.o
    return out


def symbols(objs):
    """({symbol: defining file}, {file: {undefined symbols}})"""
    defs, undefs = {}, {}
    for name, path in objs:
        text = subprocess.run(["nm", "-g", path], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBRCVW":
                defs.setdefault(f[2], name)
            elif len(f) == 2 and f[0] == "U":
                undefs.setdefault(name, set()).add(f[1])
    return defs, undefs


def uses(defs, undefs):
    """{file: {used file: [symbols]}}"""
    g = {}
    for f, us in undefs.items():
        for u in us:
            t = defs.get(u)
            if t and t != f:
                g.setdefault(f, {}).setdefault(t, []).append(u)
    return g


def circles(g):
    """Tarjan's strongly connected components of more than one file, iteratively."""
    index, low, on, stack, found = {}, {}, set(), [], []
    for start in sorted(g):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start), on.add(start)
        work = [(start, iter(sorted(g.get(start, {}))))]
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w), on.add(w)
                    work.append((w, iter(sorted(g.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return found


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build/rel"
    objs = objects(build)
    if not objs:
        print("circles: no objects under %s (build first)" % build, file=sys.stderr)
        return 2
    g = uses(*symbols(objs))
    found = circles(g)
    for c in found:
        print("circle: " + " <-> ".join(c))
        for f in c:
            for t, syms in sorted(g.get(f, {}).items()):
                if t in c:
                    print("  %s uses %s: %s" % (f, t, ", ".join(sorted(syms)[:6])))
    print("circles: %d among %d files" % (len(found), len(objs)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
