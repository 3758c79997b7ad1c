#!/usr/bin/env python3
"""Plans and checkpoints for the multi-rank tests (tests/cli/test_fsdp.sh).

    plan_tool.py rewrite BASE.json OUT.json --ranks 5:1,3:3,0:1,4:2 --shards random --seed 3
        Rewrites a planner-made plan of N ranks: rank i gets batch b_i as microbatches of m_i
        ("b:m"; b = 0 gives the rank no samples), and every unit's shard_sizes become random
        uneven splits (with zeros), "even", or "one" (rank 0 holds everything); --precision
        replaces the plan's precision. The rewritten plan's predictions are not the planner's
        any more, so it loses inputs.engine, the memory switches it was planned under (workers
        check those only against a planner-made plan: docs/formats.md).
    plan_tool.py compare CKPT_A CKPT_B --tol 1e-5
        Assembles the parameters of two checkpoints (a file, or a sharded step directory with
        index.json) and compares them unit by unit: max |a - b| / max |b| per unit <= tol
        (--rms: ||a - b|| / ||b||, for bf16, where a few elements may take another path).
    plan_tool.py compare CKPT_A CKPT_B --step LR*STEPS --tol 1e-2
        The bound for runs that differ only in the order of their sums (another plan, another
        BLAS kernel): rms(a - b) per unit, in units of the most AdamW can move an element
        (lr x steps). Why: the orders change each gradient element by about 1e-6 of its tensor's
        scale; Adam's update g / (sqrt(v) + eps) turns that into lr x noise / |g|, which is a
        whole step (either sign) for the few elements whose gradient is in the noise. An element
        bound (max) is then at the mercy of the one worst element, which the BLAS kernel picks
        (2.1e-4 of max |b| on AVX2, 7e-5 on AVX-512, same plan); the RMS over a unit is not
        (measured 9e-7 to 5.6e-4 of a step on four imported models and four OpenBLAS kernel
        families), while a wrong gradient moves every element it touches by O(1) of a step
        (one sample of 12 left out: 0.23).
    plan_tool.py recompute PLAN.json OUT.json none|full
        Sets every rank's recompute mode (the worker refuses a --recompute that is not its plan's).
    plan_tool.py gather CKPT
        Prints the sha256 of the assembled parameters and moments (equal => identical state).
"""
import argparse
import hashlib
import json
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ref"))
import st  # noqa: E402


def split_random(n, world, rng):
    """A random split of n into world parts, some of them zero."""
    cuts = sorted(rng.randint(0, n) for _ in range(world - 1))
    parts = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    if world > 1 and rng.random() < 0.3:  # sometimes one rank holds none of the unit
        k = rng.randrange(world)
        parts[(k + 1) % world] += parts[k]
        parts[k] = 0
    return parts


def split_even(n, world):
    return [n // world + (1 if i < n % world else 0) for i in range(world)]


def rewrite(args):
    plan = json.load(open(args.base))
    world = len(plan["ranks"])
    specs = [s.split(":") for s in args.ranks.split(",")]
    if len(specs) != world:
        sys.exit(f"--ranks has {len(specs)} entries, the plan {world} ranks")
    total = 0
    for r, (b, m) in zip(plan["ranks"], specs):
        b, m = int(b), int(m)
        r["batch"], r["microbatch"], r["microbatches"] = b, m, (b // m if b else 0)
        total += b
    plan["inputs"]["batch"] = total
    plan["inputs"].pop("engine", None)
    if args.precision:
        plan["inputs"]["precision"] = args.precision
    rng = random.Random(args.seed)
    for u in plan["units"]:
        n = u["numel"]
        if args.shards == "random":
            u["shard_sizes"] = split_random(n, world, rng)
        elif args.shards == "even":
            u["shard_sizes"] = split_even(n, world)
        else:
            u["shard_sizes"] = [n] + [0] * (world - 1)
    json.dump(plan, open(args.out, "w"), indent=1)


def set_recompute(args):
    plan = json.load(open(args.plan))
    for r in plan["ranks"]:
        r["recompute"] = args.mode
    json.dump(plan, open(args.out, "w"), indent=1)


def flatten(path):
    """{tensor name: full array}, placing each shard at its offset (from the file's metadata)."""
    if os.path.isdir(path):
        index = json.load(open(os.path.join(path, "index.json")))
        files = [os.path.join(path, f["file"]) for f in index["files"]]
    else:
        files = [path]
    pieces = {}
    for file in files:
        tensors, meta = st.read(file)
        shard = json.loads(meta["cephalo.shard"]) if "cephalo.shard" in meta else None
        names = unit_names(json.loads(meta["cephalo.model"]))
        for name, arr in tensors.items():
            kind, unit = name.split(".", 1)
            off = shard["offsets"][names.index(unit)] if shard else 0
            pieces.setdefault(name, []).append((off, arr))
    full = {}
    for name, lst in pieces.items():
        size = max(off + len(a) for off, a in lst)
        buf = np.full(size, np.nan, np.float32)
        for off, a in lst:
            buf[off:off + len(a)] = a
        if np.isnan(buf).any():
            sys.exit(f"{path}: {name} is not fully covered by the shards")
        full[name] = buf
    return full


def unit_names(model):
    return ["embedding"] + [f"block.{i}" for i in range(model["n_layer"])] + ["head"]


def compare(args):
    a, b = flatten(args.a), flatten(args.b)
    if sorted(a) != sorted(b):
        sys.exit(f"different tensors: {sorted(set(a) ^ set(b))}")
    worst, where = 0.0, ""
    for name in sorted(a):
        if not name.startswith("param."):
            continue
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if args.step:
            rel = np.sqrt(np.mean((x - y) ** 2)) / args.step
        elif args.rms:
            rel = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)
        else:
            rel = np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)
        if rel > worst:
            worst, where = rel, name
    if args.step:
        print(f"rms parameter difference {worst:.3g} x lr*steps ({where})")
    else:
        kind = "rms" if args.rms else "max"
        print(f"{kind} relative parameter difference {worst:.3g} ({where})")
    sys.exit(0 if worst <= args.tol else 1)


def gather(args):
    full = flatten(args.ckpt)
    h = hashlib.sha256()
    for name in sorted(full):
        h.update(name.encode())
        h.update(full[name].tobytes())
    print(h.hexdigest())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rewrite")
    r.add_argument("base"), r.add_argument("out")
    r.add_argument("--ranks", required=True)
    r.add_argument("--shards", choices=["random", "even", "one"], default="random")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="replaces inputs.precision")
    c = sub.add_parser("compare")
    c.add_argument("a"), c.add_argument("b")
    c.add_argument("--tol", type=float, default=1e-5)
    c.add_argument("--rms", action="store_true",
                   help="||a - b|| / ||b|| per unit instead of max |a - b| / max |b|")
    c.add_argument("--step", type=float, default=0.0,
                   help="rms(a - b) per unit in units of STEP (lr x steps: AdamW's largest move)")
    m = sub.add_parser("recompute")
    m.add_argument("plan"), m.add_argument("out"), m.add_argument("mode", choices=["none", "full"])
    g = sub.add_parser("gather")
    g.add_argument("ckpt")
    args = p.parse_args()
    {"rewrite": rewrite, "compare": compare, "gather": gather, "recompute": set_recompute}[args.cmd](args)


if __name__ == "__main__":
    main()
