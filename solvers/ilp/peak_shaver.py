"""The memory objective's fast heuristic without copies: ``PeakShaver(problem).shave(start, cap,
deadline)`` lowers a plan's peak to ``cap`` by greedy usage-for-time moves, then polishes time
under the cap (no proof; the exact bisection in ``solvers.ilp.memory`` supplies the bounds).
With resharded copies ``solvers.copy_search.CopyShaver`` takes its place.

Kept as it was before the split of ``solvers.ilp``: the shared local-search library
(``solvers.local``, issue 14) did not exist yet when this module was cut out, so its local costs,
profile and polish are still its own.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, usage_profile


class PeakShaver:
    """Fast heuristic plans for "lowest peak within a step-time bound" (no proof; the exact
    bisection in ``solvers.ilp.memory`` supplies the bounds). From a start plan, ``shave(s, cap)``
    repeatedly takes the time point with the highest live usage and moves one node live there to
    a lower-usage strategy, the one adding the least time per byte saved (neighbours fixed),
    until the peak is within ``cap``; then a feasible polish (each node takes its fastest strategy
    that keeps the live usage within ``cap``) wins back time."""

    def __init__(self, problem: Problem):
        self.p = problem
        self.offs = problem.strategy_offsets
        n = problem.num_nodes
        self.adj = [[] for _ in range(n)]
        for e in range(problem.num_edges):
            u, v = int(problem.edges[e, 0]), int(problem.edges[e, 1])
            M = problem.edge_matrix(e)
            self.adj[u].append((v, M, True))
            self.adj[v].append((u, M, False))
        ts, _ = usage_profile(problem, np.zeros(int(self.offs[-1]))[self.offs[:-1]])
        st, en = problem.intervals[:, 0], problem.intervals[:, 1]
        self.live = en > st
        self.lo = np.where(self.live, np.searchsorted(ts, st, side="left"), 0)
        self.hi = np.where(self.live, np.searchsorted(ts, en, side="left"), 0)
        self.npts = len(ts)

    def _local(self, s, i):
        o = self.offs
        c = self.p.node_costs[o[i]:o[i + 1]].copy()
        for j, M, is_u in self.adj[i]:
            c += M[:, s[j]] if is_u else M[s[j], :]
        return c

    def _usage(self, i):
        return self.p.node_usages[self.offs[i]:self.offs[i + 1]]

    def _profile(self, s):
        prof = np.zeros(self.npts + 1)
        u = self.p.node_usages[self.offs[:-1] + s]
        np.add.at(prof, self.lo[self.live], u[self.live])
        np.add.at(prof, self.hi[self.live], -u[self.live])
        return np.cumsum(prof)[:-1]

    def shave(self, start, cap, deadline):
        s = np.array(start, dtype=np.int64)
        prof = self._profile(s)
        cache = {}

        def local(i):
            if i not in cache:
                cache[i] = self._local(s, i)
            return cache[i]

        def move(i, b):
            d = self._usage(i)[b] - self._usage(i)[s[i]]
            if self.live[i]:
                prof[self.lo[i]:self.hi[i]] += d
            s[i] = b
            cache.pop(i, None)
            for j, _, _ in self.adj[i]:
                cache.pop(j, None)

        while prof.size and prof.max() > cap:
            if time.perf_counter() > deadline:
                return None
            t = int(np.argmax(prof))
            best = None
            for i in np.nonzero((self.lo <= t) & (self.hi > t) & self.live)[0]:
                u = self._usage(i)
                du = u[s[i]] - u
                if not (du > 0).any():
                    continue
                c = local(i)
                score = np.where(du > 0, (c - c[s[i]]) / np.where(du > 0, du, 1.0), np.inf)
                b = int(np.argmin(score))
                if best is None or score[b] < best[0]:
                    best = (score[b], i, b)
            if best is None:
                return None
            move(best[1], best[2])
        for _ in range(20):          # feasible polish
            changed = False
            for i in range(self.p.num_nodes):
                if time.perf_counter() > deadline:
                    break
                c = local(i)
                u = self._usage(i)
                room = cap - (prof[self.lo[i]:self.hi[i]].max() if self.live[i] and self.hi[i] > self.lo[i] else -np.inf)
                ok = (u - u[s[i]]) <= room
                cand = np.where(ok, c, np.inf)
                b = int(np.argmin(cand))
                if cand[b] < c[s[i]] - 1e-15 * max(1.0, abs(c[s[i]])):
                    move(i, b)
                    changed = True
            if not changed:
                break
        return [int(x) for x in s]

