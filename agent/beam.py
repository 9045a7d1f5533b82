"""The no-RL baseline: beam search over the env's decision order with the cost model's incremental cost.

Nodes are decided in ``env.sharding_env.decision_order`` (the order the env and the policy walk).
A beam holds up to ``width`` partial plans; deciding node i with strategy s extends a partial plan
at the incremental cost the env charges with its default (time-only) weights:

    Δ(s) = c_i[s] + Σ_{edges e = (i, j) or (j, i), j decided} E_e[s, s_j]   (+ E_e[s, s] for a self-loop)

so a complete plan's score is exactly ``costmodel.problem.evaluate(problem, plan).total`` (up to
float summation order). All B x k_i extensions are scored at once (numpy, one gather per incident
edge), and the ``width`` cheapest that can still meet the memory cap survive (ties: lower score
first, then beam rank, then strategy index, so results are deterministic).

Memory feasibility is exact pruning, as the env's memory mask: per beam we keep the lower bound
    lb(t) = Σ_{decided j live at t} u_j[s_j] + Σ_{undecided j live at t} min_s u_j[s]
on the grid of interval endpoints; an extension is kept only if lb stays ≤ cap over node i's
interval. Since the final live profile equals lb once every node is decided, every complete plan
is feasible, and a pruned prefix has no feasible completion. Hence:

* a width ≥ the number of complete plans (Π_i k_i) keeps every feasible prefix: the result is optimal;
* width 1 without a cap is greedy-by-cost (``agent.planner.greedy_by_cost``): each node in the
  decision order takes its least node + resharding cost to decided neighbours, ties to the lowest index.

``time_budget_s``: when the budget is spent mid-search the beam shrinks to its best partial plan
and finishes greedily (width 1), so a complete plan always comes back. Objectives other than time
(memory, redundancy weights) are not searched: the memory cap is the only memory term.
Costs ≥ 1e15 (IOPDDL's "impossible") are ordinary costs here, so they are avoided whenever the
beam holds an alternative.
"""
from __future__ import annotations

import math
import time

import numpy as np

from costmodel.problem import Problem, evaluate


def _incident(problem: Problem):
    """Per node, a list of (edge, other end, node_is_producer); a self-loop appears once."""
    inc: list[list[tuple[int, int, bool]]] = [[] for _ in range(problem.num_nodes)]
    for e, (u, v) in enumerate(problem.edges.tolist()):
        inc[u].append((e, v, True))
        if u != v:
            inc[v].append((e, u, False))
    return inc


def beam_search(problem: Problem, width: int = 8, memory_cap_bytes: float | None = None,
                time_budget_s: float | None = None, return_info: bool = False):
    """The cheapest complete plan (list of strategy indices) a beam of ``width`` finds; see the
    module docstring. ``memory_cap_bytes`` overrides ``problem.usage_limit`` (None: use the
    problem's own). Raises ValueError for a width < 1 or a cap no plan can meet. With
    ``return_info``, returns (plan, info) with the plan's cost, the search time and whether the
    time budget cut the beam."""
    if not isinstance(width, (int, np.integer)) or isinstance(width, bool) or width < 1:
        raise ValueError(f"beam width must be an integer >= 1, got {width!r}")
    if time_budget_s is not None and not (time_budget_s >= 0):
        raise ValueError(f"time_budget_s must be >= 0 or None, got {time_budget_s!r}")
    from env.sharding_env import decision_order

    t0 = time.perf_counter()
    p = problem if memory_cap_bytes is None else problem.with_usage_limit(float(memory_cap_bytes))
    cap = p.usage_limit
    cap = None if cap is None or not math.isfinite(cap) else float(cap)
    n = p.num_nodes
    k = p.num_strategies.astype(np.int64)
    offs = p.strategy_offsets
    order = decision_order(p)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    inc = _incident(p)

    # memory lower-bound profile on the grid of interval endpoints
    st, en = p.intervals[:, 0], p.intervals[:, 1]
    live_iv = en > st
    if cap is not None:
        umin = np.minimum.reduceat(p.node_usages, offs[:-1]) if n else np.zeros(0)
        grid = np.unique(np.concatenate([st[live_iv], en[live_iv]])) if live_iv.any() else np.zeros(1, np.int64)
        lo = np.where(live_iv, np.searchsorted(grid, st), 0)
        hi = np.where(live_iv, np.searchsorted(grid, en), 0)
        base = np.zeros(len(grid) + 1)
        np.add.at(base, lo[live_iv], umin[live_iv])
        np.add.at(base, hi[live_iv], -umin[live_iv])
        base = np.cumsum(base)[:len(grid)]
        if base.max() > cap:
            raise ValueError(f"no plan of {p.name!r} fits the memory cap {cap:.6g} bytes: the least "
                             f"possible peak is {base.max():.6g} bytes; raise memory_cap_bytes")
        lb = base[None, :].copy()                  # (B, G)
    plans = np.full((1, n), -1, np.int64)          # (B, n); -1 = undecided
    score = np.zeros(1)
    truncated = False
    for i in order.tolist():
        if time_budget_s is not None and not truncated and len(score) > 1 \
                and time.perf_counter() - t0 > time_budget_s:
            best = int(np.argmin(score))
            plans, score = plans[best:best + 1], score[best:best + 1]
            if cap is not None:
                lb = lb[best:best + 1]
            truncated = True
        w = 1 if truncated else width
        ki = int(k[i])
        B = len(score)
        incr = np.broadcast_to(p.node_costs[offs[i]:offs[i + 1]], (B, ki)).copy()
        for e, j, i_src in inc[i]:
            if j == i:                             # self-loop: the diagonal
                incr += np.diagonal(p.edge_matrix(e))[None, :]
            elif rank[j] < rank[i]:                # j decided already in every beam
                m = p.edge_matrix(e)
                sj = plans[:, j]
                incr += m[:, sj].T if i_src else m[sj, :]
        cand = score[:, None] + incr               # (B, ki)
        if cap is not None and live_iv[i]:
            top = lb[:, lo[i]:hi[i]].max(axis=1)   # (B,)
            delta = p.node_usages[offs[i]:offs[i + 1]] - umin[i]
            ok = top[:, None] + delta[None, :] <= cap
            cand = np.where(ok, cand, np.inf)
        flat = cand.ravel()
        nkeep = min(w, int(np.isfinite(flat).sum()) or 1)
        pick = np.argsort(flat, kind="stable")[:nkeep]
        if not np.isfinite(flat[pick[0]]):
            raise ValueError(f"beam search found no feasible strategy for node {i} of {p.name!r}")  # pragma: no cover
        b, s = np.divmod(pick, ki)
        plans = plans[b]
        plans[:, i] = s
        score = flat[pick]
        if cap is not None:
            lb = lb[b]
            if live_iv[i]:
                lb[:, lo[i]:hi[i]] += (p.node_usages[offs[i] + s] - umin[i])[:, None]
    # pick the cheapest beam that evaluate() confirms feasible (guards float summation order)
    chosen, cost = None, None
    for b in np.argsort(score, kind="stable"):
        c = evaluate(p, plans[b])
        if c.feasible:
            chosen, cost = plans[b], c
            break
    if chosen is None:  # pragma: no cover - only on rounding at the exact cap
        raise ValueError(f"beam search found no feasible plan of {p.name!r} under cap {cap}")
    out = [int(x) for x in chosen]
    if return_info:
        return out, {"total": cost.total, "peak_memory_bytes": cost.peak_memory_bytes, "feasible": cost.feasible,
                     "width": int(width), "truncated": truncated, "search_time_s": time.perf_counter() - t0}
    return out
