"""Ablation of the raw decode on the held-out capped problems: the network's raw plan
(``shardgym.solve(method="policy", search=False)``, ``--checkpoint``: default the shipped one) against
the same network with its learned messages swapped for BP's (``FGNN.bp_messages``: learned prices and
readout kept; damping, soft-min and message residuals at zero), Lagrangian BP (``bp_solve`` with memory
prices, what a network with zero learned corrections is) and plain BP (no prices; the decode still
masks by the least-usage floor), each as cost / best-known (results/heldout_reference.json).

    python experiments/raw_decode_ablation.py [--only SUBSTRING] [--json OUT] [--checkpoint PATH]

Uses experiments/raw_decode_bench.py's pickled problems (``--cache``, built by it).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from experiments.raw_decode_bench import binding, held_out_cli  # noqa: E402


def main() -> None:
    args, probs = held_out_cli(only="cap")
    import shardgym as sg
    from agent.fgnn import FGNN
    from agent.planner import Planner
    from costmodel.problem import evaluate
    from experiments.heldout_reference import load, lookup
    from solvers.bp import bp_solve
    entries, out = load(), {}
    planner = Planner.load(args.checkpoint)
    swapped = FGNN.bp_messages(planner.params)
    runs = {"network": lambda p: sg.solve(p, method="policy", search=False, checkpoint=args.checkpoint).strategies,
            "bp_messages": lambda p: planner.plan(p, polish=False, params=swapped),
            "lagrangian_bp": lambda p: bp_solve(p, rounds=60, memory_prices=True, bound=False).plan,
            "plain_bp": lambda p: bp_solve(p, rounds=60, memory_prices=False, bound=False).plan}
    load_before = open("/proc/loadavg").read().strip()
    best = {n: (e or {}).get("cost") or float("nan") for n, p in probs for e in [lookup(entries, n, p)]}
    for name, p in probs:
        if args.only not in name:
            continue
        e = lookup(entries, name, p)
        row = {"binding": binding(name, best)}
        for label, run in runs.items():
            t = time.perf_counter()
            x = run(p)
            c = evaluate(p, x) if x is not None else None
            ok = bool(c is not None and c.feasible)
            row[label] = {"ratio": c.total / e["cost"] if ok else float("inf"), "feasible": ok,
                          "seconds": time.perf_counter() - t}
        out[name] = row
        print(f"{name:42s} " + " ".join(f"{k} {row[k]['ratio']:6.3f}{'' if row[k]['feasible'] else '!'}" for k in runs)
              + (" (binding)" if row["binding"] else ""), flush=True)
    for group, keep in (("capped", lambda r: True), ("binding", lambda r: r["binding"])):
        for label in runs:
            rs = [r[label]["ratio"] for r in out.values() if keep(r)]
            if rs:
                print(f"{group} {label}: median {np.median(rs):.3f} max {max(rs):.3f} (n={len(rs)})")
    load_after = open("/proc/loadavg").read().strip()
    print("load", load_before, "->", load_after)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**out, "_load": {"before": load_before, "after": load_after},
                       "_checkpoint": args.checkpoint}, f, indent=1)


if __name__ == "__main__":
    main()
