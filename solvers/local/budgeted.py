"""``capped_search(problem, plan, budget)``: the factor-graph planner's search under a usage limit,
budgeted in work units (``CappedBudget``: Lagrangian rounds, HiGHS node limits, BP rounds, forest
moves, LNS neighbourhoods), so its plan does not depend on the machine's load; wall-clock limits
are safety caps only. It calls one home per piece: ``solvers.lagrange`` (``lagrangian_bound``,
``bp_relaxed``, ``union_plan``), ``solvers.local.lns`` (``refine``), ``polish`` and ``repair_memory``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.ilp import IlpConfig, solve_ilp
from solvers.lagrange import bp_relaxed, lagrangian_bound, union_plan
from solvers.local.costs import LocalCosts
from solvers.local.lns import SUB_NODES, WHOLE_MILP_MAX_NODES, refine
from solvers.local.polish import polish
from solvers.local.repair import repair_memory


@dataclass(frozen=True)
class CappedBudget:
    """The work ``capped_search`` may do, in deterministic units (rounds, nodes, neighbourhoods,
    moves); ``safety_s`` is a wall-clock cap on the whole search and ``step_safety_s`` on each
    MILP, set far above what they take (they stop nothing on a normally loaded machine; a search
    they do stop depends on the load, as before)."""
    rounds: int = 16              # Lagrangian rounds (relaxed problems solved)
    round_nodes: int = 200        # ... each HiGHS round's branch-and-bound nodes (``mip_max_nodes``)
    highs_max_nodes: int = 400    # HiGHS rounds up to this many graph nodes, ``bp_relaxed`` rounds above
    bp_rounds: int = 30           # ``bp_relaxed``: BP's rounds per relaxed problem
    union_plans: int = 6          # relaxed plans nearest the cap (either side) that join the union MILP
    union_nodes: int = 50         # the union MILP's node limit
    polish_moves: int = 64        # polish's forest moves (``polish``'s ``tree_moves``)
    neighbourhoods: int = 2       # refine's LNS neighbourhoods
    sub_nodes: int = SUB_NODES    # ... each neighbourhood MILP's node limit
    repeat_stop: int | None = 1   # ``bp_relaxed`` rounds stop after this many in a row repeat a plan, L not raised
    free_max_nodes: int = 5000    # the uncapped optimum (step 1) up to this many graph nodes (``milp_ok``'s)
    lagrange_max_nodes: int = WHOLE_MILP_MAX_NODES   # with the uncapped optimum, rounds only up to this size;
    #                               above it the union of the uncapped optimum and the start instead (step 2b)
    free_union_nodes: int = 0     # ... that union MILP's node limit (0: HiGHS's root alone)
    safety_s: float = 300.0
    step_safety_s: float = 60.0


CAPPED_BUDGET = CappedBudget()
#: of the time left (``safety_s``) the Lagrangian rounds may take; at the default 300 s their 16 rounds stop first
LAGRANGE_SHARE = 0.6


def _record(problem: Problem, info: dict, t0: float, x, phase: str) -> float:
    """``phase``'s plan ``x`` into ``info`` (its cost, None if it does not fit; ``"t_" + phase``: when the phase
    ended, s from ``t0``); returns its cost if it fits, else inf (and inf for no plan)."""
    if x is None:
        return np.inf
    c = evaluate(problem, np.asarray(x, dtype=np.int64))
    info[phase] = c.total if c.feasible else None
    info["t_" + phase] = round(time.perf_counter() - t0, 2)
    return c.total if c.feasible else np.inf


def capped_search(problem: Problem, plan, budget: CappedBudget = CAPPED_BUDGET, seed: int = 0,
                  lc: LocalCosts | None = None, return_info: bool = False):
    """The planners' search under a usage limit, budgeted in work units (``CappedBudget``), so that
    its plan does not depend on the machine's load (the wall-clock limits are safety caps only).
    Never worse than ``plan`` when ``plan`` fits; None when ``plan`` does not fit and nothing is
    found that does.

    1. The uncapped optimum (HiGHS, node-limited; up to ``free_max_nodes`` graph nodes): when it
       fits the cap it is the capped optimum, returned at once (the cap does not bind).
    2. ``budget.rounds`` Lagrangian rounds (``solvers.lagrange.lagrangian_bound`` from the uncapped
       optimum, ``plan`` the reference and Polyak target): relaxed MILPs (``round_nodes``) up to
       ``highs_max_nodes`` graph nodes, ``bp_relaxed`` above (one relaxed MILP of meshgraphnet tiny,
       819 nodes, took 10.7 s at load 2.4; fno tiny's, 323 nodes, 0.3-0.7 s). Each relaxed plan is
       repaired to fit (``repair_memory``); the cheapest fitting one is the best start. ``bp_relaxed``
       rounds stop early after ``repeat_stop`` rounds in a row repeat a plan without raising L (random
       2,000 nodes at cap 0.3: 11 rounds, the same plan, 2-3 s less at load 3-4); HiGHS rounds do not:
       on outside:rnn (211 nodes, cpu-2x4) they repeat plans at rounds 2-3 before L rises, and stopping
       there returned the decode, 1.136x the ILP, against 1.000x after 16 (session 27).
    3. The union MILP (``solvers.lagrange.union_plan``, ``union_nodes``) over ``plan``, the best start
       and the ``union_plans`` relaxed plans whose peaks are nearest the cap (the rounds jump between
       a cheap plan over the cap and a dearer one under it; the union picks per node), seeded with the
       cheaper start, so never worse than it.
    2b. Instead of 2-3, above ``lagrange_max_nodes`` graph nodes with the uncapped optimum in hand: the
       union MILP over it and the start (``free_union_nodes``: the root alone). Why (session 27,
       meshgraphnet large @ h100-2x8 cap 0.3, 4,095 nodes, load 3): there each ``bp_relaxed`` round
       costs ~1.3 s and without the uncapped optimum the rounds stopped after one (BP's uncapped
       plan fits) and moved nothing (the union, polish and refine gave 0.0134041 from 0.0134044 in
       9.4 s); the uncapped optimum (4.6 s) and the union of it and the start (5.0 s at 0 nodes,
       17 s at 50, the same plan) give 0.0133134, 0.5 % under a 60-s ``solve(method="ilp")``. Step 4
       is skipped there: after that union, polish and the 2 LNS neighbourhoods moved nothing (2.1 s at
       load 3.7; 10 s of ``refine`` gave 0.0133119, 0.01 %). Where that union is no cheaper than the start,
       steps 2-4 follow (the uncapped optimum their first round): on vit base @ h100-2x8 at 0.79 GB it kept
       the decode's 0.017744, where the rounds reach 0.0157 in a 60-s ``solve(method="policy")``.
    4. ``polish`` (``polish_moves`` forest moves) and ``refine`` (``neighbourhoods`` LNS MILPs).
    Where the start (``plan``, repaired) meets a lower bound (the uncapped optimum's after step 1, the
    Lagrangian's after step 2) it is optimal and returned at once, phase "at the bound" (session 28: the
    decode of outside:mixer cpu-2x4 capped costs the uncapped optimum; polish and refine took 4.0 s on it).

    Measured through ``solve(method="policy")`` on the held-out split (session 16, load 2.0-2.2,
    against results/heldout_reference.json refreshed that night): binding caps median 1.000x, max
    1.142x (meshgraphnet tiny cap 0.5 @ h100-2x8 1.142, @ a100-hetero-2x4 1.062, @ tpu-4x4 1.055;
    every fno problem 1.000), 9-16 s; the previous wall-clock path, same load: median 1.179x, max
    1.451x, 10-15 s. The same costs came out at load 3-6, and beside two busy loops (load 5-6,
    meshgraphnet @ a100 61.8 s against 15.6 s, fno tiny @ a100 53.3 s against 17 s). What does the
    work there: the union MILP (meshgraphnet: repaired Lagrangian start 1.21-1.50x -> union
    1.06-1.14x); polish and the 2 LNS neighbourhoods moved nothing on these problems. Starved much
    harder (nice 10 beside two nice-0 loops, about 10x slower) the 120-s safety cap then in force
    stopped the rounds (fno tiny @ a100: 3 rounds in 155 s, 1.179x) and the plan changed; the caps
    are now 300 s / 60 s a MILP, so the plan is load-independent only while a run stays under them
    (about 10x the 15-30 s it takes at load 2-5).
    ``return_info`` adds a dict (phase costs, rounds, the Lagrangian bound)."""
    t0 = time.perf_counter()
    b = budget
    deadline = t0 + float(b.safety_s)
    lc = lc or LocalCosts(problem)
    info = {"rounds": 0, "bound": -float("inf")}

    def left(cap: float) -> float:
        return max(min(cap, deadline - time.perf_counter()), 0.5)

    def over() -> bool:       # past ``safety_s`` (a caller's time limit): the phases left are skipped
        if time.perf_counter() < deadline:
            return False
        info["stopped"] = "time limit"
        return True

    def done(x, phase):
        x = [int(v) for v in x]
        info["phase"], info["wall_s"] = phase, time.perf_counter() - t0
        return (x, info) if return_info else x

    s = np.asarray(plan, dtype=np.int64)
    if not lc.feasible(s):
        r = repair_memory(problem, s, lc=lc, time_limit_s=left(b.step_safety_s))
        s = None if r is None else np.asarray(r, dtype=np.int64)
    cost = (lambda x: evaluate(problem, x).total)
    best, best_cost = (None, np.inf) if s is None else (s, cost(s))
    info["start"] = best_cost

    def consider(x, phase):
        nonlocal best, best_cost
        c = _record(problem, info, t0, x, phase)
        if c < best_cost * (1 - 1e-12):
            best, best_cost = np.asarray(x, dtype=np.int64), c

    first = None
    if problem.num_nodes <= b.free_max_nodes and not over():
        try:
            free, fi = solve_ilp(problem.with_usage_limit(None), time_limit_s=left(b.step_safety_s),
                                 initial_plan=None if s is None else [int(v) for v in s], config=IlpConfig.node_limited(b.round_nodes))
            if fi.status == "optimal":
                first = (float(fi.bound), free)
                if lc.feasible(np.asarray(free)):
                    info["bound"] = float(fi.bound)
                    return done(free, "uncapped optimum")
        except (RuntimeError, ValueError):
            pass
    if first is not None and best is not None and best_cost - first[0] <= 1e-9 * abs(best_cost):
        info["bound"] = first[0]     # the start meets the uncapped optimum's bound: optimal (mixer capped: 4.0 s -> 0)
        return done(best, "at the bound")
    if best is not None and over():      # a fitting plan and no time left: no rounds
        return done(best, "search")
    if first is not None and best is not None and problem.num_nodes > b.lagrange_max_nodes:   # step 2b
        info["bound"], before = first[0], best_cost
        consider(union_plan(problem, [first[1], [int(v) for v in best]], left(b.step_safety_s),
                            start=[int(v) for v in best], max_nodes=b.free_union_nodes), "free union")
        if best_cost < before:      # no step 4 here: it moved nothing (the docstring); no gain: the rounds (2)
            return done(best, "free union")
    ref = None if best is None else [int(v) for v in best]
    solver = None if problem.num_nodes <= b.highs_max_nodes else bp_relaxed(b.bp_rounds, b.polish_moves)
    # the rounds leave a share of the time for their plans' repairs and the union (a caller's limit: the core's
    # planner_search on vit base h100-2x8 0.79 GB spent all 23 s of its limit in 8 rounds and had no start)
    res = lagrangian_bound(problem, max(LAGRANGE_SHARE * (deadline - time.perf_counter()), 1.0), upper=lambda: best_cost if np.isfinite(best_cost) else np.inf,
                           ref=ref, round_s=b.step_safety_s, first=first, max_rounds=b.rounds,
                           round_nodes=b.round_nodes, relaxed_solver=solver,
                           repeat_stop=None if solver is None else b.repeat_stop)
    info["rounds"], info["bound"] = res.rounds, float(res.bound)
    if best is not None and best_cost - res.bound <= 1e-9 * abs(best_cost):   # the Lagrangian bound proves the start
        return done(best, "at the bound")
    if best is None and not res.plans:   # nothing fits: neither ``plan`` (repaired) nor any relaxed plan
        info["phase"], info["wall_s"] = "none", time.perf_counter() - t0
        return (None, info) if return_info else None
    out = rounds_tail(problem, res.plans, None if best is None else [int(v) for v in best], b, seed=seed, lc=lc,
                      deadline=deadline, extra=None if s is None else [int(v) for v in s], info=info, t0=t0)
    if out is None:
        info["phase"], info["wall_s"] = "none", time.perf_counter() - t0
        return (None, info) if return_info else None
    return done(out, "search")


def rounds_tail(problem: Problem, plans, start, budget: CappedBudget = CAPPED_BUDGET, seed: int = 0,
                lc: LocalCosts | None = None, deadline: float | None = None, extra=None, info: dict | None = None,
                t0: float | None = None):
    """``capped_search``'s steps after its Lagrangian rounds, from the relaxed ``plans`` and ``start`` (a plan that
    fits, or None): each relaxed plan repaired (``repair_memory``; the cheapest a start), the union MILP over the
    ``budget.union_plans`` plans whose peaks are nearest the cap, the best start (and ``extra``), then ``polish``
    and ``refine`` (``budget.neighbourhoods``). The best plan that fits (never worse than ``start``), or None.
    ``deadline``: a wall-clock cap on each step (the safety cap; the capped core passes its own deadline).
    ``info``: each phase's cost and end time (s from ``t0``) recorded as ``capped_search``'s info."""
    b, lc = budget, lc or LocalCosts(problem)
    t0 = time.perf_counter() if t0 is None else t0
    deadline = time.perf_counter() + float(b.safety_s) if deadline is None else deadline
    info = {} if info is None else info
    cost = (lambda x: evaluate(problem, x).total)
    best, best_cost = (None, np.inf) if start is None else (np.asarray(start, dtype=np.int64), cost(start))

    def left(cap: float) -> float:
        return max(min(cap, deadline - time.perf_counter()), 0.5)

    def over() -> bool:       # past the deadline (a caller's time limit): the steps left are skipped
        if time.perf_counter() < deadline:
            return False
        info["stopped"] = "time limit"
        return True

    def consider(x, phase):
        nonlocal best, best_cost
        c = _record(problem, info, t0, x, phase)
        if c < best_cost * (1 - 1e-12):
            best, best_cost = np.asarray(x, dtype=np.int64), c

    starts = []
    for x in plans:
        y = np.asarray(x, dtype=np.int64)
        if not lc.feasible(y):
            if over():
                continue
            y = repair_memory(problem, y, lc=lc, time_limit_s=left(b.step_safety_s))
        if y is not None:
            starts.append((cost(y), np.asarray(y, dtype=np.int64)))
    if starts:
        consider(min(starts, key=lambda t: t[0])[1], "lagrange start")
    seed_plan = best
    if best is None:   # nothing fits
        return None
    if plans and not over():
        free_p = problem.with_usage_limit(None)
        uniq = list({tuple(x): None for x in plans})     # the rounds repeat plans (first seen first)
        peaks = np.array([evaluate(free_p, list(x)).peak_memory_bytes for x in uniq])
        near = np.argsort(np.abs(np.log(np.maximum(peaks, 1.0) / float(problem.usage_limit))), kind="stable")[:b.union_plans]
        pool = [list(uniq[i]) for i in sorted(near.tolist())] + [[int(v) for v in seed_plan]]
        info["union_pool"] = len(pool)
        if extra is not None:
            pool.append([int(v) for v in extra])
        consider(union_plan(problem, pool, left(b.step_safety_s), start=[int(v) for v in best], max_nodes=b.union_nodes),
                 "union")
    if over():
        return [int(v) for v in best]
    consider(polish(problem, best, time_limit_s=left(b.step_safety_s), lc=lc, seed=seed, tree_moves=b.polish_moves),
             "polish")
    if b.neighbourhoods > 0 and not over():
        consider(refine(problem, best, left(b.step_safety_s * 4), seed=seed, max_neighbourhoods=b.neighbourhoods,
                        sub_nodes=b.sub_nodes), "refine")
    return [int(v) for v in best]
