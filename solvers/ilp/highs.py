"""HiGHS control: a quiet instance (``new_highs``), our options (``configure``), the LP
relaxation tried first (``try_lp``), and one solve with its time limit, start, objective gap and
yes/no cutoff callback, ending in (status, x, objective, dual bound) (``run_model``).

Solving is the LP relaxation first (``try_lp``): an integral vertex is a proven optimum (the case
on every traced model tried); a fractional one is rounded into the MIP's start. Optimality is up
to HiGHS's ``mip_rel_gap`` (default 1e-6) and its feasibility tolerance (1e-9, relative to the
scaled rows). The statuses: "optimal", "infeasible", "time_limit", "interrupted" (the cutoff
answered), "lp_not_integral" (``lp_only``), else HiGHS's own name of its model status.
"""
from __future__ import annotations

import os
import sys
import time

import highspy
import numpy as np

from solvers.ilp.types import RunOptions


def new_highs():
    """A Highs instance without the banner HiGHS 1.16 writes to the C-level stdout on construction
    (output_flag cannot be set before the constructor runs): fd 1 points at /dev/null meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return h


#: the thread count HiGHS's process-wide task scheduler was started with (None: not started here)
_scheduler_threads: list = [None]


def reset_scheduler() -> None:
    """Drop HiGHS's global task scheduler (non-blocking: the old one is abandoned, not joined; after a
    fork its workers do not exist, ``solvers.ilp.guard.start_child``) so the next run starts one with
    its own ``threads``. HiGHS keeps the first run's thread count for
    the process: a later run asking for another one did not run its MIP (a 6-node memory objective
    with copies, threads=1 after the capped core's threads=2 in the same process: status time_limit
    after 0.07 s of a 5 s limit, peak 38 against the optimum 31)."""
    try:
        highspy.Highs.resetGlobalScheduler(False)
    except AttributeError:   # an older highspy without it
        pass
    _scheduler_threads[0] = None


def set_threads(h, threads: int) -> None:
    """``h``'s thread count, resetting HiGHS's process-wide scheduler first when it was started here
    with another count (``reset_scheduler``): every model built outside ``configure`` (e.g.
    solvers/tied_milp.py) sets its threads through this, or its run fails after ours."""
    if _scheduler_threads[0] not in (None, int(threads)):
        reset_scheduler()
    _scheduler_threads[0] = int(threads)
    h.setOptionValue("threads", int(threads))


def configure(h, run: RunOptions) -> None:
    """Our HiGHS options for every model, then ``run.config.highs_options``."""
    h.setOptionValue("output_flag", bool(run.verbose))
    set_threads(h, run.threads)
    h.setOptionValue("mip_rel_gap", float(run.rel_gap))
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    # HiGHS 1.16's MIP restart (after the root fixes many columns) can hang past the time limit:
    # meshgraphnet tiny on h100-2x8 under half its peak span ran 17 minutes of a 60 s limit; with
    # restarts off it returns at 60 s
    h.setOptionValue("mip_allow_restart", False)
    for key, val in run.config.highs_options:
        h.setOptionValue(key, val)


def try_lp(model, time_limit_s: float):
    """Solve the LP relaxation (dual simplex). If it ends optimal with every strategy variable at
    0 or 1 (within 1e-7), that vertex is an optimal plan of the MIP and the LP value its proven
    bound: -> ("optimal", x, obj, obj). A fractional LP optimum -> ("fractional", x, obj, obj)
    (the caller may round it into a start for the MIP); no LP optimum in time -> None. The
    integrality is restored either way.

    Why: the linearised edge model is the local polytope of a pairwise problem, and on the zoo's
    traced graphs it is integral (gpt 125m and 1.3b on h100-2x8: no fractional strategy variable),
    so the LP alone proves the optimum. HiGHS's MIP solves the same root LP but then spends as
    long again in presolve, cuts and heuristics (gpt 125m: 10.8 s LP against 29 s MIP)."""
    h = model.highs
    nx = model.num_x
    idx = np.arange(nx, dtype=np.int32)
    h.changeColsIntegrality(nx, idx, np.full(nx, highspy.HighsVarType.kContinuous))
    h.setOptionValue("time_limit", float(max(time_limit_s, 0.05)))
    try:
        h.run()
        ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        if ok:
            x = np.asarray(h.getSolution().col_value)
            xs = x[:nx]
            obj = float(h.getInfo().objective_function_value)
            if float(np.max(np.minimum(np.abs(xs), np.abs(1.0 - xs)), initial=0.0)) <= 1e-7:
                return "optimal", x, obj, obj
            return "fractional", x, obj, obj
    finally:
        h.changeColsIntegrality(nx, idx, np.full(nx, highspy.HighsVarType.kInteger))
        h.clearSolver()
    return None


def run_model(model, cost: np.ndarray, time_limit_s: float, start: np.ndarray | None,
              abs_gap: float = 0.0, cutoff: float | None = None, lp_first: bool = True, rounder=None,
              lp_only: bool = False, lp_share: float = 0.5):
    """Set the objective (column costs), optionally a start, solve. -> (status, x, obj, bound).
    ``abs_gap``: HiGHS's mip_abs_gap in objective units (just under 1 unit for integer data,
    where a gap below 1 proves the optimum; 0 otherwise, leaving mip_rel_gap in charge).
    ``lp_first``: try the LP relaxation first (``try_lp``, up to ``lp_share`` of the time limit)
    and return its vertex when that is integral. ``rounder(x)``: a start vector made from a
    fractional LP solution (or None); it seeds the MIP when it is cheaper than ``start``.
    ``lp_only``: stop after the LP; -> ("lp_not_integral", None, nan, nan) unless it proved the optimum.
    The bound is the higher of HiGHS's MIP dual bound and a fractional LP optimum found first: the
    MIP solves its root LP again and, stopped at its limit before that ends, has none (-inf)."""
    t_run = time.perf_counter()
    lp_bound = -np.inf
    h = model.highs
    h.setOptionValue("mip_abs_gap", float(abs_gap))
    n = len(cost)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost.astype(np.float64))
    h.setOptionValue("time_limit", float(max(time_limit_s, 0.05)))
    h.clearCallbacks()
    if cutoff is not None:
        # a yes/no question: stop at the first plan with objective <= cutoff, or once the dual
        # bound proves there is none
        def stop(kind, message, out, inp, data):
            if out.mip_primal_bound <= cutoff or out.mip_dual_bound > cutoff * (1 + 1e-9) + 1e-12:
                inp.user_interrupt = True
        h.setCallback(stop, None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
    def end_callback():
        if cutoff is not None:
            h.stopCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
            h.clearCallbacks()

    if lp_first and model.num_x:
        done = try_lp(model, time_limit_s * (1.0 if lp_only else lp_share))
        if lp_only and (done is None or done[0] != "optimal"):
            end_callback()
            return "lp_not_integral", None, float("nan"), float("nan")
        if done is not None and done[0] == "fractional":
            lp_bound = done[3]      # the relaxation's optimum: a dual bound the MIP may not reach in time
            rounded = rounder(done[1]) if rounder is not None else None
            if rounded is not None and (start is None or float(cost @ rounded) < float(cost @ start)):
                start = rounded
            done = None
        if done is not None:
            end_callback()
            return done
        h.setOptionValue("time_limit", float(max(time_limit_s - (time.perf_counter() - t_run), 0.05)))
    # The min-M model with copy columns (``model.min_peak_with_copies``): HiGHS 1.16's
    # MIP presolve does not return from ``HPresolve::strengthenInequalities`` on its copy-memory
    # rows (long rows of edge-bounded z columns, coefficients from 3e-5 to 1): gpt tiny on cpu-2x4,
    # memory objective, a 30 s limit still in presolve after 150 s (py-spy's native stack), while
    # the same model with presolve off stops near its limit. The LP relaxation keeps its presolve.
    # Without presolve HiGHS checks its clock less often in the root LP and cuts (37.6 s of a 30 s
    # limit at load 3.5, past the watchdog's grace of 2 s + 5 %, which then loses the whole solve),
    # so that MIP gets 80 % of the time left; and its feasibility-jump heuristic (run before the
    # root LP), the other place py-spy found it past its limit under load, is off when it starts
    # from a plan. Only there: with presolve off, 3 of 1,200 tiny time-under-cap steps with a
    # cutoff (tests/test_edge_memory.py's brute-force check, 2 nodes) stayed undecided for their
    # whole limit, HiGHS answering "interrupted" with an objective below its own bound.
    mip_presolve_off = model.min_peak_with_copies
    if mip_presolve_off:
        h.setOptionValue("presolve", "off")
        h.setOptionValue("mip_heuristic_run_feasibility_jump", start is None)
        h.setOptionValue("time_limit", float(max(0.8 * (time_limit_s - (time.perf_counter() - t_run)), 0.05)))
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    try:
        h.run()
    finally:
        if mip_presolve_off:
            h.setOptionValue("presolve", "choose")
            h.setOptionValue("mip_heuristic_run_feasibility_jump", True)
    st = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == 2
    x = np.asarray(h.getSolution().col_value) if has else None
    name = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
        highspy.HighsModelStatus.kTimeLimit: "time_limit",
        highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible",
        highspy.HighsModelStatus.kInterrupt: "interrupted",
    }.get(st, h.modelStatusToString(st))
    end_callback()
    bound = float(info.mip_dual_bound)
    if name != "infeasible" and np.isfinite(lp_bound) and not bound >= lp_bound:   # also when NaN / -inf
        bound = float(lp_bound)
    return name, x, float(info.objective_function_value), bound

