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
    compressed time points [``lo``, ``hi``); ``self(lam)``: the priced entries as a flat array,
    Σ over each entry's copies of nbytes · max(Σ_{t∈[lo,hi)} λ_t, 0), summed in entry order. Computed (session 28)
    as one sparse matrix-vector product, entries (row = edge entry, in their order within it; column = their
    distinct (lo, hi) span, ``pair``) times the spans' price sums: the same products added in the same order
    as ``np.bincount`` (bitwise equal on gpt 7b @ h100-2x8, tests/test_bp_copies.py), 13-22 ms against
    78-90 ms there (3.5 M entries, 88 price updates a BP run, load 4)."""

    def __init__(self, size: int, idx: np.ndarray, lo: np.ndarray, hi: np.ndarray, nbytes: np.ndarray,
                 spans: tuple | None = None):
        import scipy.sparse as sp
        self.size, self.idx, self.lo, self.hi, self.nbytes = size, idx, lo, hi, nbytes
        if spans is None:      # (each entry's span, the spans' lo, hi): from the entries (copy_prices: the members)
            w = int(hi.max(initial=0)) + 1
            keys, pair = np.unique(lo * w + hi, return_inverse=True)
            spans = (pair.reshape(-1), keys // w, keys % w)
        pair, self.plo, self.phi = spans
        o = np.argsort(idx, kind="stable")
        self.matrix = sp.csr_matrix((nbytes[o], pair[o], np.r_[0, np.cumsum(np.bincount(idx, minlength=size))]),
                                    shape=(size, len(self.plo)))

    def __call__(self, lam: np.ndarray) -> np.ndarray:
        cum = np.concatenate([[0.0], np.cumsum(lam)])
        return self.matrix @ np.maximum(cum[self.phi] - cum[self.plo], 0.0)


def copy_prices(g) -> CopyPrices | None:
    """The copy prices of ``g`` (a ``solvers.local.LocalCosts``); None without copy groups on edges. Vectorised
    over the members (session 28; the per-member loop before it took 10 s of Lagrangian BP's 41 s on gpt 7b @
    h100-2x8, 204,708 members): the same entries in the same order (member by member, each member's in the edge
    matrix's row-major order), so ``CopyPrices`` sums them in the same order (tests/test_bp_copies.py)."""
    em = g.p.edge_memory
    if em is None or not em.num_groups or not len(em.member_node) or not len(g.eu):
        return None
    n, ne = int(g.n), len(g.eu)
    keys = g.eu.astype(np.int64) * n + g.ev
    order = np.lexsort((np.arange(ne), keys))          # by key, the last edge of a repeated key last (a dict's)
    sk, se = keys[order], order
    last = np.r_[sk[1:] != sk[:-1], True]
    sk, se = sk[last], se[last]

    def find(k):                                        # edge index of each key, −1 if none
        pos = np.minimum(np.searchsorted(sk, k), max(len(sk) - 1, 0))
        return np.where(sk[pos] == k, se[pos], -1) if len(sk) else np.full(len(k), -1)
    gi = em.member_group
    P, C = em.group_node[gi].astype(np.int64), em.member_node.astype(np.int64)
    ef, eb = find(P * n + C), find(C * n + P)
    forward = ef >= 0
    e = np.where(forward, ef, eb)
    # per member: the producer strategies not free and the consumer strategies wanted, each ascending
    kp, kc = np.diff(em.free_offsets), np.diff(em.want_offsets)
    nf = ~em.member_free.astype(bool)
    wt = em.member_want.astype(bool)
    nf_cs, wt_cs = np.r_[0, np.cumsum(nf)], np.r_[0, np.cumsum(wt)]
    nf_cnt = nf_cs[em.free_offsets[1:]] - nf_cs[em.free_offsets[:-1]]
    wt_cnt = wt_cs[em.want_offsets[1:]] - wt_cs[em.want_offsets[:-1]]
    nf_pos = np.nonzero(nf)[0] - np.repeat(em.free_offsets[:-1], kp)[nf]      # producer strategy of each
    wt_pos = np.nonzero(wt)[0] - np.repeat(em.want_offsets[:-1], kc)[wt]      # consumer strategy of each
    nf_start, wt_start = np.r_[0, np.cumsum(nf_cnt)], np.r_[0, np.cumsum(wt_cnt)]
    cnt = np.where(e >= 0, nf_cnt * wt_cnt, 0)
    if not cnt.any():
        return None
    mem = np.repeat(np.arange(len(C)), cnt)
    j = np.arange(int(cnt.sum())) - np.repeat(np.r_[0, np.cumsum(cnt)[:-1]], cnt)
    a, b = nf_cnt[mem], wt_cnt[mem]
    fw = forward[mem]
    pi, ci = np.where(fw, j // np.maximum(b, 1), j % np.maximum(a, 1)), np.where(fw, j % np.maximum(b, 1), j // np.maximum(a, 1))
    p, c = nf_pos[nf_start[mem] + pi], wt_pos[wt_start[mem] + ci]
    idx = g.eoff[e[mem]] + np.where(fw, p * kc[mem] + c, c * kp[mem] + p)
    t_member, h = np.searchsorted(g.times, em.member_time), np.searchsorted(g.times, em.member_time + 1)
    t_early = np.minimum(np.searchsorted(g.times, em.group_time)[gi], h)   # lo when early, per member
    early = np.zeros(len(mem), dtype=bool)
    if em.group_early is not None and em.group_time is not None:
        ke = np.diff(em.early_offsets)
        gm = gi[mem]
        has = ke[gm] > 0
        early[has] = em.group_early[em.early_offsets[gm[has]] + p[has]]
    w = int(h.max(initial=0)) + 1        # each member's two spans [lo, hi), numbered: the entries' ``spans``
    keys, inv = np.unique(np.r_[np.minimum(t_member, h) * w + h, t_early * w + h], return_inverse=True)
    pair = np.where(early, inv.reshape(-1)[len(h):][mem], inv.reshape(-1)[:len(h)][mem])
    hi = h[mem]
    lo = np.minimum(np.where(early, t_early[mem], t_member[mem]), hi)
    return CopyPrices(len(g.ec), idx, lo, hi, em.group_bytes[gi[mem]].astype(float), (pair, keys // w, keys % w))
