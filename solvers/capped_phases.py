"""Phases of the capped core (``solvers.capped.solve_capped``) that call HiGHS on the whole problem:
the least-peak search when no plan fits yet, the uncapped MILP's bound and plan, and the capped MILP
from the incumbent. Each offers its plans to the core's ``consider`` (kept only if it fits) and
says what it found through ``say``; toulbar2's phase (``cfn_phase``). And the processes ``solve_guarded`` runs
beside the core (``start_besides``): ``lp_beside`` (the capped LP's bound), ``second_search``, ``uncapped_beside``
(the uncapped MILP on graphs too big for the capped one), and ``post_seed`` (its hand-over of a late seed). Moved
here from solvers/capped.py (its 400-line limit)."""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from costmodel.problem import evaluate
from solvers.cfn import cfn_solve
from solvers.ilp import IlpConfig, solve_ilp
from solvers.ilp.guard import start_child
from solvers.local import fitting_least_usage_plan, improve
from solvers.local.budgeted import CAPPED_BUDGET, capped_search
from solvers.search import solve_large


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


def capped_milp(problem, time_limit_s, best, relax_cap, threads, consider, say):
    """One HiGHS solve warm-started from the best plan; its SolveInfo, or None without a plan."""
    try:
        plan, info = solve_ilp(problem, time_limit_s=time_limit_s, initial_plan=best[0], relax_cap=relax_cap,
                               threads=threads)
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


#: ``lp_beside``'s HiGHS settings: the memory rows as running sums (vit tiny h100-2x8 at the 75 % cap, one process
#: after the other at load 7-9: the LP in 10.7 s against 26.1 s as dense rows, 367k against 2.3M nonzeros;
#: results/s23c_lp_probe_vit75.json), all of the limit for the LP first, then the MIP's root (its cuts) and no
#: branching: the bound is what it is for
LP_BESIDE_CONFIG = IlpConfig(dense_memory_nonzeros=-1, lp_share=1.0, highs_options=(("mip_max_nodes", 1),))
#: ... its HiGHS limit is this share of ``lp_beside``'s: HiGHS's root can run past its limit (vit tiny at the 75 %
#: cap, the MIP after a 10.7-s LP: 72.4 s wall for a 40-s limit, results/s23c_lp_probe_vit75.json), and the bound
#: arrives only when ``solve_ilp`` returns, so the rest of the time is slack for that before the child is killed
LP_BESIDE_SHARE = 0.8


def lp_beside(problem, seeds, time_limit_s: float):
    """(process, receiving end) of a forked child (``solvers.ilp.guard.start_child``) that solves the capped
    MILP's LP relaxation, then its root, on one HiGHS thread within ``LP_BESIDE_SHARE`` of ``time_limit_s``
    (``LP_BESIDE_CONFIG``), from the first of ``seeds`` that fits (else the least-usage plan repaired, at most
    5 s; none: it sends nothing), and sends ("bound", seconds) when that bound is finite. The resharded copies are exact rows
    there, so it can be above the Lagrangian's pairwise copy terms: vit tiny h100-2x8 at session 15's 75 %
    cap, LP 5.22e-5 s against the Lagrangian's converged 4.475e-5 (results/s23c_ref_vit75.json).
    ``solvers.capped.solve_guarded`` runs it beside the core (``CappedConfig.lp_beside_idle``)."""
    def body(send):
        start = next((list(s) for s in seeds if s is not None and evaluate(problem, s).feasible), None)
        start = start if start is not None else fitting_least_usage_plan(problem, time_limit_s=min(5.0, 0.1 * time_limit_s))
        if start is None:
            return
        try:
            _, info = solve_ilp(problem, time_limit_s=LP_BESIDE_SHARE * time_limit_s, threads=1, relax_cap=False,
                                initial_plan=[int(x) for x in start], config=LP_BESIDE_CONFIG)
        except (RuntimeError, ValueError):
            return
        if np.isfinite(info.bound):
            send.send(("bound", float(info.bound)))

    return start_child(body)


def uncapped_beside(problem, time_limit_s: float, repair_s: float):
    """(process, receiving end) of a forked child (``solvers.ilp.guard.start_child``) that runs ``uncapped_bound``
    (HiGHS without the cap, one thread, ``time_limit_s``; its plan repaired and polished within ``repair_s`` when it
    breaks the cap) and sends ("plan", plan, cost, tag) for each plan that fits and ("bound", b) for HiGHS's dual bound
    of the uncapped problem, a lower bound of the capped optimum. ``solvers.capped.solve_guarded`` runs it beside
    the core on graphs too big for the capped MILP (``CappedConfig.uncapped_beside``), where the core has no
    uncapped phase of its own: a cap that does not bind is then proven in the uncapped MILP's time (gpt 1.3b
    h100-2x8 at 80 GiB: 19 s, ``solvers.ilp.objectives._relax_cap``), and a binding one gets the uncapped optimum
    repaired as a start and its bound."""
    def body(send):
        def consider(plan, tag) -> bool:
            c = evaluate(problem, plan)
            if c.feasible:
                send.send(("plan", [int(x) for x in plan], float(c.total), tag))
            return bool(c.feasible)

        bound, _, _ = uncapped_bound(problem, time_limit_s, 1, consider, lambda msg: None, repair_s=repair_s)
        if np.isfinite(bound):
            send.send(("bound", float(bound)))

    return start_child(body)


def start_besides(problem, seeds, time_limit_s: float, config, big: bool, say) -> tuple:
    """The children ``solvers.capped.solve_guarded`` runs beside the core, each (process, receiving end) or None:
    (second search, capped LP, uncapped MILP). ``big``: the graph is too big for the core's MILP (``milp_ok``)."""
    spare = (os.cpu_count() or 1) - os.getloadavg()[0]     # idle cores (a loaded machine: none to spare)
    free = second = None
    if config.uncapped_beside and big and problem.edge_memory is not None and time_limit_s >= 4 * config.guard_margin_s:
        if spare >= 1.0:     # on an idle core only: beside a starved core it cost gpt 7b h100-2x8 at 58.6 GB every plan
            free = uncapped_beside(problem, time_limit_s - 2 * config.guard_margin_s,
                                   min(3 * config.repair_max_s, 0.15 * time_limit_s))
        say(f"{spare:.1f} idle cores: {'the' if free else 'no'} uncapped milp beside")
    if config.second_search and time_limit_s >= config.second_min_s and big:
        if spare >= (2.0 if free is not None else 1.0):     # the uncapped MILP beside takes one
            second = second_search(problem, time_limit_s - config.guard_margin_s)
        say(f"{spare:.1f} idle cores: {'a' if second else 'no'} second search")
    lp = lp_beside(problem, seeds, time_limit_s - 2 * config.guard_margin_s) if (
        problem.edge_memory is not None and not big and time_limit_s >= 4 * config.guard_margin_s
        and spare >= config.lp_beside_idle) else None
    return second, lp, free


def second_search(problem, time_limit_s: float):
    """(process, receiving end) of a second ``solve_large`` (another seed) in a forked child
    (``solvers.ilp.guard.start_child``) that sends each new best plan as (plan, cost), for an idle core."""
    def body(send):
        solve_large(problem, time_limit_s, seed=1, use_lns=False,
                    on_plan=lambda s: send.send(([int(x) for x in s], float(evaluate(problem, s).total))))

    return start_child(body)


def cfn_phase(problem, time_limit_s, best, consider, say, give_up_empty=False, prepared=None) -> float:
    """toulbar2 rounds at adaptive memory prices (``solvers.cfn``) from the best plan; its bound.
    On contest-size graphs a round without a plan hands the rest of the time to the search."""
    r = cfn_solve(problem, time_limit_s, starts=[best[0]], progress=say, give_up_empty=give_up_empty, prepared=prepared,
                  on_plan=lambda plan, cost: consider(plan, "cfn"))
    consider(r.plan, "cfn")
    if np.isfinite(r.lower_bound):
        say(f"cfn bound: {r.lower_bound:.10g} after {r.rounds} rounds")
    return r.lower_bound


#: ``planner_search``'s budget: the planner's, with the Lagrangian rounds after the uncapped optimum at every size (the
#: planner takes the union of that optimum and its start alone from 2,000 nodes on, ``CappedBudget.lagrange_max_nodes``).
#: In the core, at 60 s (load 1.2-2.9): vit base 0.79 GB 0.015722, gap 28.5 %, against 0.017708 / 36.6 % with the
#: planner's budget; gpt 125m 2.30 GB 0.014673 / 10.6 % against 0.014840 / 11.6 % (the uncapped optimum's bound either way)
PLANNER_SEARCH_BUDGET = replace(CAPPED_BUDGET, lagrange_max_nodes=10**9)


def planner_search(problem, plan, time_limit_s: float, consider, say) -> float:
    """The planner's capped search (``solvers.local.budgeted.capped_search``: Lagrangian rounds by BP, their
    plans repaired, the union MILP, polish, LNS) from the core's incumbent, its work budget cut at
    ``time_limit_s``; the core's phase on graphs with copies too big for the capped MILP, after BP. Why:
    ``solve(method="policy", time_limit_s=60)`` (BP, then this search) beat the core's BP + ``solve_large`` on
    vit base @ h100-2x8 at cap 0.79 GB, 0.017180 against 0.017708 (results/s27_policy_limit.json). Returns its
    Lagrangian bound (−inf when it has none)."""
    if plan is None or time_limit_s < 2.0:
        return -float("inf")
    out, info = capped_search(problem, plan, replace(PLANNER_SEARCH_BUDGET, safety_s=time_limit_s), return_info=True)
    consider(out, "planner search")
    say(f"planner search: {info.get('phase')} after {info.get('rounds')} rounds, bound {info.get('bound'):.10g}")
    return float(info.get("bound", -float("inf")))


def closed(cost: float, bound: float) -> bool:
    """Does ``bound`` prove ``cost`` optimal? Never without a plan (cost inf: inf - b <= 1e-6·inf held, so
    every phase after the search was skipped when none had found a plan, vit tiny cpu-2x4 at cap 731,651 B)."""
    return bool(np.isfinite(cost) and np.isfinite(bound) and cost - bound <= 1e-6 * max(abs(cost), 1e-300))
