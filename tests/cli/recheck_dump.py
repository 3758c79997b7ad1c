#!/usr/bin/env python3
"""Re-checks a plan's optimum from `cephalo plan --dump-costs` alone, by exhaustive search.

usage: recheck_dump.py COSTS.json PLAN.json
Prints the exhaustive optimum and the plan's predicted value (iter_ms - optimizer_ms); exits 1
when they differ. Small instances only (the search enumerates every assignment)."""
import itertools
import json
import math
import sys


def best_cost(costs):
    comm = costs["comm"]
    bpp = costs["state_bytes_per_param"]
    params = costs["params"]
    even_state = comm["even_state_params"] * bpp
    groups = costs["groups"]
    ranks = [groups[g] for g in costs["rank_group"]]
    B = costs["batch"]
    options = [[tuple(c) for c in r["candidates"]] for r in ranks]
    best = math.inf
    for combo in itertools.product(*options):
        if sum(m * l for m, l, *_ in combo) != B:
            continue
        F = max(c[2] for c in combo)
        K = max(c[3] for c in combo)
        even = all(c[4] + even_state <= r["usable_bytes"] for c, r in zip(combo, ranks))
        room = sum(math.floor((r["usable_bytes"] - c[4]) / bpp) for c, r in zip(combo, ranks))
        if not even and room < params:
            continue
        f = 1.0 if even else comm["uneven_factor"]
        cost = comm["exposed_ms"] * f + max(F, comm["fwd_collectives_ms"] * f) + max(K, comm["bwd_collectives_ms"] * f)
        best = min(best, cost)
    return best


def main():
    costs = json.load(open(sys.argv[1]))
    plan = json.load(open(sys.argv[2]))
    expect = best_cost(costs)
    got = plan["predicted"]["iter_ms"] - plan["predicted"]["optimizer_ms"]
    print(f"exhaustive optimum {expect:.6f} ms, plan {got:.6f} ms")
    sys.exit(0 if abs(expect - got) <= 1e-6 * max(1.0, expect) else 1)


main()
