"""The column structures of the ILP model: edge blocks (``EdgeBlocks``: one y per block of equal
edge costs), the memory part (``MemAux``: dense rows or running sums, the time points to check,
``memory_rows``), and the map from copy masks to y columns for ``copy_rows``
(``y_terms``). ``solvers.ilp.model`` assembles them into one HiGHS model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem
from solvers.local.costs import starts


@dataclass(frozen=True, eq=False)
class EdgeBlocks:
    """Edge cost matrices cut into blocks of identical entries. Strategies of u whose rows of an
    edge's matrix are identical form one group (likewise columns), and the model gets one y per
    (row group, column group) block, with sum_h y[g, h] = sum_{s in g} x[u, s] and
    sum_g y[g, h] = sum_{t in h} x[v, t]. Costs are constant on blocks, and any block solution
    splits into a full one (y[s, t] = y[g, h] x[u, s] x[v, t] / (X[g] X[h])), so the LP and the
    MIP are the same as with one y per entry, with fewer columns (gpt 125m: 666k -> 450k)."""

    ru: np.ndarray       # group of each producer strategy, edges concatenated
    cv: np.ndarray       # group of each consumer strategy
    gu: np.ndarray       # groups per edge
    gv: np.ndarray
    boff: np.ndarray     # first block of each edge (row-major gu x gv blocks)
    bcost: np.ndarray    # cost of each block
    ycol: np.ndarray     # y column of each block (relative to the first y column), -1 if forbidden

    @staticmethod
    def of(p: Problem, forbid: bool, signatures: dict | None = None) -> EdgeBlocks:
        """``signatures``: per edge a code matrix that must be constant on blocks too (the copy
        masks, ``copy_rows.edge_signatures``)."""
        ru, cv, gu, gv, bc = [], [], [], [], []
        for e in range(p.num_edges):
            M = p.edge_matrix(e)
            sig = None if signatures is None else signatures.get(e)
            if sig is None:
                rows, r_inv = np.unique(M, axis=0, return_inverse=True)
                _, first_c, c_inv = np.unique(rows, axis=1, return_index=True, return_inverse=True)
            else:
                both, r_inv = np.unique(np.hstack([M, sig]), axis=0, return_inverse=True)
                rows = both[:, :M.shape[1]]
                _, first_c, c_inv = np.unique(np.vstack([rows, both[:, M.shape[1]:]]), axis=1,
                                              return_index=True, return_inverse=True)
            ru.append(r_inv.ravel())
            cv.append(c_inv.ravel())
            gu.append(rows.shape[0])
            gv.append(len(first_c))
            bc.append(rows[:, first_c].ravel())
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dtype=dt))
        bcost = cat(bc, np.float64)
        gu_a, gv_a = np.array(gu, dtype=np.int64), np.array(gv, dtype=np.int64)
        ok = bcost < FORBIDDEN_COST if forbid else np.ones(len(bcost), dtype=bool)
        ycol = np.where(ok, np.cumsum(ok) - 1, -1)
        return EdgeBlocks(cat(ru, np.int64), cat(cv, np.int64), gu_a, gv_a, starts(gu_a * gv_a),
                           bcost, ycol)

    def block_of(self, p: Problem, s: np.ndarray) -> np.ndarray:
        """The block each edge pays under plan ``s`` (original strategy indices)."""
        k = p.num_strategies
        su, sv = s[p.edges[:, 0]], s[p.edges[:, 1]]
        g = self.ru[starts(k[p.edges[:, 0]]) + su]
        h = self.cv[starts(k[p.edges[:, 1]]) + sv]
        return self.boff + g * self.gv + h


@dataclass(frozen=True, eq=False)
class MemAux:
    """The memory part of the model. With usages offset by each node's least usage (the sum of
    the least usages is the constant ``const`` per time point), a node j whose usage varies gets
    a column u_j = sum_s (usage - umin) / scale * x[j, s]; the live usage at checked time point t
    is a running sum L_t = L_{t-1} + (u of nodes starting at t) - (u of nodes ended at t). The cap
    is a column bound on L_t, the peak M one row L_t + const_t / scale <= M. This is the same
    polytope as one row per time point over every live (node, strategy) pair, with O(nodes)
    nonzeros instead of O(nodes x points x strategies): 10.7M -> 3.6M in all on gpt 1.3b. Up to
    ``dense_max_nonzeros`` (``IlpConfig.dense_memory_nonzeros``) the dense rows are used instead (``dense``): same polytope, and HiGHS's
    MIP heuristics find better plans with them."""

    var_nodes: np.ndarray     # nodes with a u column
    lo: np.ndarray            # first checked point of each (index into the points)
    hi: np.ndarray            # one past its last
    const: np.ndarray         # sum of least usages at each point (bytes)
    x_node: np.ndarray        # (u index, x column, coefficient) triples defining u
    x_col: np.ndarray
    x_coef: np.ndarray
    u_max: np.ndarray
    u0: int                   # first u column; the L columns follow the u columns
    l0: int
    dense: bool = False       # one row per point over the x columns instead (see ``of``)
    pts: np.ndarray | None = None   # the checked time points

    @property
    def num_cols(self) -> int:
        return 0 if self.dense else len(self.var_nodes) + len(self.const)

    @staticmethod
    def of(p: Problem, row_times, mem_scale: float, u0: int, dense_max_nonzeros: int) -> MemAux | None:
        pts, live = memory_rows(p)
        if row_times is not None and len(pts):
            pts = pts[np.isin(pts, row_times)]   # the others can never bind (see bounds.tighten)
        if not len(pts):
            return None
        k, offs = p.num_strategies, p.strategy_offsets
        st, en = p.intervals[:, 0], p.intervals[:, 1]
        lo_i = np.searchsorted(pts, st, side="left")
        hi_i = np.searchsorted(pts, en, side="left")
        cnt = np.where(live, hi_i - lo_i, 0)
        umin = np.minimum.reduceat(p.node_usages, offs[:-1])
        umax = np.maximum.reduceat(p.node_usages, offs[:-1])
        const = np.zeros(len(pts) + 1)
        np.add.at(const, lo_i[cnt > 0], umin[cnt > 0])
        np.add.at(const, hi_i[cnt > 0], -umin[cnt > 0])
        const = np.cumsum(const)[:-1]
        var = np.nonzero((cnt > 0) & (umax > umin))[0]
        kk = k[var]
        j = np.repeat(np.arange(len(var)), kk)
        col = offs[var][j] + np.arange(int(kk.sum())) - np.repeat(starts(kk), kk)
        coef = (p.node_usages[col] - umin[var][j]) / mem_scale
        nz = coef != 0
        # the dense rows are kept where they are small: HiGHS's MIP heuristics work better on
        # rows over the strategy columns (random 1,000-node problem, 60 s: 312k vs 549k)
        nnz = int(cnt[var][j[nz]].sum())
        if p.edge_memory is not None:   # each copy's z enters every row of its span
            s_lo, s_hi, ok = p.edge_memory.spans()
            nnz += int((np.searchsorted(pts, s_hi[ok]) - np.searchsorted(pts, s_lo[ok])).sum())
        dense = nnz <= dense_max_nonzeros
        return MemAux(var, lo_i[var], hi_i[var], const, j[nz], col[nz], coef[nz],
                       (umax[var] - umin[var]) / mem_scale, u0, u0 + len(var), dense, pts)

    def fill(self, v: np.ndarray) -> None:
        """Set the u and L columns of a start vector from its strategy columns."""
        if self.dense:
            return
        u = np.zeros(len(self.var_nodes))
        np.add.at(u, self.x_node, self.x_coef * v[self.x_col])
        step = np.zeros(len(self.const) + 1)
        np.add.at(step, self.lo, u)
        np.add.at(step, self.hi, -u)
        v[self.u0:self.l0] = u
        v[self.l0:self.l0 + len(self.const)] = np.cumsum(step)[:-1]


def y_terms(p: Problem, eb: EdgeBlocks, S: int):
    """For copy_rows: (u, v, mask over u's x v's strategies) -> the y columns of the
    blocks of the u-v edge that the mask covers (blocks are pure: the copy signatures), or None
    when no edge joins u and v. Forbidden blocks have no column (their y is 0)."""
    k = p.num_strategies
    pair = {(int(a), int(b)): e for e, (a, b) in enumerate(p.edges)}
    ru_off = starts(k[p.edges[:, 0]]) if p.num_edges else np.zeros(0, dtype=np.int64)
    cv_off = starts(k[p.edges[:, 1]]) if p.num_edges else np.zeros(0, dtype=np.int64)

    def terms(u, v, mask):
        e, M = pair.get((u, v)), mask
        if e is None:
            e, M = pair.get((v, u)), mask.T
            if e is None:
                return None
        a, b = p.edges[e]
        r = eb.ru[ru_off[e]:ru_off[e] + k[a]]
        c = eb.cv[cv_off[e]:cv_off[e] + k[b]]
        si, ti = np.nonzero(M)
        yc = eb.ycol[np.unique(eb.boff[e] + r[si] * eb.gv[e] + c[ti])]
        return (S + yc[yc >= 0]).tolist()
    return terms


def memory_rows(p: Problem):
    """Time points to check (just before an interval ends) -> (row index per (node, point) pair)."""
    st, en = p.intervals[:, 0], p.intervals[:, 1]
    live = en > st
    if not live.any() and p.edge_memory is None:
        return np.zeros(0), None
    ends, times = en[live], np.concatenate([st[live], en[live]])
    if p.edge_memory is not None:   # a copy lives over member steps: [t, t') ends at some step + 1
        cp = p.edge_memory.time_points()
        ends, times = np.concatenate([ends, cp]), np.concatenate([times, cp])
    ends, times = np.unique(ends), np.unique(times)
    # the last time point strictly before each end
    pos = np.searchsorted(times, ends) - 1
    pts = np.unique(times[pos[pos >= 0]])
    return pts, live

