"""Session 25 (task b, issue 18): the raw decode through the network's jitted planning run, before and
after it followed bp_solve's schedule (copy-priced phase included).

    python experiments/s25b_jitted_decode.py --rows-json /tmp/rows.json [--no-large]   # one tree's rows
    python experiments/s25b_jitted_decode.py --before BEFORE.json [--ilp-s 60]           # head rows + JSON

Rows (run in the tree that is the current directory: its modules come first on sys.path, so the
same script measures an exported base revision): on the 7 binding-cap held-out rows of
experiments/raw_decode_bench.py (the problems pickled in /tmp/heldout_problems.pkl), the raw decode
``shardgym.solve(method="policy", search=False)`` through the jitted run (forced:
``agent.fgnn_planner.NUMPY_BP_MAX_NODES`` = 0) and through ``bp_solve`` (numpy, the shipped path up to
4,000 nodes), each / the best-known cost (results/heldout_reference.json), feasibility and seconds
(one call each; a first call compiles the jitted run's shape bucket); and meshgraphnet large @
h100-2x8 cap fraction 0.3 (4,095 nodes: above NUMPY_BP_MAX_NODES, so the shipped jitted path), the
raw decode's cost and wall time (a first call, compile included, then a warm one). With ``--before``
the head's rows are joined to a base tree's and, once, bp_solve's plan of the large problem and a
``--ilp-s`` ``solve(method="ilp")`` as its reference; writes results/s25b_jitted_decode.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
LARGE = ("meshgraphnet", "large", "h100-2x8", 0.3)


def _sha(x) -> str:
    import numpy as np
    return hashlib.sha1(np.asarray(x, np.int64).tobytes()).hexdigest()[:12]


def rows(large: bool = True) -> dict:
    """This tree's rows (see the module docstring)."""
    import agent.fgnn_planner as fp
    import shardgym as sg
    from costmodel.problem import evaluate
    from env.workloads import Workload
    from experiments.heldout_reference import load, lookup
    from experiments.raw_decode_bench import binding, held_out_problems
    entries, best, out = load(), {}, {"heldout": {}, "load_before": open("/proc/loadavg").read().strip()}
    probs = held_out_problems()
    for name, p in probs:
        e = lookup(entries, name, p)
        best[name] = e["cost"] if e and e.get("cost") else float("nan")
    shipped = fp.NUMPY_BP_MAX_NODES
    for name, p in probs:
        if not binding(name, best):
            continue
        row = {}
        for path, limit in (("jitted", 0), ("numpy", shipped)):
            fp.NUMPY_BP_MAX_NODES = limit
            t = time.perf_counter()
            x = sg.solve(p, method="policy", search=False).strategies
            dt = time.perf_counter() - t
            c = evaluate(p, x)
            row[path] = {"ratio": c.total / best[name], "feasible": bool(c.feasible), "seconds": dt, "plan": _sha(x)}
        fp.NUMPY_BP_MAX_NODES = shipped
        out["heldout"][name] = row
        print(name, json.dumps(row), flush=True)
    if large:
        p = Workload(LARGE[0], LARGE[1], LARGE[2], memory_cap_fraction=LARGE[3]).build()
        out["large"] = {"name": f"{LARGE[0]}-{LARGE[1]}@{LARGE[2]} cap{LARGE[3]}", "nodes": p.num_nodes}
        for call in ("first", "warm"):
            t = time.perf_counter()
            x = sg.solve(p, method="policy", search=False).strategies
            c = evaluate(p, x)
            out["large"][call] = {"seconds": time.perf_counter() - t, "total": c.total, "feasible": bool(c.feasible),
                                  "plan": _sha(x)}
            print("large", call, json.dumps(out["large"][call]), flush=True)
    out["load_after"] = open("/proc/loadavg").read().strip()
    return out


def main() -> None:
    import tree_ab

    def extra(ap):
        ap.add_argument("--ilp-s", type=float, default=60.0)
        ap.add_argument("--no-large", action="store_true")
    args = tree_ab.parse(__doc__, ROOT, extra)
    before = tree_ab.rows_or_before(args, lambda: rows(not args.no_large))
    if before is None:
        return
    import numpy as np

    import shardgym as sg
    from costmodel.problem import evaluate
    from env.workloads import Workload
    from experiments.common import write_results
    from solvers.bp import bp_solve
    head = rows(not args.no_large)
    summary = {}
    for tree, r in (("before", before), ("after", head)):
        for path in ("jitted", "numpy"):
            rs = [v[path]["ratio"] for v in r["heldout"].values()]
            summary[f"{tree}_{path}"] = {"median": float(np.median(rs)), "max": float(max(rs)),
                                         "all_feasible": all(v[path]["feasible"] for v in r["heldout"].values())}
    summary["after_jitted_plan_equals_numpy"] = sum(v["jitted"]["plan"] == v["numpy"]["plan"] for v in head["heldout"].values())
    ref = {}
    if "large" in head:
        p = Workload(LARGE[0], LARGE[1], LARGE[2], memory_cap_fraction=LARGE[3]).build()
        t = time.perf_counter()
        r = bp_solve(p, bound=False)
        ref["bp_solve"] = {"seconds": time.perf_counter() - t, "total": r.cost, "rounds": r.rounds, "plan": _sha(r.plan)}
        t = time.perf_counter()
        plan = sg.solve(p, method="ilp", time_limit_s=args.ilp_s)
        c = evaluate(p, plan.strategies)
        ref["ilp"] = {"seconds": time.perf_counter() - t, "time_limit_s": args.ilp_s, "total": c.total,
                      "feasible": bool(c.feasible), "status": str(plan.info.get("status", ""))}
        for tree, r in (("before", before), ("after", head)):
            summary[f"large_{tree}_over_ilp"] = r["large"]["warm"]["total"] / c.total
        summary["large_after_plan_equals_bp_solve"] = head["large"]["warm"]["plan"] == ref["bp_solve"]["plan"]
        print("reference", json.dumps(ref), flush=True)
    print(json.dumps(summary, indent=1))
    print("wrote", write_results("s25b_jitted_decode", {"summary": summary, "before": before, "after": head,
                                                        "large_reference": ref}, config=vars(args)))


if __name__ == "__main__":
    main()
