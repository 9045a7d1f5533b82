"""Train the GNN policy: teacher plans, behaviour cloning, then PPO, in a run folder that survives
interruption. ``shardgym train ARGS`` and ``python experiments/pretrain.py ARGS`` both call ``main``;
``--model fgnn`` hands the run to agent/fgnn_train.py (the factor-graph network).

1. Problems: every workload of ``env.workloads.train_workloads()`` uncapped and again under a seeded
   random memory cap (``--no-workloads`` skips them), plus ``--random-problems`` synthetic problems.
2. Teacher plans (``--teacher heuristic|ilp``) and their demonstration steps, for at most
   ``--teacher-fraction`` of the budget.
3. Behaviour cloning for ``--bc-fraction`` of what is left (or exactly ``--bc-epochs`` epochs).
4. PPO until ``--minutes`` have passed since the first start (every phase and every earlier
   session of the run counts), or until ``--updates`` updates in all.

Run folder (``--out``; default ``runs/train-YYYYmmdd-HHMMSS`` under the current directory, never the
package; agent/runs.py): ``state.json`` (config, phase, seconds used), ``teacher.msgpack`` (demonstrations so far,
saved after every problem), ``bc.msgpack`` (after BC), ``policy.msgpack`` (PPO, every
``--checkpoint-every`` updates, at Ctrl-C and at the end), ``card.json`` (the record). Every file is
written atomically (tmp + rename); checkpoints carry a checksum of their weights. An existing
checkpoint in ``--out`` is refused without ``--force``. Ctrl-C in any phase saves what it has and
exits 130 with the command that resumes; ``--resume RUN_DIR`` continues from the last checkpoint
with the run's saved config (the RL phase continues bit-identically: PPO's state is a function of
params, optimizer state, key and update counter, all in the checkpoint).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
from flax import serialization

from agent.checkpoints import load_checkpoint, write_atomic
from agent.cliutil import OneLineParser
from agent.fgnn_train import main as fgnn_main
from agent.imitation import behaviour_cloning, demonstrations
from agent.ppo import PPOConfig, PPOTrainer, problem_env_fn
from agent.runs import BC, POLICY, STATE, TEACHER, BudgetSpent, Run, budget_alarm, git_rev, run_dir, write_json
from costmodel.problem import evaluate
from env.sharding_env import ShardingEnv
from env.workloads import Workload, random_problem, train_workloads
from solvers.ilp import solve_ilp
from solvers.local import heuristic_plan


class Interrupted(Exception):
    """Ctrl-C in a phase after its state was saved."""


def teacher_plan(problem, teacher: str, ilp_time_limit_s: float):
    """The teacher's plan of ``problem`` and a record of how it was made: the heuristic's, or with
    ``teacher="ilp"`` the ILP's (``ilp_time_limit_s``) where it is feasible and no worse."""
    plan, name = heuristic_plan(problem)
    info = {"teacher": f"heuristic:{name}"}
    if teacher == "ilp" and ilp_time_limit_s > 0.5:
        try:
            s, si = solve_ilp(problem, objective="time", time_limit_s=ilp_time_limit_s)
            c = evaluate(problem, s)
            info["ilp_status"] = si.status
            if c.feasible and (plan is None or c.total <= evaluate(problem, plan).total):
                plan, info["teacher"] = s, f"ilp:{si.status}"
        except (RuntimeError, ValueError) as exc:  # infeasible or solver trouble: keep the heuristic
            info["ilp_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return plan, info


def build_parser(prog: str = "shardgym train") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description="Train the sharding policy: teacher plans, behaviour cloning, PPO.")
    ap.add_argument("--model", choices=("gnn", "fgnn"), default="gnn",
                    help="gnn: the PPO policy (this module); fgnn: the factor-graph network (agent/fgnn_train.py)")
    ap.add_argument("--minutes", type=float, default=20.0, help="total wall-time budget, every phase counted")
    ap.add_argument("--updates", type=int, default=None, help="stop PPO after this many updates in all")
    ap.add_argument("--teacher-fraction", type=float, default=0.3, help="most of the budget for teacher plans")
    ap.add_argument("--bc-fraction", type=float, default=0.5, help="share of the remaining budget for BC")
    ap.add_argument("--bc-epochs", type=int, default=None, help="exactly this many BC epochs (instead of time)")
    ap.add_argument("--teacher", choices=("ilp", "heuristic"), default="heuristic")
    ap.add_argument("--ilp-seconds", type=float, default=20.0)
    ap.add_argument("--workloads", action=argparse.BooleanOptionalAction, default=True,
                    help="include the traced train-split workloads (--no-workloads: random problems only)")
    ap.add_argument("--random-problems", type=int, default=32)
    ap.add_argument("--demo-steps", type=int, default=48, help="demonstration steps kept per problem")
    ap.add_argument("--bc-batch", type=int, default=32)
    ap.add_argument("--checkpoint-every", type=int, default=5, help="PPO updates between checkpoints")
    ap.add_argument("--out", default=None, help="run folder (default runs/train-<time>)")
    ap.add_argument("--force", action="store_true", help="overwrite a checkpoint already in --out")
    ap.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    ap.add_argument("--no-progress", action="store_true")
    defaults = PPOConfig(hidden=32, rounds=4, random_fraction=0.3, random_start=0.75, num_envs=8, num_steps=32)
    for f in dataclasses.fields(PPOConfig):
        v = getattr(defaults, f.name)
        typ = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(v, bool) else type(v)
        ap.add_argument("--" + f.name.replace("_", "-"), type=typ, default=v, help=f"PPOConfig.{f.name}")
    return ap


def _check_args(a) -> None:
    if not a.minutes > 0:
        raise ValueError(f"--minutes must be > 0, got {a.minutes}")
    for name in ("teacher_fraction", "bc_fraction"):
        if not 0 <= getattr(a, name) <= 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(a, name)}")
    for name in ("updates", "bc_epochs"):
        if getattr(a, name) is not None and getattr(a, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    if a.random_problems < 0 or a.checkpoint_every < 1 or a.bc_batch < 1:
        raise ValueError("--random-problems must be >= 0, --checkpoint-every and --bc-batch >= 1")
    if not a.workloads and a.random_problems == 0:
        raise ValueError("--no-workloads needs --random-problems > 0: there would be nothing to train on")


def _problems(a, cfg, deadline: float):
    rng = np.random.default_rng(cfg.seed)
    problems = []
    if a.workloads:
        for w in train_workloads():
            if time.perf_counter() > deadline:
                break
            problems.append(w.build())
            problems.append(Workload(w.model, w.size, w.cluster, None, float(rng.uniform(0.2, 1.0))).build())
    for j in range(a.random_problems):
        problems.append(random_problem(rng, int(rng.integers(20, 201)), 8,
                                       memory_cap_fraction=float(rng.uniform(0.2, 1.0)) if rng.random() < 0.5 else None,
                                       name=f"random-train-{j}"))
    return problems


def _teacher_phase(run: Run, a, cfg) -> list:
    saved = {"done": 0, "demos": {}, "rows": "[]"}
    if os.path.exists(run.path(TEACHER)):
        with open(run.path(TEACHER), "rb") as f:
            saved = serialization.msgpack_restore(f.read())
    demos = [saved["demos"][k] for k in sorted(saved["demos"], key=int)]
    rows = json.loads(saved["rows"])
    done = int(saved["done"])
    if run.state.get("phase") != "teacher":
        return demos
    deadline = run.t0 + a.teacher_fraction * run.budget_s
    problems = _problems(a, cfg, deadline)
    print(f"{len(problems)} training problems; teacher={a.teacher}; {done} labelled before", flush=True)

    def save():
        doc = {"done": done, "rows": json.dumps(rows, default=float),
               "demos": {str(i): d for i, d in enumerate(demos)}}
        write_atomic(run.path(TEACHER), serialization.msgpack_serialize(doc))
        run.save()

    try:
        for j in range(done, len(problems)):
            if time.perf_counter() > deadline:
                rows.append({"stopped": f"teacher budget used after {j} problems"})
                break
            p = problems[j]
            ilp_time_limit_s = min(a.ilp_seconds, max(0.0, deadline - time.perf_counter()))
            plan, info = teacher_plan(p, a.teacher, ilp_time_limit_s)
            if plan is None:
                rows.append({"problem": p.name, "skipped": "no feasible teacher plan"})
            else:
                env = ShardingEnv(workloads=p, copy_obs=False)
                try:
                    steps = demonstrations(env, plan, seed=cfg.seed + j, keep=a.demo_steps)
                    c = evaluate(p, plan)
                    rows.append({"problem": p.name, "nodes": p.num_nodes, "teacher_cost": c.total, **info})
                    demos.extend(steps)
                except ValueError as exc:
                    rows.append({"problem": p.name, "skipped": str(exc)})
            done = j + 1
            save()
    except KeyboardInterrupt:
        save()
        raise Interrupted("teacher plans") from None
    save()
    run.save(phase="bc", teacher_rows=len(rows))
    print(f"teacher: {done} problems, {len(demos)} demonstration steps at {run.elapsed():.0f}s", flush=True)
    return demos


def _bc_phase(run: Run, a, cfg, demos):
    if run.state.get("phase") in ("ppo", "done"):
        return
    if not demos:   # checked before building a trainer (its environments cost seconds of the budget)
        print("no demonstrations: PPO starts from random weights", flush=True)
        run.save(phase="ppo", bc_history=[])
        return
    trainer = PPOTrainer(cfg) if not os.path.exists(run.path(BC)) else PPOTrainer.load(run.path(BC))
    time_limit_s = None if a.bc_epochs is not None else max(run.left() * a.bc_fraction, 1.0)
    epochs = a.bc_epochs if a.bc_epochs is not None else 10_000
    done_epochs = int(run.state.get("bc_epochs_done", 0))
    try:
        hist = behaviour_cloning(trainer, demos, epochs=max(epochs - done_epochs, 0), batch_size=a.bc_batch,
                                 time_limit_s=time_limit_s, seed=cfg.seed + done_epochs,
                                 log=lambda r: print("  bc", {k: round(v, 4) for k, v in r.items()}, flush=True))
    except KeyboardInterrupt:
        trainer.save(run.path(BC))
        run.save()
        raise Interrupted("behaviour cloning") from None
    trainer.save(run.path(BC))
    run.save(phase="ppo", bc_history=run.state.get("bc_history", []) + hist)
    trainer.close()


def _start_trainer(run: Run, cfg, env_fn=None):
    """The PPO trainer at update 0: BC's weights if there are any, else a fresh initialisation."""
    trainer = PPOTrainer(cfg, env_fn=env_fn)
    if os.path.exists(run.path(BC)):
        trainer.params = serialization.from_state_dict(trainer.params, load_checkpoint(run.path(BC))["params"])
        trainer.opt_state = trainer.optimizer.init(trainer.params)
    return trainer


def _ppo_phase(run: Run, a, cfg) -> None:
    """PPO until the budget or ``--updates``. The budget is also held inside steps that cannot check
    the clock (building environments, a rollout): ``runs.budget_alarm`` ends them, the unfinished update
    is dropped (the trainer restores its state) and the run ends normally."""
    ck = run.path(POLICY)
    trainer, spent, hist = None, False, []
    try:
        with budget_alarm(run.left() if a.updates is None else float("inf")):
            if os.path.exists(ck):
                trainer = PPOTrainer.load(ck)
            else:
                trainer = _start_trainer(run, cfg)
                trainer.save(ck)   # update 0: a resume before the first PPO checkpoint starts from here
            todo = None if a.updates is None else max(a.updates - trainer.update_count, 0)
            if (todo is None or todo > 0) and run.left() > 0:
                hist = trainer.train(num_updates=todo, time_limit_s=run.left(), checkpoint_path=ck,
                                     checkpoint_every=a.checkpoint_every, progress=not a.no_progress)
                # or the budget ran out while the alarm's BudgetSpent was swallowed where Python
                # ignores exceptions (a gc callback: seen under pytest -n 2 with hypothesis loaded)
                # and the trainer's own time limit ended it
                spent = isinstance(getattr(trainer, "interrupt", None), BudgetSpent) or run.left() <= 0
    except BudgetSpent:
        spent = True
    if trainer is None:   # the budget ran out while the environments were built: a policy at update 0
        trainer = _start_trainer(run, cfg, env_fn=problem_env_fn(random_problem(np.random.default_rng(0), 8, 4)))
        trainer.save(ck)
    if spent:
        print(f"--minutes budget reached during PPO; the policy is the one after update {trainer.update_count}",
              flush=True)
    run.save(ppo_updates=trainer.update_count, ppo_history=run.state.get("ppo_history", []) + hist)
    if getattr(trainer, "interrupted", False) and not spent:
        raise Interrupted("PPO")
    trainer.close()


def _wants_fgnn(argv: list) -> bool:
    """``--model fgnn`` given, or ``--resume`` of a run folder made with it."""
    for j, x in enumerate(argv):
        if x == "--model=fgnn" or (x == "--model" and argv[j + 1:j + 2] == ["fgnn"]):
            return True
        if x == "--resume" and j + 1 < len(argv):
            path = os.path.join(argv[j + 1], STATE)
            if os.path.exists(path):
                with open(path) as f:
                    return json.load(f).get("args", {}).get("model") == "fgnn"
    return False


def main(argv=None, prog: str = "shardgym train") -> int:
    """Parse ``argv``, run (or resume) the phases; 0 when done, 130 after Ctrl-C (state saved)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if _wants_fgnn(argv):   # the factor-graph network: its own phases (agent/fgnn_train.py), this run folder
        return fgnn_main(argv, prog=f"{prog} --model fgnn" if "--model" not in argv else prog)
    ap = build_parser(prog)
    a = ap.parse_args(argv)
    if a.resume:
        path = os.path.join(a.resume, STATE)
        if not os.path.exists(path):
            raise ValueError(f"--resume {a.resume}: no {STATE} there (not a run folder of `shardgym train`)")
        with open(path) as f:
            state = json.load(f)
        saved = dict(state["args"])
        explicit = {k: v for k, v in vars(a).items() if f"--{k.replace('_', '-')}" in argv}
        for k in ("minutes", "updates", "no_progress"):   # what a resume may change
            if k in explicit:
                saved[k] = explicit[k]
        a = argparse.Namespace(**{**vars(a), **saved, "resume": a.resume, "out": a.resume})
        run = Run(a.resume, saved, float(saved["minutes"]) * 60, state)
    else:
        _check_args(a)
        out = run_dir(a.out, a.force)
        args = {k: v for k, v in vars(a).items() if k not in ("resume", "force")}
        args["out"] = out
        run = Run(out, args, float(a.minutes) * 60)
        run.save()
    cfg = PPOConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(PPOConfig)})
    print(f"run folder {run.out} (resume with `shardgym train --resume {run.out}`)", flush=True)
    try:
        demos = _teacher_phase(run, a, cfg)
        _bc_phase(run, a, cfg, demos)
        del demos
        _ppo_phase(run, a, cfg)
    except (Interrupted, KeyboardInterrupt) as exc:
        if isinstance(exc, KeyboardInterrupt):   # between checkpoints: the last saved state stands
            run.save()
        print(f"shardgym: interrupted{f' in {exc}' if str(exc) else ''}; saved to {run.out}; resume with "
              f"`shardgym train --resume {run.out}`", file=sys.stderr, flush=True)
        return 130
    ck = run.path(POLICY)
    extra = {"command": f"{prog} " + " ".join(argv), "wall_s": run.elapsed(), "git_rev": git_rev()}
    card = {**extra, "config": cfg.to_dict(), "args": run.args, "sessions": run.state["sessions"],
            "ppo_updates": run.state.get("ppo_updates", 0), "bc_history": run.state.get("bc_history", []),
            "ppo_history": run.state.get("ppo_history", []), "checkpoint_bytes": os.path.getsize(ck)}
    write_json(run.path("card.json"), card)
    run.save(phase="done")
    print(f"wrote {ck} ({os.path.getsize(ck) / 1e6:.2f} MB) after {run.elapsed() / 60:.1f} min "
          f"({run.state.get('ppo_updates', 0)} PPO updates)")
    return 0
