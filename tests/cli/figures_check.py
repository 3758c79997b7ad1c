#!/usr/bin/env python3
"""figures_check.py ROOT - checks docs/figures.md's table against the repository at ROOT.

Each row of the table under "## The figures" names a file (a markdown link relative to docs/), the
words that quote a figure there ("..." with \\| for a table's |), the command that reproduces it
and the machine and date. The quoted words must appear in that file (runs of whitespace, line
breaks included, count as one space); every `make TARGET` must be a Makefile rule, every
repository path in the command must exist, every build/*/bench/NAME must be a Makefile product
with its bench/ source, every VARIABLE the command sets must be read by the Makefile, bench/ or mk/,
and the last column must carry a date (YYYY-MM-DD). Prints "N figures checked" or one line per
problem (docs/figures.md:LINE: ...) and exits 1. Used by tests/cli/test_figures.sh."""
import os
import re
import sys


def cells(line):
    """The cells of a markdown table row, split on | not preceded by a backslash."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [p.strip() for p in parts[1:-1]]


def flat(text):
    return re.sub(r"\s+", " ", text)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def check_command(root, makefile, readers, span, where, problems):
    words = span.split()
    if not words:
        return
    if words[0] == "make":
        for w in words[1:]:
            if "=" in w:
                continue
            rule = re.compile(r"^[^\t#=\n]*(?<![\w.$(/-])" + re.escape(w) + r"(?![\w-])[^\t#=\n]*:(?!=)", re.M)
            if not rule.search(makefile):
                problems.append(f"{where}: `{span}`: the Makefile has no target {w}")
    for w in words:
        name = w.split("=", 1)[0] if "=" in w else w
        if re.fullmatch(r"[A-Z][A-Z0-9_]{2,}", name):
            if not any(name in r for r in readers):
                problems.append(f"{where}: `{span}`: nothing in the Makefile, bench/ or mk/ reads {name}")
            continue
        if "/" not in w or "$" in w or "=" in w or w.startswith("-"):
            continue
        m = re.fullmatch(r"build/[^/]+/bench/([\w-]+)", w)
        if m:
            src = os.path.join(root, "bench", m.group(1) + ".c")
            product = re.compile(r"\$\(BUILD\)/bench/" + re.escape(m.group(1)) + r"(?![\w.])")
            if not os.path.exists(src) or not product.search(makefile):
                problems.append(f"{where}: `{span}`: {w} is not built by the Makefile from bench/{m.group(1)}.c")
            continue
        if w.startswith("build/"):
            continue
        if not os.path.exists(os.path.join(root, w)):
            problems.append(f"{where}: `{span}`: {w} does not exist")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: figures_check.py ROOT")
    root = sys.argv[1]
    table = os.path.join(root, "docs", "figures.md")
    makefile = read(os.path.join(root, "Makefile"))
    readers = [makefile]
    for d in ("bench", "mk"):
        for name in sorted(os.listdir(os.path.join(root, d))):
            p = os.path.join(root, d, name)
            if os.path.isfile(p):
                readers.append(read(p))
    problems, rows, inside = [], 0, False
    for no, line in enumerate(read(table).splitlines(), 1):
        if line.startswith("## "):
            inside = line.strip() == "## The figures"
            continue
        if not inside or not line.startswith("|") or re.fullmatch(r"\|[-| ]+\|", line.strip()):
            continue
        c = cells(line)
        where = f"docs/figures.md:{no}"
        if c[:3] == ["figure", "quoted in", "as"]:
            continue
        if len(c) != 5:
            problems.append(f"{where}: {len(c)} cells, expected 5 (figure, quoted in, as, command, machine and date)")
            continue
        rows += 1
        link = re.fullmatch(r"\[[^\]]+\]\(([^)#]+)\)", c[1])
        quote = re.fullmatch(r'"(.+)"', c[2])
        if not link or not quote:
            problems.append(f"{where}: expected a [file](link) and a \"quoted\" text, got {c[1]!r} and {c[2]!r}")
            continue
        target = os.path.normpath(os.path.join(root, "docs", link.group(1)))
        shown = os.path.relpath(target, root)
        if not os.path.isfile(target):
            problems.append(f"{where}: {shown} does not exist")
            continue
        text = flat(quote.group(1).replace("\\|", "|"))
        if text not in flat(read(target)):
            problems.append(f"{where}: {shown} no longer says \"{text}\" (changed the figure? change this table too)")
        spans = re.findall(r"`([^`]+)`", c[3])
        if not spans:
            problems.append(f"{where}: the command column names no `command`")
        for span in spans:
            check_command(root, makefile, readers, span, where, problems)
        if not re.search(r"\b20\d\d-\d\d-\d\d\b", c[4]):
            problems.append(f"{where}: no date (YYYY-MM-DD) in {c[4]!r}")
    if rows == 0:
        problems.append("docs/figures.md: no rows under \"## The figures\"")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"{rows} figures checked")


if __name__ == "__main__":
    main()
