"""Phases of the capped core (``solvers.capped.solve_capped``) that call HiGHS on the whole problem:
the least-peak search when no plan fits yet, the uncapped MILP's bound and plan, and the capped MILP
from the incumbent. Each offers its plans to the core's ``consider`` (kept only if it fits) and
says what it found through ``say``; and ``post_seed``, ``solve_guarded``'s hand-over of a late seed. Moved
here from solvers/capped.py (its 400-line limit)."""
from __future__ import annotations

import numpy as np

from costmodel.problem import evaluate
from solvers.ilp import IlpConfig, solve_ilp
from solvers.local import improve


def least_peak(problem, time_limit_s, threads, consider, say, seeds=()) -> None:
    """Memory first, when no plan fits yet (copies can put the repaired least-usage plan over a cap
    that other plans meet): the memory objective (``solvers.ilp.solve_ilp(objective="memory")`` on
    the problem without its limit, from ``seeds`` (fitting or not): the copy-free model's plan, the
    peak shaver's bisection, the min-peak MILP), each plan it streams and its answer offered to
    ``consider`` (kept if it fits)."""
    try:
        plan, info = solve_ilp(problem.with_usage_limit(None), objective="memory", time_limit_s=time_limit_s,
                               threads=threads, initial_plans=[list(s) for s in seeds],
                               on_incumbent=lambda s: consider(s, "least peak"))
    except (RuntimeError, ValueError) as exc:
        say(f"least peak gave nothing: {exc}")
        return
    consider(plan, "least peak")
    say(f"least peak: {info.objective:.10g} B against the limit {problem.usage_limit:.10g} B")


def uncapped_bound(problem, time_limit_s, threads, consider, say, repair_s: float = 0.0) -> tuple[float, bool]:
    """HiGHS on the problem without its limit: dropping the cap is a relaxation, so its dual bound
    bounds the capped optimum from below, and its plan, when it fits, is a candidate (then the
    capped optimum when that bound meets it); when it does not fit, that plan repaired with the
    copies priced and polished, both within ``repair_s`` (``solvers.local.improve``), is one (the
    policy planner's second start, made from the optimum instead of a decode). (bound, proven, plan): -inf and
    None when HiGHS gives nothing in time."""
    try:
        plan, info = solve_ilp(problem.with_usage_limit(None), time_limit_s=time_limit_s, threads=threads)
    except (RuntimeError, ValueError) as exc:
        say(f"uncapped milp gave nothing: {exc}")
        return -float("inf"), False, None
    if not consider(plan, "uncapped milp") and repair_s > 0 and not evaluate(problem, plan).feasible:
        fit = improve(problem, plan, polish_time_limit_s=None, repair_time_limit_s=repair_s)
        if fit is not None:
            consider(fit, "uncapped milp, repaired")
        else:
            say("uncapped milp's plan: the repair found no plan that fits")
    say(f"uncapped milp: status={info.status} bound={info.bound:.10g}")
    return (float(info.bound) if np.isfinite(info.bound) else -float("inf")), info.status == "optimal", plan


def capped_milp(problem, time_limit_s, best, relax_cap, threads, consider, say, dense_nonzeros: int | None = None,
                lp_share: float | None = None):
    """One HiGHS solve warm-started from the best plan; its SolveInfo, or None without a plan.
    ``dense_nonzeros``: the model's ``IlpConfig.dense_memory_nonzeros`` (None: the ILP's default; -1:
    the memory rows as running sums, ``solvers.ilp.blocks.MemAux``); ``lp_share``: ``IlpConfig.lp_share``,
    the share of ``time_limit_s`` its LP relaxation may take first (its optimum is the bound when the MIP
    that follows has none; None: the ILP's default)."""
    base = IlpConfig()
    config = IlpConfig(dense_memory_nonzeros=base.dense_memory_nonzeros if dense_nonzeros is None else int(dense_nonzeros),
                       lp_share=base.lp_share if lp_share is None else float(lp_share))
    try:
        plan, info = solve_ilp(problem, time_limit_s=time_limit_s, initial_plan=best[0], relax_cap=relax_cap,
                               threads=threads, config=config)
    except (RuntimeError, ValueError) as exc:       # no MILP plan in time: keep the others
        say(f"milp gave no plan: {exc}")
        return None
    consider(plan, "milp")
    say(f"milp: status={info.status} bound={info.bound:.10g}")
    return info


def post_seed(mail, plan) -> None:
    """Pass a late seed to the core (``solve_capped``'s ``inbox``); the core may be gone already."""
    try:
        mail.send([int(x) for x in plan])
    except (BrokenPipeError, OSError):
        pass
