"""Planning with a trained policy: decode, keep the cheapest feasible of K plans, polish.

``Planner.load("pretrained" | path)`` reads a checkpoint (agent/checkpoints.py);
``plan(problem, mode, samples, memory_cap_bytes, polish, seed)`` decodes ``samples`` plans
(greedy = argmax; sample = draws from π), repairs memory if needed, optionally polishes each by
local search, and returns the cheapest feasible one under ``costmodel.problem.evaluate``.

Fast decoding. Stepping the GNN once per node would cost N forwards; instead the GNN embeds the
whole graph once every ``refresh`` decisions (refresh = max(1, ⌈N / max_passes⌉), so at most
``max_passes`` forwards), and between passes each decision uses the last node embeddings with the
*current* action features from the env's incremental state (resharding to decided neighbours,
peak rise, ...), scored by the policy head in numpy. With ``refresh=1`` this is exactly the
policy the env trains (small problems use that); with larger ``refresh`` the embeddings lag by
at most refresh−1 decisions, an approximation.

Local search (``polish``): iterated best response. Each node's local cost for strategy s is
c_i(s) + Σ_(i,v) E[s, s_v] + Σ_(u,i) E[s_u, s]; every round computes all of them vectorised, and
moves a set of improving nodes no two of which share an edge (each moves iff its gain beats all
its neighbours'), so the total falls by exactly the sum of their gains. Moves that would break the
memory cap are dropped (only usage-non-increasing moves are kept when the batch is infeasible).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from costmodel.problem import Problem, evaluate

PRETRAINED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained", "policy.msgpack")


# ---- vectorised local costs ----------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LocalCosts:
    """Index arrays to compute every strategy's local cost for a plan in O(S + Σ_e (k_u + k_v))."""

    problem: Problem
    node_of: np.ndarray      # flat strategy -> node
    static: np.ndarray       # node cost + self-loop diagonal, per flat strategy
    r_tgt: np.ndarray        # row entries: target flat strategy of the producer
    r_base: np.ndarray       # edge_costs index without the consumer's strategy
    r_other: np.ndarray      # the consumer node
    c_tgt: np.ndarray
    c_base: np.ndarray
    c_other: np.ndarray      # the producer node
    c_mult: np.ndarray       # k_v: stride of the producer's strategy
    usage: np.ndarray        # per flat strategy; 0 for nodes with an empty interval
    nbr_u: np.ndarray        # edges without self-loops
    nbr_v: np.ndarray

    @classmethod
    def of(cls, p: Problem) -> LocalCosts:
        k = p.num_strategies
        off = p.strategy_offsets
        node_of = np.repeat(np.arange(p.num_nodes), k)
        static = p.node_costs.astype(np.float64).copy()
        u, v = (p.edges[:, 0], p.edges[:, 1]) if p.num_edges else (np.zeros(0, int), np.zeros(0, int))
        loop = u == v
        for e in np.nonzero(loop)[0]:
            static[p.node_slice(int(u[e]))] += np.diagonal(p.edge_matrix(int(e)))
        es = np.nonzero(~loop)[0]
        ku, kv = k[u[es]], k[v[es]]
        # rows: for each edge e and producer strategy s
        r_e = np.repeat(es, ku)
        r_s = np.arange(len(r_e)) - np.repeat(np.cumsum(ku) - ku, ku)
        r_tgt = off[u[r_e]] + r_s
        r_base = p.edge_offsets[r_e] + r_s * k[v[r_e]]
        c_e = np.repeat(es, kv)
        c_t = np.arange(len(c_e)) - np.repeat(np.cumsum(kv) - kv, kv)
        c_tgt = off[v[c_e]] + c_t
        c_base = p.edge_offsets[c_e] + c_t
        live = (p.intervals[:, 1] > p.intervals[:, 0])[node_of]
        return cls(p, node_of, static, r_tgt, r_base, v[r_e], c_tgt, c_base, u[c_e], k[v[c_e]],
                   np.where(live, p.node_usages, 0.0), u[es], v[es])

    def local(self, plan: np.ndarray) -> np.ndarray:
        """Per flat strategy: node cost + resharding to the neighbours' strategies in ``plan``."""
        p = self.problem
        S = len(self.static)
        tot = self.static.copy()
        if len(self.r_tgt):
            tot += np.bincount(self.r_tgt, p.edge_costs[self.r_base + plan[self.r_other]], minlength=S)
            tot += np.bincount(self.c_tgt, p.edge_costs[self.c_base + plan[self.c_other] * self.c_mult], minlength=S)
        return tot

    def best(self, tot: np.ndarray) -> np.ndarray:
        """First argmin strategy of each node's segment of ``tot``."""
        off = self.problem.strategy_offsets
        mins = np.minimum.reduceat(tot, off[:-1])
        idx = np.where(tot <= mins[self.node_of], np.arange(len(tot)), len(tot))
        return np.minimum.reduceat(idx, off[:-1]) - off[:-1]


def polish(problem: Problem, plan, time_budget_s: float = 1.0, max_rounds: int = 10_000,
           lc: LocalCosts | None = None) -> list[int]:
    """Iterated best response (see module docstring); never makes a plan worse or infeasible."""
    lc = lc or LocalCosts.of(problem)
    plan = np.asarray(plan, dtype=np.int64).copy()
    off = problem.strategy_offsets
    n = problem.num_nodes
    limit = problem.usage_limit
    t0 = time.perf_counter()
    prio_base = np.arange(n)
    for _ in range(max_rounds):
        if time.perf_counter() - t0 > time_budget_s:
            break
        tot = lc.local(plan)
        cur_flat = off[:-1] + plan
        cur = tot[cur_flat]
        best = lc.best(tot)
        gain = cur - tot[off[:-1] + best]
        scale = max(float(np.abs(cur).max()), 1e-30)
        cand = gain > 1e-12 * scale
        if not cand.any():
            break
        # priority by gain (ties: lower index first); a node moves iff it beats all its neighbours
        order = np.lexsort((-prio_base, gain))
        prio = np.empty(n, np.int64)
        prio[order] = np.arange(n)
        prio = np.where(cand, prio, -1)
        nb = np.full(n, -1, np.int64)
        np.maximum.at(nb, lc.nbr_u, prio[lc.nbr_v])
        np.maximum.at(nb, lc.nbr_v, prio[lc.nbr_u])
        move = cand & (prio > nb)
        new = plan.copy()
        new[move] = best[move]
        if limit is not None and not evaluate(problem, new).feasible:
            safe = move & (lc.usage[off[:-1] + best] <= lc.usage[cur_flat])
            if not safe.any():
                # best moves all raise memory: retry restricted to non-increasing usage strategies
                tot2 = np.where(lc.usage <= lc.usage[cur_flat][lc.node_of], tot, np.inf)
                best2 = lc.best(tot2)
                gain2 = cur - tot2[off[:-1] + best2]
                cand2 = gain2 > 1e-12 * scale
                if not cand2.any():
                    break
                prio2 = np.where(cand2, prio, -1)
                nb2 = np.full(n, -1, np.int64)
                np.maximum.at(nb2, lc.nbr_u, prio2[lc.nbr_v])
                np.maximum.at(nb2, lc.nbr_v, prio2[lc.nbr_u])
                safe = cand2 & (prio2 > nb2)
                if not safe.any():
                    break
                best = best2
            new = plan.copy()
            new[safe] = best[safe]
        plan = new
    return [int(x) for x in plan]


def repair_memory(problem: Problem, plan, lc: LocalCosts | None = None, max_moves: int | None = None) -> list[int] | None:
    """Make a plan feasible under the usage limit by repeatedly switching, among the nodes live
    at the peak, the strategy with the least cost increase per byte saved. None if it fails."""
    plan = np.asarray(plan, dtype=np.int64).copy()
    limit = problem.usage_limit
    if limit is None or evaluate(problem, plan).feasible:
        return [int(x) for x in plan]
    lc = lc or LocalCosts.of(problem)
    off = problem.strategy_offsets
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    for _ in range(max_moves or 4 * problem.num_nodes):
        usage = lc.usage[off[:-1] + plan]
        from costmodel.problem import usage_profile
        times, live = usage_profile(problem, usage)
        j = int(np.argmax(live))
        if live[j] <= limit:
            return [int(x) for x in plan]
        t = times[j]
        alive = (st <= t) & (t < en)
        tot = lc.local(plan)
        cur_flat = off[:-1] + plan
        saved = lc.usage[cur_flat][lc.node_of] - lc.usage
        dcost = tot - tot[cur_flat][lc.node_of]
        ok = alive[lc.node_of] & (saved > 0)
        if not ok.any():
            return None
        score = np.where(ok, np.maximum(dcost, 0) / np.where(ok, saved, 1) - 1e-30 * saved, np.inf)
        f = int(np.argmin(score))
        i = int(lc.node_of[f])
        plan[i] = f - off[i]
    return [int(x) for x in plan] if evaluate(problem, plan).feasible else None


def min_memory_plan(problem: Problem) -> list[int]:
    """Each node's least-usage strategy (ties: least node cost): the plan of least peak memory."""
    lc = LocalCosts.of(problem)
    u = lc.usage
    scale = max(float(np.abs(problem.node_costs).max()), 1e-30)
    key = u + 1e-9 * max(float(u.max()), 1.0) * (problem.node_costs / scale)
    return [int(x) for x in lc.best(key)]


def decision_order(problem: Problem) -> np.ndarray:
    """Topological order of the nodes (Kahn, ties by index); nodes on cycles last, by index."""
    n = problem.num_nodes
    if not problem.num_edges:
        return np.arange(n)
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    keep = u != v
    indeg = np.bincount(v[keep], minlength=n)
    order_e = np.argsort(u[keep], kind="stable")
    uu, vv = u[keep][order_e], v[keep][order_e]
    start = np.searchsorted(uu, np.arange(n + 1))
    import heapq
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(i)
        for w in vv[start[i]:start[i + 1]]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, int(w))
    if len(out) < n:
        seen = np.zeros(n, bool)
        seen[out] = True
        out.extend(np.nonzero(~seen)[0].tolist())
    return np.asarray(out)


def greedy_by_cost(problem: Problem, order=None) -> list[int]:
    """Baseline: in decision order, each node takes the strategy minimising its node cost plus
    resharding to the neighbours already decided (no look-ahead, memory ignored)."""
    order = decision_order(problem) if order is None else order
    n = problem.num_nodes
    k = problem.num_strategies
    adj: list[list[tuple[int, int, bool]]] = [[] for _ in range(n)]
    for e, (u, v) in enumerate(problem.edges.tolist()):
        adj[u].append((e, v, True))
        if u != v:
            adj[v].append((e, u, False))
    plan = np.full(n, -1, np.int64)
    for i in order:
        i = int(i)
        c = problem.node_costs[problem.node_slice(i)].astype(np.float64).copy()
        for e, w, i_is_src in adj[i]:
            if w == i:
                c += np.diagonal(problem.edge_matrix(e))
            elif plan[w] >= 0:
                m = problem.edge_matrix(e)
                c += m[:, plan[w]] if i_is_src else m[plan[w], :]
        plan[i] = int(np.argmin(c))
    del k
    return [int(x) for x in plan]
