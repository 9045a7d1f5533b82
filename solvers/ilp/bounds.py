"""Exact facts about plans that need no solver, used before and around every model: least-usage
and the least-usage plan's peak (``min_usage``, on ``solvers.local.least_usage_plan``), lower and upper bounds on the peak
(``node_min_peak``, ``peak_upper_bound``), the exact tightening of the memory part
(``tighten``), and the choice among caller seeds (``check_seeds``, ``best_seed``).

Exact tightening before every model with memory in it (``tighten``): a strategy that breaks the
cap on its own (every other node at its least usage) is dropped; a memory row at time t is kept
only if the live usage with every node at its largest remaining usage can exceed the cap (or,
for the peak variable M, a proven lower bound on M); nodes with no kept row in their interval
are memory-free and go through the reductions like nodes without memory (dominance, leaf/chain
elimination). On gpt tiny / cpu-2x4 at the minimum peak: 7,460 -> 3,800 strategies, 483 -> 80
rows, 626 -> 241 free nodes.
"""
from __future__ import annotations

import numpy as np

from costmodel.problem import Problem, as_strategy_array, evaluate, fits, usage_profile
from solvers.local import least_usage_plan


def check_seeds(problem: Problem, seeds) -> list[list[int]]:
    """Caller seeds (strategy lists or Plans) as lists of ints; ValueError naming a bad one."""
    out = []
    for s in seeds:
        s = getattr(s, "strategies", s)   # a Plan works too
        try:
            arr = as_strategy_array(problem, s)
        except Exception as e:  # noqa: BLE001 - PlanError or a shape error
            raise ValueError(f"initial_plan(s): not a plan of {problem.name!r}: {e}") from e
        out.append([int(x) for x in arr])
    return out


def minmax(problem: Problem, vals: np.ndarray, allowed: np.ndarray | None = None):
    """Per-node min and max of ``vals`` (one entry per strategy) over the allowed strategies."""
    offs = problem.strategy_offsets[:-1]
    if allowed is None:
        return np.minimum.reduceat(vals, offs), np.maximum.reduceat(vals, offs)
    return (np.minimum.reduceat(np.where(allowed, vals, np.inf), offs),
            np.maximum.reduceat(np.where(allowed, vals, -np.inf), offs))


def min_usage(problem: Problem):
    """(the plan giving every node its least usage, its peak = the lowest peak of any plan).
    Usage is per node and the live profile a sum over nodes, so this plan minimises the live
    usage at every time point at once: its peak is the memory optimum (without a time bound)."""
    plan = least_usage_plan(problem)
    return plan, evaluate(problem, plan).peak_memory_bytes


def range_min(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min(a[lo[i]:hi[i]]) for every i (inf where the range is empty): a sparse table."""
    out = np.full(len(lo), np.inf)
    ok = hi > lo
    if not len(a) or not ok.any():
        return out
    table = [np.asarray(a, dtype=np.float64)]
    j = 1
    while 2 * j <= len(a):
        prev = table[-1]
        table.append(np.minimum(prev[:-j], prev[j:]))
        j *= 2
    length = np.where(ok, hi - lo, 1)
    lev = np.floor(np.log2(length)).astype(np.int64)
    for lv in np.unique(lev[ok]):
        idx = ok & (lev == lv)
        t = table[lv]
        out[idx] = np.minimum(t[lo[idx]], t[hi[idx] - (1 << int(lv))])
    return out


def tighten(problem: Problem, allowed, prune_cap, row_level):
    """Exact tightening of the memory part. Returns (allowed, memory_free, row_times).

    * Strategy pruning (``prune_cap``): with every other node at its least usage, node i's
      strategy s raises the live usage at each of i's time points t to lmin(t) + u_s - umin_i; if
      that exceeds the cap at some t, no plan within the cap uses s.
    * Rows (``row_level``): with every node at its largest remaining usage the live usage at t is
      lmax(t); a row at t with lmax(t) <= row_level can never bind (for a cap row_level = cap; for
      the peak variable M, row_level = a proven lower bound on M). Only the others are kept.
    * Nodes with no kept row in their interval are memory-free: their usage cannot matter, so the
      reductions may treat them like nodes without memory (dominance, leaf/chain elimination).
    """
    k = problem.num_strategies
    n = problem.num_nodes
    node_of = np.repeat(np.arange(n), k)
    use = problem.node_usages
    allowed = np.ones(len(use), dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool).copy()
    umin, _ = minmax(problem, use, allowed)
    em = problem.edge_memory   # copies only add memory: lmin stays a lower bound; lmax gets them all
    ts, lmin = usage_profile(problem, umin, times_too=None if em is None else em.time_points())
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    live = en > st
    lo = np.where(live, np.searchsorted(ts, st, side="left"), 0)
    hi = np.where(live, np.searchsorted(ts, en, side="left"), 0)
    if prune_cap is not None:
        ms = range_min(prune_cap - lmin, lo, hi)
        tol = 1e-9 * max(abs(float(prune_cap)), 1.0)
        drop = allowed & ((use - umin[node_of]) > ms[node_of] + tol)
        keep = allowed & ~drop
        empty = np.add.reduceat(keep.astype(np.int64), problem.strategy_offsets[:-1]) == 0
        keep |= allowed & np.repeat(empty, k)   # cap below this node's least usage: infeasible anyway
        allowed = keep
    _, umax = minmax(problem, use, allowed)
    _, lmax = usage_profile(problem, umax, times_too=None if em is None else em.time_points())
    if em is not None:
        lmax = lmax + em.upper_profile(ts)
    if row_level is None:
        bind = np.ones(len(ts), dtype=bool)
    else:
        bind = lmax > row_level
    cb = np.concatenate([[0], np.cumsum(bind)])
    free = ((cb[hi] - cb[lo]) == 0) | (umax <= umin) | ~live
    if em is not None:
        free &= ~em.involved(n)
    return allowed, free, ts[bind]


def best_seed(problem, seeds, cap, max_time, key):
    """The seed with the least ``key(cost)`` among those within ``cap`` and ``max_time`` (None if none)."""
    best, best_key = None, None
    for s in seeds:
        c = evaluate(problem, s)
        if not fits(c.peak_memory_bytes, cap) or (max_time is not None and c.total > max_time):
            continue
        kk = key(c)
        if best_key is None or kk < best_key:
            best, best_key = s, kk
    return best


def step_time_floor(problem: Problem) -> float:
    """Each node's cheapest strategy plus each edge's cheapest resharding entry (seconds): a lower
    bound on every plan's step time (``evaluate``'s total, node + edge costs), exact where the
    cheapest choices agree."""
    k = problem.num_strategies
    nodes = float(np.minimum.reduceat(problem.node_costs, problem.strategy_offsets[:-1]).sum()) if len(k) else 0.0
    eo = problem.edge_offsets
    keep = eo[1:] > eo[:-1]
    edges = float(np.minimum.reduceat(problem.edge_costs, eo[:-1][keep]).sum()) if keep.any() else 0.0
    return nodes + edges


def node_min_peak(problem: Problem) -> float:
    """The peak of the least node usages without the copies: a lower bound on every plan's peak
    (copies only add memory); the optimum when the problem has no edge memory."""
    umin = np.minimum.reduceat(problem.node_usages, problem.strategy_offsets[:-1])
    return float(max(usage_profile(problem, umin)[1].max(), 0.0))



def peak_upper_bound(problem: Problem) -> float:
    """The peak of the profile where every node holds its largest usage: no plan's live usage
    exceeds it at any time point, so a cap at or above it never binds."""
    k = problem.num_strategies
    big = np.maximum.reduceat(problem.node_usages, problem.strategy_offsets[:-1]) if len(k) else np.zeros(0)
    em = problem.edge_memory
    ts, live = usage_profile(problem, big, times_too=None if em is None else em.time_points())
    if em is not None:
        live = live + em.upper_profile(ts)
    return float(live.max()) if len(live) else 0.0

