"""Memory repair: the one "cheapest cost per byte saved at the worst point" repair.

``repair_memory(problem, plan)`` makes a plan fit ``problem.usage_limit``: while the live profile
(node usages + live copies, ``LocalCosts.profile``) is over the limit, take its highest point j and
switch, among the nodes live at j, the strategy with the least cost increase per byte it saves at
j (local costs, neighbours fixed; ties to more bytes saved). None if no move saves bytes at j or
the moves run out (``max_moves``, default 4 n) or the time (``time_limit_s``).

``repair_tied(C, gc, sc)`` is the same repair over the components of a permutation contraction
(``solvers.local.prune.Contraction``; the large-instance driver and ``solvers.cfn`` work there):
variables are components, a component strategy's bytes at j are its members' (``C.usage_at``), and
each round moves, cheapest first, distinct components until j's excess is covered (a move can raise
other points; later rounds see that). Greedy: it may fail where a plan exists.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.local.costs import LocalCosts


def _shave(lc: LocalCosts, x: np.ndarray, profile, usage_at, cap: float, max_rounds: int,
           deadline: float | None, batch: bool) -> np.ndarray | None:
    """The repair loop over the variables of ``lc`` (see the module docstring)."""
    x = np.asarray(x, dtype=np.int64).copy()
    off = lc.offs
    for _ in range(max_rounds):
        live = profile(x)
        j = int(np.argmax(live))
        excess = float(live[j]) - cap
        if excess <= 0:
            return x
        if deadline is not None and time.perf_counter() > deadline:
            return None
        uj = usage_at(j)
        L = lc.local(x)
        cur = off[:-1] + x
        saved = uj[cur][lc.node_of] - uj
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
    return x if profile(x).max(initial=0.0) <= cap else None


def repair_memory(problem: Problem, plan, lc: LocalCosts | None = None, max_moves: int | None = None,
                  time_limit_s: float | None = None) -> list[int] | None:
    """``plan`` made to fit the usage limit (see the module docstring), or None."""
    plan = np.asarray(plan, dtype=np.int64)
    limit = problem.usage_limit
    if limit is None or evaluate(problem, plan).feasible:
        return [int(x) for x in plan]
    lc = lc or LocalCosts(problem)
    deadline = None if time_limit_s is None else time.perf_counter() + float(time_limit_s)
    out = _shave(lc, plan, lc.profile, lc.usage_at, float(limit), max_moves or 4 * problem.num_nodes,
                 deadline, batch=False)
    return None if out is None or not evaluate(problem, out).feasible else [int(x) for x in out]


def repair_tied(C, gc: LocalCosts, sc: np.ndarray, time_limit_s: float, max_rounds: int = 200) -> np.ndarray | None:
    """A component plan of contraction ``C`` (component graph ``gc``) that fits, or None."""
    g = C.g
    if g.cap is None:
        return sc
    return _shave(gc, sc, lambda x: g.profile(C.expand(x)), C.usage_at, float(g.cap), max_rounds,
                  time.perf_counter() + float(time_limit_s), batch=True)
