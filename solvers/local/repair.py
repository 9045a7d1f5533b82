"""Memory repair: the one "cheapest cost per byte saved at the worst point" repair.

``repair_memory(problem, plan)`` makes a plan fit ``problem.usage_limit``: while the live profile
(node usages + live copies, ``LocalCosts.profile``) is over the limit, take its highest point j and
switch, among the nodes live at j and the producers and readers of copies that may be live at j,
the strategy with the least cost increase per byte it saves at j (node bytes + copy bytes,
``solvers.local.copies.CopyMoves``; local costs, neighbours fixed; ties to more bytes saved). With copies, each round moves, cheapest first, distinct nodes until j's
excess is covered (as ``repair_tied``): one move a round took 29 s per repair on unet tiny's
policy decode, the batch 2 s, at about the same final cost (planner polish included: 0.006131 vs
0.006178 s). None if no move saves bytes at j or
the moves run out (``max_moves``, default 4 n) or the time (``time_limit_s``).

``fitting_least_usage_plan(problem)``: the least-usage plan, repaired when its copies break the
limit (the start every capped solver anchors on).

``repair_tied(C, gc, sc)`` is the same repair over the components of a permutation contraction
(``solvers.local.prune.Contraction``; the large-instance driver and ``solvers.cfn`` work there):
variables are components, a component strategy's bytes at j are its members' (``C.usage_at``), and
each round moves, cheapest first, distinct components until j's excess is covered (a move can raise
other points; later rounds see that). ``Pruning``'s problem (``C.g``) has no copy groups, so with
``pr`` (the pruning of a problem with copies) the profile shaved is the original problem's, copies
included, and a component move is priced with its members' copy bytes too: the sum of each
member's single-node ``CopyMoves`` saving (exact when at most one member of a copy group moves;
members of one group moving together are priced as if one at a time, and each round re-reads the
exact profile). Without ``pr`` only node bytes count. Greedy: it may fail where a plan exists.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, evaluate, fits
from solvers.local.copies import CopyMoves
from solvers.local.costs import LocalCosts
from solvers.local.greedy import least_usage_plan

#: with copies, the repair gives up after this many rounds without a new lowest excess (moves that
#: kill one copy can make another live elsewhere; gpt tiny's raw policy decode cycled for 2,500)
STALL_ROUNDS = 50


def _shave(lc: LocalCosts, x: np.ndarray, profile, usage_at, cap: float, max_rounds: int,
           deadline: float | None, batch: bool, copy_saved=None) -> np.ndarray | None:
    """The repair loop over the variables of ``lc`` (see the module docstring)."""
    x = np.asarray(x, dtype=np.int64).copy()
    off = lc.offs
    low, since = np.inf, 0
    for _ in range(max_rounds):
        live = profile(x)
        j = int(np.argmax(live))
        excess = float(live[j]) - cap
        if excess <= 0:
            return x
        if deadline is not None and time.perf_counter() > deadline:
            return None
        low, since = (excess, 0) if excess < low else (low, since + 1)
        if copy_saved is not None and since > STALL_ROUNDS:   # copy moves can cycle: give up
            return None
        uj = usage_at(j)
        L = lc.local(x)
        cur = off[:-1] + x
        saved = uj[cur][lc.node_of] - uj
        if copy_saved is not None:
            saved = saved + copy_saved(x, j)
        dcost = L - L[cur][lc.node_of]
        ok = saved > 0
        if not ok.any():
            return None
        score = np.where(ok, np.maximum(dcost, 0) / np.where(ok, saved, 1) - 1e-30 * saved, np.inf)
        if not batch:
            f = int(np.argmin(score))
            x[lc.node_of[f]] = lc.local_index[f]
            continue
        moved = set()
        for f in np.lexsort((-saved, score)).tolist():
            if not np.isfinite(score[f]) or excess <= 0:
                break
            i = int(lc.node_of[f])
            if i in moved:
                continue
            moved.add(i)
            x[i] = lc.local_index[f]
            excess -= saved[f]
    return x if fits(profile(x).max(initial=0.0), cap) else None


def repair_memory(problem: Problem, plan, lc: LocalCosts | None = None, max_moves: int | None = None,
                  time_limit_s: float | None = None) -> list[int] | None:
    """``plan`` made to fit the usage limit (see the module docstring), or None."""
    plan = np.asarray(plan, dtype=np.int64)
    limit = problem.usage_limit
    if limit is None or evaluate(problem, plan).feasible:
        return [int(x) for x in plan]
    lc = lc or LocalCosts(problem)
    deadline = None if time_limit_s is None else time.perf_counter() + float(time_limit_s)
    moves = None if problem.edge_memory is None else CopyMoves(problem)
    out = _shave(lc, plan, lc.profile, lc.usage_at, float(limit), max_moves or 4 * problem.num_nodes,
                 deadline, batch=moves is not None,
                 copy_saved=None if moves is None else (lambda x, j: moves.saved_at(x, int(lc.times[j]))))
    return None if out is None or not evaluate(problem, out).feasible else [int(x) for x in out]


def fit_with_copies(problem: Problem, plan, lc: LocalCosts | None = None,
                    time_limit_s: float | None = None) -> list[int] | None:
    """``plan`` if it fits the usage limit by ``evaluate``; when the problem has copy groups (whose
    memory node-usage bounds and prices do not see) and it does not fit, the plan repaired with the
    copies priced (``repair_memory``); None when it still does not fit, or does not fit and the
    problem has no copies. The one check every solver applies to a plan its own bound called fitting."""
    plan = np.asarray(plan, dtype=np.int64)
    if problem.usage_limit is None or evaluate(problem, plan).feasible:
        return [int(x) for x in plan]
    if problem.edge_memory is None:
        return None
    return repair_memory(problem, plan, lc=lc, time_limit_s=time_limit_s)


def fitting_least_usage_plan(problem: Problem, time_limit_s: float | None = None) -> list[int] | None:
    """The least-usage plan (``least_usage_plan``) through ``fit_with_copies``. Without copy groups
    the least-usage plan fits iff any plan does; with them, None proves nothing."""
    return fit_with_copies(problem, least_usage_plan(problem), time_limit_s=time_limit_s)


def repair_tied(C, gc: LocalCosts, sc: np.ndarray, time_limit_s: float, max_rounds: int = 200,
                pr=None) -> np.ndarray | None:
    """A component plan of contraction ``C`` (component graph ``gc``) that fits, or None. ``pr``:
    the ``Pruning`` whose problem ``C.g`` is (``prepare``); needed to see copies (see the module
    docstring), without it only node bytes count."""
    g = C.g
    if g.cap is None:
        return sc
    p = None if pr is None else pr.g.p
    if p is None or p.edge_memory is None:
        return _shave(gc, sc, lambda x: g.profile(C.expand(x)), C.usage_at, float(g.cap), max_rounds,
                      time.perf_counter() + float(time_limit_s), batch=True)
    lo, moves = pr.g, CopyMoves(p)
    # original flat index of each row of C's space (member i's row for component strategy a)
    oflat = lo.offs[g.node_of] + pr.orig_local[C.oflat]
    size = len(gc.cost)

    def orig(x):
        return pr.to_orig(C.expand(x))

    def usage_at(j):                      # members' bytes at the original axis' point j
        return C.usage_live(lo.live_mask & (lo.lo <= j) & (lo.hi > j))

    def copy_saved(x, j):                 # Σ over members of their single-node copy savings
        return np.bincount(C.cflat, weights=moves.saved_at(orig(x), int(lo.times[j]))[oflat], minlength=size)

    return _shave(gc, sc, lambda x: lo.profile(orig(x)), usage_at, float(p.usage_limit), max_rounds,
                  time.perf_counter() + float(time_limit_s), batch=True, copy_saved=copy_saved)
