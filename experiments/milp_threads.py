"""The capped core's MILP phase alone, HiGHS on 1 thread against 2, on a loaded 2-core machine.

The cell: a bench_capped cell (``--cell problem@cluster@fraction``, caps from ``--caps-file``'s setups), by default
fno tiny tpu-4x4 at the 75 % cap, which session 25 proved optimal in the core's MILP phase and session 27 did not.
First ``solve(method="ilp")`` at ``--seconds`` for the incumbent (the core's own answer), then, alternating which
goes first, ``solvers.ilp.solve_ilp`` on the capped problem warm-started from it (``relax_cap=False``, as the core's
``capped_milp`` after its uncapped MILP proved), with ``threads`` 1 and 2, ``--reps`` times each, up to ``--limit``
seconds: status, bound, wall, and the 1-min load before and after each. HiGHS's work is the same at either count
(deterministic: the same root, cuts and nodes); only the wall differs, and it moves with the load, so the runs
alternate and record it.

    nice -n 5 python experiments/milp_threads.py --reps 2 --out s28b_milp_threads
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


def main(argv=None) -> None:
    import shardgym as sg
    from experiments.bench_capped import _pair, _step
    from experiments.common import write_results
    from solvers.ilp import solve_ilp
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cell", default="fno:tiny@tpu-4x4@0.75")
    ap.add_argument("--caps-file", default="results/s27a_caps.json")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    spec, cluster, frac = a.cell.split("@")
    setup = json.load(open(a.caps_file))["setups"][f"{spec}|{cluster}"]
    cap = setup["lo_bytes"] + float(frac) * (setup["hi_bytes"] - setup["lo_bytes"])
    p = sg.build_problem(sg.trace(*_pair(_step(spec))), sg.Cluster.preset(cluster)).with_usage_limit(None)
    pc = p.with_usage_limit(cap)
    load = (lambda: round(os.getloadavg()[0], 2))
    t = time.perf_counter()
    start = sg.solve(p, method="ilp", memory_cap_bytes=cap, time_limit_s=a.seconds)
    core = {"cost": sg.evaluate(pc, start).total, "status": start.info.get("status"), "gap": start.info.get("gap"),
            "wall_s": round(time.perf_counter() - t, 1)}
    print("core:", core, flush=True)
    runs = []
    for i in range(a.reps):
        for threads in ((2, 1) if i % 2 == 0 else (1, 2)):
            before, t = load(), time.perf_counter()
            _, info = solve_ilp(pc, time_limit_s=a.limit, initial_plan=start.strategies, relax_cap=False, threads=threads)
            runs.append({"threads": threads, "status": info.status, "bound": info.bound, "objective": info.objective,
                         "wall_s": round(time.perf_counter() - t, 1), "load_before": before, "load_after": load()})
            print(runs[-1], flush=True)
    if a.out:
        write_results(a.out, {"cell": a.cell, "cap_bytes": cap, "core": core, "runs": runs}, config=vars(a))


if __name__ == "__main__":
    main()
