"""The memory objective's seeds and its floor (issue 13): ``memory_seeds`` gathers the cheap plans
the search for the least peak starts from, and ``keep_best`` makes sure the answer is never worse
(by the model's peak, then step time) than the best of them within the cap and the step-time bound.

The seeds, besides the caller's plans and the baselines (``solvers.dispatch.baseline_seeds``):

- the planner's raw decode (``policy_seed.raw``, or ``policy_seed`` itself), when the caller passes
  one (``shardgym.solve`` does): one forward pass and the masked decode, 0.1-0.8 s on the zoo's tiny
  models, 3.5 s on gpt 125m (cpu-2x4, load 4-5);
- the time-optimal plan: ``solve_ilp`` with the time objective, given ``TIME_SEED_SHARE`` of the
  limit and started from the seeds above (so at worst it answers the fastest of them); on graphs
  beyond the capped core's MILP (``milp_ok``) only from ``TIME_SEED_BIG_S`` on. Under any step-time
  bound a plan can meet, the time-optimal plan meets it.

Why (gpt 125m cpu-2x4, compiled abstractly, the cost model of session 20, 30 s limit): the best
baseline within 1.05 x Megatron's step time was Megatron's plan itself (3703 MiB predicted); the
bisection's first cap (0.9 x that) found nothing in 18 s and the MIP nothing better, so the memory
objective answered Megatron's plan, with and without the bound, while the planner's plan (3406 MiB,
0.952 of the bound) and the time-optimal one (3443 MiB, 0.95) were lower and no slower
(results/s20e_fidelity_real_gpt.json). On fno tiny the planner's raw decode (2.81 MB) is below what
the search found from the baselines in 2 and 5 s (Megatron's 2.97 MB).
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.capped import milp_ok
from solvers.ilp.bounds import best_seed
from solvers.ilp.guard import SolveOverrun, solve_ilp_guarded
from solvers.ilp.types import InfeasibleError

#: share of the memory objective's time limit the time-optimal seed's ILP may take (gpt tiny cpu-2x4:
#: optimal in 1.4-2.8 s at load 4-6)
TIME_SEED_SHARE = 0.25
#: the time-optimal seed's ILP gets at least this many seconds, or is skipped when less is left
TIME_SEED_MIN_S = 1.0
#: on a graph larger than the capped core's MILP holds (``solvers.capped.milp_ok``) the time seed runs
#: only when its share is at least this long: gpt 125m cpu-2x4 (3,283 nodes) was solved to optimality in
#: 9 s of 30 at load 2 (results/s20e_fidelity_real_gpt.json), but gave no plan in 7.5 or 15 s at load 7
#: (killed past the limit while building and presolving: 8.6 / 16.1 s spent for nothing)
TIME_SEED_BIG_S = 20.0


def memory_seeds(problem: Problem, time_limit_s: float, seeds, policy_seed=None) -> tuple[list[list[int]], dict]:
    """(new seeds, info): the planner's raw decode (when ``policy_seed`` is given) and the
    time-optimal plan (``TIME_SEED_SHARE`` of ``time_limit_s``, started from ``seeds`` and the
    planner's plan; the module docstring says when it runs), each as a list of ints. A seed that cannot be had (the planner finds no plan
    that fits, ValueError; the time ILP finds none in its time) is left out. ``info``: per seed
    its name, peak bytes, step time and seconds taken."""
    out, info = [], {}
    known = [list(s) for s in seeds]
    if policy_seed is not None:
        t = time.perf_counter()
        try:
            pol = getattr(policy_seed, "raw", policy_seed)(problem)
        except ValueError:
            pol = None
        if pol is not None:
            out.append([int(x) for x in getattr(pol, "strategies", pol)])
            info["policy"] = _describe(problem, out[-1], t)
    limit = TIME_SEED_SHARE * float(time_limit_s)
    if limit >= (TIME_SEED_MIN_S if milp_ok(problem) else TIME_SEED_BIG_S):
        t = time.perf_counter()
        starts = known + out + ([[0] * problem.num_nodes] if problem.meta is not None else [])
        try:
            plan, _ = solve_ilp_guarded(problem, objective="time", time_limit_s=limit, initial_plans=starts)
        except SolveOverrun as exc:   # its best incumbent, if any: the starts are there anyway
            plan = best_seed(problem, exc.incumbents, problem.usage_limit, None, lambda c: c.total)
        except (RuntimeError, InfeasibleError):
            plan = None
        if plan is not None:
            out.append([int(x) for x in plan])
            info["time"] = _describe(problem, out[-1], t)
    return out, info


def _describe(problem: Problem, plan, t0: float) -> dict:
    c = evaluate(problem, plan)
    return {"peak_memory_bytes": float(c.peak_memory_bytes), "step_time_s": float(c.total),
            "seconds": round(time.perf_counter() - t0, 2)}


def keep_best(problem: Problem, strategies, info: dict, seeds, max_step_time_s) -> tuple[list[int], dict]:
    """The memory objective's floor: ``strategies`` unless a seed within the cap
    (``problem.usage_limit``) and ``max_step_time_s`` has a lower (peak, step time); then that seed,
    with ``info``'s objective, peak and step time set to its figures and source "seed". A finite
    bound in ``info`` stays (it bounds every plan's peak within the limits); the gap is recomputed
    from it for the answer."""
    key = (lambda c: (c.peak_memory_bytes, c.total))
    cands = [list(strategies)] + [list(s) for s in seeds]
    best = best_seed(problem, cands, problem.usage_limit, max_step_time_s, key)
    info = dict(info)
    swap = best is not None and best is not cands[0]
    strategies = best if swap else strategies
    bound = info.get("bound")
    bounded = bound is not None and np.isfinite(bound)
    c = evaluate(problem, strategies) if swap or bounded else None   # the answer's figures, once
    if swap:
        info.update(objective=float(c.peak_memory_bytes), source="seed")
        if "peak_memory_bytes" in info:
            info.update(peak_memory_bytes=float(c.peak_memory_bytes), step_time_s=float(c.total),
                        redundant_memory_bytes=float(c.redundant_memory_bytes))
        if info.get("status") == "optimal":   # the search proved a worse plan optimal: not a proof
            info["status"] = "time_limit"
    if bounded:
        peak = c.peak_memory_bytes
        info["gap"] = max(peak - float(bound), 0.0) / max(peak, 1e-300)
    return [int(x) for x in strategies], info
