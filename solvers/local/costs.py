"""The one local-cost engine and the one adjacency builder of the local-search library.

* ``incidence(problem)``: CSR incidence, for node i the entries ptr[i]:ptr[i+1] give (edge,
  neighbour, i_is_producer); a self-loop appears once (as producer). Every node-by-node walk
  (greedy construction, one node's local cost, forest moves, BFS neighbourhoods, the env) uses it.
* ``LocalCosts(problem)`` (also ``LocalCosts.of``): index arrays over a Problem's flat strategy
  space, built once, so that for a plan s

      L[flat(i, a)] = c_i[a] + Σ_{e=(i,v)} E_e[a, s_v] + Σ_{e=(u,i)} E_e[s_u, a]   (+ E_e[a, a] for a self-loop)

  comes out for every strategy at once in O(S + Σ_e (k_u + k_v)) (``local``), or for one node
  (``node_local``; ``decided=True`` counts only neighbours with s_j >= 0, greedy's view). The node
  costs may be replaced (``node_cost``: Lagrangian prices, penalties). ``seg_argmin`` is each
  node's first cheapest strategy. The compressed time axis (every interval end point and every
  copy step of ``Problem.edge_memory``) carries the plan's live profile (``profile``, through
  ``costmodel.profile``) and Lagrangian prices (``interval_sums``).
"""
from __future__ import annotations

import numpy as np

from costmodel.problem import Problem, evaluate
from costmodel.profile import live_on, starts, step_sum  # starts: re-exported for the solvers


def incidence(problem: Problem):
    """(ptr, edge, neighbour, i_is_producer): node i's incident edges at ptr[i]:ptr[i+1], in edge
    order with the edges it produces first... as a stable sort by node of [producer ends, consumer
    ends]; a self-loop appears once (as producer)."""
    n, m = problem.num_nodes, problem.num_edges
    if m == 0:
        z = np.zeros(0, np.int64)
        return np.zeros(n + 1, np.int64), z, z, np.zeros(0, bool)
    e = np.arange(m)
    u, v = problem.edges[:, 0].astype(np.int64), problem.edges[:, 1].astype(np.int64)
    loop = u == v
    node = np.concatenate([u, v[~loop]])
    nbr = np.concatenate([v, u[~loop]])
    eid = np.concatenate([e, e[~loop]])
    is_src = np.concatenate([np.ones(m, bool), np.zeros(int((~loop).sum()), bool)])
    srt = np.argsort(node, kind="stable")
    ptr = np.searchsorted(node[srt], np.arange(n + 1))
    return ptr, eid[srt], nbr[srt], is_src[srt]


class LocalCosts:
    """CSR views of one Problem for local costs, moves and profiles (see the module docstring)."""

    def __init__(self, p: Problem):
        self.p = self.problem = p
        self.n = n = p.num_nodes
        self.k = k = p.num_strategies.astype(np.int64)
        self.offs = p.strategy_offsets.astype(np.int64)
        self.node_of = np.repeat(np.arange(n), k)
        self.local_index = np.arange(len(p.node_costs)) - self.offs[self.node_of]
        self.cost = p.node_costs.astype(np.float64)
        self.usage = p.node_usages.astype(np.float64)
        E = p.edges
        self.eu, self.ev = E[:, 0].astype(np.int64), E[:, 1].astype(np.int64)
        self.eoff = p.edge_offsets.astype(np.int64)
        self.ec = p.edge_costs.astype(np.float64)
        loop = self.eu == self.ev
        self.loop_diag = None                      # Σ self-loop diagonals per flat strategy
        if loop.any():
            self.loop_diag = np.zeros(len(self.cost))
            for e in np.nonzero(loop)[0].tolist():
                i = int(self.eu[e])
                self.loop_diag[self.offs[i]:self.offs[i + 1]] += np.diagonal(self.matrix(e))
        # gather plans over the edges that are not self-loops: the k_u entries of u's side, k_v of v's
        es = np.nonzero(~loop)[0]
        ku, kv = k[self.eu[es]], k[self.ev[es]]
        self.gu_edge = np.repeat(es, ku)
        self.gu_loc = np.arange(int(ku.sum())) - np.repeat(starts(ku), ku)
        self.gu_flat = self.offs[self.eu[self.gu_edge]] + self.gu_loc
        self.gv_edge = np.repeat(es, kv)
        self.gv_loc = np.arange(int(kv.sum())) - np.repeat(starts(kv), kv)
        self.gv_flat = self.offs[self.ev[self.gv_edge]] + self.gv_loc
        self.nbr_u, self.nbr_v = self.eu[es], self.ev[es]
        self.adj_ptr, self.adj_edge, self.adj, self.adj_src = incidence(p)
        # compressed time axis (with the shared resharded copies' steps)
        st, en = p.intervals[:, 0], p.intervals[:, 1]
        self.live_mask = en > st
        em = p.edge_memory
        self.times = np.unique(np.concatenate([st, en] + ([] if em is None else [em.time_points()])))
        self.lo = np.searchsorted(self.times, st)
        self.hi = np.searchsorted(self.times, en)
        self.cap = p.usage_limit
        self.live_usage = np.where(self.live_mask[self.node_of], self.usage, 0.0)   # 0 for empty intervals

    @classmethod
    def of(cls, p: Problem) -> LocalCosts:
        return cls(p)

    # ---- costs ---------------------------------------------------------------------------
    def local(self, s: np.ndarray, node_cost: np.ndarray | None = None) -> np.ndarray:
        """Per flat strategy: its node cost (``node_cost``, default the problem's) + the edges to
        the neighbours' strategies in ``s`` (a self-loop: its diagonal)."""
        L = (self.cost if node_cost is None else node_cost).astype(np.float64, copy=True)
        if self.loop_diag is not None:
            L += self.loop_diag
        if len(self.gu_edge):
            S = len(L)
            sv = s[self.ev[self.gu_edge]]
            L += np.bincount(self.gu_flat, self.ec[self.eoff[self.gu_edge] + self.gu_loc * self.k[self.ev[self.gu_edge]] + sv],
                             minlength=S)
            su = s[self.eu[self.gv_edge]]
            L += np.bincount(self.gv_flat, self.ec[self.eoff[self.gv_edge] + su * self.k[self.ev[self.gv_edge]] + self.gv_loc],
                             minlength=S)
        return L

    def node_local(self, s: np.ndarray, i: int, node_cost: np.ndarray | None = None,
                   decided: bool = False) -> np.ndarray:
        """Node i's local cost vector given its neighbours' strategies in ``s``; ``decided``: only
        the neighbours with s_j >= 0 count (a self-loop always does)."""
        nc = self.cost if node_cost is None else node_cost
        lo, hi = int(self.offs[i]), int(self.offs[i + 1])
        c = nc[lo:hi].astype(np.float64, copy=True)
        ki = hi - lo
        for q in range(int(self.adj_ptr[i]), int(self.adj_ptr[i + 1])):
            e, j = int(self.adj_edge[q]), int(self.adj[q])
            base = int(self.eoff[e])
            if j == i:
                c += self.ec[base + np.arange(ki) * (ki + 1)]
            elif decided and s[j] < 0:
                continue
            elif self.adj_src[q]:
                c += self.ec[base + np.arange(ki) * int(self.k[j]) + s[j]]
            else:
                c += self.ec[base + s[j] * ki: base + (s[j] + 1) * ki]
        return c

    def neighbour_lists(self) -> tuple[list, list]:
        """(neighbours, edges): per node, Python lists of its incident edges' other ends and edge
        ids, in ``incidence`` order (built once: node-by-node walks in Python index them faster)."""
        if getattr(self, "_nbr_lists", None) is None:
            cut = self.adj_ptr[1:-1].tolist()
            self._nbr_lists = ([a.tolist() for a in np.split(self.adj, cut)],
                               [a.tolist() for a in np.split(self.adj_edge, cut)])
        return self._nbr_lists

    def matrix(self, e: int) -> np.ndarray:
        """Edge e's cost matrix (k_u x k_v view)."""
        return self.ec[self.eoff[e]:self.eoff[e + 1]].reshape(int(self.k[self.eu[e]]), int(self.k[self.ev[e]]))

    def seg_argmin(self, L: np.ndarray) -> np.ndarray:
        """Per node, the first strategy with the least L (NaN-safe)."""
        if not self.n:
            return np.zeros(0, dtype=np.int64)
        m = np.minimum.reduceat(L, self.offs[:-1])
        idx = np.where(L <= m[self.node_of], np.arange(len(L)), len(L))
        return np.minimum(np.minimum.reduceat(idx, self.offs[:-1]) - self.offs[:-1], self.k - 1)

    def total(self, s: np.ndarray) -> float:
        return evaluate(self.p, s).total

    def colour_classes(self) -> list[np.ndarray]:
        """A greedy proper colouring (nodes in index order, each the least colour unused by its
        neighbours): independent sets that ``best_response`` may move one at a time."""
        colour = np.full(self.n, -1, dtype=np.int64)
        ptr, adj = self.adj_ptr, self.adj
        for i in range(self.n):
            used = set(colour[adj[ptr[i]:ptr[i + 1]]].tolist())
            c = 0
            while c in used:
                c += 1
            colour[i] = c
        return [np.nonzero(colour == c)[0] for c in range(int(colour.max(initial=-1)) + 1)]

    # ---- memory --------------------------------------------------------------------------
    def profile_of(self, u: np.ndarray) -> np.ndarray:
        """Live usage at each compressed time point when node i holds u[i] bytes."""
        return step_sum(self.lo, self.hi, u, len(self.times))

    def profile(self, s: np.ndarray) -> np.ndarray:
        """Live usage at each compressed time point under plan ``s`` (with its live copies)."""
        live = self.profile_of(self.live_usage[self.offs[:-1] + s])
        if self.p.edge_memory is not None:
            cs, ce, cb = self.p.edge_memory.intervals(np.asarray(s, dtype=np.int64))
            live = live + live_on(self.times, cs, ce, cb)
        return live

    def feasible(self, s: np.ndarray) -> bool:
        """Whether plan ``s`` fits the usage limit (copies included)."""
        return self.cap is None or self.profile(s).max(initial=0.0) <= self.cap

    def interval_sums(self, lam: np.ndarray) -> np.ndarray:
        """Per node: Σ_{t ∈ interval(i)} lam_t over the compressed time points (0 for an empty
        interval): a node's Lagrangian price per byte."""
        P = np.concatenate([[0.0], np.cumsum(lam)])
        return np.where(self.live_mask, P[self.hi] - P[self.lo], 0.0)

    def usage_at(self, j: int) -> np.ndarray:
        """Per flat strategy: the bytes it holds at compressed time point j (0 if not live there)."""
        live = self.live_mask & (self.lo <= j) & (self.hi > j)
        return np.where(live[self.node_of], self.usage, 0.0)
