"""The planner's choice of recomputation (``shardgym.recompute.choose``) against the 40 % target.

Per model size: ``choose`` traces the plain gpt step under each recompute policy (None, "dots",
"dots_no_batch", "blocks"; ``--policies`` a subset), solves the min-memory ILP within ``--bound`` x the plain program's Megatron step
time (``--ilp-time-limit-s`` per policy) and keeps the least predicted peak. The chosen plan and
plain Megatron's are compiled (the first size of the zoo is executed, with numerics; larger sizes
are compiled abstractly on a cluster with unbounded memory, as experiments/s21c_remat.py does, whose
``plan_row`` records each plan) and the saving is XLA's memory against plain Megatron's.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/s22b_choose.py \
        --models gpt:tiny,gpt:125m --out s22b_choose

``--verify-rounds N`` also runs the chosen plan through ``sg.verify`` (the memory objective's mode: XLA's missed
buffers charged every round, the peak LNS between rounds, the plan XLA measures least kept) and adds its row.

Writes results/<out>.json (config, seed, git revision, one record per model size).
"""
from __future__ import annotations

import argparse
import sys
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
    policies: tuple = ()   # the recompute policies choose tries (empty: all of POLICIES)
    verify_rounds: int = 0   # > 0: the chosen plan through sg.verify (memory mode: charged, polished, XLA's least)
    top: int = 8
    seed: int = 0


def run_model(name: str, size: str, cfg: Config) -> dict:
    import shardgym as sg
    import zoo
    from experiments.fidelity import unbounded
    from experiments.s21c_remat import plan_row

    executed = size == zoo.sizes(name)[0]
    cluster = sg.Cluster.preset(cfg.cluster)
    if not executed:
        cluster = unbounded(cluster)
    fn, args = zoo.build(name, size, abstract=not executed, seed=cfg.seed)
    t0 = time.perf_counter()
    kw = {"policies": tuple(None if p == "none" else p for p in cfg.policies)} if cfg.policies else {}
    choice = sg.recompute.choose(fn, args, cluster, bound_vs_megatron=cfg.bound, time_limit_s=cfg.ilp_time_limit_s,
                                 name=f"{name}-{size}", **kw)
    choose_s = time.perf_counter() - t0
    plain = sg.trace(fn, *args, name=f"{name}-{size}")
    problem = sg.build_problem(plain, cluster)
    mega = sg.solve(problem, method="megatron")
    mega_s = sg.evaluate(problem, mega).step_time_s
    rows = [dict(plan_row("plain megatron", fn, args, plain, problem, mega, mega_s, executed, cfg.top), strategies=None),
            dict(plan_row(f"chosen ({choice.policy}) min-memory {cfg.bound}x", fn, args, choice.graph, choice.problem,
                          choice.plan, mega_s, executed, cfg.top), strategies=[int(x) for x in choice.plan.strategies])]
    verified = None
    if cfg.verify_rounds > 0:
        t1 = time.perf_counter()
        v = sg.verify(fn, args, choice.graph, choice.problem, plan=choice.plan, rounds=cfg.verify_rounds, method="ilp",
                      objective="memory", max_step_time_s=choice.max_step_time_s, time_limit_s=cfg.ilp_time_limit_s)
        print(v.summary(), flush=True)
        verified = {"rounds": [dict(r.to_dict(), strategies=None) for r in v.rounds],
                    "chosen_round": v.plan.info["verify"]["chosen_round"], "verify_s": time.perf_counter() - t1}
        rows.append(dict(plan_row(f"chosen ({choice.policy}), verified ({cfg.verify_rounds} rounds)", fn, args,
                                  choice.graph, choice.problem, v.plan, mega_s, executed, cfg.top),
                         strategies=[int(x) for x in v.plan.strategies]))
    for r in rows:
        r["saving_vs_plain_megatron_xla"] = 1 - r["xla_MiB"] / rows[0]["xla_MiB"]
    mib = 2.0 ** -20
    cands = [dict(c, peak_MiB=None if c["peak_memory_bytes"] is None else c["peak_memory_bytes"] * mib,
                  step_time_vs_plain_megatron=c["step_time_s"] / mega_s) for c in choice.candidates]
    for c in cands:
        print(f"  candidate {c['policy']!s:14s} pred {c['peak_MiB'] or float('nan'):10.3f} MiB  step "
              f"{c['step_time_vs_plain_megatron']:.3f}x"
              f"  within {c['within_bound']}  ({c['status']})", flush=True)
    return {"model": name, "size": size, "executed": executed, "chosen_policy": choice.policy,
            "bound_s": choice.max_step_time_s, "plain_megatron_step_time_s": mega_s, "choose_s": choose_s,
            "candidates": cands, "plans": rows, "verify": verified}


def main(argv=None) -> list[dict]:
    from experiments.common import print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt:tiny,gpt:125m", help="comma-separated model:size")
    ap.add_argument("--ilp-time-limit-s", type=float, default=60.0, help="per policy")
    ap.add_argument("--bound", type=float, default=1.05, help="x plain Megatron's modelled step time")
    ap.add_argument("--policies", default="", help="comma-separated recompute policies ('none': the plain "
                    "program; default: every policy of costmodel.trace.recompute.POLICIES)")
    ap.add_argument("--verify-rounds", type=int, default=0, help="> 0: verify the chosen plan with XLA this many "
                    "rounds (sg.verify, memory objective: charged every round, peak LNS between, XLA's least kept)")
    ap.add_argument("--out", default="s22b_choose")
    a = ap.parse_args(argv)
    cfg = Config(models=tuple(m for m in a.models.split(",") if m), ilp_time_limit_s=a.ilp_time_limit_s,
                 bound=a.bound, policies=tuple(p for p in a.policies.split(",") if p), verify_rounds=a.verify_rounds)
    out = []
    for spec in cfg.models:
        name, _, size = spec.partition(":")
        print(f"{name}:{size}", flush=True)
        out.append(run_model(name, size or "tiny", cfg))
        write_results(a.out, {"models": out}, config=cfg, seed=cfg.seed)
    rows = [dict(model=f"{m['model']}:{m['size']}", **r) for m in out for r in m["plans"]]
    print_table(rows, ["model", "plan", "xla_MiB", "pred_MiB", "pred_over_xla", "step_time_vs_plain_megatron",
                       "saving_vs_plain_megatron_xla"],
                title=f"per-device memory by XLA's count; target: 40% below plain Megatron within {cfg.bound}x its step time")
    return out


if __name__ == "__main__":
    main()
