"""What the ILP says when no plan meets the constraints: ``explain_infeasible`` finds out whether
the memory cap or the step-time bound fails and raises the ``InfeasibleError`` that names it, with
the lowest peak any plan reaches (``raise_cap``) or the fastest step time under the cap
(``raise_time``); ``min_time_plan_within`` is the two-phase objectives' fallback start when no
seed meets the step-time bound, and raises the same errors.
"""
from __future__ import annotations

import time
from dataclasses import replace

from costmodel.problem import evaluate, fits
from solvers.ilp.bounds import best_seed, min_usage, node_min_peak
from solvers.ilp.reduced import core
from solvers.ilp.types import InfeasibleError, Request, RunOptions


def _asked(problem, o: RunOptions) -> str:
    """Where the cap comes from, for the message."""
    asked = []
    if o.memory_cap_bytes is not None:
        asked.append(f"memory_cap_bytes={o.memory_cap_bytes:.6g}")
    if problem.usage_limit is not None:
        asked.append(f"the problem's usage_limit={problem.usage_limit:.6g}")
    return " and ".join(asked)


def raise_cap(problem, cap, o: RunOptions, peak):
    raise InfeasibleError(
        f"no plan fits the memory cap of {cap:.6g} bytes ({_asked(problem, o)}): the lowest peak "
        f"memory any plan reaches is {peak:.6g} bytes; raise the cap to at least that",
        min_peak_bytes=peak)


def raise_time(problem, cap, max_time, peak, fastest):
    if peak is None:
        peak = min_usage(problem)[1]
    where = "" if cap is None else f" within the memory cap of {cap:.6g} bytes"
    raise InfeasibleError(
        f"no plan meets max_step_time_s={max_time:.6g}{where}: the fastest step time any plan "
        f"reaches is {fastest:.6g}; raise max_step_time_s to at least that",
        min_peak_bytes=peak, min_step_time_s=fastest)


def explain_infeasible(problem, cap, max_time, o: RunOptions):
    """Raise the InfeasibleError that says what fails: the cap (with the lowest peak any plan
    reaches, ignoring the step-time bound) or the step-time bound (with the fastest step time
    any plan reaches under the cap)."""
    _, peak = min_usage(problem)
    if problem.edge_memory is not None:
        peak = node_min_peak(problem)   # a lower bound (the least peak needs a solve)
    if not fits(peak, cap):
        raise_cap(problem, cap, o, peak)
    # memory alone is feasible: the step-time bound fails
    o2 = replace(o, deadline=max(o.deadline, time.perf_counter() + 5.0))   # at least 5 s more
    out = core(problem, o2, Request(cap=cap, start=min_usage(problem)[0]))
    if out is None and problem.edge_memory is not None:   # the copies break the cap
        raise_cap(problem, cap, o, peak)
    if out is None:  # pragma: no cover - the min-usage plan fits the cap
        raise AssertionError("the min-usage plan fits the cap")
    fastest = evaluate(problem, out[0]).total
    raise_time(problem, cap, max_time, peak, fastest)


def min_time_plan_within(problem, o: RunOptions, cap, max_time, seeds, peak=None) -> list[int]:
    """When no seed meets the step-time bound: the min-time plan under ``cap``, which must meet
    ``max_time``. InfeasibleError when nothing fits or the proven fastest plan is too slow
    (``peak``: the lowest peak for its message, None = the least-usage plan's), RuntimeError when
    HiGHS's plan in time is too slow and not proven fastest."""
    out = core(problem, o, Request(cap=cap, start=best_seed(problem, seeds, cap, None, lambda c: c.total)))
    if out is None:
        explain_infeasible(problem, cap, max_time, o)
    plan_t, info_t = out
    if max_time is not None and evaluate(problem, plan_t).total > max_time:
        if info_t.status == "optimal":
            raise_time(problem, cap, max_time, peak, evaluate(problem, plan_t).total)
        raise RuntimeError(f"HiGHS found no plan within max_step_time_s={max_time:.6g} for "
                           f"{problem.name!r} within the time limit; raise time_limit_s")
    return plan_t
