#!/usr/bin/env python3
"""crd_doc.py - every field of the CephaloJob CRD is documented in docs/k8s.md, and every field
documented there exists (tests/cli/test_crd_doc.sh).

The spec and status tables of docs/k8s.md ("### `spec`", "### `status`") name fields in their
first column, in backticks, dotted from spec or status (`gpus.minGPUs`; a list `conditions[]`).
A field counts as documented when a row names it, or when its parent is documented and the
parent's row names it in backticks (`tolerations`' row lists `key`, `operator`, ...); an object
whose fields have rows of their own needs none (`optimizer`: `optimizer.lr`, ...). An inline
model's fields are a model file's: docs/formats.md's model file table ("## Model files",
"### Fields") documents them. Free-form parts (no properties in the schema) have no fields.

    mk/crd_doc.py [--crd FILE] [--docs DIR]    exit 0 all documented, 1 not (each field named)
"""
import argparse
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = re.compile(r"`([A-Za-z][A-Za-z0-9_.]*)(?:\[\])?`")


def table_rows(text, heading):
    """The rows of the first table after `heading` (a whole line), as (first cell, whole row)."""
    lines = text.splitlines()
    if heading not in lines:
        raise SystemExit(f"crd_doc.py: no heading {heading!r}")
    rows, i = [], lines.index(heading) + 1
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    for line in lines[i:]:
        if not line.startswith("|"):
            break
        cells = line.split("|")
        if len(cells) > 2 and not set(cells[1].strip()) <= set("-: "):
            rows.append((cells[1], line))
    return rows[1:]  # less the header


def documented(rows, prefix=""):
    """{dotted name: the text of its row}, from each row's first cell."""
    out = {}
    for first, row in rows:
        for name in NAME.findall(first):
            out[prefix + name] = row
    return out


def fields(schema, path=""):
    """(dotted path, its schema) of every property under schema; list items are looked into."""
    if schema.get("type") == "array":
        schema = schema.get("items", {})
    for name, sub in (schema.get("properties") or {}).items():
        p = f"{path}.{name}" if path else name
        yield p, sub
        yield from fields(sub, p)


def check(crd_path, docs):
    crd = yaml.safe_load(open(crd_path))
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    k8s = open(os.path.join(docs, "k8s.md")).read()
    model = open(os.path.join(docs, "formats.md")).read()
    model = model[model.index("\n## Model files"):]
    model_fields = documented(table_rows(model, "### Fields"))
    problems, counts = [], {}
    for part in ("spec", "status"):
        rows = documented(table_rows(k8s, f"### `{part}`"))
        have = dict(fields(root[part]))
        counts[part] = len(have)
        for path in have:
            parent, _, leaf = path.rpartition(".")
            if path in rows or any(r.startswith(path + ".") for r in rows):  # a row, or rows of its fields
                continue
            if part == "spec" and parent == "model.inline":
                if leaf not in model_fields:
                    problems.append(f"{part}.{path}: an inline model field that docs/formats.md's model file table lacks")
                continue
            if parent in rows and f"`{leaf}`" in rows[parent]:
                rows[path] = rows[parent]  # its own fields may be named in the same row
                continue
            where = f", or name it in `{parent}`'s row" if parent in rows else ""
            problems.append(f"{part}.{path}: not in docs/k8s.md's {part} table (give it a row{where})")
        for name in sorted(documented(table_rows(k8s, f"### `{part}`"))):
            if name not in have:
                problems.append(f"{part}.{name}: documented in docs/k8s.md's {part} table but not in {crd_path}")
    return problems, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crd", default=os.path.join(ROOT, "crds", "cephalojobs.cephalo.dev.yaml"))
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    a = ap.parse_args()
    problems, counts = check(a.crd, a.docs)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"every CRD field is documented: {counts['spec']} spec and {counts['status']} status fields")
    return 0


if __name__ == "__main__":
    sys.exit(main())
