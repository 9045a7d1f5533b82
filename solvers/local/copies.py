"""Single-node moves priced with the resharded copies (``Problem.edge_memory``) at one time point.

``CopyMoves(problem).saved_at(s, t)``: per flat strategy (node i, strategy b), the copy bytes live
at time t that moving node i alone to b saves (negative: the move makes a copy live at t), by the
rule of ``CopyGroups.intervals``: a copy made by a collective (early) lives from its producer's
step to its last active reader's step, inclusive; any other copy only at its active readers' steps.

A producer's move changes every member's free flag and the early flag of its groups; a reader's
move changes its member's want flag. Both are priced for every group that may be live at t
(``CopyGroups.spans``) and every strategy at once, over the flat flag arrays (a few numpy passes;
about 5-25 ms on unet tiny's 9,583 groups). Exact for one move (checked against re-pricing with
``CopyGroups.intervals`` in tests/test_capped_copies.py), except where one node holds two roles
in the same group (it produces and reads the copy, or reads it at two steps): those members are
priced as if they moved one at a time. The repair that uses it (``solvers.local.repair_memory``)
re-checks the exact profile after every move.
"""
from __future__ import annotations

import numpy as np

from costmodel.problem import Problem


class CopyMoves:
    def __init__(self, problem: Problem):
        em = self.em = problem.edge_memory
        offs = problem.strategy_offsets.astype(np.int64)
        k = problem.num_strategies.astype(np.int64)
        G, M = em.num_groups, len(em.member_node)
        self.size = int(offs[-1])
        self.g_of = em.member_group
        self.lo_t, self.hi_t, self.has = em.spans()
        # producer moves: entry e of member_free is (member f_m[e], producer strategy f_b[e])
        kf = np.diff(em.free_offsets)
        self.f_m = np.repeat(np.arange(M), kf)
        self.f_b = np.arange(len(em.member_free)) - em.free_offsets[:-1][self.f_m]
        ku = k[em.group_node]
        gbase = np.zeros(G + 1, dtype=np.int64)
        np.cumsum(ku, out=gbase[1:])
        self.key = gbase[self.g_of[self.f_m]] + self.f_b            # (group, producer strategy)
        self.nkeys = int(gbase[-1])
        self.key_g = np.repeat(np.arange(G), ku)
        self.key_b = np.arange(self.nkeys) - gbase[:-1][self.key_g]
        self.key_flat = offs[em.group_node[self.key_g]] + self.key_b
        has_e = self.has_e = np.diff(em.early_offsets) > 0
        self.key_early = np.zeros(self.nkeys, dtype=bool)
        sel = has_e[self.key_g]
        self.key_early[sel] = em.group_early[em.early_offsets[:-1][self.key_g[sel]] + self.key_b[sel]]
        # reader moves: entry e of member_want is (member w_m[e], reader strategy w_b[e])
        kw = np.diff(em.want_offsets)
        self.w_m = np.repeat(np.arange(M), kw)
        self.w_flat = offs[em.member_node[self.w_m]] + (np.arange(len(em.member_want)) - em.want_offsets[:-1][self.w_m])
        self.f_g, self.w_g = self.g_of[self.f_m], self.g_of[self.w_m]

    def saved_at(self, s: np.ndarray, t: int) -> np.ndarray:
        """Per flat strategy: copy bytes at t saved by moving that strategy's node alone to it."""
        em, g_of = self.em, self.g_of
        s = np.asarray(s, dtype=np.int64)
        G = em.num_groups
        out = np.zeros(self.size)
        span = self.has & (self.lo_t <= t) & (self.hi_t > t)
        if not span.any():
            return out
        want_now = em.member_want[em.want_offsets[:-1] + s[em.member_node]]
        free_now = em.member_free[em.free_offsets[:-1] + s[em.group_node[g_of]]]
        act = want_now & ~free_now
        tm = em.member_time
        early = np.zeros(G, dtype=bool)
        early[self.has_e] = em.group_early[em.early_offsets[:-1][self.has_e] + s[em.group_node[self.has_e]]]
        g_ok = em.group_time <= t
        long_m, short_m = tm >= t, tm == t
        n_long = np.bincount(g_of, act & long_m, minlength=G)
        n_short = np.bincount(g_of, act & short_m, minlength=G)
        cur = (np.where(early, (n_long > 0) & g_ok, n_short > 0) & span).astype(float)
        b = em.group_bytes
        # the producer moves to strategy key_b (only the entries of groups that may be live at t)
        e = np.flatnonzero(span[self.f_g])
        fm = self.f_m[e]
        a = want_now[fm] & ~em.member_free[e]
        key = self.key[e]
        lk = np.bincount(key, a & long_m[fm], minlength=self.nkeys) > 0
        sk = np.bincount(key, a & short_m[fm], minlength=self.nkeys) > 0
        kk = np.flatnonzero(span[self.key_g])
        kg = self.key_g[kk]
        new = np.where(self.key_early[kk], lk[kk] & g_ok[kg], sk[kk])
        out += np.bincount(self.key_flat[kk], (cur[kg] - new) * b[kg], minlength=self.size)
        # a reader moves its member to strategy w_b
        e = np.flatnonzero(span[self.w_g])
        m = self.w_m[e]
        g = g_of[m]
        a = em.member_want[e] & ~free_now[m]
        other_l = (n_long[g] - (act & long_m)[m]) > 0
        other_s = (n_short[g] - (act & short_m)[m]) > 0
        new = np.where(early[g], (other_l | (a & long_m[m])) & g_ok[g], other_s | (a & short_m[m]))
        out += np.bincount(self.w_flat[e], (cur[g] - new) * b[g], minlength=self.size)
        return out
