"""A stored min-memory plan polished by a longer peak LNS (``solvers.minmem_lns.peak_lns``), executed.

Reads one plan's strategies from results/<source>.json (a ``minmem_breakdown`` or ``minmem_polish``
record: ``plans[k]`` with ``plan`` and ``strategies``), rebuilds its program (the zoo model's first size, traced under
``--policy``) on cpu-2x4, runs the peak LNS for ``--lns-s`` seconds under ``--bound`` x the plain
program's Megatron step time, and executes the start, the polished plan and plain Megatron
(``s21c_remat.plan_row``: XLA memory, prediction, step time, numerics).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/minmem_polish.py \
        --source s23b_breakdown_blocks --plan "blocks min-memory 1.05x" --policy blocks --lns-s 600

Writes results/<out>.json (config, seed, git revision, load).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import RESULTS_DIR, cpu_devices  # noqa: E402

cpu_devices()


@dataclass
class Config:
    model: str = "gpt"
    source: str = ""
    plan: str = ""
    policy: str | None = None
    cluster: str = "cpu-2x4"
    bound: float = 1.05
    lns_s: float = 600.0
    lns_seed: int = 0
    seed: int = 0


def main(argv=None) -> dict:
    import shardgym as sg
    from experiments.common import write_results
    from experiments.s21c_remat import executed_programs, plan_row
    from solvers.minmem_lns import peak_lns

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--source", required=True, help="results/<source>.json, a minmem_breakdown record")
    ap.add_argument("--plan", required=True, help="the plan's label in it")
    ap.add_argument("--policy", default="", help="the recompute policy it was solved under ('': none)")
    ap.add_argument("--bound", type=float, default=1.05)
    ap.add_argument("--lns-s", type=float, default=600.0)
    ap.add_argument("--lns-seed", type=int, default=0, help="the LNS's neighbourhood draws")
    ap.add_argument("--out", default="minmem_polish")
    a = ap.parse_args(argv)
    cfg = Config(model=a.model, source=a.source, plan=a.plan, policy=a.policy or None, bound=a.bound, lns_s=a.lns_s,
                 lns_seed=a.lns_seed)
    record = json.loads((Path(RESULTS_DIR) / f"{cfg.source}.json").read_text())
    rows = record["plans"]
    got = [r for r in rows if r["plan"] == cfg.plan]
    if not got:
        raise ValueError(f"no plan {cfg.plan!r} in results/{cfg.source}.json; it has {[r['plan'] for r in rows]}")
    fn, args, plain, pp, mega, mega_s, graph, problem = executed_programs(cfg.model, cfg.cluster, cfg.policy, cfg.seed)
    # a minmem_polish record before rows carried their strategies: the polished plan's at the top level
    start = got[0]["strategies"] if "strategies" in got[0] else record["strategies"] \
        if cfg.plan.startswith("polished") else None
    if start is None:
        raise ValueError(f"plan {cfg.plan!r} of results/{cfg.source}.json has no strategies")
    t0 = time.perf_counter()
    better, info = peak_lns(problem, start, cfg.bound * mega_s, time.perf_counter() + cfg.lns_s,
                           seed=cfg.lns_seed)
    lns_wall = time.perf_counter() - t0
    plans = [("plain megatron", plain, pp, mega),
             ("start", graph, problem, sg.Plan.for_problem(problem, start, method="ilp", objective="memory")),
             (f"polished ({cfg.lns_s:g} s LNS)", graph, problem,
              sg.Plan.for_problem(problem, list(better), method="ilp", objective="memory"))]
    out = [dict(plan_row(name, fn, args, g, p, plan, mega_s, True, 8), strategies=list(plan.strategies))
           for name, g, p, plan in plans]
    for r in out:
        r["saving_vs_plain_megatron_xla"] = 1 - r["xla_MiB"] / out[0]["xla_MiB"]
        print(f"  {r['plan']:24s} saving {r['saving_vs_plain_megatron_xla']:.3f}", flush=True)
    res = {"policy": cfg.policy, "lns_wall_s": lns_wall, "lns": info, "plans": out,
           "strategies": [int(x) for x in better]}
    write_results(a.out, res, config=cfg, seed=cfg.seed)
    return res


if __name__ == "__main__":
    main()
