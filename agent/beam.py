"""The no-RL baseline: beam search over the env's decision order with the cost model's incremental cost.

Nodes are decided in ``solvers.local.decision_order`` (the order the env and the policy walk).
A beam holds up to ``width`` partial plans; deciding node i with strategy s extends a partial plan
at the incremental cost the env charges with its default (time-only) weights:

    Δ(s) = (c_i[s] + Σ_{edges e = (i, j) or (j, i), j decided} E_e[s, s_j]) + E_e[s, s] for a self-loop

with the edges summed in decision order of j, exactly as ``solvers.local.greedy_by_cost`` sums them,
so a complete plan's score is ``costmodel.problem.evaluate(problem, plan).total`` (up to float
summation order). All B x k_i extensions are scored at once (numpy, one gather per incident edge),
and the ``width`` cheapest that can still meet the memory cap survive (ties: lower score first,
then lower Δ, then beam rank, then strategy index, so results are deterministic).

Memory feasibility is exact pruning, as the env's memory mask: per beam we keep the lower bound
    lb(t) = Σ_{decided j live at t} u_j[s_j] + Σ_{undecided j live at t} min_s u_j[s]
on the grid of interval endpoints; an extension is kept only if lb stays ≤ cap over node i's
interval. Since the final live profile equals lb once every node is decided, every complete plan
is feasible, and a pruned prefix has no feasible completion (on problems without resharded
copies: with ``Problem.edge_memory`` the bound counts node usages only, the cheapest beam that
fits with its copies by ``evaluate`` is returned, else the first that ``solvers.local.repair_memory``
makes fit, and the optimality below holds only without copies). Hence:

* a width ≥ the number of complete plans (Π_i k_i) keeps every feasible prefix: the result is optimal;
* width 1 without a cap is greedy-by-cost (``solvers.local.greedy_by_cost``), plan for plan, on any
  graph (IOPDDL's cycles too): the same order, the same sums, and Δ breaks score ties.

``time_limit_s``: when the budget is spent mid-search the beam shrinks to its best partial plan
and finishes greedily (width 1), so a complete plan always comes back. Objectives other than time
(memory, redundancy weights) are not searched: the memory cap is the only memory term.
Costs ≥ ``FORBIDDEN_COST`` (IOPDDL's "impossible") are ordinary costs here, so they are avoided whenever the
beam holds an alternative.
"""
from __future__ import annotations

import math
import time

import numpy as np

from costmodel.limits import Limits
from costmodel.problem import Problem, evaluate
from costmodel.profile import step_sum
from solvers.local import decision_order, fit_with_copies, incidence


def _decided_edges(problem: Problem, rank: np.ndarray) -> list[list[tuple[int, int, bool]]]:
    """Per node i, its (edge, neighbour j, i is the producer) with j decided before i, in the order
    ``greedy_by_cost`` adds them: by rank of j, then j's incidence order; self-loops apart."""
    ptr, eid, nbr, src = incidence(problem)
    n = problem.num_nodes
    owner = np.repeat(np.arange(n), np.diff(ptr))
    mate = {(int(owner[q]), int(eid[q])): q for q in range(len(eid))}
    out: list[list] = [[] for _ in range(n)]
    for q in range(len(eid)):
        i, j, e = int(owner[q]), int(nbr[q]), int(eid[q])
        if j != i and rank[j] < rank[i]:
            out[i].append((int(rank[j]), mate[(j, e)], e, j, bool(src[q])))
    return [[(e, j, s) for _, _, e, j, s in sorted(lst)] for lst in out]


def beam_search(problem: Problem, width: int = 8, memory_cap_bytes: float | None = None,
                time_limit_s: float | None = None, return_info: bool = False):
    """The cheapest complete plan (list of strategy indices) a beam of ``width`` finds; see the
    module docstring. ``memory_cap_bytes`` tightens ``problem.usage_limit`` to the smaller of the
    two (``costmodel.limits.Limits``; None: the problem's own). Raises ValueError for a width < 1 or
    a cap no plan can meet. With ``return_info``, returns (plan, info) with the plan's cost, the search time and whether the
    time budget cut the beam."""
    if not isinstance(width, (int, np.integer)) or isinstance(width, bool) or width < 1:
        raise ValueError(f"beam width must be an integer >= 1, got {width!r}")
    if time_limit_s is not None and not (time_limit_s >= 0):
        raise ValueError(f"time_limit_s must be >= 0 or None, got {time_limit_s!r}")
    t0 = time.perf_counter()
    p = Limits.of(memory_cap_bytes=memory_cap_bytes).apply(problem)
    cap = p.usage_limit
    cap = None if cap is None or not math.isfinite(cap) else float(cap)
    n = p.num_nodes
    k = p.num_strategies.astype(np.int64)
    offs = p.strategy_offsets
    order = decision_order(p)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    inc = _decided_edges(p, rank)
    loop_of: dict = {}
    for e in np.nonzero(p.edges[:, 0] == p.edges[:, 1])[0].tolist():
        loop_of.setdefault(int(p.edges[e, 0]), []).append(int(e))

    # memory lower-bound profile on the grid of interval endpoints
    st, en = p.intervals[:, 0], p.intervals[:, 1]
    live_iv = en > st
    if cap is not None:
        umin = np.minimum.reduceat(p.node_usages, offs[:-1]) if n else np.zeros(0)
        grid = np.unique(np.concatenate([st[live_iv], en[live_iv]])) if live_iv.any() else np.zeros(1, np.int64)
        lo = np.where(live_iv, np.searchsorted(grid, st), 0)
        hi = np.where(live_iv, np.searchsorted(grid, en), 0)
        base = step_sum(lo[live_iv], hi[live_iv], umin[live_iv], len(grid))
        if base.max() > cap:
            raise ValueError(f"no plan of {p.name!r} fits the memory cap {cap:.6g} bytes: the least "
                             f"possible peak is {base.max():.6g} bytes; raise memory_cap_bytes")
        lb = base[None, :].copy()                  # (B, G)
    plans = np.full((1, n), -1, np.int64)          # (B, n); -1 = undecided
    score = np.zeros(1)
    truncated = False
    for i in order.tolist():
        if time_limit_s is not None and not truncated and len(score) > 1 \
                and time.perf_counter() - t0 > time_limit_s:
            best = int(np.argmin(score))
            plans, score = plans[best:best + 1], score[best:best + 1]
            if cap is not None:
                lb = lb[best:best + 1]
            truncated = True
        w = 1 if truncated else width
        ki = int(k[i])
        B = len(score)
        acc = np.zeros((B, ki))
        for e, j, i_src in inc[i]:                 # j decided already in every beam
            m = p.edge_matrix(e)
            sj = plans[:, j]
            acc += m[:, sj].T if i_src else m[sj, :]
        incr = p.node_costs[offs[i]:offs[i + 1]][None, :] + acc
        for e in loop_of.get(i, ()):               # self-loop: the diagonal
            incr = incr + np.diagonal(p.edge_matrix(e))[None, :]
        cand = score[:, None] + incr               # (B, ki)
        if cap is not None and live_iv[i]:
            top = lb[:, lo[i]:hi[i]].max(axis=1)   # (B,)
            delta = p.node_usages[offs[i]:offs[i + 1]] - umin[i]
            ok = top[:, None] + delta[None, :] <= cap
            cand = np.where(ok, cand, np.inf)
        flat = cand.ravel()
        nkeep = min(w, int(np.isfinite(flat).sum()) or 1)
        pick = np.lexsort((np.arange(len(flat)), incr.ravel(), flat))[:nkeep]
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
    if chosen is None and p.edge_memory is not None:   # the beam's bound sees node usages, not copies
        for b in np.argsort(score, kind="stable"):
            fit = fit_with_copies(p, plans[b])
            if fit is not None:
                chosen, cost = np.asarray(fit), evaluate(p, fit)
                break
    if chosen is None:  # pragma: no cover - only on rounding at the exact cap, or copies no repair fits
        raise ValueError(f"beam search found no feasible plan of {p.name!r} under cap {cap}")
    out = [int(x) for x in chosen]
    if return_info:
        return out, {"total": cost.total, "peak_memory_bytes": cost.peak_memory_bytes, "feasible": cost.feasible,
                     "width": int(width), "truncated": truncated, "search_time_s": time.perf_counter() - t0}
    return out
