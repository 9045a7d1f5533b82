"""Peak shaving that sees the resharded copies (``Problem.edge_memory``): the memory objective's
heuristic when copies make its exact model big (``solvers.ilp`` uses it in place of the
node-usage-only ``solvers.ilp.peak_shaver.PeakShaver`` for such problems).

``CopyShaver(problem).shave(start, cap, deadline)``: from ``start``, repeatedly take the time point
with the highest live usage (nodes + live copies, as ``evaluate`` prices them) and make the one
move that lowers it at the least time per byte saved: some node live there, or the producer or a
reader of a copy live there, takes another strategy (neighbours fixed). The byte saving at that
point is exact (node usage + the copies of every group the node touches); the time is the node's
local cost (``solvers.local.LocalCosts.node_local``). Stops when the peak is within ``cap`` (-> the
plan, then polished by ``solvers.local.best_response`` within ``cap``) or no move lowers the peak
point (-> None). No proof: the ILP's exact steps supply bounds.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, usage_profile
from solvers.local import LocalCosts, best_response


class CopyShaver:
    def __init__(self, problem: Problem):
        self.p = p = problem
        self.em = em = problem.edge_memory
        self.offs = problem.strategy_offsets
        n = problem.num_nodes
        self.lc = LocalCosts(problem)
        self.g_of = em.member_group
        self.members = [list(range(int(em.member_offsets[g]), int(em.member_offsets[g + 1])))
                        for g in range(em.num_groups)]
        self.groups_of: list = [set() for _ in range(n)]
        for g, u in enumerate(em.group_node.tolist()):
            self.groups_of[u].add(g)
        for m, v in enumerate(em.member_node.tolist()):
            self.groups_of[v].add(int(self.g_of[m]))
        self.st, self.en = p.intervals[:, 0], p.intervals[:, 1]
        # plain Python lists for the per-move loop (numpy scalar indexing is ~10x slower)
        self.m_node, self.m_time = em.member_node.tolist(), em.member_time.tolist()
        self.m_want = [em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]].tolist()
                       for m in range(len(self.m_node))]
        self.m_free = [em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]].tolist()
                       for m in range(len(self.m_node))]
        self.g_node, self.g_time, self.g_bytes = em.group_node.tolist(), em.group_time.tolist(), em.group_bytes.tolist()
        self.g_early = [em.group_early[em.early_offsets[g]:em.early_offsets[g + 1]].tolist()
                        for g in range(em.num_groups)]

    def _group_at(self, g, s, t) -> float:
        """Bytes of group g's copy live at time t under plan s."""
        su = int(s[self.g_node[g]])
        ge = self.g_early[g]
        early = bool(ge) and ge[su]
        last, here = -1, False
        for m in self.members[g]:
            if self.m_want[m][int(s[self.m_node[m]])] and not self.m_free[m][su]:
                tm = self.m_time[m]
                if tm > last:
                    last = tm
                here = here or tm == t
        if early:
            return self.g_bytes[g] if last >= 0 and self.g_time[g] <= t <= last else 0.0
        return self.g_bytes[g] if here else 0.0

    def _profile(self, s):
        flat = self.offs[:-1] + s
        return usage_profile(self.p, self.p.node_usages[flat], extra=self.em.intervals(s))

    def shave(self, start, cap, deadline):
        s = np.array(start, dtype=np.int64)
        lo_t, hi_t, _ = self.em.spans()
        while True:
            if time.perf_counter() > deadline:
                return None
            ts, live = self._profile(s)
            j = int(np.argmax(live))
            if live[j] <= cap:
                return self._polish(s, cap, deadline)
            t = int(ts[j])
            cand = set(np.nonzero((self.st <= t) & (self.en > t))[0].tolist())
            for g in np.nonzero((lo_t <= t) & (hi_t > t))[0]:
                if self._group_at(int(g), s, t) > 0:
                    cand.add(int(self.em.group_node[g]))
                    cand.update(int(self.em.member_node[m]) for m in self.members[int(g)])
            best = None
            for i in cand:
                k = int(self.offs[i + 1] - self.offs[i])
                if k < 2:
                    continue
                u = self.p.node_usages[self.offs[i]:self.offs[i + 1]]
                on = self.st[i] <= t < self.en[i]
                gs = self.groups_of[i]
                cur = sum(self._group_at(g, s, t) for g in gs)
                c = self.lc.node_local(s, i)
                si = s[i]
                for b in range(k):
                    if b == si:
                        continue
                    s[i] = b
                    d = (u[b] - u[si] if on else 0.0) + sum(self._group_at(g, s, t) for g in gs) - cur
                    s[i] = si
                    if d >= 0:
                        continue
                    score = (c[b] - c[si]) / -d
                    if best is None or score < best[0]:
                        best = (score, i, b)
            if best is None:
                return None
            s[best[1]] = best[2]

    def _polish(self, s, cap, deadline):
        """Win back time: best response (``solvers.local.best_response``) on the true cost that
        keeps the plan's peak (copies included) within ``cap``."""
        capped = self.p.with_usage_limit(cap)
        return best_response(capped, s, time_limit_s=max(deadline - time.perf_counter(), 0.0), lc=LocalCosts(capped))
