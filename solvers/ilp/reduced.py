"""The reduced-problem driver: one exact solve of a ``Request``. ``core`` tightens the memory part
exactly (``bounds.tighten``), reduces the problem (``solvers.reduce``), and calls
``solve_reduced`` once with forbidden entries left out and, if that model is infeasible, once
with them allowed. ``solve_reduced`` builds the model (``model.build_model``), sets the scaled
objective and the absolute gap that proves integral optima, starts HiGHS from the caller's plan
(``highs.run_model``), runs the lexicographic phase 2 (the first measure fixed, then time), expands
the plan back to the original problem and reports it as a ``SolveInfo`` in original units.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from costmodel.problem import FORBIDDEN_COST, evaluate
from solvers.ilp.bounds import tighten
from solvers.ilp.highs import run_model
from solvers.ilp.model import build_model, decode, start_vector
from solvers.ilp.types import Request, RunOptions, SolveInfo
from solvers.reduce import Reduction, identity_reduction, reduce_problem


def core(problem, o: RunOptions, req: Request):
    """One exact HiGHS solve (the model of ``solvers.ilp.model``) after the exact tightenings and
    reductions. Returns (plan, SolveInfo), or None when the model is infeasible. ``req.allowed``: a
    strategy mask the caller proved safe; ``req.m_lo``: a proven lower bound on the peak M."""
    cap, need_m, allowed = req.cap, req.need_m, req.allowed
    memory_matters = cap is not None or need_m
    red_matters = req.weights.redundancy > 0
    free, row_times = None, None
    if memory_matters:
        allowed, free, row_times = tighten(problem, allowed, cap, req.m_lo if need_m else cap)
    attempts = [True, False] if o.forbid and not req.lp_only else [o.forbid]
    for use_forbid in attempts:
        if o.reduce:
            classes = (problem.edge_memory.strategy_classes(problem.num_strategies)
                       if memory_matters and problem.edge_memory is not None else None)
            red = reduce_problem(problem, memory_matters=memory_matters, redundancy_matters=red_matters,
                                 forbidden=FORBIDDEN_COST if use_forbid else None,
                                 allowed=allowed, memory_free=free, copy_classes=classes)
        else:
            red = identity_reduction(problem)
        out = solve_reduced(problem, red, replace(req, forbid=use_forbid, row_times=row_times,
                                                  col_mask=None if o.reduce else allowed), o)
        if out is not None:
            return out
    return None


def solve_reduced(problem, red: Reduction, req: Request, run: RunOptions):
    """Solve ``req`` on ``red.problem`` (``req.forbid``, ``row_times`` and ``col_mask`` set by
    ``core``): (plan of ``problem``, SolveInfo), or None when the model is infeasible (or, with
    ``lp_only``, its LP is not integral). RuntimeError when HiGHS has no plan in time and the
    request has no start."""
    p = red.problem
    w, lexi, need_m, max_time = req.weights, req.lexi, req.need_m, req.max_step_time_s
    use_forbid, initial_plan, objective = req.forbid, req.start, req.objective
    model = build_model(p, req, run)
    mem_scale = model.mem_scale
    num_cols = len(model.time_cols)
    ts = model.time_scale
    primary = np.zeros(num_cols)
    if w.time:
        primary += w.time * model.time_cols / ts
    if w.redundancy:
        nzr = np.abs(model.red_cols[model.red_cols != 0])
        rs = float(np.median(nzr)) if nzr.size else 1.0
        primary += w.redundancy * model.red_cols / rs
    else:
        rs = 1.0
    if need_m:
        primary[model.m_col] += w.memory
    start = None
    if initial_plan is not None:
        c = red.contract(list(initial_plan))
        if c is not None:
            start = start_vector(p, c, model, use_forbid)
    def integral(a):
        a = a[np.abs(a) < FORBIDDEN_COST]
        return bool(np.all(a == np.round(a)))
    tgap = 0.999 / ts if integral(p.node_costs) and integral(p.edge_costs) else 0.0
    if lexi and need_m:
        agap = 0.999 / mem_scale if integral(p.node_usages) else 0.0
    elif lexi:
        agap = 0.999 / rs if integral(p.node_redundant) else 0.0
    elif w.time and not need_m and not w.redundancy:
        agap = tgap / w.time
    else:
        agap = 0.0
    # only with the time objective
    cutoff = None if req.cutoff_step_time_s is None else req.cutoff_step_time_s / ts
    def rounder(xf):
        """The LP solution rounded (each node its largest x), as a start if it meets every bound."""
        plan = decode(p, xf)
        c = evaluate(p, plan)
        if not c.feasible or (max_time is not None and c.total > max_time):
            return None
        return start_vector(p, plan, model, use_forbid)

    # the min-M model with copy columns: its LP relaxation is not integral (the z columns), and
    # trying it first spent the MIP's time on it: gpt tiny cpu-2x4, memory objective at 60 s,
    # the LP stopped unsolved at 23.5 s and the MIP after it improved nothing (peak 1,280,528 B,
    # bound 714,000 = the copy-free floor, gap 44 %); straight to the MIP, which solves its own root
    # LP: 1,001,648 B, HiGHS's bound 819,577 B, gap 18 % (load 6.5)
    lp_first = not model.min_peak_with_copies
    status, x, obj, bound = run_model(model, primary, run.deadline - time.perf_counter(), start, agap, cutoff,
                                      lp_first=lp_first, rounder=rounder, lp_only=req.lp_only,
                                      lp_share=run.config.lp_share)
    if x is None:
        if status in ("infeasible", "lp_not_integral"):
            return None
        # HiGHS has no incumbent of its own yet (big models spend the limit in presolve / the root
        # LP): the seed it was started from is the answer, reported with no bound, if it meets the
        # cap and the step-time bound (a seed priced without copies may break the cap with them)
        plan = None if initial_plan is None else [int(v) for v in initial_plan]
        cost = None if plan is None else evaluate(problem, plan)
        if cost is None or (req.cap is not None and cost.peak_memory_bytes > req.cap * (1 + 1e-9)) or \
                (max_time is not None and cost.total > max_time * (1 + 1e-9)):
            raise RuntimeError(f"HiGHS found no feasible plan for {problem.name!r} within the time limit "
                               f"(status {status}); raise time_limit_s")
        objval = objective_value(cost, objective, lexi, w)
        return plan, _info("time_limit", objval, float("nan"), float("nan"), cost, req, run, model, red)
    first_status = status
    if lexi:
        # fix the primary objective at its optimum, then minimise time
        h = model.highs
        val = float(primary @ x)
        slack = 1e-9 * max(abs(val), 1.0) + 1e-12
        if need_m:
            h.changeColBounds(model.m_col, float(h.getLp().col_lower_[model.m_col]), val + slack)
        if model.red_row is not None:
            h.changeRowBounds(model.red_row, -np.inf, val * rs + slack * rs)
        remaining = run.deadline - time.perf_counter()
        if remaining > 0.05:
            st2, x2, _, _ = run_model(model, model.time_cols / ts, remaining, x, tgap, lp_share=run.config.lp_share)
            if x2 is not None:
                x = x2
                if st2 != "optimal":
                    first_status = "time_limit" if first_status == "optimal" else first_status
    plan = red.expand(decode(p, x))
    cost = evaluate(problem, plan)
    objval = objective_value(cost, objective, lexi, w)
    # bound back to original units
    if lexi and objective == "memory":
        bnd = bound * mem_scale
    elif lexi and objective == "redundancy":
        bnd = bound * rs
    elif w.time and not w.memory and not w.redundancy:
        bnd = bound * ts / w.time
    else:
        bnd = float("nan")  # mixed objective: HiGHS's bound is in normalised units
    if status == "optimal" and agap > 0 and np.isfinite(bnd) and bnd < objval:
        bnd = float(objval)   # integral objective: a gap below one unit proves the optimum
    gap = abs(objval - bnd) / max(abs(objval), 1e-300) if np.isfinite(bnd) else float("nan")
    if first_status == "optimal":
        gap = min(gap, 0.0) if np.isfinite(gap) and gap < 1e-6 else gap
    return plan, _info(first_status, objval, bnd, gap, cost, req, run, model, red)


def _info(status, objval, bnd, gap, cost, req: Request, run: RunOptions, model, red: Reduction) -> SolveInfo:
    """The SolveInfo of a plan of cost ``cost`` (original problem) found on ``model``."""
    return SolveInfo(
        status=status, objective=float(objval), bound=float(bnd), gap=float(gap),
        wall_s=time.perf_counter() - run.t0, num_vars=len(model.time_cols), num_rows=model.num_rows,
        reduced_nodes=int((red.problem.num_strategies > 1).sum()), objective_name=req.objective,
        step_time_s=cost.total, peak_memory_bytes=cost.peak_memory_bytes,
        redundant_memory_bytes=cost.redundant_memory_bytes, reduction=dict(red.stats))


def objective_value(cost, objective, lexi, w) -> float:
    """The reported objective of a plan's Cost: the peak or the redundant bytes for the
    lexicographic objectives, else the weighted sum."""
    if objective == "memory" and lexi:
        return cost.peak_memory_bytes
    if objective == "redundancy" and lexi:
        return cost.redundant_memory_bytes
    return w.key(cost)

