"""Where ``method="policy"``'s plan under a cap comes from: per cell, the planner's raw decode and
``solvers.local.budgeted.capped_search``'s phases from it (cost after each phase and the wall time
at its end), the same search ``solve(method="policy")`` runs (``agent.fgnn_planner.FGPlanner.plan``).

    python experiments/policy_phases.py --cells vit:tiny@cpu-2x4@0.5,gpt:tiny@tpu-4x4@0.75 \
        --caps-file results/s26a_seedsearch_ab_cpu.json,results/s25_bench_capped_tpu.json --out s27a_policy_phases

Caps: lo + f (hi - lo) from the caps files' ``setups`` (as ``experiments/bench_capped.py --caps-file``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", required=True, help="problem@cluster@fraction,...")
    ap.add_argument("--caps-file", required=True, help="comma list of bench_capped results files (their setups)")
    ap.add_argument("--out", default="policy_phases")
    a = ap.parse_args(argv)
    import shardgym as sg
    from agent.planner import DEFAULT_POLICY, Planner
    from experiments.bench_capped import _pair, _step
    from experiments.common import write_results
    from solvers.local.budgeted import capped_search
    setups = {}
    for f in a.caps_file.split(","):
        setups.update(json.loads(open(f).read())["setups"])
    planner, graphs, rows = Planner.load(DEFAULT_POLICY), {}, []
    for cell in a.cells.split(","):
        spec, cl, frac = cell.split("@")
        if spec not in graphs:
            graphs[spec] = sg.trace(*_pair(_step(spec)))
        s = setups[f"{spec}|{cl}"]
        cap = s["lo_bytes"] + float(frac) * (s["hi_bytes"] - s["lo_bytes"])
        p = sg.build_problem(graphs[spec], sg.Cluster.preset(cl)).with_usage_limit(cap)
        load = [round(x, 2) for x in os.getloadavg()]
        t = time.perf_counter()
        raw = planner.plan(p, polish=False)
        t_raw = time.perf_counter() - t
        t = time.perf_counter()
        plan, info = capped_search(p, raw, return_info=True)
        row = {"problem": spec, "cluster": cl, "cap_fraction": float(frac), "cap_bytes": cap, "load_avg": load,
               "raw_cost": sg.evaluate(p, raw).total, "raw_feasible": bool(sg.evaluate(p, raw).feasible),
               "raw_s": round(t_raw, 2), "search_s": round(time.perf_counter() - t, 2),
               "search_cost": None if plan is None else sg.evaluate(p, plan).total, "search": info,
               "load_avg_after": [round(x, 2) for x in os.getloadavg()]}
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        write_results(a.out, {"rows": rows}, config=vars(a))


if __name__ == "__main__":
    main()
