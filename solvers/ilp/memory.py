"""The memory objective: min peak M, then *lexicographically* min time at that peak.

- Phase 1 without ``max_step_time_s`` needs no solver: usage is per node and the live profile a
  sum over nodes, so the plan giving every node its least usage minimises every time point at
  once; its peak M* is the optimum (``bounds.min_usage``). Phase 2 = time objective under the cap
  M*, seeded with that plan. SolveInfo.bound/gap refer to phase 1 (bound = M*, gap 0); status is
  "time_limit" when phase 2 (the time tie-break) is not proven in time. With copy groups that
  shortcut is void: the min-M model runs between the copy-free lower bound and the best seed,
  after the peak shaver's bisection (``min_peak_model``; ``PeakShaver`` prices the copies through
  ``solvers.local.repair_memory``).
- With a bound T: seeds (``initial_plans``; ``shardgym.solve`` passes the baseline plans of a
  traced problem) give UB = the lowest peak of a seed within T. A fast peak-shaving heuristic
  (``solvers.ilp.peak_shaver``) bisects the cap for better plans within T; then exact steps "min
  time under cap C" stop at the first plan within T (UB = its peak) or when HiGHS's dual bound
  proves none exists (LB = C); integral usages close at UB <= floor(LB) + 1, otherwise the min-M
  model between the bounds finishes. At the time limit: the best plan, status "time_limit", bound
  LB (>= M*), gap (UB - LB) / UB. Never above the best seed within T.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from costmodel.problem import evaluate, fits
from solvers.ilp.bounds import best_seed, min_usage, node_min_peak
from solvers.ilp.infeasible import explain_infeasible, min_time_plan_within, raise_cap
from solvers.ilp.peak_shaver import PeakShaver
from solvers.ilp.reduced import core
from solvers.ilp.types import MEMORY, InfeasibleError, Request, RunOptions, SolveInfo


def solve_memory(problem, o: RunOptions, cap, max_time, seeds):
    """Memory objective: min peak, then min time at that peak (lexicographic).

    Phase 1 without a step-time bound is exact and free: M* = the peak of the min-usage plan
    (``bounds.min_usage``). Phase 2 is a time objective under the cap M*, seeded with that plan.
    With a bound T: if the min-time plan among the peak-M* plans meets T, that is the answer.
    Otherwise a bisection on the peak M between LB (no plan with peak <= LB meets T) and UB (the
    lowest peak of a known plan within T): each step solves min time under the cap C, which
    either yields a plan within T (UB = its peak) or proves none exists (LB = C). Peaks of
    integral usages are integral, so UB <= floor(LB) + 1 proves UB optimal; otherwise the
    min-M model closes the rest with the tight bounds. At the time limit the best plan is
    returned with status "time_limit", bound LB and gap (UB - LB) / UB.
    """
    p0, mstar = min_usage(problem)
    copies = problem.edge_memory is not None
    if copies and o.config.copy_free_share > 0:
        # the same objective without the copies (the old, fast model) seeds the real one: gpt tiny,
        # cpu-2x4, under 1.05x Megatron's step time its plan peaks at 1.34 MB with its copies,
        # where the copy-aware search alone stayed at Megatron's 1.66 MB
        try:
            free_plan, _ = solve_memory(replace(problem, edge_memory=None),
                                        o.until(time.perf_counter() + o.config.copy_free_share * o.left()),
                                        cap, max_time, seeds)
            seeds = seeds + [free_plan]
            o.offer(free_plan)
        except (RuntimeError, InfeasibleError):
            pass   # no copy-free plan within T in that time: the seeds stand
    if copies:   # the min-usage plan's peak is then only an upper bound: M* needs the min-M model
        mstar = node_min_peak(problem)
    if cap is not None and mstar > cap:
        raise_cap(problem, cap, o, mstar)
    seeds = seeds + [p0]
    time_key = (lambda c: c.total)
    c0 = evaluate(problem, p0)
    if copies and max_time is None:
        return min_peak_model(problem, o, cap, seeds, mstar)
    if not copies and (max_time is None or c0.total <= max_time):
        polished = PeakShaver(problem).shave(p0, mstar, time.perf_counter() + 0.1 * o.left())
        start = best_seed(problem, seeds + ([polished] if polished else []), mstar, None, time_key)
        o.offer(start)
        out = core(problem, o, Request(cap=mstar, start=start))
        assert out is not None, "the min-usage plan fits its own peak"
        plan, info = out
        return plan, info.but(objective=info.peak_memory_bytes, bound=mstar, gap=0.0, objective_name="memory")
    # ---- with a step-time bound ----
    integral = bool(np.all(problem.node_usages == np.round(problem.node_usages)))
    best = best_seed(problem, seeds, cap, max_time, lambda c: (c.peak_memory_bytes, c.total))
    if best is None:   # no seed meets T: the min-time plan under the cap is the natural one
        best = min_time_plan_within(problem, o, cap, max_time, seeds, mstar)
    bc = evaluate(problem, best)
    ub, lb, lb_strict = bc.peak_memory_bytes, mstar, False
    lexi_done = False          # is ``best`` known to be the min-time plan under the cap ub?
    steps = []

    def closed():
        if ub <= lb:
            return True
        return lb_strict and integral and ub <= np.floor(lb) + 1

    # heuristic bisection for a low UB fast (seconds), from every seed and the min-usage plan
    shaver = PeakShaver(problem)
    h_until = time.perf_counter() + max(o.config.heuristic_share * o.left(), min(2.0, o.left()))
    h_lo = mstar
    starts = seeds   # the seeds (caller's plans first) and p0
    while time.perf_counter() < h_until and (ub - h_lo) > 1e-3 * ub:
        c = h_lo + 0.5 * (ub - h_lo)
        if copies:   # the lower bound is weak with copies: step down from the best plan instead
            c = max(c, 0.9 * ub)
        if integral:
            c = float(np.floor(c))
        if not h_lo < c < ub:
            break
        got = None
        for st in ([best] if copies else [best] + starts):
            r = shaver.shave(st, c, h_until)
            if r is None:
                continue
            rc = evaluate(problem, r)
            if rc.total <= max_time and fits(rc.peak_memory_bytes, cap) and \
                    (got is None or (rc.peak_memory_bytes, rc.total) < (got[1].peak_memory_bytes, got[1].total)):
                got = (r, rc)
        steps.append((float(c), "heuristic " + ("found" if got else "none"), None))
        if got is not None and (got[1].peak_memory_bytes, got[1].total) < (ub, bc.total):
            best, bc, ub = got[0], got[1], got[1].peak_memory_bytes
            lexi_done = False
            o.offer(best)
        else:
            h_lo = c       # not a proof: only steers the heuristic

    c_next = mstar
    while not closed() and o.left() > 0.5 and (ub - lb) > 1e-4 * ub:
        c = c_next
        budget = max(0.4 * o.left(), min(5.0, o.left()))
        tstep = time.perf_counter()
        try:
            out = core(problem, o.until(time.perf_counter() + budget),
                       Request(cap=c if cap is None else min(c, cap), start=p0, cutoff_step_time_s=max_time))
        except RuntimeError:
            out = "timeout"
        if out is None:   # only when the cap alone is infeasible: cannot happen for c >= M*
            lb, lb_strict, res = c, True, "infeasible"
        elif out == "timeout":
            res = "timeout"
        else:
            plan, info = out
            pc = evaluate(problem, plan)
            if pc.total <= max_time:
                res = "feasible"
                if (pc.peak_memory_bytes, pc.total) < (ub, bc.total):
                    best, bc, ub = plan, pc, pc.peak_memory_bytes
                    lexi_done = info.status == "optimal"
                    o.offer(best)
            elif info.status == "optimal" or info.bound > max_time:
                lb, lb_strict, res = c, True, "none within T"
            else:
                res = "undecided"
        steps.append((float(c), res, round(time.perf_counter() - tstep, 2)))
        if res in ("timeout", "undecided"):
            c_next = c + 0.5 * (ub - c)     # an easier cap next
        else:
            c_next = lb + 0.5 * (ub - lb)
        if integral:
            c_next = float(np.floor(c_next))
            if lb_strict and c_next <= lb:
                c_next = float(np.floor(lb) + 1)
        if c_next >= ub:
            break
    status = "optimal" if closed() else "time_limit"
    if status != "optimal" and o.left() > 1.0 and (ub - lb) <= 0.02 * ub:
        # close the last bit with the min-peak model between the proven bounds
        out = core(problem, o, Request(weights=MEMORY, objective="memory", lexi=True,
                                       cap=ub if cap is None else min(ub, cap), need_m=True,
                                       max_step_time_s=max_time, start=best, m_lo=lb))
        if out is not None:
            plan, info = out
            pc = evaluate(problem, plan)
            if pc.total <= max_time and (pc.peak_memory_bytes, pc.total) <= (ub, bc.total):
                best, bc, ub = plan, pc, pc.peak_memory_bytes
                lexi_done = info.status == "optimal"
            if info.status == "optimal":
                status, lb = "optimal", ub
            elif np.isfinite(info.bound):
                lb = max(lb, info.bound)
    if not lexi_done and o.left() > 0.5:
        out = core(problem, o, Request(cap=ub, start=best))
        if out is not None:
            plan, info = out
            pc = evaluate(problem, plan)
            if pc.peak_memory_bytes <= ub and pc.total <= bc.total:
                best, bc = plan, pc
            lexi_done = info.status == "optimal"
    if not lexi_done:
        status = "time_limit"
    gap = 0.0 if status == "optimal" else (ub - lb) / max(ub, 1e-300)
    red_stats = {"bisection": steps, "min_usage_peak": mstar}
    return best, SolveInfo(
        status=status, objective=bc.peak_memory_bytes, bound=float(lb if status != "optimal" else ub),
        gap=float(gap), wall_s=time.perf_counter() - o.t0, num_vars=0, num_rows=0,
        reduced_nodes=0, objective_name="memory", step_time_s=bc.total,
        peak_memory_bytes=bc.peak_memory_bytes, redundant_memory_bytes=bc.redundant_memory_bytes,
        reduction=red_stats)



def min_peak_model(problem, o: RunOptions, cap, seeds, m_lo):
    """Min peak, then min time at it, for a problem with copy groups (``edge_memory``): the min-M
    model between ``m_lo`` (a proven lower bound) and the best seed's peak, seeded with it. When
    no seed fits ``cap`` (the least-usage plan's copies can break it), the model runs under ``cap``
    from no start; InfeasibleError when it has no plan. At the time limit the bound is the higher of
    HiGHS's dual bound and ``m_lo``; the gap is (peak - bound) / peak."""
    best = best_seed(problem, seeds, cap, None, lambda c: (c.peak_memory_bytes, c.total))
    ub = cap if best is None else evaluate(problem, best).peak_memory_bytes
    # heuristic bisection on the cap for a lower start (the exact model is big with copies)
    shaver, c_lo = PeakShaver(problem), m_lo
    h_until = time.perf_counter() + o.config.heuristic_share * o.left()
    while best is not None and time.perf_counter() < h_until and ub - c_lo > 1e-3 * ub:
        c = c_lo + 0.5 * (ub - c_lo)
        r = shaver.shave(best, c, h_until)
        rp = None if r is None else evaluate(problem, r).peak_memory_bytes
        if rp is not None and rp < ub:
            best, ub = r, rp
        else:
            c_lo = c
    o.offer(best)
    out = core(problem, o, Request(weights=MEMORY, objective="memory", lexi=True,
                                   cap=ub if cap is None else min(ub, cap), need_m=True, start=best, m_lo=m_lo))
    if out is None and best is None:
        explain_infeasible(problem, cap, None, o)
    if out is None:  # pragma: no cover - the seed fits its own peak
        raise AssertionError("the best seed fits its own peak")
    plan, info = out
    red = dict(info.reduction)
    red["min_usage_peak"] = m_lo
    pc = evaluate(problem, plan)
    if best is not None and info.status != "optimal" and \
            (pc.peak_memory_bytes, pc.total) > (ub, evaluate(problem, best).total):
        plan = list(best)   # HiGHS's incumbent at the time limit is worse than its start
        pc = evaluate(problem, plan)
    bound, gap = info.bound, info.gap
    if info.status != "optimal":   # at the time limit: HiGHS's dual bound (-inf or NaN before its root
        # LP ends: gpt tiny cpu-2x4 at 15 s) or the copy-free least peak ``m_lo``, whichever is higher
        bound = max(float(bound) if np.isfinite(bound) else -np.inf, float(m_lo))
        gap = max(pc.peak_memory_bytes - bound, 0.0) / max(pc.peak_memory_bytes, 1e-300)
    return plan, info.but(objective_name="memory", reduction=red, objective=pc.peak_memory_bytes,
                          step_time_s=pc.total, peak_memory_bytes=pc.peak_memory_bytes,
                          redundant_memory_bytes=pc.redundant_memory_bytes, bound=float(bound), gap=float(gap))

