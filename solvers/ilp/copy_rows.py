"""The ILP's columns for the resharded copies of a Problem (``Problem.edge_memory``).

One continuous column z in [0, 1] per piece of a copy's possible life that holds a checked time
point, entering the memory rows there with the copy's bytes:

* an early copy (made by a collective, ``CopyGroups.group_early``) lives from the producer's step
  to the last active member: one z per stretch (previous member step, next member step] from the
  producer's step on, with  z >= Σ_{(s, t): early[s], want_j[t]} y_e[s, t]  for every member j at
  or after the stretch, y_e being the linearised edge variables of the edge between the producer
  and j's consumer (``solvers.ilp.blocks.EdgeBlocks``);
* a short-lived copy (any other transition) holds at its members' steps: one z per step with
  z >= Σ_{(s, t): not early[s], not free_j[s], want_j[t]} y_e[s, t] for each member j there.

With x one-hot, y_e = x_u x_vᵀ, so each sum is 1 exactly when that member needs the copy there,
and z only raises memory rows: some optimum has z at that bound. Each bound is a sum over one
edge's y, which the local polytope of the edge model keeps tight (an AND of two x's would not be).
The edge blocks must not mix entries a copy treats differently: ``edge_signatures`` gives the code
matrix the ILP adds to each edge's cost when grouping rows and columns. Where the reductions folded
an edge away, the bound falls back to the x form z >= W_j + E - 1 (early) / z >= W_j - F_j - E
(short-lived), exact at integral x.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CopyColumns:
    lo: np.ndarray      # (Z,) first checked point (index into the points) of each z
    hi: np.ndarray      # (Z,) one past its last
    coef: np.ndarray    # (Z,) copy bytes / memory scale
    rows: np.ndarray    # COO of the lower-bound rows: row (local), column, value
    cols: np.ndarray
    vals: np.ndarray
    row_lo: np.ndarray  # lower bound of each row (upper bound +inf)
    row_z: np.ndarray   # the z column of each row
    z0: int

    @property
    def num_cols(self) -> int:
        return len(self.lo)

    @property
    def num_rows(self) -> int:
        return len(self.row_lo)

    def fill(self, v: np.ndarray) -> None:
        """Set the z columns of a start vector from its x and y columns (z = max(0, the bounds))."""
        if not self.num_cols:
            return
        other = self.cols != self.row_z[self.rows]
        lhs = np.zeros(self.num_rows)
        np.add.at(lhs, self.rows[other], self.vals[other] * v[self.cols[other]])
        z = np.zeros(self.num_cols)
        np.maximum.at(z, self.row_z - self.z0, np.maximum(self.row_lo - lhs, 0.0))
        v[self.z0:self.z0 + self.num_cols] = np.minimum(z, 1.0)


def _member_masks(em, g, m, k_u):
    """(early mask, short-lived mask) over (producer strategy, consumer strategy) for member m."""
    want = em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]]
    free = em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]]
    a, b = int(em.early_offsets[g]), int(em.early_offsets[g + 1])
    early = em.group_early[a:b] if b > a else np.zeros(k_u, dtype=bool)
    return np.outer(early & ~free, want), np.outer(~early & ~free, want)


def edge_signatures(p) -> dict:
    """Per edge index: a k_u x k_v matrix of codes, distinct where some member's masks differ
    (random weights per mask, fixed seed: equal codes for different masks have probability ~0)."""
    em = p.edge_memory
    if em is None:
        return {}
    pair = {(int(a), int(b)): e for e, (a, b) in enumerate(p.edges)}
    k = p.num_strategies
    rng = np.random.default_rng(12345)
    out: dict = {}
    g_of = em.member_group
    for m in range(len(em.member_node)):
        g = int(g_of[m])
        u, v = int(em.group_node[g]), int(em.member_node[m])
        e, flip = pair.get((u, v)), False
        if e is None:
            e, flip = pair.get((v, u)), True
        if e is None:
            continue
        for mask in _member_masks(em, g, m, int(k[u])):
            code = (mask.T if flip else mask) * rng.random()
            out[e] = out.get(e, 0.0) + code
    return out


def copy_columns(p, pts: np.ndarray, mem_scale: float, z0: int, y_terms) -> CopyColumns | None:
    """The copy columns of problem ``p`` over the checked time points ``pts`` (sorted), numbered
    from column ``z0``. ``y_terms(u, v, mask)``: the y columns summing the entries of ``mask``
    (producer u's strategies x consumer v's) of the edge between u and v, or None if it is gone.
    None when no copy can be live at a checked point."""
    em = p.edge_memory
    if em is None or not em.num_groups or not len(pts):
        return None
    offs, k = p.strategy_offsets, p.num_strategies
    lo, hi, coef, R, C, V, rlo, rz = [], [], [], [], [], [], [], []

    def xcols(node, flags):
        return [int(offs[node] + i) for i in np.nonzero(flags)[0]]

    def new_z(t_lo, t_hi, g):
        a_i = int(np.searchsorted(pts, t_lo, side="left"))
        b_i = int(np.searchsorted(pts, t_hi, side="right"))
        if b_i <= a_i:
            return None
        lo.append(a_i)
        hi.append(b_i)
        coef.append(float(em.group_bytes[g]) / mem_scale)
        return z0 + len(lo) - 1

    def bound(z, u, v, mask, x_plus, x_minus, x_lo):
        """z >= Σ_mask y (or, without the edge, z >= Σ x_plus - Σ x_minus + x_lo)."""
        r = len(rlo)
        ys = y_terms(u, v, mask)
        if ys is not None:
            terms = [(z, 1.0)] + [(c, -1.0) for c in ys]
            rlo.append(0.0)
        else:
            terms = [(z, 1.0)] + [(c, -1.0) for c in x_plus] + [(c, 1.0) for c in x_minus]
            rlo.append(x_lo)
        cc, inv = np.unique(np.array([t[0] for t in terms], dtype=np.int64), return_inverse=True)
        vv = np.zeros(len(cc))
        np.add.at(vv, inv, np.array([t[1] for t in terms]))
        R.extend([r] * len(cc))
        C.extend(cc.tolist())
        V.extend(vv.tolist())
        rz.append(z)

    for g in range(em.num_groups):
        if em.group_bytes[g] <= 0:
            continue
        u, ku = int(em.group_node[g]), int(k[int(em.group_node[g])])
        a, b = int(em.early_offsets[g]), int(em.early_offsets[g + 1])
        early = em.group_early[a:b] if b > a else np.zeros(ku, dtype=bool)
        masks = {}
        for m in range(int(em.member_offsets[g]), int(em.member_offsets[g + 1])):
            masks[m] = _member_masks(em, g, m, ku)
        # short-lived copies: one z per step, bounded by every member reading there
        zs: dict = {}
        for m, (_, short) in masks.items():
            if not short.any():
                continue
            v, t = int(em.member_node[m]), int(em.member_time[m])
            if t not in zs:
                zs[t] = new_z(t, t, g)
            z = zs[t]
            if z is None:
                continue
            want = em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]]
            free = em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]]
            bound(z, u, v, short, xcols(v, want), xcols(u, free | early), 0.0)
        # the early copy: from the producer's step to the last active member
        ms = [m for m, (ea, _) in masks.items() if ea.any()]
        if not ms:
            continue
        t_u = int(em.group_time[g])
        prev = t_u - 1
        for t in sorted({int(em.member_time[m]) for m in ms}):
            if t <= prev:
                continue
            z = new_z(prev + 1, t, g)
            prev = t
            if z is None:
                continue
            for m in ms:
                if int(em.member_time[m]) >= t:
                    v = int(em.member_node[m])
                    want = em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]]
                    free = em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]]
                    bound(z, u, v, masks[m][0], xcols(v, want) + xcols(u, early & ~free), [], -1.0)
    if not lo:
        return None
    return CopyColumns(np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64), np.array(coef),
                       np.array(R, dtype=np.int64), np.array(C, dtype=np.int64), np.array(V, dtype=np.float64),
                       np.array(rlo), np.array(rz, dtype=np.int64), z0)
