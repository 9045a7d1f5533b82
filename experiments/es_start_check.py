"""Does agent/fgnn_es.py's objective start where it should? On the problems an ES run trains and validates on
(``agent.fgnn_es.binding_problems``: the training split's binding-cap problems of at most ``--max-nodes``
nodes, never a held-out model or cluster), the zero-correction network's own plan (``FGNN.plan``, the
jitted run that the ES ``Scorer`` prices every perturbation with) against ``solvers.bp.bp_solve``'s
(Lagrangian BP in numpy, 60 rounds): the cost ratio per problem (1.0: the ES start is Lagrangian BP), whether the
problem has copy groups on its edges (``solvers.bp_copies.copy_prices``: where the jitted decode lacked
bp_solve's copy-priced phase before session 25) and both wall times (the first jitted call of a shape compiles).

    nice -n 10 python experiments/es_start_check.py [--problems 40] [--max-nodes 1000]   # results/s25c_es_start_check.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments.common import cpu_devices, write_results  # noqa: E402

cpu_devices()

import numpy as np  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--max-nodes", type=int, default=1000)
    ap.add_argument("--random-problems", type=int, default=48)
    ap.add_argument("--val-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-name", default="s25c_es_start_check")
    args = ap.parse_args()
    from agent.fgnn import FGNN, FGConfig, FGInputs
    from agent.fgnn_es import binding_problems
    from costmodel.problem import evaluate
    from solvers.bp import bp_solve
    from solvers.bp_copies import copy_prices
    from solvers.local import LocalCosts

    def cost(p, plan):
        c = None if plan is None else evaluate(p, plan)
        return c.total if c is not None and c.feasible else float("inf")

    a = SimpleNamespace(seed=args.seed, random_problems=args.random_problems, problems=args.problems,
                        max_nodes=args.max_nodes, val_every=args.val_every)
    load0 = open("/proc/loadavg").read().strip()
    tr, va = binding_problems(a, time.perf_counter() + 1e9, print)
    net = FGNN(FGConfig())
    zero = FGNN.zero_corrections(net.params)
    rows = []
    for split, items in (("train", tr), ("validation", va)):
        for name, p in items:
            t = time.perf_counter()
            try:
                cn = cost(p, net.plan(p, params=zero, inputs=FGInputs.of(p)))
            except ValueError:     # no decode fits
                cn = float("inf")
            tn, t = time.perf_counter() - t, time.perf_counter()
            cb = cost(p, bp_solve(p, rounds=net.config.rounds, memory_prices=True).plan)
            rows.append({"split": split, "name": name, "nodes": p.num_nodes,
                         "copy_groups": copy_prices(LocalCosts(p)) is not None, "network": cn, "bp_solve": cb,
                         "ratio": cn / cb if np.isfinite(cb) and cb > 0 else None,
                         "network_s": round(tn, 2), "bp_solve_s": round(time.perf_counter() - t, 2)})
            print(rows[-1], flush=True)
    same = sum(r["ratio"] is not None and abs(r["ratio"] - 1) < 1e-9 for r in rows)
    summary = {"problems": len(rows), "train": len(tr), "validation": len(va), "same_cost": same,
               "with_copy_groups": sum(r["copy_groups"] for r in rows), "load_before": load0,
               "load_after": open("/proc/loadavg").read().strip()}
    print(summary)
    print(write_results(args.out_name, {"summary": summary, "rows": rows}, config=vars(args), seed=args.seed))


if __name__ == "__main__":
    main()
