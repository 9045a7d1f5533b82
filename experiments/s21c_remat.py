"""Selective attention recomputation (gpt ``remat_attention``) against the 40 % min-memory target.

Per model size, on the plain program and on the remat program (zoo/gpt.py, ``GPTConfig.remat_attention``:
scores, mask, softmax and probs.v under jax.checkpoint): Megatron's plan, and the min-memory ILP
plan under a step-time bound of ``--bound`` x the PLAIN program's Megatron step time (the issue's
bound; seeded with that program's Megatron plan and the all-replicated one), and with
``--time-optimal`` the time objective's ILP plan. ``--programs remat-mlp`` is the remat program with
the MLP's gelu recomputed too (``GPTConfig.remat_mlp``). ``--programs dots,dots-no-batch`` are the
plain program traced with the planner's recompute policy (``sg.trace(..., recompute="dots" |
"dots_no_batch")``, costmodel/trace/recompute.py), executed as traced. Each plan is
compiled (the first size of the zoo is executed, with numerics; larger sizes are compiled
abstractly on a cluster with unbounded memory) and XLA's per-device memory, the model's predicted
peak and the modelled step time are recorded, with XLA's buffers at its peak by kind. Savings
are given against Megatron's plan on the plain program and on the same (remat) program.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/s21c_remat.py \
        --models gpt:tiny,gpt:125m --out s21c_remat

Writes results/<out>.json (config, seed, git revision, one record per model size).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()


@dataclass
class Config:
    models: tuple = ("gpt:tiny", "gpt:125m")
    cluster: str = "cpu-2x4"
    bound: float = 1.05
    ilp_time_limit_s: float = 60.0
    top: int = 8
    seed: int = 0
    programs: tuple = ("plain", "remat")
    time_optimal: bool = False


#: program tag -> (the GPTConfig fields it sets (plain: both off), the trace's recompute policy)
PROGRAMS = {"plain": ({}, None), "remat": ({"remat_attention": True}, None),
            "remat-mlp": ({"remat_attention": True, "remat_mlp": True}, None),
            "dots": ({}, "dots"), "dots-no-batch": ({}, "dots_no_batch")}


def executed_programs(model: str, cluster_name: str, policy, seed: int = 0):
    """(fn, args, plain graph, its Problem, plain Megatron's plan, its modelled step time, the graph traced under
    recompute ``policy``, its Problem): the zoo model's first size on ``cluster_name``, real arrays (executed)."""
    import shardgym as sg
    import zoo

    size = zoo.sizes(model)[0]
    fn, args = zoo.build(model, size, seed=seed)
    cluster = sg.Cluster.preset(cluster_name)
    plain = sg.trace(fn, *args, name=f"{model}-{size}")
    pp = sg.build_problem(plain, cluster)
    mega = sg.solve(pp, method="megatron")
    graph = sg.trace(fn, *args, name=f"{model}-{size}", recompute=policy)
    return fn, args, plain, pp, mega, sg.evaluate(pp, mega).step_time_s, graph, sg.build_problem(graph, cluster)


def plan_row(name, fn, args, graph, problem, plan, mega_plain_s, executed: bool, top: int) -> dict:
    import shardgym as sg
    from experiments.minmem_bounds import peak_by_kind
    from runtime.core import execute

    with tempfile.TemporaryDirectory(prefix="s21c-") as d:
        rep = execute(fn, args, graph, plan, problem=problem, compiler_options={"xla_dump_to": d})
        peak = peak_by_kind(d, top)
    c = sg.evaluate(problem, plan)
    mib = 2.0 ** -20
    row = {"plan": name, "xla_MiB": rep.xla_memory_bytes * mib, "pred_MiB": c.peak_memory_bytes * mib,
           "pred_over_xla": c.peak_memory_bytes / rep.xla_memory_bytes, "step_time_s": c.step_time_s,
           "step_time_vs_plain_megatron": c.step_time_s / mega_plain_s, "compile_s": rep.compile_time_s,
           "status": plan.info.get("status"), "gap": plan.info.get("gap"),
           "bound_MiB": None if plan.info.get("bound") is None else plan.info["bound"] * mib,
           "peak_by_kind_MiB": {k: v * mib for k, v in peak["by_kind_bytes"].items()},
           "peak_largest": peak["largest"]}
    if executed:
        row.update(max_rel_err=rep.max_rel_err, loss_rel_err=rep.loss_rel_err, measured_step_s=rep.step_time_s)
    print(f"  {name:28s} XLA {row['xla_MiB']:10.3f} MiB  pred {row['pred_MiB']:10.3f} ({row['pred_over_xla']:.3f}x)  "
          f"step {row['step_time_vs_plain_megatron']:.3f}x plain Megatron  ({row['status']}, compile "
          f"{rep.compile_time_s:.0f} s)", flush=True)
    return row


def run_model(name: str, size: str, cfg: Config) -> dict:
    import shardgym as sg
    import zoo
    from experiments.fidelity import unbounded
    from zoo import gpt
    from zoo.common import build_step

    executed = size == zoo.sizes(name)[0]
    cluster = sg.Cluster.preset(cfg.cluster)
    if not executed:
        cluster = unbounded(cluster)
    rows, mega_plain_s = [], None
    for tag, (fields, policy) in PROGRAMS.items():
        if tag != "plain" and tag not in cfg.programs:
            continue
        mcfg = dataclasses.replace(zoo.config(name, size), **fields)
        fn, args = build_step(gpt, mcfg, abstract=not executed, seed=cfg.seed)
        graph = sg.trace(fn, *args, name=f"{name}-{size}{'' if tag == 'plain' else '-' + tag}", recompute=policy)
        problem = sg.build_problem(graph, cluster)
        mega = sg.solve(problem, method="megatron")
        if mega_plain_s is None:
            mega_plain_s = sg.evaluate(problem, mega).step_time_s
        rows.append(plan_row(f"{tag} megatron", fn, args, graph, problem, mega, mega_plain_s, executed, cfg.top))
        if tag not in cfg.programs:   # plain Megatron is always compiled: the savings are against it
            continue
        t0 = time.perf_counter()
        mm = sg.solve(problem, method="ilp", objective="memory", time_limit_s=cfg.ilp_time_limit_s,
                      max_step_time_s=cfg.bound * mega_plain_s,
                      initial_plans=[list(mega.strategies), [0] * problem.num_nodes])
        solve_s = time.perf_counter() - t0
        rows.append(plan_row(f"{tag} min-memory {cfg.bound}x", fn, args, graph, problem, mm, mega_plain_s,
                              executed, cfg.top))
        rows[-1]["solve_s"] = solve_s
        if cfg.time_optimal:   # the time objective's plan: below Megatron's memory on the plain program (s20)
            t0 = time.perf_counter()
            tp = sg.solve(problem, method="ilp", objective="time", time_limit_s=cfg.ilp_time_limit_s,
                          initial_plans=[list(mega.strategies)])
            solve_s = time.perf_counter() - t0
            rows.append(plan_row(f"{tag} time-optimal", fn, args, graph, problem, tp, mega_plain_s, executed, cfg.top))
            rows[-1]["solve_s"] = solve_s
    by = {r["plan"]: r for r in rows}
    for r in rows:
        r["saving_vs_plain_megatron_xla"] = 1 - r["xla_MiB"] / by["plain megatron"]["xla_MiB"]
        same = by[r["plan"].split(" ")[0] + " megatron"]
        r["saving_vs_same_program_megatron_xla"] = 1 - r["xla_MiB"] / same["xla_MiB"]
    return {"model": name, "size": size, "executed": executed, "plain_megatron_step_time_s": mega_plain_s,
            "plans": rows}


def main(argv=None) -> list[dict]:
    from experiments.common import print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt:tiny,gpt:125m", help="comma-separated model:size (gpt only)")
    ap.add_argument("--ilp-time-limit-s", type=float, default=60.0)
    ap.add_argument("--programs", default="plain,remat", help="whose min-memory plan to solve, comma-separated: "
                    + ", ".join(PROGRAMS))
    ap.add_argument("--time-optimal", action="store_true", help="also the time objective's ILP plan per program")
    ap.add_argument("--out", default="s21c_remat")
    a = ap.parse_args(argv)
    bad = [p for p in a.programs.split(",") if p and p not in PROGRAMS]
    if bad:
        raise SystemExit(f"s21c_remat: unknown program(s) {bad}; choose from {', '.join(PROGRAMS)}")
    cfg = Config(models=tuple(m for m in a.models.split(",") if m), ilp_time_limit_s=a.ilp_time_limit_s,
                 programs=tuple(p for p in a.programs.split(",") if p), time_optimal=a.time_optimal)
    out = []
    for spec in cfg.models:
        name, _, size = spec.partition(":")
        if name != "gpt":
            raise SystemExit(f"s21c_remat: only gpt has remat_attention, got {spec!r}")
        print(f"{name}:{size}", flush=True)
        out.append(run_model(name, size or "tiny", cfg))
        write_results(a.out, {"models": out}, config=cfg, seed=cfg.seed)
    rows = [dict(model=f"{m['model']}:{m['size']}", **r) for m in out for r in m["plans"]]
    print_table(rows, ["model", "plan", "xla_MiB", "pred_MiB", "pred_over_xla", "step_time_vs_plain_megatron",
                       "saving_vs_plain_megatron_xla", "saving_vs_same_program_megatron_xla"],
                title=f"per-device memory by XLA's count; target: 40% below plain Megatron within {cfg.bound}x its step time")
    return out


if __name__ == "__main__":
    main()
