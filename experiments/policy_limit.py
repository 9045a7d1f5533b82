"""``solve(method="policy", time_limit_s=L)`` against the ILP's recorded 60-s answer on the same cap.

Until session 27 the planner dropped ``time_limit_s``: its capped search ran 114-201 s on fno tiny @
cpu-2x4 and 146-170 s on gpt 7b / vit base @ h100-2x8 under ``solve``'s 60-s default. Per cell (a row of
a results file: its problem, cap in bytes and ILP answer), the policy is run with each of ``--limits``
("none": no limit, the old behaviour), one after the other in this run; cost, wall, fit, and cost over
the recorded ILP cost (the ILP is not re-run: its load is the file's). Cells are
``FILE:problem:cluster:fraction`` (experiments/bench_capped.py's rows) or ``FILE:model:size:cluster:cap``
(experiments/big_capped.py's rows, problem built by experiments/anytime.py's ``build``).

    nice -n 5 python experiments/policy_limit.py --cells results/s26a_seedsearch_ab_cpu.json:fno:tiny:cpu-2x4:0.25 \\
        --limits 60,none --out s27_policy_limit
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")


def cell(spec: str):
    """(problem without a limit, cap bytes, the recorded ILP row) of a ``--cells`` entry."""
    import shardgym as sg
    from experiments.anytime import build
    from experiments.bench_capped import _step
    path, rest = spec.split(":", 1)
    rows = json.load(open(path))["rows"]
    parts = rest.split(":")
    if len(parts) == 4 and any(r.get("problem") == rest for r in rows):        # big_capped.py's row
        row = next(r for r in rows if r["problem"] == rest)
        p = build(rest)
        return p.with_usage_limit(None), float(row["cap_bytes"]), {"ilp_cost": row["cost"], "ilp_s": row["wall_s"],
                                                                   "gap": row.get("gap"), "ilp_load": row["load_avg_before"]}
    problem, cluster, frac = ":".join(parts[:-2]), parts[-2], float(parts[-1])
    match = [r for r in rows if r["problem"] == problem and r["cluster"] == cluster and r["cap_fraction"] == frac
             and r.get("variant", "after") == "after"]
    if not match:
        raise SystemExit(f"--cells: {spec!r}: no such row (problem, cluster, cap_fraction, variant 'after') in {path}")
    row = match[0]
    fn, args = _step(problem)
    p = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset(cluster)).with_usage_limit(None)
    return p, float(row["cap_bytes"]), {"ilp_cost": row["ilp_cost"], "ilp_s": row["ilp_s"], "gap": row.get("gap"),
                                        "ilp_load": row["load_avg_before"], "policy_cost_then": row.get("policy_cost"),
                                        "policy_s_then": row.get("policy_s")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", required=True, help="comma list of FILE:problem:cluster:fraction (module docstring)")
    ap.add_argument("--limits", default="60,none", help="comma list of seconds or 'none'")
    ap.add_argument("--out", default="policy_limit")
    a = ap.parse_args(argv)
    import shardgym as sg
    from experiments.common import print_table, write_results
    limits = [None if x == "none" else float(x) for x in a.limits.split(",")]
    rows = []
    for spec in a.cells.split(","):
        p, cap, ilp = cell(spec)
        for lim in limits:
            row = {"cell": spec.split(":", 1)[1], "nodes": p.num_nodes, "cap_bytes": cap, "limit_s": lim, **ilp,
                   "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
            t = time.perf_counter()
            try:
                c = sg.evaluate(p.with_usage_limit(cap), sg.solve(p, method="policy", memory_cap_bytes=cap, time_limit_s=lim))
                row.update(policy_cost=c.total, fits=bool(c.feasible))
            except (RuntimeError, ValueError) as exc:
                row.update(policy_cost=None, fits=False, error=str(exc)[:200])
            row["policy_s"] = round(time.perf_counter() - t, 1)
            row["ilp_over_policy"] = (round(row["ilp_cost"] / row["policy_cost"], 4)
                                      if row["policy_cost"] and row["ilp_cost"] else None)
            row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
            rows.append(row)
            print(row, flush=True)
    print_table(rows, ["cell", "limit_s", "policy_cost", "policy_s", "ilp_cost", "ilp_s", "ilp_over_policy"],
                title="solve(method='policy', time_limit_s=L) against the recorded 60-s ILP")
    write_results(a.out, {"rows": rows, "config": vars(a)})


if __name__ == "__main__":
    main()
