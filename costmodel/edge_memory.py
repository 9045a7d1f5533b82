"""Edge memory: the resharded copies XLA materialises, shared per (value, destination layout).

When a consumer reads a value in another layout than its producer stores it in, XLA materialises
the resharded copy (an all-gather's result, a sliced or permuted operand written out for a dot).
It makes one copy per (value, layout) and shares it between every consumer that reads that layout
(common-subexpression elimination: the forward matmul and the backward weight-gradient matmul
read the same gathered activation), so the copy is live from the first to the last of those
consumers. How much memory a plan spends on copies therefore depends on the strategies of the
producer *and* of every consumer: no per-node usage and no pairwise edge term can say it.

``CopyGroups`` is the Problem's record of these copies (``Problem.edge_memory``; None for IOPDDL
instances and for every problem built without it, which then price exactly as before):

* copy group g: the value of producer node ``group_node[g]`` in one destination layout, holding
  ``group_bytes[g]`` per device while live;
* its members m in ``group_members`` (CSR via ``member_offsets``): a consumer node
  ``member_node[m]`` reading at step ``member_time[m]``; it *wants* the copy under its strategies
  ``member_want`` (flat, k_consumer entries per member) unless the producer's strategy is one of
  ``member_free`` (flat, k_producer entries per member: the producer already stores that layout,
  or the transition moves no bytes into a fusible consumer);
* a member is *active* under a plan iff want[s_consumer] and not free[s_producer]; a group with
  active members holds its bytes over [first active step, last active step + 1) (half-open, like
  node intervals). A group with one member is a short-lived buffer at that consumer's step.

``evaluate``, the ILP (``ilp_copy_columns``), local search and the environment all price copies
through this module. Approximate (measured in results/fidelity*.json): XLA's scheduler may free a
copy between two far-apart consumers and re-gather it (not modelled: counted as live throughout).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _starts(counts):
    out = np.zeros(len(counts), dtype=np.int64)
    if len(counts) > 1:
        np.cumsum(counts[:-1], out=out[1:])
    return out


@dataclass(frozen=True, eq=False)
class CopyGroups:
    group_node: np.ndarray       # (G,) producer node of each copy
    group_bytes: np.ndarray      # (G,) per-device bytes of the copy
    member_offsets: np.ndarray   # (G+1,) members of group g: member_offsets[g]:member_offsets[g+1]
    member_node: np.ndarray      # (M,) consumer node
    member_time: np.ndarray      # (M,) the consumer's step (its interval start)
    member_want: np.ndarray      # flat bool: k_consumer entries per member
    want_offsets: np.ndarray     # (M+1,)
    member_free: np.ndarray      # flat bool: k_producer entries per member
    free_offsets: np.ndarray     # (M+1,)

    @property
    def num_groups(self) -> int:
        return len(self.group_node)

    @property
    def member_group(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_groups), np.diff(self.member_offsets))

    @classmethod
    def from_lists(cls, groups) -> "CopyGroups":
        """``groups``: [(producer node, bytes, [(consumer node, step, want bools, free bools), ...])]."""
        gn, gb, mo, mn, mt, mw, mf = [], [], [0], [], [], [], []
        for u, b, members in groups:
            gn.append(int(u))
            gb.append(float(b))
            for v, t, want, free in members:
                mn.append(int(v))
                mt.append(int(t))
                mw.append(np.asarray(want, dtype=bool))
                mf.append(np.asarray(free, dtype=bool))
            mo.append(len(mn))
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=bool))
        return cls(np.array(gn, dtype=np.int64), np.array(gb, dtype=np.float64), np.array(mo, dtype=np.int64),
                   np.array(mn, dtype=np.int64), np.array(mt, dtype=np.int64), cat(mw),
                   np.concatenate([[0], np.cumsum([len(w) for w in mw])]).astype(np.int64), cat(mf),
                   np.concatenate([[0], np.cumsum([len(f) for f in mf])]).astype(np.int64))

    def check(self, num_strategies: np.ndarray) -> None:
        """Shapes against a Problem's strategy counts (one clear line naming the bad group)."""
        k = np.asarray(num_strategies)
        g_of = self.member_group
        bad = np.nonzero(np.diff(self.want_offsets) != k[self.member_node])[0]
        if len(bad):
            m = int(bad[0])
            raise ValueError(f"edge_memory: copy group {int(g_of[m])} member {m} has {int(np.diff(self.want_offsets)[m])} "
                             f"want flags, but its consumer node {int(self.member_node[m])} has {int(k[self.member_node[m]])} strategies")
        bad = np.nonzero(np.diff(self.free_offsets) != k[self.group_node[g_of]])[0]
        if len(bad):
            m = int(bad[0])
            raise ValueError(f"edge_memory: copy group {int(g_of[m])} member {m} has {int(np.diff(self.free_offsets)[m])} "
                             f"free flags, but its producer node {int(self.group_node[g_of[m]])} has "
                             f"{int(k[self.group_node[g_of[m]]])} strategies")
        if np.any(self.group_bytes < 0) or not np.all(np.isfinite(self.group_bytes)):
            raise ValueError("edge_memory: copy bytes must be finite and >= 0")

    # ---- pricing a plan ----------------------------------------------------------------------
    def active(self, s: np.ndarray) -> np.ndarray:
        """(M,) bool: member m needs its group's copy under plan ``s``."""
        g_of = self.member_group
        want = self.member_want[self.want_offsets[:-1] + s[self.member_node]]
        free = self.member_free[self.free_offsets[:-1] + s[self.group_node[g_of]]]
        return want & ~free

    def intervals(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, end, bytes) of every copy live under plan ``s`` (half-open intervals)."""
        if not self.num_groups or not len(self.member_node):
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros(0)
        act = self.active(s)
        big = np.iinfo(np.int64).max
        first = np.minimum.reduceat(np.where(act, self.member_time, big), self.member_offsets[:-1].clip(max=len(act) - 1))
        last = np.maximum.reduceat(np.where(act, self.member_time, -1), self.member_offsets[:-1].clip(max=len(act) - 1))
        nonempty = np.diff(self.member_offsets) > 0
        on = nonempty & (last >= 0)
        return first[on], last[on] + 1, self.group_bytes[on]

    def time_points(self) -> np.ndarray:
        """Every time at which some copy may start or end (member steps and one past them)."""
        return np.unique(np.concatenate([self.member_time, self.member_time + 1]))

    def involved(self, n: int) -> np.ndarray:
        """(n,) bool: nodes whose strategy changes some copy (producers and consumers)."""
        out = np.zeros(n, dtype=bool)
        out[self.group_node] = True
        out[self.member_node] = True
        return out

    def upper_profile(self, times: np.ndarray) -> np.ndarray:
        """At each time in ``times``: the bytes of every copy that could be live there (each group
        over [its first member's step, its last member's step + 1)); no plan's copies exceed it."""
        out = np.zeros(len(times))
        if not self.num_groups or not len(self.member_node):
            return out
        mo = self.member_offsets[:-1].clip(max=len(self.member_time) - 1)
        lo_t = np.minimum.reduceat(self.member_time, mo)
        hi_t = np.maximum.reduceat(self.member_time, mo) + 1
        ok = np.diff(self.member_offsets) > 0
        acc = np.zeros(len(times) + 1)
        np.add.at(acc, np.searchsorted(times, lo_t[ok], side="left"), self.group_bytes[ok])
        np.add.at(acc, np.searchsorted(times, hi_t[ok], side="left"), -self.group_bytes[ok])
        return np.cumsum(acc)[:-1]

    def restrict(self, keep: list) -> "CopyGroups":
        """The same copies over a reduced problem whose node i keeps strategies ``keep[i]``."""
        g_of = self.member_group
        want = [self.member_want[self.want_offsets[m]:self.want_offsets[m + 1]][np.asarray(keep[int(v)])]
                for m, v in enumerate(self.member_node)]
        free = [self.member_free[self.free_offsets[m]:self.free_offsets[m + 1]][np.asarray(keep[int(self.group_node[g_of[m]])])]
                for m in range(len(self.member_node))]
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=bool))
        return CopyGroups(self.group_node, self.group_bytes, self.member_offsets, self.member_node, self.member_time,
                          cat(want), np.concatenate([[0], np.cumsum([len(w) for w in want])]).astype(np.int64),
                          cat(free), np.concatenate([[0], np.cumsum([len(f) for f in free])]).astype(np.int64))

    # ---- JSON (an optional key beside the contest fields) ---------------------------------------
    def to_dict(self) -> dict:
        return {k: getattr(self, k).tolist() for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict) -> "CopyGroups":
        dt = {"group_bytes": np.float64, "member_want": bool, "member_free": bool}
        try:
            return cls(**{k: np.asarray(d[k], dtype=dt.get(k, np.int64)) for k in cls.__dataclass_fields__})
        except KeyError as exc:
            raise ValueError(f"edge_memory: field {exc} is missing") from exc


# ---- the ILP's copy columns ---------------------------------------------------------------------
@dataclass(frozen=True)
class CopyColumns:
    """Columns z in [0, 1] for the memory rows, one per (copy group, segment of its span that holds
    a checked time point). A segment is a member's step (the copy is live there iff some member at
    or before it and some member at or after it are active) or the open stretch between two
    consecutive member steps (live iff one member before and one after are active). With x one-hot,
    member m is active iff W_m - F_m = 1 where W_m = Σ_{want} x[consumer] and F_m = Σ_{free} x[producer],
    so the rows  z >= W_i + W_j - 1 - F_i - F_j  (z >= W_i - F_i when i = j; F counted once when
    both members share their free flags) over the member pairs (i before, j after) make z >= 1
    exactly when the copy is live there, and z >= 0 otherwise; z only raises memory rows, so some
    optimum has z at that bound (the same polytope at integral x as one binary per segment).
    Only x columns appear: the edge blocks and the reductions need not know about copies.
    """

    lo: np.ndarray      # (Z,) first checked point (index into the points) of each z
    hi: np.ndarray      # (Z,) one past its last
    coef: np.ndarray    # (Z,) copy bytes / memory scale
    rows: np.ndarray    # COO of the lower-bound rows: row (local), column, value
    cols: np.ndarray
    vals: np.ndarray
    row_lo: np.ndarray  # lower bound of each row (upper bound +inf)
    z0: int

    @property
    def num_cols(self) -> int:
        return len(self.lo)

    @property
    def num_rows(self) -> int:
        return len(self.row_lo)

    def fill(self, v: np.ndarray) -> None:
        """Set the z columns of a start vector from its x columns (z = max(0, its rows' bounds))."""
        if not self.num_cols:
            return
        z_of_row = self.cols[self._zpos]
        lhs = np.zeros(self.num_rows)
        other = ~self._zmask
        np.add.at(lhs, self.rows[other], self.vals[other] * v[self.cols[other]])
        need = np.maximum(self.row_lo - lhs, 0.0)     # z >= row_lo - (the x part)
        z = np.zeros(self.num_cols)
        np.maximum.at(z, z_of_row - self.z0, need)
        v[self.z0:self.z0 + self.num_cols] = np.minimum(z, 1.0)

    @property
    def _zmask(self):
        return (self.cols >= self.z0) & (self.cols < self.z0 + self.num_cols)

    @property
    def _zpos(self):
        # the z entry of each row, in row order (every row has exactly one)
        idx = np.nonzero(self._zmask)[0]
        return idx[np.argsort(self.rows[idx], kind="stable")]


def ilp_copy_columns(p, pts: np.ndarray, mem_scale: float, z0: int) -> CopyColumns | None:
    """The copy columns of problem ``p`` (``p.edge_memory``) over the checked time points ``pts``
    (sorted), numbered from column ``z0``. None when no copy can be live at a checked point."""
    em = p.edge_memory
    if em is None or not em.num_groups or not len(pts):
        return None
    offs = p.strategy_offsets
    lo, hi, coef, R, C, V, rlo = [], [], [], [], [], [], []
    r = 0

    def xterms(node, flags, sign):
        idx = np.nonzero(flags)[0]
        return list(offs[node] + idx), [sign] * len(idx)

    for g in range(em.num_groups):
        ms = np.arange(em.member_offsets[g], em.member_offsets[g + 1])
        if not len(ms) or em.group_bytes[g] <= 0:
            continue
        u = int(em.group_node[g])
        # members that can be active at all
        ms = [m for m in ms if em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]].any()
              and not em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]].all()]
        if not ms:
            continue
        times = sorted({int(em.member_time[m]) for m in ms})
        segs = []   # (t_lo, t_hi inclusive of points, members before, members after)
        for a, t in enumerate(times):
            segs.append((t, t, [m for m in ms if em.member_time[m] <= t], [m for m in ms if em.member_time[m] >= t]))
            if a + 1 < len(times):
                segs.append((t + 1, times[a + 1] - 1, [m for m in ms if em.member_time[m] <= t],
                             [m for m in ms if em.member_time[m] >= times[a + 1]]))
        for t_lo, t_hi, before, after in segs:
            a_i = int(np.searchsorted(pts, t_lo, side="left"))
            b_i = int(np.searchsorted(pts, t_hi, side="right"))
            if b_i <= a_i:
                continue
            zc = z0 + len(lo)
            lo.append(a_i)
            hi.append(b_i)
            coef.append(float(em.group_bytes[g]) / mem_scale)
            done = set()
            for i in before:
                for j in after:
                    key = (min(i, j), max(i, j))
                    if key in done:
                        continue
                    done.add(key)
                    cols, vals = [zc], [1.0]
                    fi = em.member_free[em.free_offsets[i]:em.free_offsets[i + 1]]
                    fj = em.member_free[em.free_offsets[j]:em.free_offsets[j + 1]]
                    for m in ({i, j}):
                        c, v = xterms(int(em.member_node[m]), em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]], -1.0)
                        cols += c
                        vals += v
                    c, v = xterms(u, fi, 1.0)
                    cols += c
                    vals += v
                    if i != j and not np.array_equal(fi, fj):
                        c, v = xterms(u, fj, 1.0)
                        cols += c
                        vals += v
                    # merge duplicate columns (a consumer reading the value twice)
                    cc, inv = np.unique(np.asarray(cols, dtype=np.int64), return_inverse=True)
                    vv = np.zeros(len(cc))
                    np.add.at(vv, inv, np.asarray(vals))
                    R += [r] * len(cc)
                    C += list(cc)
                    V += list(vv)
                    rlo.append(-1.0 if i != j else 0.0)
                    r += 1
    if not lo:
        return None
    return CopyColumns(np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64), np.array(coef),
                       np.array(R, dtype=np.int64), np.array(C, dtype=np.int64), np.array(V, dtype=np.float64),
                       np.array(rlo), z0)


class CopyTracker:
    """The copies of a plan decided node by node (the environment's running live profile).
    ``decide(i, s_i, strategies)`` -> [(lo, hi, bytes)]: the grid ranges [lo, hi) that became
    covered by a copy when node i took strategy s_i (``strategies[j] < 0``: j not decided yet).
    A copy's span only grows as members turn active, so the ranges add up to ``intervals``."""

    def __init__(self, em: CopyGroups, grid: np.ndarray, n: int):
        self.em = em
        g_of = em.member_group
        self.g_of = g_of
        self.mlo = np.searchsorted(grid, em.member_time).tolist()
        self.mhi = np.searchsorted(grid, em.member_time + 1).tolist()
        touch: list = [[] for _ in range(n)]
        for m, (v, g) in enumerate(zip(em.member_node.tolist(), g_of.tolist())):
            touch[v].append(m)
            touch[int(em.group_node[g])].append(m)
        self.touch = touch
        self.lo = [None] * em.num_groups
        self.hi = [None] * em.num_groups

    def fresh(self) -> "CopyTracker":
        """A tracker with nothing decided, sharing this one's static tables."""
        t = object.__new__(CopyTracker)
        t.em, t.g_of, t.mlo, t.mhi, t.touch = self.em, self.g_of, self.mlo, self.mhi, self.touch
        t.lo = [None] * self.em.num_groups
        t.hi = [None] * self.em.num_groups
        return t

    def decide(self, i: int, si: int, strategies) -> list:
        em, out = self.em, []
        for m in self.touch[i]:
            g = int(self.g_of[m])
            u, v = int(em.group_node[g]), int(em.member_node[m])
            su, sv = (si if u == i else strategies[u]), (si if v == i else strategies[v])
            if su < 0 or sv < 0 or not em.member_want[em.want_offsets[m] + sv] or em.member_free[em.free_offsets[m] + su]:
                continue
            a, b, lo, hi = self.mlo[m], self.mhi[m], self.lo[g], self.hi[g]
            if lo is None:
                out.append((a, b, float(em.group_bytes[g])))
                self.lo[g], self.hi[g] = a, b
                continue
            if a < lo:
                out.append((a, lo, float(em.group_bytes[g])))
                self.lo[g] = a
            if b > hi:
                out.append((hi, b, float(em.group_bytes[g])))
                self.hi[g] = b
        return out
