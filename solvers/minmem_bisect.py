"""Min peak memory under a step-time bound T by bisection on the memory cap (issue 13):
``min_peak_within(problem, T, seeds, deadline)``. The least time under a cap c falls as c rises,
so the least peak within T is the least c whose time-optimal plan under c meets T. Each step
runs the capped planner's search (``solvers.local.budgeted.capped_search``, a small budget) under
c from the best plan so far: a plan within T lowers UB to its own peak (often below c); none
raises LB to c (not a proof: the search is a heuristic). The bracket starts at [the copy-free
least peak ``node_min_peak``, the least peak of a seed within T]. The memory objective with
``max_step_time_s`` runs it as a first phase and seeds the MIP with its plan
(``solvers.dispatch.solve_exact``); the MIP keeps the bound. The bisection ends by its deadline
(the step's search budget is the time left; the step runs in a forked child killed at the deadline,
``_step``; a step starts only with ``shave_s`` + ``MIN_SEARCH_S`` left): past it by the fork and
kill only (tests: <= 0.5 s with a search that sleeps 20 s; before, 20 s).

Measured (results/s17e_minmem.json, cpu-2x4 tiny, T = 1.05 x Megatron's step, 60 s, load 4-6),
predicted MiB before -> after: gpt 1.264 -> 1.107 (180 s: 1.021), meshgraphnet 0.387 -> 0.381,
unet 2.631 -> 2.036, vit 0.946 -> 0.820, mlp 0.0239 -> 0.0227. gpt by XLA: 1.279 MiB (180 s:
1.215) against Megatron's 1.445. There the time bound does not bind: below ~1.06 MB the search
finds no plan that fits the cap at all.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import replace

from costmodel.problem import Problem, evaluate, fits
from solvers.ilp.bounds import best_seed, node_min_peak
from solvers.ilp.guard import start_child, stop_child
from solvers.ilp.peak_shaver import PeakShaver
from solvers.local.budgeted import CappedBudget, capped_search
from solvers.local.lns import WHOLE_MILP_MAX_NODES

#: the per-cap search: fewer Lagrangian rounds than the planner's default (each bisection step is one search)
#: (gpt tiny cpu-2x4 at load 4: 6 rounds + polish + 1 LNS 53-61 s a cap, 3 rounds and no LNS 35-41 s,
#: the same plans within 0.2 %: polish and LNS moved nothing). Session 27's additions to the
#: planner's budget (``repeat_stop``, the uncapped optimum and its union up to 5,000 nodes) are off here:
#: not measured on the bisection
BISECT_BUDGET = CappedBudget(rounds=3, round_nodes=50, union_nodes=20, polish_moves=8, neighbourhoods=0,
                             safety_s=60.0, step_safety_s=20.0, repeat_stop=None, free_max_nodes=WHOLE_MILP_MAX_NODES)
#: the first caps step down from the best plan's peak by this factor at most (low caps cost a
#: whole search to fail: gpt tiny at the bracket's midpoint 1.07 MB found nothing in 26 s). 0.9 until
#: session 22: on gpt tiny (1.05x Megatron, 60 s, load 5-7) its step at 0.9 x 1.49 MB failed in 13-18 s
#: and the step after it, which finds a 1.41-MB plan at 0.81 of the bound (the slack the peak LNS,
#: ``solvers.minmem_lns``, spends), was cut; at 0.95 the second step finds 1.48 MB at 0.79 of it
STEP_DOWN = 0.95
#: a step starts only when its shave (``shave_s``) and at least this much search time are left
#: before the deadline; the search gets the time left less ``STEP_MARGIN_S`` and its forked child
#: is killed at the deadline (``_step``)
MIN_SEARCH_S = 1.0
STEP_MARGIN_S = 0.5
#: share of ``solve_exact``'s time limit the bisection may take before the peak LNS
#: (``solvers.minmem_lns``) and the MIP (0.7 before the LNS)
BISECT_SHARE = 0.45


def min_peak_within(problem: Problem, max_time: float, seeds, deadline: float, budget: CappedBudget = BISECT_BUDGET,
                    rel_tol: float = 0.01, shave_s: float = 2.0):
    """(plan, info): the least-peak plan found with step time (``evaluate(...).total``) <= ``max_time``
    and peak within ``problem.usage_limit``, or (None, info) when no seed meets T (the bisection needs
    a feasible start). ``info``: the steps (cap, result, peak, time, seconds), lo, ub."""
    cap = problem.usage_limit
    best = best_seed(problem, seeds, cap, max_time, lambda c: (c.peak_memory_bytes, c.total))
    info = {"steps": []}
    if best is None:
        return None, info
    best = [int(v) for v in best]
    bc = evaluate(problem, best)
    ub, lo = bc.peak_memory_bytes, node_min_peak(problem)
    shaver = PeakShaver(problem)
    while ub - lo > rel_tol * ub:
        c = max(lo + 0.5 * (ub - lo), STEP_DOWN * ub)
        t0 = time.perf_counter()
        left = deadline - t0
        if left < shave_s + MIN_SEARCH_S:   # too little left for a step to end in a useful answer
            break
        b = replace(budget, safety_s=min(budget.safety_s, left - STEP_MARGIN_S),
                    step_safety_s=min(budget.step_safety_s, left - STEP_MARGIN_S))
        cp = problem.with_usage_limit(c if cap is None else min(c, cap))
        x, stopped = _step(problem, cp, best, c, max_time, shaver, b, min(deadline, t0 + shave_s), deadline)
        res = "stopped at the deadline" if stopped else "none"
        if x is not None:
            xc = evaluate(problem, x)
            res = f"{xc.peak_memory_bytes:.0f} B, {xc.total / max_time:.4f} T"
            if xc.total <= max_time and fits(xc.peak_memory_bytes, cap) and \
                    (xc.peak_memory_bytes, xc.total) < (bc.peak_memory_bytes, bc.total):
                best, bc, ub = [int(v) for v in x], xc, xc.peak_memory_bytes
                res = "within T: " + res
            else:
                lo = c
        elif not stopped:
            lo = c
        info["steps"].append((float(c), res, round(time.perf_counter() - t0, 2)))
        if stopped:
            break
    info.update(lo=float(lo), ub=float(ub))
    return best, info


def _step(problem: Problem, cp: Problem, best, c: float, max_time: float, shaver: PeakShaver, b: CappedBudget,
          shave_until: float, deadline: float):
    """One bisection step under cap ``c`` (``cp``: the problem capped there): (plan or None, stopped).
    The shaver's plan when it meets T, else the capped search's (budget ``b``). Run in a forked child
    (``solvers.ilp.guard.start_child``) killed at ``deadline``: the search's own limits are not enough
    (HiGHS overruns natively; the Lagrangian's last round and each phase's 0.5-s floor run past it: gpt
    125m cpu-2x4 steps of 16-18 s and 28-35 s overran a 30-s solve by 5-13 s, results/s21b_fidelity_real_gpt.json).
    Stopped: (None, True), and the step tells nothing about the cap. Inline without fork or inside a
    daemon child (whose parent's watchdog bounds it)."""
    def work():
        x = shaver.shave(best, c, shave_until)
        if x is None or evaluate(problem, x).total > max_time:
            # no shaved plan within T: the capped search for the least time under c (from the
            # shaved plan when it fits c, else from the best plan, repaired)
            x = capped_search(cp, best if x is None else x, b)
        return None if x is None else [int(v) for v in x]

    if not hasattr(os, "fork") or mp.current_process().daemon:
        return work(), False
    proc, recv = start_child(lambda send: send.send(("done", work())))
    try:
        got = recv.recv() if recv.poll(max(deadline - time.perf_counter(), 0.0)) else None
    except EOFError:           # the child died without an answer (killed, out of memory): nothing learnt
        got = None
    finally:
        stop_child(proc)
    return (None, True) if got is None else (got[1], False)


#: ``core_descent``: each step asks the capped core (``solvers.dispatch.solve_capped_time``) for the
#: least time under a cap at least this far below the best peak (as ``STEP_DOWN`` for the bisection)
CORE_STEP_DOWN = 0.96
#: a core step runs at most this long, and starts only with at least ``CORE_STEP_MIN_S`` left. gpt tiny
#: ("blocks" program, cpu-2x4, cap 0.86 MiB, 1.05x Megatron's step, load 3-5, session 24): the core's plan
#: is 1.057x Megatron at 60 s, 1.033x at 120 s, 1.040x at 200 s; the plan within T came from its union
#: MILP at 144 s of a 150-s run (the phases before it: the policy seed ~40 s, BP, the Lagrangian)
CORE_STEP_S = 150.0
CORE_STEP_MIN_S = 100.0
#: before each core step, ``polish(plan, until)`` (the peak LNS, ``solvers.minmem_lns.peak_lns``) runs this long:
#: a step from a plan the LNS has brought to the bound asks for a cap just below the frontier. From the
#: bisection's plan alone (gpt tiny "blocks", 1.209 MB at 0.82 T) the first 150-s step went to 1.159 MB only
CORE_POLISH_S = 60.0


def core_descent(problem: Problem, max_time: float, best, deadline: float, solve_step, lo: float | None = None,
                 step_s: float = CORE_STEP_S, min_step_s: float = CORE_STEP_MIN_S, polish=None,
                 polish_s: float = CORE_POLISH_S, progress=None):
    """(plan, info): ``best`` (a plan within ``max_time`` and ``problem.usage_limit``; ValueError if not)
    improved by the capped core. Each step caps the problem at ``c = max(lo + (ub - lo) / 2,
    CORE_STEP_DOWN x ub)`` (ub: the best plan's peak; lo: the highest cap a step failed at, first
    ``lo`` or the copy-free least peak) and calls ``solve_step(capped problem, seconds, seeds)`` (the
    least time under the cap, ``solvers.dispatch.solve_capped_time``; None when it found no plan): a
    plan within ``max_time`` lowers ub to its own peak, anything else raises lo to c. Steps get
    ``step_s`` each and start only with ``min_step_s`` left before ``deadline``; before each,
    ``polish(plan, until)`` (when given) may lower the best plan's peak within T (``CORE_POLISH_S``).
    ``info["plans"]``: every new best plan in order (the memory objective hands them to ``verify`` as
    candidates: XLA, not the model, decides among plans this close; ``shardgym.verifier``).

    Why beside the bisection (``min_peak_within``): the bisection's step is a small capped search
    (``BISECT_BUDGET``) that fits many steps into a short limit; the core's step is the whole capped
    solve (BP, the Lagrangian, the MILP on the union of its plans' strategies) and finds plans within
    T at caps where the small search finds none. gpt tiny "blocks" under 1.05x Megatron (load 3-5):
    the 60-s memory objective plus 600 s of peak LNS stopped at 0.892 MiB predicted (a local optimum:
    two more 120-s LNS rounds moved 0.4 %); one core step at 0.86 MiB found a plan within T at 0.859
    (0.824 MiB by XLA). No proof: a failed step is the core's heuristic answer, not infeasibility."""
    best = [int(v) for v in best]
    bc = evaluate(problem, best)
    cap = problem.usage_limit
    if not fits(bc.peak_memory_bytes, cap) or bc.total > max_time:
        raise ValueError("core_descent: the start plan must fit the memory cap and the step-time bound")
    ub = bc.peak_memory_bytes
    lo = node_min_peak(problem) if lo is None else float(lo)
    info = {"peak_before": float(ub), "steps": [], "plans": []}   # plans: each new best, in order
    say = progress or (lambda msg: None)
    while ub - lo > 0.005 * ub:
        if polish is not None and deadline - time.perf_counter() >= min_step_s + 1.0:
            x = polish(best, min(time.perf_counter() + polish_s, deadline - min_step_s))
            xc = evaluate(problem, x)
            if xc.total <= max_time and fits(xc.peak_memory_bytes, cap) and \
                    (xc.peak_memory_bytes, xc.total) < (bc.peak_memory_bytes, bc.total):
                best, bc, ub = [int(v) for v in x], xc, xc.peak_memory_bytes
                info["steps"].append(("polish", f"{ub:.0f} B, {xc.total / max_time:.4f} T", None))
                info["plans"].append(best)
                say(f"core descent: polished to {ub:.0f} B")
        t0 = time.perf_counter()
        left = deadline - t0
        if left < min_step_s:
            break
        c = max(lo + 0.5 * (ub - lo), CORE_STEP_DOWN * ub)
        cp = problem.with_usage_limit(c if cap is None else min(c, cap))
        x = solve_step(cp, min(step_s, left), [best])
        res = "none"
        if x is not None:
            xc = evaluate(problem, x)
            res = f"{xc.peak_memory_bytes:.0f} B, {xc.total / max_time:.4f} T"
            if xc.total <= max_time and fits(xc.peak_memory_bytes, cap) and xc.peak_memory_bytes < ub:
                best, bc, ub = [int(v) for v in x], xc, xc.peak_memory_bytes
                res = "within T: " + res
                info["plans"].append(best)
            else:
                lo = c
        else:
            lo = c
        info["steps"].append((float(c), res, round(time.perf_counter() - t0, 2)))
        say(f"core descent: cap {c:.0f} B -> {res} ({time.perf_counter() - t0:.1f}s)")
    info.update(lo=float(lo), ub=float(ub), peak_after=float(bc.peak_memory_bytes))
    return best, info
