"""Session 27 (task b, issue 18): the default planner (``shardgym.solve(method="policy")``) on the 9 capped
held-out problems, a base tree against this one, one after the other: the rows session 27's change to
``solvers.local.budgeted.capped_search`` can touch (the uncapped rows take no capped search).

    python experiments/s27b_heldout_default_ab.py --rows-json /tmp/base_rows.json   # in the base tree
    python experiments/s27b_heldout_default_ab.py --before /tmp/base_rows.json      # here: rows + JSON

Each row: cost / best-known (results/heldout_reference.json), feasibility, seconds (one call), a hash of
the plan and the search's Lagrangian rounds. The problems come from experiments/raw_decode_bench.py's
pickle (/tmp/heldout_problems.pkl). With ``--before``, this tree's rows are joined to the base's and
results/s27b_heldout_default_ab.json is written (medians over the capped and the binding-cap rows, how
many plans are the same).
"""
from __future__ import annotations

import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")


def rows() -> dict:
    """This tree's rows (the module docstring)."""
    import shardgym as sg
    from costmodel.problem import evaluate
    from experiments.heldout_reference import load, lookup
    from experiments.raw_decode_bench import binding, held_out_problems
    from experiments.s25b_jitted_decode import _sha
    entries, best, out = load(), {}, {"rows": {}, "load_before": open("/proc/loadavg").read().strip()}
    probs = held_out_problems()
    for name, p in probs:
        e = lookup(entries, name, p)
        best[name] = e["cost"] if e and e.get("cost") else float("nan")
    for name, p in probs:
        if " cap" not in name:
            continue
        t = time.perf_counter()
        plan = sg.solve(p, method="policy")
        dt = time.perf_counter() - t
        c = evaluate(p, plan.strategies)
        search = plan.info.get("search") or {}
        out["rows"][name] = {"ratio": c.total / best[name], "feasible": bool(c.feasible), "seconds": round(dt, 2),
                             "plan": _sha(plan.strategies), "binding": binding(name, best), "nodes": p.num_nodes,
                             "rounds": search.get("rounds"), "phase": search.get("phase")}
        print(name, json.dumps(out["rows"][name]), flush=True)
    out["load_after"] = open("/proc/loadavg").read().strip()
    return out


def main() -> None:
    import tree_ab
    args = tree_ab.parse(__doc__, ROOT, lambda ap: ap.add_argument("--out", default="s27b_heldout_default_ab",
                                                                    help="results/OUT.json (session 28: s28a_...)"))
    before = tree_ab.rows_or_before(args, rows)
    if before is None:
        return
    import numpy as np

    from experiments.common import write_results
    head = rows()
    summary = {}
    for tree, r in (("before", before), ("after", head)):
        for which, keep in (("capped", lambda v: True), ("binding", lambda v: v["binding"])):
            rs = [v["ratio"] for v in r["rows"].values() if keep(v)]
            summary[f"{tree}_{which}"] = {"median": float(np.median(rs)), "max": float(max(rs)), "n": len(rs)}
        summary[f"{tree}_seconds"] = round(sum(v["seconds"] for v in r["rows"].values()), 1)
        summary[f"{tree}_all_feasible"] = all(v["feasible"] for v in r["rows"].values())
    summary["same_plans"] = sum(before["rows"][k]["plan"] == v["plan"] for k, v in head["rows"].items())
    print(json.dumps(summary, indent=1))
    write_results(args.out, {"before": before, "after": head, "summary": summary}, config=vars(args))


if __name__ == "__main__":
    main()
