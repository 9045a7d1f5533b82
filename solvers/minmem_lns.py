"""Min peak memory under a step-time bound by large-neighbourhood search on the peak (issue 13):
``peak_lns(problem, start, max_time, deadline)``.

The bisection on the cap (``solvers.minmem_bisect``) asks the capped search for the least *time*
under a cap and moves single nodes (repair, best response): it cannot shard a weight, its optimizer
state, its gradient and the readers of each at once when each move alone adds a resharded copy.
Here each step frees a neighbourhood of the nodes that hold memory at the current peak and solves
it exactly for the least *peak* with the rest fixed: the sub-MILP (``solvers.local.subproblem``: the
outside nodes' usage and copies as a background, their edges folded into node costs) minimises the
peak variable M under the step-time row ``step time of the neighbourhood <= max_time - the fixed
rest's - (1 - SLACK_SHARE) x the plan's slack`` (all the slack when that proves nothing better); a
plan with a lower peak is kept, after a second sub-MILP on the same neighbourhood wins back step
time under its peak (the least time under that cap). Neighbourhoods: nodes live at a time point within ``NEAR`` of the peak drawn in
proportion to the bytes they hold above their least usage there plus the bytes of the copies they
make live there, each with its graph neighbours (the chain a sharding spreads along), ``size`` nodes
in all; the size grows by ``GROW`` after a neighbourhood the sub-MILP proved had nothing better, and
shrinks after one it could not solve in time. Each sub-MILP runs under the ILP watchdog
(``solve_ilp_guarded``, killed ``GRACE_S`` past its limit) and ends by ``deadline``.

No proof: a local optimum of the neighbourhoods drawn. The start matters through its slack: gpt tiny
cpu-2x4 under 1.05x Megatron's step (load 5), 25 s: from the bisection's 1,394,832-B plan at 0.81 of the
bound 1,148,816 B (slack share 0.3, 0.93 of the bound left) or 1,158,288 B (share 1, 0.998); from
Megatron's (1,657,616 B, 0.95) 40 s: 1,419,280 B (0.3) / 1,444,368 B (1); from the time-optimal plan
(2,035,536 B, 0.73) 25 s: 1,421,520 B (0.3) / 1,352,144 B (1). The min-peak MIP given 1,500 s (one thread,
nice 10, load 5-9; results/s22c_reference_bound.json) found nothing below its 1,394,832-B start; its
root ended at ~810 s with a bound of 892,699 B (nothing logged after 953 s; killed at ~1,770 s). In ``solvers.dispatch.solve_exact`` (after the bisection and the MIP; results/s22c_minmem_seq.json,
cpu-2x4 tiny, 1.05x Megatron, 60 s, one model at a time, load 3.8-5.1), predicted MiB before -> after:
gpt 1.3302 -> 1.1561, vit 0.8158 -> 0.7778, unet 2.2669 -> 2.6277 (worse: the bisection's second step
ran past its shorter share, and from a plan at 0.99 of the bound the LNS moved 0.1 %), mlp (96 nodes,
no LNS) 0.02387 both; gpt tiny by XLA 1.2906 -> 1.2647 MiB (10.7 -> 12.5 % below Megatron's). Run both
at once (load 7-9, results/s22c_minmem_zoo_*.json) the bisection's slow steps were cut and nothing
gained. One neighbourhood of 20 / 30 / 40 nodes: its peak sub-MILP proved in 1.0 /
1.2 s / not in 6.6 s, the step-time one in 2.4 / 0.6 / not in 8 s (so ``SIZE`` 25, ``SUB_S`` 3 s).
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, evaluate, fits
from solvers.local.costs import LocalCosts
from solvers.local.lns import resolve, start_of
from solvers.local.subproblem import subproblem

#: nodes per neighbourhood at the start, and its bounds (grown / shrunk as the module docstring says)
SIZE, MIN_SIZE, MAX_SIZE, GROW = 25, 10, 160, 1.25
#: a time point is "at the peak" when its live usage is within this share of the peak
NEAR = 0.02
#: share of the time left after the bisection (``solvers.minmem_bisect``) that ``solvers.dispatch.solve_exact``
#: gives this search, after the MIP (``lns_after``)
LNS_SHARE = 0.75
#: ``solve_exact`` runs the search only on graphs with at least this many nodes; below, the MIP keeps the
#: time: mlp tiny (96 nodes) cpu-2x4, 60 s, load 8.6: 0.02387 MiB with the MIP's 0.3 of the time after the
#: bisection, 0.02854 with 0.25 of it and the search the rest (gpt / vit / unet tiny: 633-880 nodes)
LNS_MIN_NODES = 300
#: the search ends this long before ``solve_exact``'s limit
LNS_MARGIN_S = 0.2
#: share of the step-time slack (``max_time`` - the plan's step time) one neighbourhood may spend
SLACK_SHARE = 0.3
#: each peak sub-MILP's time limit, the step-time one's after it; the watchdog kills either this long past it
SUB_S, TIME_SUB_S, GRACE_S = 3.0, 2.0, 0.5
#: no sub-MILP starts with less than this left before the deadline
MIN_SUB_S = 0.5


def peak_lns(problem: Problem, start, max_time: float | None, deadline: float, seed: int = 0,
             size: int = SIZE, slack: float = SLACK_SHARE, progress=None):
    """(plan, info): ``start`` (a plan within ``max_time`` and ``problem.usage_limit``; ValueError if
    not) improved by the peak LNS until ``deadline`` (a ``time.perf_counter()`` value); never worse
    by (peak, step time). ``max_time`` None: no step-time bound. ``info``: steps tried and kept,
    the peak before and after."""
    s = np.asarray(start, dtype=np.int64).copy()
    c = evaluate(problem, s)
    if not fits(c.peak_memory_bytes, problem.usage_limit) or (max_time is not None and c.total > max_time):
        raise ValueError("peak_lns: the start plan must fit the memory cap and the step-time bound")
    info = {"peak_before": float(c.peak_memory_bytes), "tried": 0, "kept": 0, "proved": 0, "failed": 0}
    rng = np.random.default_rng(seed)
    free = problem.num_strategies > 1
    g = LocalCosts(problem.with_usage_limit(c.peak_memory_bytes))   # the peak as the cap: the sub's background
    while deadline - time.perf_counter() > MIN_SUB_S + GRACE_S and free.any():
        sel = _neighbourhood(g, s, c.peak_memory_bytes, rng, size, free)
        if not len(sel):
            break
        sub = subproblem(g, s, sel)[0]
        rest = c.total - evaluate(sub, start_of(sub, s, sel)).total    # the step time of everything outside
        info["tried"] += 1
        status = "failed"
        for share in ((slack, 1.0) if slack < 1.0 and max_time is not None else (1.0,)):
            # the least peak of the neighbourhood within ``share`` of the slack (all of it when the
            # rationed share proves nothing better: a move may need more than the share)
            budget = min(SUB_S, deadline - time.perf_counter() - GRACE_S)
            if budget < MIN_SUB_S:
                break
            bound = None if max_time is None else max(max_time - rest - (1.0 - share) * (max_time - c.total), 1e-30)
            try:
                t, tc, sinfo = resolve(problem, s, sel, sub, weights={"memory": 1.0}, time_limit_s=budget,
                                       grace_s=GRACE_S, max_step_time_s=bound)
            except Exception:  # noqa: BLE001 -- no plan in time, infeasible, or killed: keep the plan
                status = "failed"
                break
            status = "kept" if _within(problem, tc, max_time) and tc.peak_memory_bytes < c.peak_memory_bytes \
                else ("proved" if sinfo.status == "optimal" else "open")
            if status != "proved":
                break
        if status == "kept":
            g = LocalCosts(problem.with_usage_limit(tc.peak_memory_bytes))
            s, c = _least_time(g, problem, t, tc, sel, max_time, deadline)
            if progress:
                progress(f"peak lns: {c.peak_memory_bytes:.0f} B, {c.total:.6g} s ({len(sel)} nodes)")
        elif status == "proved":
            size = min(MAX_SIZE, int(size * GROW) + 1)
        else:
            size = max(MIN_SIZE, int(size / GROW))
        if status in info:
            info[status] += 1
    info.update(peak_after=float(c.peak_memory_bytes), size=size)
    return [int(x) for x in s], info


def lns_after(problem: Problem, strategies, info: dict, max_time: float, limit_at: float):
    """``solve_exact``'s last phase: (plan, info) with ``strategies`` (its answer so far) improved by
    ``peak_lns`` until ``LNS_MARGIN_S`` before ``limit_at``; ``info`` records the search ("peak_lns") and,
    when it found a lower peak, the plan's figures (objective, peak, step time, source "peak_lns", gap
    against a finite bound). A start beyond the limits is left as it is."""
    info = dict(info)
    try:
        plan, info["peak_lns"] = peak_lns(problem, strategies, max_time, limit_at - LNS_MARGIN_S)
    except ValueError:
        return list(strategies), info
    c = evaluate(problem, plan)
    if c.peak_memory_bytes < info["peak_lns"]["peak_before"]:
        info.update(objective=float(c.peak_memory_bytes), source="peak_lns")
        if "peak_memory_bytes" in info:
            info.update(peak_memory_bytes=float(c.peak_memory_bytes), step_time_s=float(c.total),
                        redundant_memory_bytes=float(c.redundant_memory_bytes))
        bound = info.get("bound")
        if bound is not None and np.isfinite(bound):
            info["gap"] = max(c.peak_memory_bytes - float(bound), 0.0) / max(c.peak_memory_bytes, 1e-300)
        if info.get("status") == "optimal":   # a worse plan was called optimal: not a proof
            info["status"] = "time_limit"
    return plan, info


def _within(problem: Problem, c, max_time) -> bool:
    return fits(c.peak_memory_bytes, problem.usage_limit) and (max_time is None or c.total <= max_time)


def _least_time(g: LocalCosts, problem: Problem, s: np.ndarray, c, sel: np.ndarray, max_time, deadline: float):
    """(plan, cost): the least step time of neighbourhood ``sel`` under the cap ``g.cap`` (``s``'s peak)
    with the rest fixed, when that sub-MILP ends in time and is faster; else ``s`` (the peak sub-MILP
    spends the step-time slack freely, which the next neighbourhoods need)."""
    budget = min(TIME_SUB_S, deadline - time.perf_counter() - GRACE_S)
    if budget < MIN_SUB_S:
        return s, c
    try:
        t, tc, _ = resolve(problem, s, sel, subproblem(g, s, sel)[0], time_limit_s=budget, grace_s=GRACE_S)
    except Exception:  # noqa: BLE001 -- no plan in time or killed: keep s
        return s, c
    ok = _within(problem, tc, max_time) and (tc.peak_memory_bytes, tc.total) < (c.peak_memory_bytes, c.total)
    return (t, tc) if ok else (s, c)


def _neighbourhood(g: LocalCosts, s: np.ndarray, peak: float, rng, size: int, free: np.ndarray) -> np.ndarray:
    """Up to ``size`` nodes with a choice (``free``): centres drawn among the nodes live at a time point
    within ``NEAR`` of ``peak``, in proportion to their bytes above their least usage plus the bytes of
    the live copies they produce or read there, each followed by its graph neighbours."""
    p = g.p
    live = g.profile(s)
    hot = np.nonzero(live >= (1.0 - NEAR) * peak)[0]
    hot_mask = np.zeros(len(g.times) + 1, dtype=bool)
    hot_mask[hot] = True
    cum = np.concatenate([[0], np.cumsum(hot_mask[:-1])])
    at_hot = g.live_mask & (cum[g.hi] - cum[g.lo] > 0)
    umin = np.minimum.reduceat(g.usage, g.offs[:-1])
    w = np.where(at_hot, g.usage[g.offs[:-1] + s] - umin, 0.0)
    em = p.edge_memory
    if em is not None and em.num_groups:
        act = em.active(s)
        ht = g.times[hot]
        # a copy group's bytes go to its producer and its active readers when the copy is live at a hot point
        a, b, has = em.spans()
        on = has & _spans_hot(ht, a, b) & (em.group_bytes > 0)
        g_of = em.member_group
        m = act & on[g_of]
        np.add.at(w, em.member_node[m], em.group_bytes[g_of[m]])
        gm = np.zeros(em.num_groups, dtype=bool)
        gm[g_of[m]] = True
        np.add.at(w, em.group_node[gm], em.group_bytes[gm])
    w = np.where(free, w, 0.0)
    if w.sum() <= 0:
        return np.zeros(0, dtype=np.int64)
    chosen: list[int] = []
    seen = np.zeros(g.n, dtype=bool)
    pool = np.nonzero(w > 0)[0]
    order = rng.choice(pool, size=len(pool), replace=False, p=w[pool] / w[pool].sum())
    for i in order.tolist():
        if len(chosen) >= size:
            break
        for j in [i] + g.adj[g.adj_ptr[i]:g.adj_ptr[i + 1]].tolist():
            if len(chosen) < size and not seen[j] and free[j]:
                seen[j] = True
                chosen.append(int(j))
    return np.array(sorted(chosen), dtype=np.int64)


def _spans_hot(ht: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per span [a, b): whether some time in ``ht`` (sorted) lies in it."""
    return np.searchsorted(ht, a, side="left") < np.searchsorted(ht, b, side="left")
