"""Where is the min-memory optimum (issue 13)? One long min-peak MIP on a zoo model, its HiGHS log kept.

Per model, on cpu-2x4: the min-peak model (``solve_ilp(weights={"memory": 1})``: min M, the peak
variable, with the copies priced) under a step-time bound of ``--bound`` x Megatron's predicted step
(``--bound 0``: no bound; with ``--recompute POLICY`` the program is traced under that
recompute policy and the bound is still ``--bound`` x the *plain* program's Megatron step, as
``shardgym.recompute.choose`` sets it), seeded with the baselines and the time-optimal plan
(``solvers.minmem_seeds.memory_seeds``) and, with ``--seed-solve-s``, the memory objective's own plan
(``sg.solve``) in that many seconds. HiGHS's log is written to results/<name>.log; the incumbent and the
dual bound over time are parsed from it. Records the answer's peak and step time, HiGHS's bound, the
copy-free least peak (``node_min_peak``) and the seeds' peaks.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 nice -n 10 .venv/bin/python experiments/minmem_reference.py
    ... --model gpt:tiny --bound 1.05 --time-limit-s 1800 --name s22c_reference_bound

Writes results/<name>.json (config, seed, git revision, load).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()

from experiments.verify_minmem import minmem_setup  # noqa: E402

_PCT = re.compile(r"^-?[\d.]+%$|^inf$|^Large$")


@dataclass
class Config:
    model: str = "gpt:tiny"
    cluster: str = "cpu-2x4"
    bound: float = 1.05
    time_limit_s: float = 1800.0
    seed_solve_s: float = 0.0
    threads: int = 1
    recompute: str | None = None
    seed: int = 0


def parse_highs_log(text: str) -> list[tuple]:
    """(seconds, best bound, best solution) per line of HiGHS's MIP progress table (None where blank)."""
    out = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) < 8 or not re.match(r"^[\d.]+s$", tok[-1]):
            continue
        pcts = [i for i, t in enumerate(tok) if _PCT.match(t)]
        if len(pcts) < 2:
            continue
        g = pcts[1]

        def num(t):
            try:
                return float(t)
            except ValueError:
                return None
        out.append((float(tok[-1][:-1]), num(tok[g - 2]), num(tok[g - 1])))
    return out


def main(argv=None) -> dict:
    import numpy as np

    import shardgym as sg
    from experiments.common import write_results
    from solvers.dispatch import baseline_seeds
    from solvers.ilp import solve_ilp
    from solvers.ilp.bounds import node_min_peak
    from solvers.minmem_seeds import memory_seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt:tiny")
    ap.add_argument("--bound", type=float, default=1.05, help="x Megatron's step time; 0: no bound")
    ap.add_argument("--time-limit-s", type=float, default=1800.0)
    ap.add_argument("--seed-solve-s", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--recompute", default="", help="recompute policy of the traced program ('': none)")
    ap.add_argument("--name", default="minmem_reference")
    a = ap.parse_args(argv)
    cfg = Config(model=a.model, bound=a.bound, time_limit_s=a.time_limit_s, seed_solve_s=a.seed_solve_s,
                 threads=a.threads, recompute=a.recompute or None)
    name, _, size = cfg.model.partition(":")
    fn, args, _, problem, mega = minmem_setup(name, size or "tiny", cfg)
    T = cfg.bound * sg.evaluate(problem, mega).step_time_s if cfg.bound > 0 else None
    if cfg.recompute is not None:   # the recomputing program, bounded by the plain program's Megatron step
        graph = sg.trace(fn, *args, name=f"{name}-{size}", recompute=cfg.recompute)
        cluster = sg.Cluster.preset(cfg.cluster)
        if (size or "tiny") != "tiny":
            from experiments.fidelity import unbounded
            cluster = unbounded(cluster)
        problem = sg.build_problem(graph, cluster)
        mega = sg.solve(problem, method="megatron")
    seeds = baseline_seeds(problem)
    more, _ = memory_seeds(problem, 20.0, seeds)
    seeds += more
    if cfg.seed_solve_s > 0:
        seeds.append(list(sg.solve(problem, method="ilp", objective="memory", max_step_time_s=T,
                                   time_limit_s=cfg.seed_solve_s).strategies))
    seed_rows = [(float(c.peak_memory_bytes), float(c.total)) for c in (sg.evaluate(problem, s) for s in seeds)]
    log = Path(__file__).resolve().parent.parent / "results" / f"{a.name}.log"
    sys.stdout.flush()
    saved = os.dup(1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    t0 = time.perf_counter()
    try:
        plan, info = solve_ilp(problem, weights={"memory": 1.0}, max_step_time_s=T, time_limit_s=cfg.time_limit_s,
                               verbose=True, threads=cfg.threads, initial_plans=seeds)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(fd)
    wall = time.perf_counter() - t0
    c = sg.evaluate(problem, plan)
    trace = parse_highs_log(log.read_text())
    mc = sg.evaluate(problem, mega)
    # HiGHS's figures are in units of the model's ``mem_scale`` bytes (solvers/ilp/model.py): the ratio of
    # the answer's peak to the last incumbent in the log, when the answer is HiGHS's incumbent
    last = next((r[2] for r in reversed(trace) if r[2] is not None), None)
    scale = float(c.peak_memory_bytes) / last if last else None
    rec = {"model": cfg.model, "recompute": cfg.recompute, "step_bound_s": T, "megatron_peak_bytes": float(mc.peak_memory_bytes),
           "megatron_step_s": float(mc.total), "peak_bytes": float(c.peak_memory_bytes), "step_s": float(c.total),
           "status": info.status, "highs_bound_bytes": float(info.bound) if np.isfinite(info.bound) else None,
           "gap": float(info.gap) if np.isfinite(info.gap) else None, "node_min_peak_bytes": node_min_peak(problem),
           "seeds_peak_step": seed_rows, "wall_s": wall, "load": os.getloadavg(),
           "highs_scale_bytes": scale,
           "highs_dual_bound_bytes": None if scale is None or not trace or trace[-1][1] is None else trace[-1][1] * scale,
           "highs_trace_s_bound_incumbent": trace[:: max(1, len(trace) // 200)] + trace[-1:]}
    write_results(a.name, rec, config=cfg, seed=cfg.seed)
    print({k: v for k, v in rec.items() if k not in ("highs_trace_s_bound_incumbent", "seeds_peak_step")})
    return rec


if __name__ == "__main__":
    main()
