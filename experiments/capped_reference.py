"""A long reference for one capped cell of ``bench_capped``: which side of the 60-s gap is weak?

Per cell (problem, cluster, cap fraction; the caps from a ``bench_capped`` results file's setups):
1. ``shardgym.solve(method="ilp", memory_cap_bytes=cap, time_limit_s=--seconds)``: the 60-s answer
   (cost, bound, gap, the phase log), as the benchmark measures it;
2. the capped MILP (``solvers.ilp.solve_ilp`` on the capped problem, copies in its rows) started from
   that plan, for ``--milp-seconds`` at ``--threads`` HiGHS threads (``--dense-nonzeros -1``: the memory
   rows as running sums, ``IlpConfig.dense_memory_nonzeros``), under the watchdog
   (``solve_ilp_guarded``): its plan, status and dual bound (the fractional root LP's value when the
   MIP stops before its own root), with HiGHS's own log on stdout (``--verbose``).
A better plan there says the 60-s incumbent is weak; a higher bound says the 60-s bound is. Both plans
are stored (``plan_60s``, ``plan_ref``) so that later runs can start from them.

    nohup nice -n 10 python -m experiments.capped_reference --cell vit:tiny,h100-2x8,0.75 \
        --caps-file results/bench_capped_s15.json --out s23c_ref_vit75 > /tmp/ref_vit75.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("WANDB_MODE", "disabled")
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", required=True, help="problem,cluster,fraction (e.g. vit:tiny,h100-2x8,0.75)")
    ap.add_argument("--caps-file", required=True, help="a bench_capped results JSON (its setups' lo/hi bytes)")
    ap.add_argument("--seconds", type=float, default=60.0, help="the benchmark's limit for step 1")
    ap.add_argument("--milp-seconds", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--verbose", action="store_true", help="HiGHS's log on stdout")
    ap.add_argument("--dense-nonzeros", type=int, default=None,
                    help="the MILP's IlpConfig.dense_memory_nonzeros (-1: memory as running sums; default: the ILP's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--add-log", default=None, help="no solve: parse this saved --verbose log into results/<--out>.json "
                                                    "(``highs_log``: the LP's and the MIP's bounds over time, in seconds)")
    a = ap.parse_args(argv)
    if a.add_log:
        return add_log(a.out, a.add_log)
    import shardgym as sg
    from costmodel.problem import evaluate
    from experiments.bench_capped import _pair, _step
    from experiments.common import git_rev, write_results
    from solvers.ilp import IlpConfig
    from solvers.ilp.guard import SolveOverrun, solve_ilp_guarded

    spec, cl, frac = a.cell.split(",")
    setup = json.loads(open(a.caps_file).read())["setups"].get(f"{spec}|{cl}")
    if setup is None:
        raise SystemExit(f"--cell: {spec}|{cl} is not in {a.caps_file}'s setups")
    cap = setup["lo_bytes"] + float(frac) * (setup["hi_bytes"] - setup["lo_bytes"])
    p = sg.build_problem(sg.trace(*_pair(_step(spec))), sg.Cluster.preset(cl)).with_usage_limit(None)
    pc = p.with_usage_limit(cap)
    out = {"problem": spec, "cluster": cl, "cap_fraction": float(frac), "cap_bytes": cap, "nodes": p.num_nodes,
           "git_rev": git_rev(), "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
    t, log = time.perf_counter(), []
    plan = sg.solve(p, method="ilp", memory_cap_bytes=cap, time_limit_s=a.seconds,
                    progress=lambda m: log.append(f"{time.perf_counter() - t:.1f}s {m}"))
    c = evaluate(pc, list(plan.strategies))
    out["at_60s"] = {"cost": c.total, "feasible": c.feasible, "bound": plan.info.get("bound"),
                     "gap": plan.info.get("gap"), "source": plan.info.get("source"),
                     "wall_s": round(time.perf_counter() - t, 1), "log": log[:120],
                     "load_avg_after": [round(x, 2) for x in os.getloadavg()]}
    out["plan_60s"] = [int(x) for x in plan.strategies]
    print({k: v for k, v in out["at_60s"].items() if k != "log"}, flush=True)
    write_results(a.out, out, config=vars(a))
    t, inc = time.perf_counter(), []
    try:
        ref, info = solve_ilp_guarded(pc, time_limit_s=a.milp_seconds, initial_plan=out["plan_60s"], threads=a.threads,
                                      relax_cap=False, verbose=a.verbose, config=IlpConfig() if a.dense_nonzeros is None
                                      else IlpConfig(dense_memory_nonzeros=a.dense_nonzeros),
                                      progress=lambda m: inc.append(f"{time.perf_counter() - t:.1f}s {m}"))
        rc = evaluate(pc, ref)
        out["milp"] = {"cost": rc.total, "feasible": rc.feasible, "status": info.status, "bound": float(info.bound),
                       "wall_s": round(time.perf_counter() - t, 1)}
        out["plan_ref"] = [int(x) for x in ref]
    except (RuntimeError, ValueError) as exc:       # SolveOverrun included: no answer in time
        out["milp"] = {"error": str(exc)[:300], "overrun": isinstance(exc, SolveOverrun),
                       "wall_s": round(time.perf_counter() - t, 1)}
    out["milp"]["incumbents"] = inc[:50]
    out["milp"]["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(out["milp"], flush=True)
    write_results(a.out, out, config=vars(a))


def add_log(name: str, log_path: str) -> None:
    """HiGHS's own log of the reference MILP (``--verbose``) into ``results/<name>.json`` as ``highs_log``:
    the LP relaxations' optima and run times, and each MIP progress line's (time, dual bound, best plan),
    in step-time seconds: HiGHS's scaled objective times (the start plan's cost / HiGHS's value of that
    start, its "MIP start solution is feasible" line). For a MILP killed by the watchdog (no answer), the
    log is what remains of its bound."""
    import re

    from experiments.common import RESULTS_DIR, write_results
    out = json.loads((RESULTS_DIR / f"{name}.json").read_text())
    text = open(log_path).read()
    start = re.search(r"MIP start solution is feasible: objective value is ([0-9.eE+-]+)", text)
    if start is None:
        raise SystemExit(f"--add-log: no 'MIP start solution is feasible' line in {log_path}")
    scale = out["at_60s"]["cost"] / float(start.group(1))
    lps = [{"objective_s": float(v) * scale, "run_s": float(t)} for v, t in
           re.findall(r"Objective value\s+:\s+([0-9.eE+-]+)\n(?:.*\n){0,2}?HiGHS run time\s+:\s+([0-9.]+)", text)]
    rows = re.findall(r"^\s*[A-Z]?\s+\d+\s+\d+\s+\d+\s+[0-9.]+%\s+([0-9.eE+-]+|-inf)\s+([0-9.eE+-]+|inf)\s+.*?([0-9.]+)s$",
                      text, re.M)
    mip = [{"time_s": float(t), "bound_s": float(b) * scale, "best_s": float(p) * scale} for b, p, t in rows]
    out["highs_log"] = {"file": log_path, "scale_s": scale, "lp": lps, "mip": mip,
                        "last": mip[-1] if mip else None}
    write_results(name, {k: v for k, v in out.items() if k not in ("config", "seed", "git_rev", "timestamp", "env")},
                  config=out.get("config"))
    print(out["highs_log"]["lp"], out["highs_log"]["last"])


if __name__ == "__main__":
    main()
