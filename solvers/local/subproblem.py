"""An LNS neighbourhood as its own Problem (``subproblem``): the nodes of the neighbourhood free,
the rest fixed at the current plan (their edges folded into node costs, their live usage and copies
a background), such that a plan of the neighbourhood fits iff the whole plan does. Used by
``solvers.local.lns.lns``."""
from __future__ import annotations

import numpy as np

from costmodel.edge_memory import CopyGroups
from costmodel.problem import Problem
from costmodel.profile import live_on, step_sum
from solvers.local.costs import LocalCosts


def subproblem(g: LocalCosts, s: np.ndarray, sel: np.ndarray):
    """The problem over ``sel`` with the rest fixed at s: outside edges fold into node costs and the
    outside live usage becomes single-strategy background nodes (one per compressed time segment).
    With copy groups, those with a producer or reader in ``sel`` go into the subproblem (their
    outside nodes as one-strategy, zero-cost, zero-byte nodes; ``_sub_copies``), their bytes under s
    leave the background, and background nodes also cover where they may be live: a sub plan fits
    iff the whole plan does (tests/test_capped_copies.py). Before, the copies of s stayed in the
    background: a move that made a copy live looked fitting and one that killed one did not."""
    p = g.p
    pos = np.full(g.n, -1, dtype=np.int64)
    pos[sel] = np.arange(len(sel))
    costs, usages, red = [], [], []
    for i in sel:
        sl = slice(g.offs[i], g.offs[i + 1])
        costs.append(g.cost[sl].copy())
        usages.append(g.usage[sl])
        red.append(np.zeros(int(g.k[i])))
    edges, ecosts = [], []
    for i in sel:
        for q in range(g.adj_ptr[i], g.adj_ptr[i + 1]):
            e = int(g.adj_edge[q])
            j = int(g.adj[q])
            u, v = int(g.eu[e]), int(g.ev[e])
            M = g.matrix(e)
            if pos[j] >= 0:
                if i == u:  # add each inner edge once, from its producer
                    edges.append((int(pos[u]), int(pos[v])))
                    ecosts.append(M.ravel())
            elif i == u:
                costs[pos[i]] = costs[pos[i]] + M[:, s[v]]
            else:
                costs[pos[i]] = costs[pos[i]] + M[s[u], :]
    intervals = [tuple(p.intervals[i]) for i in sel]
    usage_limit = em = None
    if g.cap is not None:
        live = g.profile(s)
        su = np.where(g.live_mask[sel], g.usage[g.offs[sel] + s[sel]], 0.0)
        bg = live - step_sum(g.lo[sel], g.hi[sel], su, len(g.times))
        lo, hi = g.lo[sel][g.live_mask[sel]], g.hi[sel][g.live_mask[sel]]
        cover = step_sum(lo, hi, np.ones(len(lo)), len(g.times))
        if p.edge_memory is not None:
            em, outside = _sub_copies(p.edge_memory, s, pos, len(sel))
            for _ in outside:                  # fixed outside producers / readers: one strategy
                costs.append(np.zeros(1))
                usages.append(np.zeros(1))
                red.append(np.zeros(1))
                intervals.append((0, 0))
            if em.num_groups:
                cur = np.concatenate([s[sel], np.zeros(len(outside), dtype=np.int64)])
                bg = bg - live_on(g.times, *em.intervals(cur))    # the copies the sub now prices
                a, b, has = em.spans()
                cover = cover + live_on(g.times, a[has], b[has], np.ones(int(has.sum())))
        events = [p.intervals[sel][g.live_mask[sel]].ravel()]
        if em is not None and em.num_groups:
            events.append(em.time_points())
        for t0, t1, b in _background(g.times, cover, bg, np.unique(np.concatenate(events))):
            costs.append(np.zeros(1))
            usages.append(np.array([b]))
            red.append(np.zeros(1))
            intervals.append((t0, t1))
        usage_limit = g.cap
    sub = Problem.from_lists(f"{p.name}[lns]", costs, usages, intervals, edges, ecosts,
                             usage_limit=usage_limit, node_redundant=red, edge_memory=em)
    return sub, pos


def _background(times: np.ndarray, cover: np.ndarray, bg: np.ndarray, events: np.ndarray) -> list:
    """The fixed outside usage as (start, end, bytes) nodes: one per run of consecutive covered
    compressed time points with no ``events`` (the neighbourhood's interval ends and copy steps)
    inside, holding the run's largest background. Exact: within such a run the neighbourhood's
    live set is the same at every point, so only the largest background can bind. One node per
    time point, as before, made 90-node neighbourhoods of meshgraphnet tiny @ h100-2x8 cap 0.5
    (652 time points, 8,351 copy groups) 790-825-node MILPs that overran every 1-s limit."""
    out = []
    seg = np.searchsorted(events, times, side="right")   # points with equal seg: no event between
    end = np.append(times[1:], times[-1] + 1) if len(times) else times
    run = None
    for j in np.nonzero(cover > 0)[0].tolist():
        if run is not None and run[3] == j - 1 and seg[j] == run[4]:
            run = (run[0], int(end[j]), max(run[2], float(bg[j])), j, run[4])
        else:
            if run is not None:
                out.append(run[:3])
            run = (int(times[j]), int(end[j]), float(bg[j]), j, int(seg[j]))
    if run is not None:
        out.append(run[:3])
    return [(a, b, max(u, 0.0)) for a, b, u in out]


def _sub_copies(em: CopyGroups, s: np.ndarray, pos: np.ndarray, n_sel: int):
    """(the copy groups with a producer or reader in the neighbourhood, over the subproblem's nodes;
    the outside nodes they involve, in the order of their one-strategy nodes after the
    neighbourhood's): an outside node's flags are cut to its fixed strategy s[i]."""
    g_of = em.member_group
    inside = np.zeros(em.num_groups, dtype=bool)
    inside |= pos[em.group_node] >= 0
    inside[g_of[pos[em.member_node] >= 0]] = True
    inside &= em.group_bytes > 0
    outside: dict = {}

    def node(i):
        i = int(i)
        if pos[i] >= 0:
            return int(pos[i])
        return n_sel + outside.setdefault(i, len(outside))

    def cut(flags, i):
        return flags if pos[int(i)] >= 0 else flags[int(s[int(i)]):int(s[int(i)]) + 1]

    groups = []
    for gi in np.nonzero(inside)[0].tolist():
        u = int(em.group_node[gi])
        members = []
        for m in range(int(em.member_offsets[gi]), int(em.member_offsets[gi + 1])):
            v = int(em.member_node[m])
            members.append((node(v), int(em.member_time[m]),
                            cut(em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]], v),
                            cut(em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]], u)))
        ea, eb = int(em.early_offsets[gi]), int(em.early_offsets[gi + 1])
        early = cut(em.group_early[ea:eb], u) if eb > ea else np.zeros(0, dtype=bool)
        groups.append((node(u), float(em.group_bytes[gi]), members, int(em.group_time[gi]), early))
    return CopyGroups.from_lists(groups), list(outside)
