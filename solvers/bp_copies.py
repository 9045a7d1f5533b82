"""Lagrangian prices of the resharded copies on the edges that make them, for solvers/bp.py.

``copy_prices(g) -> CopyPrices | None``: each member of a copy group (``costmodel.edge_memory``)
whose producer and consumer share an edge of the strategy graph puts its copy's bytes on that
edge's cost entries (producer strategy, consumer strategy) under which it is active (the consumer
wants the copy, the producer does not already store its layout); ``CopyPrices(lam)`` is then the
flat edge-cost array of those bytes priced at λ summed over the copy's live time points (from the
producer's step for a collective-made copy, the member's step otherwise, to the member's step + 1).

Approximate, so it only steers the relaxation and never enters a bound: a copy shared by several
consumers is priced once per member (over-counted), and a member with no edge to its producer is
not priced. Why (session 16, held-out split, meshgraphnet tiny cap 0.5): node-usage prices cannot
see the copies, so the plain decode fit on node usage but broke the cap by 1.5x with its copies, and
the copy-aware decode, filling memory in index order, ended 1.84-2.14x the best-known cost.
"""
from __future__ import annotations

import numpy as np


class CopyPrices:
    """Entries ``idx`` of the flat edge costs, each with a copy of ``nbytes`` live over the
    compressed time points [``lo``, ``hi``); ``self(lam)``: the priced entries as a flat array."""

    def __init__(self, size: int, idx: np.ndarray, lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray):
        self.size, self.idx, self.lo, self.hi, self.nbytes = size, idx, lo, hi, nbytes

    def __call__(self, lam: np.ndarray) -> np.ndarray:
        cum = np.concatenate([[0.0], np.cumsum(lam)])
        return np.bincount(self.idx, self.nbytes * np.maximum(cum[self.hi] - cum[self.lo], 0.0),
                           minlength=self.size)


def copy_prices(g) -> CopyPrices | None:
    """The copy prices of ``g`` (a ``solvers.local.LocalCosts``); None without copy groups on edges."""
    em = g.p.edge_memory
    if em is None or not em.num_groups or not len(em.member_node) or not len(g.eu):
        return None
    edge = {(u, v): e for e, (u, v) in enumerate(zip(g.eu.tolist(), g.ev.tolist()))}
    g_of = em.member_group
    idx, lo, hi, nb = [], [], [], []
    for m in range(len(em.member_node)):
        gi = int(g_of[m])
        P, C = int(em.group_node[gi]), int(em.member_node[m])
        e, forward = (edge[(P, C)], True) if (P, C) in edge else (edge.get((C, P)), False)
        if e is None:
            continue
        want = em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]]
        free = em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]]
        act = ~free[:, None] & want[None, :]                      # (k_producer, k_consumer)
        t_member = int(np.searchsorted(g.times, em.member_time[m]))
        start = np.full(len(free), t_member)
        if em.group_early is not None and em.group_time is not None:
            early = em.group_early[em.early_offsets[gi]:em.early_offsets[gi + 1]]   # empty: never early
            if len(early):
                start = np.where(early, int(np.searchsorted(g.times, em.group_time[gi])), start)
        start = np.broadcast_to(start[:, None], act.shape)
        if not forward:
            act, start = act.T, start.T
        flat = act.ravel()
        if not flat.any():
            continue
        idx.append(g.eoff[e] + np.nonzero(flat)[0])
        lo.append(start.ravel()[flat])
        hi.append(np.full(int(flat.sum()), int(np.searchsorted(g.times, em.member_time[m] + 1))))
        nb.append(np.full(int(flat.sum()), float(em.group_bytes[gi])))
    if not idx:
        return None
    lo_a, hi_a = np.concatenate(lo), np.concatenate(hi)
    return CopyPrices(len(g.ec), np.concatenate(idx), np.minimum(lo_a, hi_a), hi_a, np.concatenate(nb))
