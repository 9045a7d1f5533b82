"""How long the capped MILP's LP relaxation takes, memory as dense rows against running sums
(``IlpConfig.dense_memory_nonzeros``), on a cell of ``experiments/capped_reference.py`` (its cap, its 60-s plan
as the start), one setting after the other in one process so that both see the same load.

Per setting: ``solve_ilp`` on the capped problem, 1 HiGHS thread, ``lp_share`` 0.97 (the LP gets nearly all of
``--seconds``; the MIP after it the rest), with ``solvers.ilp.highs.try_lp`` timed (its wall seconds and
outcome: "fractional" / "optimal" / None when it did not finish); the answer's bound (the LP's optimum when
the MIP has no root bound yet) and status.

    nice -n 5 python -m experiments.capped_lp_probe --ref s23c_ref_vit75 --dense=-1,2000000 --out s23c_lp_probe_vit75
    nice -n 5 python -m experiments.capped_lp_probe --ref s23c_ref_vit25 --dense=-1,-1 --solver ipm, --seconds 120 --out X
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
    ap.add_argument("--ref", required=True, help="results/<name>.json of capped_reference.py")
    ap.add_argument("--dense", default="-1,2000000", help="IlpConfig.dense_memory_nonzeros values, in order")
    ap.add_argument("--seconds", type=float, default=100.0)
    ap.add_argument("--solver", default="", help="HiGHS's solver option per setting, a comma list as long as --dense "
                                                 "(e.g. ipm; empty: ours)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import shardgym as sg
    import solvers.ilp.highs as highs
    from experiments.bench_capped import _pair, _step
    from experiments.common import RESULTS_DIR, write_results
    from solvers.ilp import IlpConfig, solve_ilp

    ref = json.loads((RESULTS_DIR / f"{a.ref}.json").read_text())
    p = sg.build_problem(sg.trace(*_pair(_step(ref["problem"]))), sg.Cluster.preset(ref["cluster"]))
    pc = p.with_usage_limit(ref["cap_bytes"])
    lps = []
    plain = highs.try_lp

    def timed(model, time_limit_s):
        t = time.perf_counter()
        out = plain(model, time_limit_s)
        lps.append({"outcome": None if out is None else out[0], "wall_s": round(time.perf_counter() - t, 2),
                    "limit_s": round(time_limit_s, 1)})
        return out

    highs.try_lp = timed
    rows = []
    settings = [int(x) for x in a.dense.split(",")]
    solvers = (a.solver.split(",") + [""] * len(settings))[:len(settings)]
    for dense, solver in zip(settings, solvers):
        lps.clear()
        load = [round(x, 2) for x in os.getloadavg()]
        t = time.perf_counter()
        _, info = solve_ilp(pc, time_limit_s=a.seconds, threads=1, relax_cap=False, initial_plan=ref["plan_60s"],
                            config=IlpConfig(dense_memory_nonzeros=dense, lp_share=0.97,
                                             highs_options=(("solver", solver),) if solver else ()))
        rows.append({"dense_memory_nonzeros": dense, "solver": solver or "choose", "lp": list(lps), "status": info.status, "bound": float(info.bound),
                     "wall_s": round(time.perf_counter() - t, 1), "load_avg_before": load,
                     "load_avg_after": [round(x, 2) for x in os.getloadavg()]})
        print(rows[-1], flush=True)
        write_results(a.out, {"ref": a.ref, "problem": ref["problem"], "cluster": ref["cluster"],
                              "cap_fraction": ref["cap_fraction"], "cap_bytes": ref["cap_bytes"], "rows": rows},
                      config=vars(a))


if __name__ == "__main__":
    main()
