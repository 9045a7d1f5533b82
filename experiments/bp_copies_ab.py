"""Lagrangian BP with and without ``solvers.bp_schedule.COPIES_BIND`` (the argmin plan's resharded copies make
the limit bind at the first price point when its node usages fit), on capped problems with copy groups.

Per problem, ``solvers.bp.bp_solve`` (60 rounds, no bound) twice in one process, the rule off then on: the
plan's cost (inf: no decode fits), the rounds run and the wall seconds, and new / old. Problems: every zoo
tiny model (gpt, mlp, vit, unet, fno, meshgraphnet) on cpu-2x4, h100-2x8 and tpu-4x4 at the cap fractions
``--fractions`` (``env.workloads.Workload``'s: least peak + f (greatest - least)), and the outside-the-zoo
steps of experiments/eval_outside.py on cpu-2x4 at its binding cap (half way from the least-usage plan's
peak to the uncapped ILP optimum's, where those differ), with that ILP's capped cost for reference
(``--ilp-seconds``). The built problems are pickled in ``--cache``.

    nice -n 10 python experiments/bp_copies_ab.py            # results/bp_copies_ab.json
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()

import numpy as np  # noqa: E402

MODELS = ("gpt", "mlp", "vit", "unet", "fno", "meshgraphnet")
CLUSTERS = ("cpu-2x4", "h100-2x8", "tpu-4x4")


def zoo_problems(fractions, cache: dict) -> list:
    """[(name, Problem)] of the zoo tiny models under caps, built once into ``cache``."""
    from env.workloads import Workload
    out = []
    for model in MODELS:
        for cl in CLUSTERS:
            for f in fractions:
                name = f"{model}:tiny:{cl}:{f:g}"
                if name not in cache:
                    cache[name] = Workload(model, "tiny", cl, None, f).build()
                out.append((name, cache[name], None))
    return out


def outside_problems(ilp_seconds: float, cache: dict) -> list:
    """[(name, Problem, the ILP's capped cost)] of eval_outside.py's steps at its binding caps."""
    import shardgym as sg
    from costmodel.problem import evaluate
    from experiments.eval_outside import _steps, binding_cap
    out = []
    for name, make in _steps().items():
        key = f"{name}:cpu-2x4:half"
        if key not in cache:
            fn, args = make()
            p = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset("cpu-2x4")).with_usage_limit(None)
            cap = binding_cap(p, sg.solve(p, method="ilp", time_limit_s=ilp_seconds))
            if cap is None:
                cache[key] = None
                continue
            pc = p.with_usage_limit(cap)
            cache[key] = (pc, evaluate(pc, sg.solve(pc, method="ilp", time_limit_s=ilp_seconds)).total)
        if cache[key] is not None:
            out.append((key, *cache[key]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fractions", default="0.05,0.2,0.5")
    ap.add_argument("--ilp-seconds", type=float, default=60.0)
    ap.add_argument("--cache", default="/tmp/bp_copies_ab_problems.pkl")
    ap.add_argument("--out", default="bp_copies_ab")
    a = ap.parse_args(argv)
    import solvers.bp_schedule as sched
    from experiments.common import print_table, write_results
    from solvers.bp import bp_solve
    cache = pickle.load(open(a.cache, "rb")) if os.path.exists(a.cache) else {}
    probs = zoo_problems([float(f) for f in a.fractions.split(",")], cache)
    probs += outside_problems(a.ilp_seconds, cache)
    with open(a.cache, "wb") as fh:
        pickle.dump(cache, fh)
    rows = []
    for name, p, ref in probs:
        row = {"problem": name, "nodes": p.num_nodes, "load_avg": [round(x, 2) for x in os.getloadavg()]}
        for key, on in (("old", False), ("new", True)):
            sched.COPIES_BIND = on
            t = time.perf_counter()
            r = bp_solve(p, bound=False)
            row.update({f"{key}_cost": r.cost, f"{key}_rounds": r.rounds, f"{key}_s": round(time.perf_counter() - t, 2)})
        sched.COPIES_BIND = True
        row["new_over_old"] = row["new_cost"] / row["old_cost"] if np.isfinite(row["old_cost"]) else float("nan")
        if ref is not None:
            row.update(ilp_cost=ref, old_over_ilp=row["old_cost"] / ref, new_over_ilp=row["new_cost"] / ref)
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    ratios = np.array([r["new_over_old"] for r in rows if np.isfinite(r["new_over_old"])])
    summary = {"problems": len(rows), "compared": int(ratios.size), "better": int((ratios < 0.999).sum()),
               "worse": int((ratios > 1.001).sum()), "geomean_new_over_old": float(np.exp(np.log(ratios).mean())),
               "min": float(ratios.min()), "max": float(ratios.max()),
               "median_s_old": float(np.median([r["old_s"] for r in rows])),
               "median_s_new": float(np.median([r["new_s"] for r in rows]))}
    print_table(rows, ["problem", "nodes", "old_cost", "new_cost", "new_over_old", "old_rounds", "new_rounds",
                       "old_s", "new_s"], title="bp_solve without / with COPIES_BIND")
    print("summary", summary)
    write_results(a.out, {"rows": rows, "summary": summary}, config=vars(a))


if __name__ == "__main__":
    main()
