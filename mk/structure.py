#!/usr/bin/env python3
"""structure.py - the house's structure facts, measured (docs/development.md, "Structure").

    mk/structure.py [--top N] [--root DIR] [BUILD]
        Prints, for the project's C and CUDA sources (tests, benchmarks, fuzz targets and the
        generated files left out): the files per folder, the longest files, the functions' count,
        median and longest, the file circles (mk/circles.py on BUILD, default build/rel: only
        when it holds objects), and the raw cJSON reads in the operator's controller, per file,
        with their sum over the reconcile logic (rec_*.c, reconcile.c, less the *view*.c
        decoders that build the typed views from the API's objects, where the reads belong).
        --root DIR measures another tree (the tests' small ones). Exit 0; 2 on a bad argument.

A function is a definition that starts at column 0 and whose body opens with '{' at the end of
its head and closes with '}' at column 0 (the project's one style, clang-format'ed), counted head
to closing brace. A raw cJSON read is a call of cJSON_Get*, cJSON_Is* on a looked-up item, or the
controller's get/get_str/get_num/json_get helpers: the issue counts them to see where the
controller still digs in the API's JSON instead of reading a typed view.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = ("tests/", "bench/", "fuzz/", "build/", "gen/", ".git/", "docker/", "charts/")
HEAD = re.compile(r"^[A-Za-z_][^;=]*\)\s*(?:const\s*)?\{\s*$")
RAW = re.compile(r"\b(?:cJSON_Get\w+|get_str|get_num|json_get\w*|get)\s*\(")


def sources():
    for d, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        dirs[:] = sorted(x for x in dirs if not (os.path.join(rel, x) + "/").lstrip("./").startswith(SKIP))
        for f in sorted(files):
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                yield os.path.normpath(os.path.join(rel, f))


def functions(path):
    """[(name, lines)] of the functions defined in path."""
    out, name, start = [], None, 0
    with open(os.path.join(ROOT, path), errors="replace") as f:
        for i, line in enumerate(f):
            if name is None and HEAD.match(line) and not line.startswith(("static const", "typedef")):
                m = re.search(r"(\w+)\s*\(", line)
                name, start = (m.group(1) if m else "?"), i
            elif name is not None and line.startswith("}"):
                out.append((name, i - start + 1))
                name = None
    return out


def count_lines(path):
    with open(os.path.join(ROOT, path), errors="replace") as f:
        return sum(1 for _ in f)


def raw_reads(path):
    n = 0
    with open(os.path.join(ROOT, path), errors="replace") as f:
        for line in f:
            code = re.sub(r"/\*.*?(\*/|$)", "", line.split("//")[0])
            if code.lstrip().startswith("*"):
                continue
            n += len(RAW.findall(code))
    return n


def circles(build):
    if not os.path.isdir(os.path.join(ROOT, build)):
        return "not measured (%s has no objects: run make first)" % build
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "circles.py"), build], cwd=ROOT,
                       capture_output=True, text=True)
    found = [l for l in r.stdout.splitlines() if "<->" in l]
    return "%d%s" % (len(found), "".join("\n    " + l for l in found))


def main():
    global ROOT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("build", nargs="?", default="build/rel")
    a = ap.parse_args()
    ROOT = os.path.abspath(a.root)
    files = list(sources())
    per_dir = {}
    for f in files:
        per_dir.setdefault(os.path.dirname(f), []).append(f)
    print("files per folder (C/CUDA sources and headers):")
    for d in sorted(per_dir):
        print("  %-22s %3d" % (d + "/", len(per_dir[d])))
    sizes = sorted(((count_lines(f), f) for f in files), reverse=True)
    print("longest files:", ", ".join("%s %d" % (f, n) for n, f in sizes[: a.top]))
    fns = [(n, name, f) for f in files if not f.endswith((".h", ".cuh")) for name, n in functions(f)]
    lens = [n for n, _, _ in fns]
    print("functions: %d, median %g lines, over 60: %d, over 100: %d"
          % (len(fns), statistics.median(lens), sum(n > 60 for n in lens), sum(n > 100 for n in lens)))
    print("longest functions:", ", ".join("%s (%s) %d" % (name, f, n) for n, name, f in sorted(fns, reverse=True)[: a.top]))
    print("file circles:", circles(a.build))
    ctl = [f for f in files if f.startswith("operator/") and not f.startswith("operator/client/") and f.endswith(".c")]
    reads = [(raw_reads(f), f) for f in ctl]
    logic = sum(n for n, f in reads if os.path.basename(f).startswith(("rec_", "reconcile")) and "view" not in f)
    print("raw cJSON reads in the operator's controller: %d, in its reconcile logic (rec_*.c, reconcile.c, less the views): %d"
          % (sum(n for n, _ in reads), logic))
    for n, f in sorted(reads, reverse=True):
        if n:
            print("  %-32s %3d" % (f, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
