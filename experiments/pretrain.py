"""Train the shipped policy: behaviour cloning on teacher plans, then PPO, on the TRAIN split.

    python experiments/pretrain.py --minutes 20            # writes agent/pretrained/policy.msgpack + card.json

1. Problems: every workload of ``env.workloads.train_workloads()`` uncapped, each again under a
   seeded random memory cap (fraction U(0.2, 1) of the way from min to max peak), plus
   ``--random-problems`` synthetic problems (``random_problem``, 20-200 nodes) for diversity.
2. Teacher plans: ``--teacher ilp`` solves each problem with ``costmodel.ilp.solve_ilp`` (time
   limit ``--ilp-seconds``) and keeps the better of that and the heuristic teacher; ``heuristic``
   takes the cheapest feasible of {replicated, dp, megatron, fsdp baselines (traced problems),
   greedy-by-cost}, each memory-repaired and polished by local search.
3. Behaviour cloning (agent/imitation.py) for ``--bc-fraction`` of the time budget, then PPO
   (agent/ppo.py) on ``MixedSampler("train", --random-fraction)`` with greedy-prefixed random
   starts, until ``--minutes`` have passed since the start (teacher time included).
4. The checkpoint and a JSON card (command, wall time, config, git revision, teacher quality,
   BC and PPO curves) go to ``--out`` (default agent/pretrained/). Ctrl-C saves and exits.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")

import numpy as np  # noqa: E402


def teacher_plan(problem, teacher: str, ilp_seconds: float):
    from agent.planner import heuristic_plan
    from costmodel.problem import evaluate
    plan, name = heuristic_plan(problem)
    info = {"teacher": f"heuristic:{name}"}
    if teacher == "ilp":
        try:
            from costmodel.ilp import solve_ilp
            s, si = solve_ilp(problem, objective="time", time_limit_s=ilp_seconds)
            c = evaluate(problem, s)
            info["ilp_status"] = si.status
            if c.feasible and (plan is None or c.total <= evaluate(problem, plan).total):
                plan, info["teacher"] = s, f"ilp:{si.status}"
        except Exception as exc:  # infeasible or solver trouble: keep the heuristic
            info["ilp_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return plan, info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="total wall-time budget")
    ap.add_argument("--bc-fraction", type=float, default=0.5, help="share of the remaining budget for BC")
    ap.add_argument("--teacher", choices=("ilp", "heuristic"), default="heuristic")
    ap.add_argument("--ilp-seconds", type=float, default=20.0)
    ap.add_argument("--random-problems", type=int, default=32)
    ap.add_argument("--demo-steps", type=int, default=48, help="demonstration steps kept per problem")
    ap.add_argument("--bc-batch", type=int, default=32)
    ap.add_argument("--out", default=os.path.join("agent", "pretrained"))
    ap.add_argument("--no-progress", action="store_true")
    from agent.ppo import PPOConfig
    defaults = PPOConfig(hidden=32, rounds=4, random_fraction=0.3, random_start=0.75, num_envs=8, num_steps=32)
    for f in dataclasses.fields(PPOConfig):
        v = getattr(defaults, f.name)
        typ = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(v, bool) else type(v)
        ap.add_argument("--" + f.name.replace("_", "-"), type=typ, default=v, help=f"PPOConfig.{f.name}")
    args = ap.parse_args(argv)
    cfg = PPOConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PPOConfig)})
    t0 = time.perf_counter()
    budget_s = args.minutes * 60

    from agent.imitation import behaviour_cloning, demonstrations
    from agent.ppo import PPOTrainer, git_rev
    from costmodel.problem import evaluate
    from env.sharding_env import ShardingEnv
    from env.workloads import Workload, random_problem, train_workloads

    rng = np.random.default_rng(cfg.seed)
    problems = []
    for w in train_workloads():
        problems.append(w.build())
        problems.append(Workload(w.model, w.size, w.cluster, None, float(rng.uniform(0.2, 1.0))).build())
    for j in range(args.random_problems):
        problems.append(random_problem(rng, int(rng.integers(20, 201)), 8,
                                       memory_cap_fraction=float(rng.uniform(0.2, 1.0)) if rng.random() < 0.5 else None,
                                       name=f"random-train-{j}"))
    print(f"{len(problems)} training problems; teacher={args.teacher}", flush=True)

    demos, teacher_rows = [], []
    for j, p in enumerate(problems):
        plan, info = teacher_plan(p, args.teacher, args.ilp_seconds)
        if plan is None:
            teacher_rows.append({"problem": p.name, "skipped": "no feasible teacher plan"})
            continue
        env = ShardingEnv(workloads=p, copy_obs=False)
        try:
            steps = demonstrations(env, plan, seed=cfg.seed + j, keep=args.demo_steps)
        except ValueError as exc:
            teacher_rows.append({"problem": p.name, "skipped": str(exc)})
            continue
        ref = env.unwrapped._c.reference_cost if hasattr(env.unwrapped, "_c") else None
        c = evaluate(p, plan)
        teacher_rows.append({"problem": p.name, "nodes": p.num_nodes, "teacher_cost": c.total,
                             "teacher_over_reference": c.total / ref if ref else None, **info})
        demos.extend(steps)
    t_teacher = time.perf_counter() - t0
    print(f"teacher plans + {len(demos)} demonstration steps in {t_teacher:.0f}s", flush=True)

    trainer = PPOTrainer(cfg)
    remaining = budget_s - (time.perf_counter() - t0)
    bc_hist = behaviour_cloning(trainer, demos, epochs=10_000, batch_size=args.bc_batch,
                                seconds=max(remaining * args.bc_fraction, 1.0), seed=cfg.seed,
                                log=lambda r: print("  bc", {k: round(v, 4) for k, v in r.items()}, flush=True))
    del demos
    t_bc = time.perf_counter() - t0 - t_teacher
    os.makedirs(args.out, exist_ok=True)
    ck = os.path.join(args.out, "policy.msgpack")
    remaining = budget_s - (time.perf_counter() - t0)
    ppo_hist = []
    if remaining > 30:
        ppo_hist = trainer.train(seconds=remaining, checkpoint_path=ck, checkpoint_every=5,
                                 progress=not args.no_progress)
    wall = time.perf_counter() - t0
    command = "python experiments/pretrain.py " + " ".join(sys.argv[1:] if argv is None else argv)
    extra = {"command": command, "wall_s": wall, "git_rev": git_rev()}
    trainer.save(ck, extra=extra)
    trainer.close()
    card = {**extra, "config": cfg.to_dict(), "teacher": args.teacher, "teacher_s": t_teacher, "bc_s": t_bc,
            "ppo_updates": len(ppo_hist), "bc_history": bc_hist, "ppo_history": ppo_hist,
            "teacher_rows": teacher_rows, "checkpoint_bytes": os.path.getsize(ck)}
    with open(os.path.join(args.out, "card.json"), "w") as f:
        json.dump(card, f, indent=1, default=float)
    print(f"wrote {ck} ({os.path.getsize(ck) / 1e6:.2f} MB) after {wall / 60:.1f} min "
          f"(teacher {t_teacher:.0f}s, BC {t_bc:.0f}s, PPO {len(ppo_hist)} updates)")


if __name__ == "__main__":
    main()
