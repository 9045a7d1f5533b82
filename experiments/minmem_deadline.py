"""Does the memory objective under a step-time bound return within its time limit (issue 16)?
Per model: ``sg.solve(method="ilp", objective="memory", max_step_time_s=1.05 x Megatron's predicted
step, time_limit_s=...)`` seeded like experiments/verify_minmem.py (Megatron's plan, replicated);
records the wall time against the limit, the plan's predicted peak and step time, where it came
from and the bisection's steps (cap, result, seconds). The solve only: nothing is compiled.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/minmem_deadline.py
    ... --models gpt:125m --time-limit-s 30 --repeats 2 --name s21e_minmem_deadline

Writes results/<name>.json (config, seed, git revision, load, one record per model and repeat).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()

from experiments.verify_minmem import SOLVE_KEYS, minmem_setup  # noqa: E402


@dataclass
class Config:
    models: tuple = ("gpt:125m",)
    cluster: str = "cpu-2x4"
    bound: float = 1.05
    time_limit_s: float = 30.0
    repeats: int = 1
    seed: int = 0


def run_once(problem, mega, cfg: Config) -> dict:
    import shardgym as sg

    bound_s = cfg.bound * sg.evaluate(problem, mega).step_time_s
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    plan = sg.solve(problem, method="ilp", objective="memory", max_step_time_s=bound_s, time_limit_s=cfg.time_limit_s,
                    initial_plans=[list(mega.strategies), [0] * problem.num_nodes])
    wall = time.perf_counter() - t0
    c, cm = sg.evaluate(problem, plan), sg.evaluate(problem, mega)
    info = plan.info
    return {"wall_s": wall, "over_limit_s": wall - cfg.time_limit_s, "load_1min": [load0, os.getloadavg()[0]],
            "pred_peak_MiB": c.peak_memory_bytes / 2 ** 20, "megatron_pred_peak_MiB": cm.peak_memory_bytes / 2 ** 20,
            "step_over_bound": c.step_time_s / bound_s,
            "solve": {k: info.get(k) for k in SOLVE_KEYS}}


def main(argv=None) -> list[dict]:
    from experiments.common import write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt:125m", help="comma-separated model:size")
    ap.add_argument("--time-limit-s", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--name", default="minmem_deadline", help="results/<name>.json")
    a = ap.parse_args(argv)
    cfg = Config(models=tuple(m for m in a.models.split(",") if m), time_limit_s=a.time_limit_s, repeats=a.repeats)
    rows = []
    for spec in cfg.models:
        name, _, size = spec.partition(":")
        *_, problem, mega = minmem_setup(name, size or "tiny", cfg)
        for r in range(cfg.repeats):
            rows.append({"model": name, "size": size or "tiny", "repeat": r, **run_once(problem, mega, cfg)})
            write_results(a.name, {"rows": rows}, config=cfg, seed=cfg.seed)
            print({k: v for k, v in rows[-1].items() if k != "solve"}, rows[-1]["solve"]["bisection"], flush=True)
    return rows


if __name__ == "__main__":
    main()
