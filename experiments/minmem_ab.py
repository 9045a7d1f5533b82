"""A/B of the memory objective's phase settings, interleaved, on zoo tiny models (session 22's check of
the peak LNS's bisection share; results/s22_lead_ab_minmem.json).

Per model and repeat: ``sg.solve(method="ilp", objective="memory", max_step_time_s=1.05 x Megatron's
modelled step, time_limit_s=60)`` seeded with Megatron's and the replicated plan, once under each
variant (``VARIANTS``: the bisection's share of the time and its step-down factor), the order
alternating per repeat so that both see the same load. Prints one row per solve (predicted peak MiB,
step time over the bound, wall, load) and writes results/<--name>.json.

    PYTHONPATH=. .venv/bin/python experiments/minmem_ab.py --models unet,gpt --name s22_lead_ab_minmem
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()

#: variant -> (BISECT_SHARE, STEP_DOWN): session 22's settings and the ones before them
VARIANTS = {"s22c": (0.45, 0.95), "oldbisect": (0.7, 0.9)}


def main(argv=None) -> list[dict]:
    import shardgym as sg
    import solvers.dispatch as dispatch
    import solvers.minmem_bisect as bisect
    import zoo
    from experiments.common import print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="unet,gpt", help="comma-separated zoo models (tiny size)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--time-limit-s", type=float, default=60.0)
    ap.add_argument("--name", default="minmem_ab", help="results/<name>.json")
    a = ap.parse_args(argv)
    rows = []
    for m in a.models.split(","):
        fn, args = zoo.build(m, "tiny", abstract=True, seed=0)
        p = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset("cpu-2x4"))
        mega = sg.solve(p, method="megatron")
        bound = 1.05 * sg.evaluate(p, mega).step_time_s
        for rep in range(a.repeats):
            for name in (list(VARIANTS) if rep % 2 == 0 else list(VARIANTS)[::-1]):
                dispatch.BISECT_SHARE = bisect.BISECT_SHARE = VARIANTS[name][0]
                bisect.STEP_DOWN = VARIANTS[name][1]
                t0 = time.perf_counter()
                plan = sg.solve(p, method="ilp", objective="memory", max_step_time_s=bound,
                                time_limit_s=a.time_limit_s,
                                initial_plans=[list(mega.strategies), [0] * p.num_nodes])
                c = sg.evaluate(p, plan)
                rows.append({"model": m, "variant": name, "rep": rep, "peak_MiB": c.peak_memory_bytes / 2 ** 20,
                             "step_vs_T": c.step_time_s / bound, "wall": time.perf_counter() - t0,
                             "load": os.getloadavg()[0]})
                print(rows[-1], flush=True)
    print_table(rows, title="memory objective, 1.05x Megatron, predicted peak per variant")
    write_results(a.name, {"rows": rows}, config=vars(a))
    return rows


if __name__ == "__main__":
    main()
