"""The capped-solving core: min cost (time) under the memory limit within a wall-clock budget, for
both ``shardgym iopddl`` and ``shardgym.solve(method="ilp", objective="time")`` under a cap.

``solve_capped(problem, time_limit_s, seeds=(), ...) -> CappedResult`` (plan, cost, bound, gap,
status, which start won). The limit is ``problem.usage_limit`` (callers fold a memory cap into it).
The budget split and the size limits are ``CappedConfig``'s fields. Phases, each against one deadline:

1. **Anchor**: the lowest-usage plan is feasible iff any plan is (``plan=None`` if not) -- on
   problems without copy groups. With resharded copies (``Problem.edge_memory``) the lowest-usage
   plan can be over the limit while other plans fit: it is repaired with the copies priced
   (``solvers.local.fitting_least_usage_plan``), the seeds count as anchors too; without any, the
   memory objective's least-peak search first (``least_peak_share``, ``least_peak``), then the later phases (BP, the search, the MILP, all pricing copies in the plans they keep) still
   look for one; "infeasible" then means none was found in time, not a proof.
2. **Starts**: the feasible ``seeds`` (baseline / policy plans), on MILP-sized graphs min-sum BP with Lagrangian
   memory prices (``solvers.bp``: a plan and a lower bound); too big for the MILP, no copies, a small tied graph: its
   exact MILP (``solvers.tied_milp.tied_phase``, ``tied_share`` of the time left; IOPDDL A proven optimal in ~30 s);
   the large-instance search (``solvers.search.solve_large``: pruning, ties, adaptive memory prices over forest DP
   and ICM, repair, polish) started from the best of them.
   With pytoulbar2 installed and a budget of at least ``cfn_min_s``, the cost-function-network
   solver (``solvers.cfn``: toulbar2 rounds at adaptive memory prices, with a Lagrangian lower
   bound) runs too: on graphs too big for the MILP first, with ``cfn_share_large`` of the time
   (the search then starts from its plan and polishes it; a toulbar2 round with no plan gives the
   time back to the search, as on IOPDDL S); on MILP-sized graphs after the search, with
   ``cfn_share_small`` of the time left (it proves B and G optimal in seconds; the MILP is skipped
   when its bound closes the gap); with copy groups for at most ``cfn_copies_max_s``: its bound ignores
   the copies (~1e-7 s against plans of ~1e-3 s on tight caps, no best plan in 40 cells of bench_capped
   s11-s12) but proves loose caps (vit tiny cpu-2x4 at 75 %: 3 s); the Lagrangian gets the rest.
3. **Exact**: with ``uncapped_share`` > 0 (``shardgym.solve``'s traced problems: 0.15), first
   HiGHS on the problem without its cap: a relaxation, so its dual bound is a lower bound of the
   capped optimum (the time optimum of gpt tiny, 0.00342 s, proven in seconds, against BP's
   0.00236 under a cap), and its plan a candidate. Then, on graphs the MILP can hold (``milp_ok``), HiGHS
   (``solvers.ilp.solve_ilp``) warm-started from the best plan, with up to ``milp_share`` of the time left; it
   proves the optimum or gives its dual bound. Then large-neighbourhood search with MILP neighbourhoods
   (``solvers.local.refine``) from the incumbent for the rest. On larger graphs the search runs to the deadline.
   Before the capped MILP, on MILP-sized graphs with copy groups, the **Lagrangian bound**
   (``solvers.lagrange``, ``lagrange_share`` of the budget, at most ``lagrange_left`` of the time left): the
   memory rows priced into the costs, the copies by pairwise lower-bound terms, each priced problem solved by HiGHS without
   memory rows; its plans are candidates (the capped MILP's root LP does not finish in 60 s on
   copy-heavy traced models; results/bench_capped_s8_cpu.json, zoo tiny on cpu-2x4: gap <= 2 % in
   9/18 cells at the s7 caps, 6/18 before; gpt tiny at the 25 % cap 5.4 % -> 1.0 %), then the capped MILP on
   the union of its plans' strategies and the best plan's (``union_plan``, ``union_share`` of the time left).

The answer is the cheapest feasible plan any phase produced, so it is never worse than a seed (also one
that arrives while it runs: ``inbox``, ``solve_guarded``'s ``late``), BP,
toulbar2 or the search. Every plan is kept only if ``evaluate`` (which prices the copies) says it
fits. ``bound`` = the largest of BP's, toulbar2's, the Lagrangian's and HiGHS's (−inf when none
applies); BP's and toulbar2's price memory by node usages alone, a relaxation of the copy-priced
limit (copies only add memory), so their bounds stay valid; the Lagrangian's copy terms are below
the copies any plan holds; HiGHS's rows hold the copies;
``status`` is "optimal" when the cost meets the bound (relative 1e-6). ``on_plan(plan, cost)`` is
called on every new best plan. Time in ``solve_capped`` is approximate by one HiGHS call's set-up
or one search step; ``solve_guarded`` (what both entry points call) runs it in a forked child that
streams its plans and is killed at the limit, so the answer is never late; on graphs too big for the MILP, when a core
is idle, a second search process (another seed) uses it for the whole budget (the child: toulbar2, then its search);
on graphs too big for the MILP with copy groups and an idle core, the uncapped MILP (``uncapped_beside``: its bound,
and its plan proves a cap that does not bind or, repaired, is a start; ``solvers.capped_phases.uncapped_beside``);
with ``lp_beside_idle`` idle cores, on a graph the MILP holds with copies, the capped LP and its root for their bound
(``solvers.capped_phases.lp_beside``: the copies in exact rows, above the Lagrangian's copy terms where it finishes;
off by default: forced on at load 7-10 it raised the bound where the LP finished and cost the core CPU elsewhere,
results/s23c_ab2.json).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers import capped_phases
from solvers.bp import bp_solve
from solvers.capped_phases import capped_milp, cfn_phase, closed, least_peak, post_seed, start_besides, uncapped_bound
from solvers.cfn import available as cfn_available
from solvers.ilp.guard import start_child, stop_child
from solvers.lagrange import lagrangian_bound, union_plan
from solvers.local import fitting_least_usage_plan, improve, prepare, refine
from solvers.local.budgeted import rounds_tail
from solvers.search import solve_large
from solvers.tied_milp import tied_phase


@dataclass(frozen=True)
class CappedConfig:
    """The capped core's budget split and size limits; the defaults are what both entry points use."""

    milp_edge_entries: int = 1_000_000   # the exact MILP only up to this many edge-cost entries
    milp_nodes: int = 5_000              # ... and nodes
    milp_share: float = 0.6              # of the time left after the starts, for the MILP
    busy_threads: int = 0                # HiGHS's threads when cores - 1-min load < 1 (0: as on an idle machine)
    bp_share: float = 0.1                # of the budget for BP (and at most bp_max_s)
    bp_max_s: float = 6.0
    bp_copies_max_s: float = float("inf")  # with copy groups: BP at most this long (0 skipped it: vit tiny cpu-2x4, 50 % cap, 1.4 -> 33 %)
    bp_big_share: float = 0.0            # with copies, too big for the MILP: of the budget for BP, first (0: skipped; TRACED's)
    search_share: float = 0.1            # of the budget for the search's start on MILP-sized graphs (at
    search_max_s: float = 6.0            # most search_max_s): it finds its plan in the first second or two there
    cfn_min_s: float = 5.0               # toulbar2 (solvers.cfn, when pytoulbar2 is installed) from this budget on
    cfn_share_large: float = 0.75        # of the time left, on graphs too big for the MILP (the search gets the rest)
    cfn_share_small: float = 0.25        # of the time left after BP and the search, on MILP-sized graphs
    guard_margin_s: float = 1.0          # solve_guarded: the child's budget is this much shorter
    uncapped_share: float = 0.0          # of the budget for the uncapped MILP's bound (0: skipped; see solve_capped)
    anchor_max_s: float = 5.0            # with copies: at most this long (and 10% of the budget) to repair the anchor
    repair_max_s: float = 3.0            # the uncapped plan's repair + polish: at most this (and 5% of the budget)
    early_lns_share: float = 0.0         # of the budget for MILP neighbourhoods right after the search (MILP-sized)
    early_lns_max_s: float = 6.0
    bp_improve_s: float = 0.0            # MILP-sized: BP's plan polished + refined (``solvers.local.improve``) this long
    lagrange_share: float = 0.6          # with copies, MILP-sized: of the budget (at most lagrange_left of the time left)
    lagrange_left: float = 0.6           # for the Lagrangian bound (solvers.lagrange; the capped MILP's root LP is slow)
    union_share: float = 0.85            # of the time left after it: the capped MILP on its plans' strategies
    rounds_tail: bool = True             # before that union: the planner's steps after its rounds on the core's (``rounds_tail``)
    lp_beside_idle: float = float("inf")  # solve_guarded, copies, MILP-sized: the capped LP's bound beside the core
                                         # when cores - 1-min load >= this (inf: never; 1: on an idle core)
    lagrange_restart: bool = True        # solvers.lagrange's ``restart``: an overshooting round steps from the best prices
    lagrange_step: str = "polyak"        # solvers.lagrange's ``step``: "polyak" or "bundle" (solvers.lagrange_bundle)
    cfn_copies_max_s: float = 5.0        # with copy groups, MILP-sized: toulbar2 at most this long (its bound ignores copies)
    least_peak_share: float = 0.25       # with copies, no fitting plan after the anchor: of the budget (<= half the time left), ``least_peak``
    tied_share: float = 0.8              # too big for the MILP, no copies: of the time left, the tied MILP's phase
    second_search: bool = True           # solve_guarded, graphs too big for the MILP, an idle core (cores - 1-min load
    second_min_s: float = 10.0           # >= 1): a second search process, from this budget on
    big_planner_share: float = 0.0       # too big for the MILP, with copies: of the time left after BP, the planner's search
    uncapped_beside: bool = False        # solve_guarded, too big for the MILP, with copies: the uncapped MILP (its bound;
                                         # its plan, repaired) in a child beside the core (``capped_phases.uncapped_beside``)


DEFAULT = CappedConfig()


@dataclass(frozen=True)
class CappedResult:
    """``plan`` (None when nothing fits), its ``cost``, the best proven lower ``bound`` (−inf if none), ``gap`` =
    (cost − bound) / |cost| (None without one), ``status`` ("optimal", "time_limit" or "infeasible"), ``source``, ``wall_s``."""
    plan: list[int] | None
    cost: float
    bound: float
    gap: float | None
    status: str
    source: str
    wall_s: float
    milp_info: object = None


def milp_ok(problem: Problem, config: CappedConfig = DEFAULT) -> bool:
    """Is ``problem`` small enough for the exact MILP phase?"""
    return len(problem.edge_costs) <= config.milp_edge_entries and problem.num_nodes <= config.milp_nodes


def solve_capped(problem: Problem, time_limit_s: float, seeds=(), progress=None, on_plan=None,
                 threads: int | None = None, relax_cap: bool = False, on_bound=None,
                 config: CappedConfig = DEFAULT, inbox=None) -> CappedResult:
    """Min time under ``problem.usage_limit`` within ``time_limit_s`` (the module docstring).
    ``inbox() -> plans``: seeds that arrive while it runs (``solve_guarded``'s ``late``), taken
    between phases and whenever the Lagrangian asks for its target, as source "late seed"."""
    cf = config
    t0 = time.perf_counter()
    budget = float(time_limit_s)
    deadline = t0 + budget
    say = progress or (lambda msg: None)
    threads = threads or (cf.busy_threads if cf.busy_threads > 0 and (os.cpu_count() or 1) - os.getloadavg()[0] < 1.0 else min(os.cpu_count() or 2, 8))
    best: list = [None, float("inf"), "none"]
    bound = -float("inf")

    def tighten(b) -> float:
        """The best bound so far, reported through ``on_bound`` when ``b`` raises it."""
        nonlocal bound
        if b is not None and np.isfinite(b) and b > bound:
            bound = float(b)
            if on_bound is not None:
                on_bound(bound)
        return bound

    def consider(plan, tag) -> bool:
        if plan is None or len(plan) != problem.num_nodes:
            return False
        c = evaluate(problem, plan)
        if c.feasible and c.total < best[1]:
            best[:] = [[int(x) for x in plan], float(c.total), tag]
            say(f"{tag}: {c.total:.10g} ({time.perf_counter() - t0:.1f}s)")
            if on_plan is not None:
                on_plan(best[0], best[1])
            return True
        return False

    left = (lambda: deadline - time.perf_counter())

    def take() -> bool:
        """The late seeds so far offered to ``consider`` (True: it is used as ``take() and ...``)."""
        for plan in (inbox() if inbox is not None else ()):
            consider(plan, "late seed")
        return True

    # 1. anchor (with copies: the least-usage plan repaired, and the seeds)
    copies = problem.edge_memory is not None
    small = milp_ok(problem, cf)
    short = budget < 2.0              # a sub-2 s budget (the contest's 1 s and less): BP and the search

    def bp_phase(t_bp) -> None:
        r = bp_solve(problem, rounds=60, memory_prices=True, time_limit_s=t_bp)
        consider(r.plan, "bp")
        if small and cf.bp_improve_s > 0 and r.plan is not None and left() > 2 * cf.bp_improve_s:
            # the planner's post-processing: mlp tiny cpu-2x4 cap 50 % 1.020e-4 -> 7.198e-5 (optimal; the search: none)
            consider(improve(problem, r.plan, 0.25 * cf.bp_improve_s, 0.75 * cf.bp_improve_s,
                             repair_time_limit_s=cf.bp_improve_s), "bp, improved")
        if np.isfinite(r.lower_bound):
            tighten(r.lower_bound)
            say(f"bp bound: {r.lower_bound:.10g} after {r.rounds} rounds")

    anchor = fitting_least_usage_plan(problem, time_limit_s=min(cf.anchor_max_s, 0.1 * budget) if copies else None)
    consider(anchor, "anchor (lowest usage)")
    for i, s in enumerate(seeds):
        consider(s, f"seed {i}")
    if not small and copies and cf.bp_big_share > 0 and left() > 2.0:   # before the least-peak search
        bp_phase(min(cf.bp_big_share * budget, 0.8 * left()))
    if best[0] is None and copies and cf.least_peak_share > 0 and left() > 4.0:
        least_peak(problem, min(cf.least_peak_share * budget, 0.5 * left()), threads, consider, say, seeds)
    if best[0] is None and not copies:
        say("no plan fits the usage limit")
        return CappedResult(None, float("inf"), -float("inf"), None, "infeasible", "none",
                            time.perf_counter() - t0)
    # 2. starts: the uncapped optimum repaired, BP, the search (with copies and no plan yet, they and
    # the MILP look for one)
    take()
    free_plan = None                  # the uncapped optimum (the Lagrangian's round at prices 0)
    if small and cf.uncapped_share > 0 and left() > 6.0:
        ub, proven_free, free_plan = uncapped_bound(problem, min(cf.uncapped_share * budget, 0.3 * left()), threads, consider,
                                          say, repair_s=min(cf.repair_max_s, 0.05 * budget))
        tighten(ub)
        relax_cap = relax_cap and not proven_free   # proven: the MILP below need not try it again
    take()
    t_bp = min(cf.bp_share * budget, cf.bp_max_s, 0.5 * left(), cf.bp_copies_max_s if copies else float("inf"))
    if small and t_bp > 0 and left() > (0.2 if short else 2.0) and not closed(best[1], bound):   # contest-size: BP loses
        bp_phase(t_bp)
    info, prepared, use_cfn = None, None, cfn_available() and not short and budget >= cf.cfn_min_s
    if take() and not copies and not small and cf.tied_share > 0 and not short and left() > 4.0:
        prepared = prepare(problem)                # pruning and ties, once for every phase
        r = tied_phase(problem, cf.tied_share * left(), best, consider, say, prepared, threads)
        if closed(best[1], tighten(r.bound)):    # proven optimal: what follows cannot improve it
            return _result(best, bound, None, t0, True)
    if take() and not small and copies and cf.big_planner_share > 0 and best[0] is not None:   # before toulbar2: its
        tighten(capped_phases.planner_search(problem, best[0], cf.big_planner_share * left() - 1.0, consider, say))  # bound ignores copies
    if use_cfn and not small and left() > 4.0:     # contest-size: toulbar2 first, the search polishes
        prepared = prepared or prepare(problem)    # pruning and ties, once for both
        tighten(cfn_phase(problem, cf.cfn_share_large * left(), best, consider, say, give_up_empty=True,
                     prepared=prepared))
    if take() and left() > (0.1 if short else 1.0) and not closed(best[1], bound):   # (a seed at the uncapped bound)
        t_search = min(cf.search_share * budget, cf.search_max_s) if small and not short else left()
        margin = 0.3 * left() if short else 0.5   # solve_large can run ~0.3 s past a short limit
        plan = solve_large(problem, max(min(t_search, left() - margin), 0.05), progress=say, use_lns=not small,
                           starts=[best[0]], on_plan=lambda s: consider(s, "search"), prepared=prepared)
        consider(plan, "search")
    if take() and small and cf.early_lns_share > 0 and best[0] is not None and left() > 4.0 and not closed(best[1], bound):
        consider(list(refine(problem, best[0], min(cf.early_lns_share * budget, cf.early_lns_max_s))), "early lns")
    t_cfn = min(cf.cfn_share_small * left(), cf.cfn_copies_max_s if copies else float("inf"))
    if take() and use_cfn and small and t_cfn > 0.5 and left() > 4.0 and not closed(best[1], bound):
        tighten(cfn_phase(problem, t_cfn, best, consider, say))
    if take() and small and copies and cf.lagrange_share > 0 and left() > 4.0 and not closed(best[1], bound):
        r = lagrangian_bound(problem, min(cf.lagrange_share * budget, cf.lagrange_left * left()), upper=lambda: take() and best[1],
                             ref=best[0], threads=threads, progress=say, restart=cf.lagrange_restart, step=cf.lagrange_step,
                             on_plan=lambda plan: consider(plan, "lagrange"),
                             first=None if free_plan is None else (ub, free_plan))
        tighten(r.bound)
        say(f"lagrange bound: {r.bound:.10g} after {r.rounds} rounds")
        if take() and cf.rounds_tail and r.plans and left() > 2.0 and not closed(best[1], bound):
            consider(rounds_tail(problem, r.plans, best[0], deadline=deadline - 1.0), "rounds tail")
        if take() and cf.union_share > 0 and r.plans and left() > 2.0 and not closed(best[1], bound):
            consider(union_plan(problem, r.plans + [best[0]], cf.union_share * left(), best[0], threads), "union")
    # 3. exact MILP, then MILP neighbourhoods from its incumbent
    if take() and small and left() > 2.0 and not closed(best[1], bound):
        info = capped_milp(problem, max(cf.milp_share * left() - 0.5, 1.0), best, relax_cap, threads, consider, say)
        tighten(None if info is None else float(info.bound))
        if take() and (info is None or info.status != "optimal") and best[0] is not None and left() > 2.0 \
                and not closed(best[1], bound):
            consider(list(refine(problem, best[0], left() - 1.5)), "lns")   # its last MILP can overrun
    if proven := info is not None and info.status == "optimal":
        tighten(min(best[1], float(info.bound)))
    return _result(best, bound, info, t0, proven)


def _result(best, bound, info, t0, proven) -> CappedResult:
    if best[0] is None:   # copies: no phase found a plan that fits in time
        return CappedResult(None, float("inf"), bound, None, "infeasible", "none", time.perf_counter() - t0, info)
    cost = best[1]
    done = proven or closed(cost, bound)
    gap = None if not np.isfinite(bound) else max(0.0, cost - bound) / max(abs(cost), 1e-300)
    return CappedResult(best[0], cost, bound, 0.0 if done else gap, "optimal" if done else "time_limit",
                        best[2], time.perf_counter() - t0, info)


def solve_guarded(problem: Problem, time_limit_s: float, seeds=(), progress=None, relax_cap: bool = False,
                  threads: int | None = None, config: CappedConfig = DEFAULT, late=None) -> CappedResult:
    """``solve_capped`` in a forked child that streams every new best plan through a pipe, killed at
    ``time_limit_s`` (a native call that overruns cannot delay the answer): the best plan streamed so far is
    returned (checked here: never one over the limit). The child gets ``time_limit_s`` − ``config.guard_margin_s``.
    Without fork (not POSIX) it runs inline. ``status``/``bound`` come from the child's own result
    when it finishes in time; otherwise the best bound it streamed (−inf if none) and "time_limit"
    (or "optimal" when that bound meets the plan's cost). The child's ``progress`` messages come
    through the pipe and are passed to ``progress`` here. ``late``: (process, receiving end) of a
    seed computed beside the core (``solvers.dispatch``'s policy seed), which sends ("plan", plan,
    seconds) or ("none", why), one or more times: a plan that fits is a candidate answer here and is passed on to the
    core (its ``inbox``), which starts its later phases from it if it is the best; the process is
    killed at the limit like the core (a seed that is late is lost, never waited for)."""
    t0 = time.perf_counter()
    deadline = t0 + float(time_limit_s)
    say = progress or (lambda msg: None)
    if not hasattr(os, "fork") or time_limit_s < 2 * config.guard_margin_s:
        if late is not None:
            stop_child(late[0])
        return solve_capped(problem, max(time_limit_s, 0.1), seeds=seeds, progress=progress,
                            relax_cap=relax_cap, threads=threads, config=config)
    post, mail = mp.get_context("fork").Pipe(duplex=False)    # parent -> core: the late seeds

    def body(send):
        r = solve_capped(problem, time_limit_s - config.guard_margin_s, seeds=seeds,
                         progress=None if progress is None else (lambda m: send.send(("log", m))),
                         on_plan=lambda plan, cost: send.send((plan, cost)), relax_cap=relax_cap,
                         threads=threads, on_bound=lambda b: send.send(("bound", b)), config=config,
                         inbox=lambda: [post.recv() for _ in iter(post.poll, False)])
        send.send(("done", r))

    proc, recv = start_child(body)
    post.close()
    second, lp, free = start_besides(problem, seeds, time_limit_s, config, not milp_ok(problem, config), say)
    best, best_cost, done, bound, other = None, float("inf"), None, -float("inf"), None
    conns = [recv] + [c[1] for c in (second, late, lp, free) if c is not None]
    while conns:
        wait = deadline - time.perf_counter()
        ready = mp_wait(conns, wait) if wait > 0 else []
        if not ready:
            say(f"deadline: stopping the solver ({time.perf_counter() - t0:.1f}s)")
            break
        for conn in ready:
            try:
                msg = conn.recv()
            except EOFError:
                conns.remove(conn)
                continue
            if late is not None and conn is late[1]:     # a late seed: ("plan", plan, s) or ("none", why); open to EOF
                c = evaluate(problem, msg[1]) if msg[0] == "plan" else None
                say(f"late seed: {c.total:.10g} after {msg[2]:.1f}s ({time.perf_counter() - t0:.1f}s)" if c is not None
                    else f"late seed: none ({msg[1]})")
                if c is not None and c.feasible:
                    post_seed(mail, msg[1])
                    if c.total < best_cost:
                        best, best_cost, other = [int(x) for x in msg[1]], float(c.total), "late seed"
            elif free is not None and conn is free[1]:    # the uncapped MILP beside: ("plan", plan, cost, tag) / ("bound", b)
                if msg[0] == "bound":
                    bound = max(bound, msg[1])
                    say(f"uncapped milp beside: bound {msg[1]:.10g} ({time.perf_counter() - t0:.1f}s)")
                else:
                    post_seed(mail, msg[1])     # the core's later phases may start from it
                    say(f"{msg[3]} beside: {msg[2]:.10g} ({time.perf_counter() - t0:.1f}s)")
                    if msg[2] < best_cost:
                        best, best_cost, other = msg[1], msg[2], f"{msg[3]} beside"
                if closed(best_cost, bound):    # proven (the cap does not bind): nothing can beat it
                    say(f"proven by the uncapped milp beside ({time.perf_counter() - t0:.1f}s)")
                    conns = []
                    break
            elif lp is not None and conn is lp[1]:     # the LP beside: ("bound", seconds)
                conns.remove(conn)
                bound = max(bound, msg[1])
                say(f"lp beside: bound {msg[1]:.10g} ({time.perf_counter() - t0:.1f}s)")
            elif conn is not recv:          # the second search: (plan, cost)
                if msg[1] < best_cost:
                    best, best_cost, other = msg[0], msg[1], "second search"
                    say(f"second search: {msg[1]:.10g} ({time.perf_counter() - t0:.1f}s)")
            elif msg[0] == "done":
                done = msg[1]
                conns.remove(conn)
                for c in (second, lp):   # proven (or nothing fits): the second search and the LP cannot help
                    if done.status in ("optimal", "infeasible") and c is not None and c[1] in conns:
                        conns.remove(c[1])
                if late is not None and late[1] in conns and (done.status == "optimal" or (
                        done.status == "infeasible" and problem.edge_memory is None)):
                    conns.remove(late[1])     # proven (without copies "infeasible" is a proof): no seed helps
            elif msg[0] == "log":     # the child's progress, said here (a caller's list sees it)
                say(msg[1])
            elif msg[0] == "bound":
                bound = max(bound, msg[1])
            elif msg[1] < best_cost:
                best, best_cost, other = msg[0], msg[1], None
    mail.close()
    for c in ((proc,), second, late, lp, free):
        if c is not None:
            stop_child(c[0])
    if done is not None and done.plan is not None and done.cost <= best_cost:
        best, best_cost, other = done.plan, done.cost, None
    if best is not None and not evaluate(problem, best).feasible:
        say("the solver's plan is over the usage limit: not returned")
        best, best_cost = None, float("inf")
    if best is None:
        status = "infeasible" if done is not None and done.status == "infeasible" else "time_limit"
        return CappedResult(None, float("inf"), -float("inf"), None, status, "none", time.perf_counter() - t0)
    if done is not None and other is None and not bound > done.bound:   # (the LP beside's can be higher)
        return CappedResult(best, best_cost, done.bound, done.gap, done.status, done.source,
                            time.perf_counter() - t0, done.milp_info)
    bound = bound if done is None else max(bound, done.bound)
    r = _result([best, best_cost, other or (done.source if done is not None else "streamed")], bound, None, t0, False)
    return CappedResult(r.plan, r.cost, r.bound, r.gap, r.status, r.source, time.perf_counter() - t0)

