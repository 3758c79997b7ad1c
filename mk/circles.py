#!/usr/bin/env python3
"""circles.py - file circles among the project's C and CUDA sources (docs/development.md, "Layers").

File A uses file B when A's object calls a function (or reads a variable) that B's object
defines. A circle is a set of files that all reach each other through such uses (a strongly
connected component of more than one file): none of them can be read, tested or replaced without
the others, and a change to one is a change to all. Read off the built objects with nm, so it
sees what the linker sees, through whatever header declared it.

    mk/circles.py [--allow FILE] [BUILD]
        BUILD: the build folder (default build/rel). Prints each circle with the symbols that
        close it; exits 1 if there is any, 2 when BUILD holds no objects or FILE is unreadable.
        --allow FILE: the circles known and still to be removed, one a line, as this prints
        them ("a <-> b", the files sorted; '#' starts a comment). A circle found is allowed when
        every file of it is in one listed circle (a listed circle may shrink); any other circle,
        a new one or a listed one grown by a file, exits 1. A listed circle that is gone is
        named (its line can go); one whose files are not all built here (the .cu objects exist
        only where CUDA is built) is passed over. make test runs it with mk/circles.allow
        (tests/cli/test_circles.sh).

The programs' main.c files, tests, benchmarks and fuzz targets are left out (they use everything
and nothing uses them), and so is an object whose source is no longer in this tree.
"""
import argparse
import glob
import os
import subprocess
import sys

SKIP = ("tests/", "bench/", "fuzz/", "gen/")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def objects(build):
    out = []
    for o in glob.glob(os.path.join(build, "**", "*.o"), recursive=True):
        rel = os.path.relpath(o, build)
        if rel.startswith(SKIP) or rel.startswith("cuda/") or os.path.basename(rel) == "main.o":
            continue
        name = rel[:-2]  # "worker/devices/cuda_device.cu" for a .cu.o
        # an object whose source is gone (moved, renamed) is stale: it would close false circles
        if os.path.exists(os.path.join(ROOT, name if name.endswith(".cu") else name + ".c")):
            out.append((name, o))
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


def read_allow(path):
    """[(line number, frozenset of files)] of an allow file."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if line:
                out.append((i, frozenset(x.strip() for x in line.split("<->"))))
    return out


def show(c, g, tag):
    """A circle found, with (up to six of) the symbols each file uses of another in it."""
    print("%s: %s" % (tag, " <-> ".join(c)))
    for f in c:
        for t, syms in sorted(g.get(f, {}).items()):
            if t in c:
                print("  %s uses %s: %s" % (f, t, ", ".join(sorted(syms)[:6])))


def verdict(c, allow):
    """(allowed?, the words for it) for a circle found, against the listed ones."""
    for _, a in allow:
        if set(c) <= a:
            return True, "allowed circle" if set(c) == a else "allowed circle (shrunk)"
    for _, a in allow:
        if set(c) & a:  # a listed circle may shrink, never take in another file
            return False, "circle grew from %s" % " <-> ".join(sorted(a))
    return False, "circle"


def gone(found, allow, built, path):
    """Names each listed circle that is built here and no longer found (its line can go)."""
    for line, a in allow:
        if a <= built and not any(set(c) <= a for c in found):
            print("%s:%d: no longer a circle: %s (remove the line)" % (path, line, " <-> ".join(sorted(a))))


def main():
    ap = argparse.ArgumentParser(description="file circles among the built objects")
    ap.add_argument("--allow", metavar="FILE", help="circles allowed, one a line (a <-> b)")
    ap.add_argument("build", nargs="?", default="build/rel")
    args = ap.parse_args()
    objs = objects(args.build)
    if not objs:
        print("circles: no objects under %s (build first)" % args.build, file=sys.stderr)
        return 2
    g = uses(*symbols(objs))
    found = circles(g)
    try:
        allow = read_allow(args.allow) if args.allow else []
    except OSError as e:
        print("circles: %s" % e, file=sys.stderr)
        return 2
    bad = 0
    for c in found:
        ok, tag = verdict(c, allow)
        bad += not ok
        show(c, g, tag)
    gone(found, allow, {n for n, _ in objs}, args.allow)
    print("circles: %d among %d files%s" % (len(found), len(objs),
                                            ", %d not allowed" % bad if args.allow else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
