"""The ILP's entry: ``solve_ilp`` validates its arguments, picks the objective and runs it.

* ``time``: min time (``reduced.core``). Under a memory cap it first tries the uncapped LP
  (``relax_cap``): a proven uncapped optimum that fits the cap is the capped optimum.
* ``memory``: min peak, then min time at it (``solvers.ilp.memory``).
* ``redundancy``: min Σ redundant bytes, then min time (``solve_redundancy``). Phase 1 is free
  (R* = Σ per-node minima, reached iff every node uses a least-redundancy strategy), so phase 2 is
  the time objective on those strategies alone; only if the cap or T rules them all out does the
  two-phase model run, seeded and with strategies that alone exceed the seed's value dropped.
* ``weights={"time": a, "memory": b, "redundancy": c}``: one solve of a·time + b·M + c·redundant.

``max_step_time_s`` adds time ≤ bound; the memory cap is min(problem.usage_limit,
``memory_cap_bytes``), both validated by ``costmodel.limits.Limits`` (a value <= 0 is its
``LimitError``). A cap that no plan can reach is dropped up front (exact; it unlocks the
reductions). OR-Tools CP-SAT (2 workers) on the same model, 60 s each (``experiments/bench_ilp.py
--sections s``): 1.34x HiGHS's cost on a random 1,000-node problem, 1.61x and 2.26x on gpt / unet
tiny, which HiGHS proves optimal in under 2 s; HiGHS is kept.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.limits import Limits
from costmodel.problem import Problem, evaluate, fits
from solvers.ilp.bounds import best_seed, check_seeds, min_usage, minmax, node_min_peak, peak_upper_bound
from solvers.ilp.infeasible import explain_infeasible, min_time_plan_within
from solvers.ilp.memory import solve_memory
from solvers.ilp.reduced import core
from solvers.ilp.types import REDUNDANCY, IlpConfig, Request, RunOptions, SolveInfo, Weights
from solvers.local import least_measure_plan


def solve_ilp(problem: Problem, objective: str = "time", memory_cap_bytes=None, max_step_time_s=None,
              time_limit_s: float = 60, weights: dict | None = None, verbose: bool = False,
              reduce: bool = True, mip_rel_gap: float = 1e-6, threads: int = 2,
              initial_plan=None, forbid: bool = True, initial_plans=None,
              relax_cap: bool = True, config: IlpConfig = IlpConfig(),
              on_incumbent=None, allowed=None) -> tuple[list[int], SolveInfo]:
    """Plan ``problem`` exactly (see the module docstring). Returns (strategies, SolveInfo).

    ``memory_cap_bytes``: tightens ``problem.usage_limit`` (the effective cap is the smaller of
    the two, as ``Limits.effective_cap``); it never relaxes it.

    ``initial_plan`` / ``initial_plans``: candidate plans (strategy lists); the best one that meets
    the cap and the step-time bound seeds the solver (e.g. baseline plans: with the memory
    objective under ``max_step_time_s`` the answer's peak is never above the best such seed).

    ``relax_cap``: with the time objective under a memory cap, first solve without the cap
    (``relax_cap``); worth it when the cap often does not bind (traced models on big devices),
    a waste of up to ``config.relax_share`` of the time limit where it always binds (IOPDDL
    instances). ``config``: the solver's tuning (``IlpConfig``). ``on_incumbent(plan)``: called with
    plans found before the last MIP ends (the memory objective's copy-free and heuristic plans; the
    caller holds its seeds already);
    ``solve_ilp_guarded`` answers the best of them when HiGHS overruns its limit. ``allowed``: a bool mask
    over all strategies (time and weighted objectives): the solve is restricted to them, answer and bound
    those of the restricted problem (``solvers.lagrange.union_plan``).

    Raises InfeasibleError when no plan meets the memory cap / step-time bound, LimitError (a
    ValueError) on a cap or bound that is not a number > 0, and RuntimeError when HiGHS finds no
    feasible plan within ``time_limit_s``.
    """
    t0 = time.perf_counter()
    if not isinstance(problem, Problem):
        raise ValueError(f"solve_ilp needs a Problem, got {type(problem).__name__}")
    w, lexi = Weights.of(objective, weights)
    limits = Limits(memory_cap_bytes, max_step_time_s)
    cap = limits.effective_cap(problem.usage_limit)
    max_step_time_s = limits.max_step_time_s
    if time_limit_s is None or not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    seeds = check_seeds(problem, ([] if initial_plan is None else [initial_plan]) + list(initial_plans or []))
    if cap is not None and peak_upper_bound(problem) <= cap:
        cap = None  # no plan can reach the cap: dropping it is exact and unlocks the reductions
    o = RunOptions(t0=t0, deadline=t0 + float(time_limit_s), reduce=reduce, threads=threads,
                   rel_gap=mip_rel_gap, verbose=verbose, forbid=forbid,
                   memory_cap_bytes=limits.memory_cap_bytes, config=config, on_incumbent=on_incumbent)
    if lexi and objective == "memory":
        return solve_memory(problem, o, cap, max_step_time_s, seeds)
    if lexi:
        return solve_redundancy(problem, o, cap, max_step_time_s, seeds)
    need_m = w.memory > 0
    m_lo = 0.0
    if need_m:   # a proven lower bound on the peak
        m_lo = node_min_peak(problem) if problem.edge_memory is not None else min_usage(problem)[1]
    start = best_seed(problem, seeds, cap, max_step_time_s, w.key)
    out = None
    if allowed is not None and (lexi or len(allowed) != len(problem.node_costs)):
        raise ValueError("solve_ilp: allowed needs one flag per strategy and the time or a weighted objective")
    if relax_cap and cap is not None and not need_m and allowed is None:
        out = _relax_cap(problem, o, w, objective, cap, max_step_time_s)
    if out is None:
        out = core(problem, o, Request(weights=w, objective=objective, cap=cap, need_m=need_m,
                                       max_step_time_s=max_step_time_s, start=start, m_lo=m_lo,
                                       allowed=None if allowed is None else np.asarray(allowed, dtype=bool)))
    if out is None:
        explain_infeasible(problem, cap, max_step_time_s, o)
    return out


def _relax_cap(problem, o: RunOptions, w: Weights, objective, cap, max_time):
    """Solve the LP relaxation without the memory cap first (up to ``relax_share`` of the time
    left; no branch-and-bound: a fractional LP ends the attempt at once). Dropping the cap
    relaxes the problem, so a proven optimum of the relaxation whose peak fits under the cap is
    a proven optimum of the capped problem; and the relaxation is much smaller (nodes whose
    usage varies can be eliminated, no memory rows). gpt 1.3b on h100-2x8 (80 GiB): the
    uncapped LP is integral, peaks at 23.9 GiB and is proven in 19 s; the capped LP does not finish
    in 140 s. -> the answer, or None when the relaxed LP is fractional or its plan breaks the cap."""
    out = core(problem, o.until(time.perf_counter() + o.config.relax_share * o.left()),
               Request(weights=w, objective=objective, max_step_time_s=max_time, lp_only=True))
    if out is None or not fits(out[1].peak_memory_bytes, cap):
        return None
    plan, info = out
    red = dict(info.reduction)
    red["memory_cap_relaxed"] = True
    return plan, info.but(wall_s=time.perf_counter() - o.t0, reduction=red)


def solve_redundancy(problem, o: RunOptions, cap, max_time, seeds):
    """Redundancy objective: min redundant bytes, then min time at that optimum.

    Phase 1 is free: R* = Σ_i min_s redundant[i, s] (a sum over nodes); a plan reaches R* iff
    every node uses one of its least-redundancy strategies, so phase 2 is the time objective on
    those strategies alone (under the cap and T). Only when that restricted problem has no plan
    (the cap or T rules all out) does the full two-phase model run, seeded with the best
    feasible plan R_inc and with every strategy whose excess over its node's minimum is above
    R_inc - R* dropped (such a strategy alone makes a plan worse than the seed).
    """
    rd = problem.node_redundant
    rmin, _ = minmax(problem, rd)
    node_of = np.repeat(np.arange(problem.num_nodes), problem.num_strategies)
    at_min = rd <= rmin[node_of]
    p0 = least_measure_plan(problem, rd)
    rstar = evaluate(problem, p0).redundant_memory_bytes
    time_key = (lambda c: c.total)
    sub_seeds = [s for s in seeds + [p0] if at_min[problem.strategy_offsets[:-1] + np.asarray(s)].all()]
    out = core(problem, o, Request(cap=cap, max_step_time_s=max_time, allowed=at_min,
                                   start=best_seed(problem, sub_seeds, cap, max_time, time_key)))
    if out is not None:
        plan, info = out
        return plan, info.but(objective=info.redundant_memory_bytes, bound=rstar, gap=0.0,
                              objective_name="redundancy")
    # the least-redundancy strategies cannot meet the cap / T: the full model
    best = best_seed(problem, seeds, cap, max_time, lambda c: (c.redundant_memory_bytes, c.total))
    if best is None:
        best = min_time_plan_within(problem, o, cap, max_time, seeds)
    rinc = evaluate(problem, best).redundant_memory_bytes
    tol = 1e-9 * max(abs(rinc), 1.0)
    allowed = (rd - rmin[node_of]) <= (rinc - rstar) + tol
    out = core(problem, o, Request(weights=REDUNDANCY, objective="redundancy", lexi=True, cap=cap,
                                   max_step_time_s=max_time, start=best, allowed=allowed))
    if out is None:  # pragma: no cover - the seed is feasible
        explain_infeasible(problem, cap, max_time, o)
    return out
def min_peak_memory(problem: Problem, max_step_time_s=None, time_limit_s: float = 60) -> float:
    """The lowest peak per-device memory any plan reaches (ignoring the problem's usage_limit).
    Without a step-time bound this is the peak of the min-usage plan (no solve)."""
    free = problem.with_usage_limit(None)
    if max_step_time_s is None and problem.edge_memory is None:
        return min_usage(free)[1]
    plan, _ = solve_ilp(free, objective="memory", max_step_time_s=max_step_time_s, time_limit_s=time_limit_s)
    return evaluate(free, plan).peak_memory_bytes

