"""Exact planning: the strategy problem as a mixed-integer program solved by HiGHS.

Model (Alpa's formulation, on the reduced problem from ``solvers.reduce``):

* x[i, s] ∈ {0, 1}, Σ_s x[i, s] = 1 for every node i (single-strategy nodes are fixed to 1).
* Edge e = (u, v): continuous y[e, s, t] ≥ 0 with Σ_t y[e, s, t] = x[u, s] and
  Σ_s y[e, s, t] = x[v, t]; with x one-hot this forces y = x_u x_vᵀ, so edge costs are linear.
  Continuous linearised edge variables beat integer ones (DESIGN.md: 14 s vs 22 s at 1,000 nodes).
  Edge entries at or above ``FORBIDDEN_COST`` (IOPDDL's 1e18 "impossible") get no variable; if
  that makes the model infeasible it is solved again with them allowed. Strategies with equal
  rows (columns) of an edge matrix share one y per block (``_EdgeBlocks``; same LP and MIP).
* Memory: at every time point just before some interval ends (the live sets there contain all
  others, and usages are ≥ 0), Σ_{i live} Σ_s usage[i, s] x[i, s] ≤ cap, with
  cap = min(problem.usage_limit, memory_cap_bytes). Nodes with one usage add a constant. Big
  models get the same constraint as running sums of per-node usage columns (``_MemAux``).
  Resharded copies (``problem.edge_memory``) add z columns bounded by edge variables
  (``solvers.copy_rows``); their nodes are kept whole by the reductions (copy classes). On gpt
  tiny the min-M model then has 7,460 integer and 129,680 columns in all (without copies the
  reductions left 3,800 strategies at the minimum peak).
* time = Σ node costs + Σ edge costs (exactly ``evaluate(...).total``).
* Solving: the LP relaxation first (``_try_lp``): an integral vertex is a proven optimum (the
  case on every traced model tried); a fractional one is rounded into the MIP's start. Under a
  memory cap the time objective first tries the uncapped LP (``_relax_cap``).

Exact tightening before every model with memory in it (``_tighten``): a strategy that breaks the
cap on its own (every other node at its least usage) is dropped; a memory row at time t is kept
only if the live usage with every node at its largest remaining usage can exceed the cap (or,
for the peak variable M, a proven lower bound on M); nodes with no kept row in their interval
are memory-free and go through the reductions like nodes without memory (dominance, leaf/chain
elimination). On gpt tiny / cpu-2x4 at the minimum peak: 7,460 -> 3,800 strategies, 483 -> 80
rows, 626 -> 241 free nodes.

Objectives:
* ``time``: min time.
* ``memory``: min peak M, then *lexicographically* min time at that peak.
  - Phase 1 without ``max_step_time_s`` needs no solver: usage is per node and the live profile
    a sum over nodes, so the plan giving every node its least usage minimises every time point
    at once; its peak M* is the optimum (``_min_usage``). Phase 2 = time objective under the
    cap M*, seeded with that plan. SolveInfo.bound/gap refer to phase 1 (bound = M*, gap 0);
    status is "time_limit" when phase 2 (the time tie-break) is not proven in time. With copy
    groups that shortcut is void: the min-M model runs between the copy-free lower bound and the
    best seed, after the copy-aware peak shaver's bisection (``_min_peak_model``).
  - With a bound T: seeds (``initial_plans``; ``shardgym.solve`` passes the baseline plans of
    a traced problem) give UB = the lowest peak of a seed within T. A fast peak-shaving
    heuristic (``_PeakShaver``) bisects the cap for better plans within T; then exact steps
    "min time under cap C" stop at the first plan within T (UB = its peak) or when HiGHS's dual
    bound proves none exists (LB = C); integral usages close at UB <= floor(LB) + 1, otherwise
    the min-M model between the bounds finishes. At the time limit: the best plan, status
    "time_limit", bound LB (>= M*), gap (UB - LB) / UB. Never above the best seed within T.
* ``redundancy``: min Σ redundant bytes, then min time. Phase 1 is free (R* = Σ per-node
  minima, reached iff every node uses a least-redundancy strategy), so phase 2 is the time
  objective on those strategies alone; only if the cap or T rules them all out does the
  two-phase model run, seeded and with strategies that alone exceed the seed's value dropped.
* ``weights={"time": a, "memory": b, "redundancy": c}``: one solve of a·time + b·M + c·redundant.
``max_step_time_s`` adds time ≤ bound; ``memory_cap_bytes`` adds the memory rows.

Optimality is up to HiGHS's ``mip_rel_gap`` (default here 1e-6) and its feasibility tolerance
(1e-9, relative to the scaled rows). OR-Tools CP-SAT (2 workers) on the same model, 60 s each
(``experiments/bench_ilp.py --sections s``): 1.34x HiGHS's cost on a random 1,000-node problem,
1.61x and 2.26x on gpt / unet tiny, which HiGHS proves optimal in under 2 s; HiGHS is kept.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from costmodel.problem import Problem, as_strategy_array, evaluate, usage_profile
from solvers.copy_rows import CopyColumns, copy_columns, edge_signatures
from solvers.copy_search import CopyShaver
from solvers.reduce import FORBIDDEN_COST, Reduction, identity_reduction, reduce_problem

OBJECTIVES = ("time", "memory", "redundancy")
HIGHS_OPTIONS: dict = {}   # extra HiGHS options for every model (benchmarks set them; empty = defaults)
HEURISTIC_SHARE = 0.5   # memory objective under a bound: share of the time limit for _PeakShaver
RELAX_SHARE = 0.5       # time objective under a cap: share of the time limit for the uncapped solve
DENSE_MEMORY_NONZEROS = 2_000_000   # memory as one dense row per time point up to this many nonzeros
LP_SHARE = 0.5          # share of a solve's time limit for the LP relaxation tried first (_try_lp)


class InfeasibleError(ValueError):
    """No plan meets the constraints. ``min_peak_bytes``: the lowest peak memory any plan reaches
    (under the step-time bound, if any); ``min_step_time_s``: the fastest step time any plan
    reaches under the memory cap (set when the step-time bound is what fails)."""

    def __init__(self, msg, min_peak_bytes=None, min_step_time_s=None):
        super().__init__(msg)
        self.min_peak_bytes = min_peak_bytes
        self.min_step_time_s = min_step_time_s


@dataclass(frozen=True)
class SolveInfo:
    status: str                 # "optimal" | "time_limit" | "infeasible" | "heuristic" | ...
    objective: float            # the requested objective on the returned plan (original problem)
    bound: float                # HiGHS's proven lower bound on the (first-phase) objective
    gap: float                  # (objective - bound) / |objective|
    wall_s: float
    num_vars: int
    num_rows: int
    reduced_nodes: int          # nodes left with more than one strategy after the reductions
    objective_name: str = "time"
    step_time_s: float = 0.0
    peak_memory_bytes: float = 0.0
    redundant_memory_bytes: float = 0.0
    reduction: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


# ---- model assembly ---------------------------------------------------------------------------
@dataclass
class _Model:
    highs: object
    num_x: int
    m_col: int | None
    red_row: int | None
    time_cols: np.ndarray        # column costs of "time" (node + edge), unscaled
    red_cols: np.ndarray
    time_scale: float
    num_rows: int
    aux: "_MemAux | None" = None
    eb: "_EdgeBlocks | None" = None
    copies: CopyColumns | None = None   # z columns of the shared resharded copies (edge_memory)


@dataclass
class _EdgeBlocks:
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
    def of(p: Problem, forbid: bool, signatures: dict | None = None) -> "_EdgeBlocks":
        """``signatures``: per edge a code matrix that must be constant on blocks too (the copy
        masks, ``solvers.copy_rows.edge_signatures``)."""
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
        return _EdgeBlocks(cat(ru, np.int64), cat(cv, np.int64), gu_a, gv_a, _starts(gu_a * gv_a),
                           bcost, ycol)

    def block_of(self, p: Problem, s: np.ndarray) -> np.ndarray:
        """The block each edge pays under plan ``s`` (original strategy indices)."""
        k = p.num_strategies
        su, sv = s[p.edges[:, 0]], s[p.edges[:, 1]]
        g = self.ru[_starts(k[p.edges[:, 0]]) + su]
        h = self.cv[_starts(k[p.edges[:, 1]]) + sv]
        return self.boff + g * self.gv + h


@dataclass
class _MemAux:
    """The memory part of the model. With usages offset by each node's least usage (the sum of
    the least usages is the constant ``const`` per time point), a node j whose usage varies gets
    a column u_j = sum_s (usage - umin) / scale * x[j, s]; the live usage at checked time point t
    is a running sum L_t = L_{t-1} + (u of nodes starting at t) - (u of nodes ended at t). The cap
    is a column bound on L_t, the peak M one row L_t + const_t / scale <= M. This is the same
    polytope as one row per time point over every live (node, strategy) pair, with O(nodes)
    nonzeros instead of O(nodes x points x strategies): 10.7M -> 3.6M in all on gpt 1.3b. Up to
    DENSE_MEMORY_NONZEROS the dense rows are used instead (``dense``): same polytope, and HiGHS's
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
    def of(p: Problem, row_times, mem_scale: float, u0: int) -> "_MemAux | None":
        pts, live = _memory_rows(p)
        if row_times is not None and len(pts):
            pts = pts[np.isin(pts, row_times)]   # the others can never bind (see _tighten)
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
        col = offs[var][j] + np.arange(int(kk.sum())) - np.repeat(_starts(kk), kk)
        coef = (p.node_usages[col] - umin[var][j]) / mem_scale
        nz = coef != 0
        # the dense rows are kept where they are small: HiGHS's MIP heuristics work better on
        # rows over the strategy columns (random 1,000-node problem, 60 s: 312k vs 549k)
        nnz = int(cnt[var][j[nz]].sum())
        if p.edge_memory is not None:   # each copy's z enters every row of its span
            s_lo, s_hi, ok = p.edge_memory.spans()
            nnz += int((np.searchsorted(pts, s_hi[ok]) - np.searchsorted(pts, s_lo[ok])).sum())
        dense = nnz <= DENSE_MEMORY_NONZEROS
        return _MemAux(var, lo_i[var], hi_i[var], const, j[nz], col[nz], coef[nz],
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


def _y_terms(p: Problem, eb: _EdgeBlocks, S: int):
    """For solvers.copy_rows: (u, v, mask over u's x v's strategies) -> the y columns of the
    blocks of the u-v edge that the mask covers (blocks are pure: the copy signatures), or None
    when no edge joins u and v. Forbidden blocks have no column (their y is 0)."""
    k = p.num_strategies
    pair = {(int(a), int(b)): e for e, (a, b) in enumerate(p.edges)}
    ru_off = _starts(k[p.edges[:, 0]]) if p.num_edges else np.zeros(0, dtype=np.int64)
    cv_off = _starts(k[p.edges[:, 1]]) if p.num_edges else np.zeros(0, dtype=np.int64)

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


def _starts(counts):
    """Exclusive prefix sum: where each run of ``counts`` starts."""
    out = np.zeros(len(counts), dtype=np.int64)
    if len(counts) > 1:
        np.cumsum(counts[:-1], out=out[1:])
    return out


def _memory_rows(p: Problem):
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


def _build(p: Problem, cap, need_m: bool, max_time, forbid: bool, weights: dict, threads: int,
           rel_gap: float, verbose: bool, row_times=None, m_lo: float = 0.0, col_mask=None):
    import highspy

    k = p.num_strategies
    n = p.num_nodes
    S = int(k.sum())
    offs = p.strategy_offsets
    node_of = np.repeat(np.arange(n), k)
    # edge y columns, one per allowed block of identical entries (see _EdgeBlocks)
    ne = p.num_edges
    copies_in = (cap is not None or need_m) and p.edge_memory is not None
    eb = _EdgeBlocks.of(p, forbid, edge_signatures(p) if copies_in else None)
    ycols = np.nonzero(eb.ycol >= 0)[0]          # allowed blocks
    Y = len(ycols)
    mem_scale, m_lower, aux = 1.0, 0.0, None
    if cap is not None or need_m:
        mem_scale = float(max(np.abs(p.node_usages).max() if S else 1.0, cap or 0.0, 1.0))
        aux = _MemAux.of(p, row_times, mem_scale, S + Y + (1 if need_m else 0))
        if aux is not None:
            m_lower = float(aux.const.max())
    cc = None
    if aux is not None and copies_in:
        cc = copy_columns(p, aux.pts, mem_scale, S + Y + (1 if need_m else 0) + aux.num_cols, _y_terms(p, eb, S))
    num_extra = (1 if need_m else 0) + (0 if aux is None else aux.num_cols) + (0 if cc is None else cc.num_cols)
    num_cols = S + Y + num_extra
    m_col = S + Y if need_m else None

    node_forbidden = (p.node_costs >= FORBIDDEN_COST) if forbid else np.zeros(S, dtype=bool)
    node_c = np.where(node_forbidden, 0.0, p.node_costs)   # forbidden columns are fixed at 0 below
    time_cols = np.concatenate([node_c, eb.bcost[ycols], np.zeros(num_extra)])
    red_cols = np.concatenate([p.node_redundant, np.zeros(Y + num_extra)])
    finite = np.abs(time_cols[np.abs(time_cols) < FORBIDDEN_COST])
    # typical coefficients near 1: HiGHS's dual tolerance (1e-7) would swamp small costs if the
    # largest cost were scaled to 1
    finite = finite[finite > 0]
    time_scale = float(np.median(finite)) if finite.size else 1.0

    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    # one-hot
    rows.append(node_of)
    cols.append(np.arange(S))
    vals.append(np.ones(S))
    lo.append(np.ones(n))
    hi.append(np.ones(n))
    r += n
    if ne:
        # row ids: for edge e, gu rows (producer groups) then gv rows (consumer groups)
        gu, gv = eb.gu, eb.gv
        rstart = _starts(gu + gv)
        e_of = np.repeat(np.arange(ne), gu * gv)[ycols]
        local = ycols - eb.boff[e_of]
        g, hh = local // gv[e_of], local % gv[e_of]
        ycol_ids = S + np.arange(Y)
        rows += [r + rstart[e_of] + g, r + rstart[e_of] + gu[e_of] + hh]
        cols += [ycol_ids, ycol_ids]
        vals += [np.ones(Y), np.ones(Y)]
        # - x terms: each strategy in its group's row
        ku_all, kv_all = k[p.edges[:, 0]], k[p.edges[:, 1]]
        er = np.repeat(np.arange(ne), ku_all)
        pu_local = np.arange(int(ku_all.sum())) - np.repeat(_starts(ku_all), ku_all)
        rows.append(r + rstart[er] + eb.ru)
        cols.append(offs[p.edges[er, 0]] + pu_local)
        vals.append(-np.ones(len(er)))
        ev = np.repeat(np.arange(ne), kv_all)
        pv_local = np.arange(int(kv_all.sum())) - np.repeat(_starts(kv_all), kv_all)
        rows.append(r + rstart[ev] + gu[ev] + eb.cv)
        cols.append(offs[p.edges[ev, 1]] + pv_local)
        vals.append(-np.ones(len(ev)))
        nr = int((gu + gv).sum())
        lo.append(np.zeros(nr))
        hi.append(np.zeros(nr))
        r += nr
    # memory (see _MemAux)
    if aux is not None and aux.dense:
        # one row per time point t: sum over live (node, strategy) of coef * x <= (cap - const_t) / scale
        P = len(aux.const)
        cnt = aux.hi - aux.lo
        reps = cnt[aux.x_node]
        pt = np.repeat(aux.lo[aux.x_node], reps) + (np.arange(int(reps.sum())) - np.repeat(_starts(reps), reps))
        rows.append(r + pt)
        cols.append(np.repeat(aux.x_col, reps))
        vals.append(np.repeat(aux.x_coef, reps))
        if cc is not None:   # a copy's z in every row of its segment
            zr = cc.hi - cc.lo
            rows.append(r + np.repeat(cc.lo, zr) + (np.arange(int(zr.sum())) - np.repeat(_starts(zr), zr)))
            cols.append(np.repeat(cc.z0 + np.arange(cc.num_cols), zr))
            vals.append(np.repeat(cc.coef, zr))
        if need_m:
            rows.append(r + np.arange(P))
            cols.append(np.full(P, m_col))
            vals.append(-np.ones(P))
            lo.append(np.full(P, -np.inf))
            hi.append(-aux.const / mem_scale)
        else:
            lo.append(np.full(P, -np.inf))
            hi.append((cap - aux.const) / mem_scale)
        r += P
    elif aux is not None:
        # per-node usage columns u, running-sum columns L
        U, P = len(aux.var_nodes), len(aux.const)
        u0, l0 = aux.u0, aux.l0
        # u_j - sum_s (usage[i, s] - umin_i) / scale * x[i, s] = 0
        rows += [r + aux.x_node, r + np.arange(U)]
        cols += [aux.x_col, u0 + np.arange(U)]
        vals += [-aux.x_coef, np.ones(U)]
        lo.append(np.zeros(U))
        hi.append(np.zeros(U))
        r += U
        # L_t - L_{t-1} - sum_{j starts at t} u_j + sum_{j ended at t} u_j = 0
        rows += [r + np.arange(P), r + np.arange(1, P), r + aux.lo, r + aux.hi[aux.hi < P]]
        cols += [l0 + np.arange(P), l0 + np.arange(P - 1), u0 + np.arange(U),
                 u0 + np.nonzero(aux.hi < P)[0]]
        vals += [np.ones(P), -np.ones(P - 1), -np.ones(U), np.ones(int((aux.hi < P).sum()))]
        if cc is not None:   # a copy's z enters the running sum at its segment's ends, like a u column
            zc = cc.z0 + np.arange(cc.num_cols)
            rows += [r + cc.lo, r + cc.hi[cc.hi < P]]
            cols += [zc, zc[cc.hi < P]]
            vals += [-cc.coef, cc.coef[cc.hi < P]]
        lo.append(np.zeros(P))
        hi.append(np.zeros(P))
        r += P
        if need_m:
            # L_t + const_t / scale <= M
            rows += [r + np.arange(P), r + np.arange(P)]
            cols += [l0 + np.arange(P), np.full(P, m_col)]
            vals += [np.ones(P), -np.ones(P)]
            lo.append(np.full(P, -np.inf))
            hi.append(-aux.const / mem_scale)
            r += P
    if cc is not None:   # z >= the y (or x) terms saying the copy is live there (solvers.copy_rows)
        rows.append(r + cc.rows)
        cols.append(cc.cols)
        vals.append(cc.vals)
        lo.append(cc.row_lo)
        hi.append(np.full(cc.num_rows, np.inf))
        r += cc.num_rows
    red_row = None
    if max_time is not None:
        nz = np.nonzero(time_cols)[0]
        rows.append(np.full(len(nz), r))
        cols.append(nz)
        vals.append(time_cols[nz] / time_scale)
        lo.append(np.array([-np.inf]))
        hi.append(np.array([max_time / time_scale]))
        r += 1
    # a spare row for the lexicographic phase (bounded later)
    if weights.get("_lex_red"):
        nz = np.nonzero(red_cols)[0]
        rows.append(np.full(len(nz), r))
        cols.append(nz)
        vals.append(red_cols[nz])
        lo.append(np.array([-np.inf]))
        hi.append(np.array([np.inf]))
        red_row = r
        r += 1

    R = np.concatenate(rows).astype(np.int64)
    C = np.concatenate(cols).astype(np.int64)
    V = np.concatenate(vals).astype(np.float64)
    order = np.lexsort((C, R))
    R, C, V = R[order], C[order], V[order]
    start = np.zeros(r + 1, dtype=np.int64)
    np.add.at(start, R + 1, 1)
    start = np.cumsum(start)

    lp = highspy.HighsLp()
    lp.num_col_ = num_cols
    lp.num_row_ = r
    col_lo = np.zeros(num_cols)
    col_hi = np.ones(num_cols)
    if need_m:
        col_lo[m_col] = max(m_lower, m_lo) / mem_scale
        col_hi[m_col] = np.inf if cap is None else cap / mem_scale
    if aux is not None and not aux.dense:
        col_hi[aux.u0:aux.l0] = aux.u_max
        col_hi[aux.l0:aux.l0 + len(aux.const)] = np.inf if cap is None else (cap - aux.const) / mem_scale
    fixed = np.repeat(k == 1, k)
    col_lo[:S][fixed] = 1.0
    col_hi[:S][node_forbidden & ~fixed] = 0.0   # 1e18 "impossible" strategies (folded costs too)
    if col_mask is not None:
        col_hi[:S][~np.asarray(col_mask, dtype=bool) & ~fixed] = 0.0   # strategies ruled out exactly
    lp.col_lower_ = col_lo
    lp.col_upper_ = col_hi
    lp.col_cost_ = np.zeros(num_cols)
    lp.row_lower_ = np.concatenate(lo)
    lp.row_upper_ = np.concatenate(hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = num_cols
    lp.a_matrix_.num_row_ = r
    lp.a_matrix_.start_ = start.astype(np.int32)
    lp.a_matrix_.index_ = C.astype(np.int32)
    lp.a_matrix_.value_ = V
    integ = [highspy.HighsVarType.kContinuous] * num_cols
    for j in range(S):
        integ[j] = highspy.HighsVarType.kInteger
    lp.integrality_ = integ
    h = new_highs()
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("mip_rel_gap", float(rel_gap))
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    h.setOptionValue("primal_feasibility_tolerance", 1e-9)
    # HiGHS 1.16's MIP restart (after the root fixes many columns) can hang past the time limit:
    # meshgraphnet tiny on h100-2x8 under half its peak span ran 17 minutes of a 60 s limit; with
    # restarts off it returns at 60 s
    h.setOptionValue("mip_allow_restart", False)
    for key, val in HIGHS_OPTIONS.items():
        h.setOptionValue(key, val)
    h.passModel(lp)
    return _Model(h, S, m_col, red_row, time_cols, red_cols, time_scale, r, aux, eb, cc), mem_scale


def _try_lp(model: _Model, time_limit_s: float):
    """Solve the LP relaxation (dual simplex). If it ends optimal with every strategy variable at
    0 or 1 (within 1e-7), that vertex is an optimal plan of the MIP and the LP value its proven
    bound: -> ("optimal", x, obj, obj). A fractional LP optimum -> ("fractional", x, obj, obj)
    (the caller may round it into a start for the MIP); no LP optimum in time -> None. The
    integrality is restored either way.

    Why: the linearised edge model is the local polytope of a pairwise problem, and on the zoo's
    traced graphs it is integral (gpt 125m and 1.3b on h100-2x8: no fractional strategy variable),
    so the LP alone proves the optimum. HiGHS's MIP solves the same root LP but then spends as
    long again in presolve, cuts and heuristics (gpt 125m: 10.8 s LP against 29 s MIP)."""
    import highspy
    h = model.highs
    nx = model.num_x
    idx = np.arange(nx, dtype=np.int32)
    h.changeColsIntegrality(nx, idx, np.full(nx, highspy.HighsVarType.kContinuous))
    h.setOptionValue("time_limit", float(max(time_limit_s, 0.05)))
    try:
        h.run()
        ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        if ok:
            x = np.asarray(h.getSolution().col_value)
            xs = x[:nx]
            obj = float(h.getInfo().objective_function_value)
            if float(np.max(np.minimum(np.abs(xs), np.abs(1.0 - xs)), initial=0.0)) <= 1e-7:
                return "optimal", x, obj, obj
            return "fractional", x, obj, obj
    finally:
        h.changeColsIntegrality(nx, idx, np.full(nx, highspy.HighsVarType.kInteger))
        h.clearSolver()
    return None


def _run(model: _Model, cost: np.ndarray, time_limit_s: float, start: np.ndarray | None,
         abs_gap: float = 0.0, cutoff: float | None = None, lp_first: bool = True, rounder=None,
         lp_only: bool = False):
    """Set the objective (column costs), optionally a start, solve. -> (status, x, obj, bound).
    ``abs_gap``: HiGHS's mip_abs_gap in objective units (just under 1 unit for integer data,
    where a gap below 1 proves the optimum; 0 otherwise, leaving mip_rel_gap in charge).
    ``lp_first``: try the LP relaxation first (``_try_lp``, up to LP_SHARE of the time limit)
    and return its vertex when that is integral. ``rounder(x)``: a start vector made from a
    fractional LP solution (or None); it seeds the MIP when it is cheaper than ``start``.
    ``lp_only``: stop after the LP; -> ("lp_not_integral", None, nan, nan) unless it proved the optimum."""
    import highspy
    t_run = time.perf_counter()
    h = model.highs
    h.setOptionValue("mip_abs_gap", float(abs_gap))
    n = len(cost)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), cost.astype(np.float64))
    h.setOptionValue("time_limit", float(max(time_limit_s, 0.05)))
    h.clearCallbacks()
    if cutoff is not None:
        # a yes/no question: stop at the first plan with objective <= cutoff, or once the dual
        # bound proves there is none
        def stop(kind, message, out, inp, data):
            if out.mip_primal_bound <= cutoff or out.mip_dual_bound > cutoff * (1 + 1e-9) + 1e-12:
                inp.user_interrupt = True
        h.setCallback(stop, None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
    def end_callback():
        if cutoff is not None:
            h.stopCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
            h.clearCallbacks()

    if lp_first and model.num_x:
        done = _try_lp(model, time_limit_s * (1.0 if lp_only else LP_SHARE))
        if lp_only and (done is None or done[0] != "optimal"):
            end_callback()
            return "lp_not_integral", None, float("nan"), float("nan")
        if done is not None and done[0] == "fractional":
            rounded = rounder(done[1]) if rounder is not None else None
            if rounded is not None and (start is None or float(cost @ rounded) < float(cost @ start)):
                start = rounded
            done = None
        if done is not None:
            end_callback()
            return done
        h.setOptionValue("time_limit", float(max(time_limit_s - (time.perf_counter() - t_run), 0.05)))
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    st = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == 2
    x = np.asarray(h.getSolution().col_value) if has else None
    name = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
        highspy.HighsModelStatus.kTimeLimit: "time_limit",
        highspy.HighsModelStatus.kUnboundedOrInfeasible: "infeasible",
        highspy.HighsModelStatus.kInterrupt: "interrupted",
    }.get(st, h.modelStatusToString(st))
    end_callback()
    return name, x, float(info.objective_function_value), float(info.mip_dual_bound)


def _decode(p: Problem, x: np.ndarray) -> list[int]:
    offs = p.strategy_offsets
    xs = x[: int(offs[-1])]
    out = []
    for i in range(p.num_nodes):
        out.append(int(np.argmax(xs[offs[i]:offs[i + 1]])))
    return out


def _start_vector(p: Problem, plan, num_cols, m_col, forbid, mem_scale, aux=None, eb=None, copies=None):
    """Column values of a plan (x, y, M, u, L) for HiGHS's setSolution."""
    v = np.zeros(num_cols)
    s = np.asarray(plan, dtype=np.int64)
    v[p.strategy_offsets[:-1] + s] = 1.0
    if p.num_edges:
        eb = _EdgeBlocks.of(p, forbid) if eb is None else eb
        b = eb.block_of(p, s)
        if (eb.ycol[b] < 0).any():
            return None
        v[int(p.strategy_offsets[-1]) + eb.ycol[b]] = 1.0
    if m_col is not None:
        v[m_col] = evaluate(p, plan).peak_memory_bytes / mem_scale
    if aux is not None:
        aux.fill(v)
    if copies is not None:
        copies.fill(v)
        if aux is not None and not aux.dense:   # the running sums carry the copies too
            P = len(aux.const)
            step = np.zeros(P + 1)
            z = v[copies.z0:copies.z0 + copies.num_cols] * copies.coef
            np.add.at(step, copies.lo, z)
            np.add.at(step, copies.hi, -z)
            v[aux.l0:aux.l0 + P] += np.cumsum(step)[:-1]
    return v


# ---- public entry ---------------------------------------------------------------------------
def _weights_for(objective, weights):
    if weights:
        w = {"time": 0.0, "memory": 0.0, "redundancy": 0.0}
        bad = set(weights) - set(w)
        if bad:
            raise ValueError(f"weights has unknown keys {sorted(bad)}; use time, memory, redundancy")
        w.update({a: float(b) for a, b in weights.items()})
        if any(x < 0 for x in w.values()) or not any(w.values()):
            raise ValueError(f"weights must be non-negative and not all zero, got {weights}")
        return w, False
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    return {"time": 1.0 if objective == "time" else 0.0,
            "memory": 1.0 if objective == "memory" else 0.0,
            "redundancy": 1.0 if objective == "redundancy" else 0.0}, objective != "time"


def new_highs():
    """A Highs instance without the banner HiGHS 1.16 writes to the C-level stdout on construction
    (output_flag cannot be set before the constructor runs): fd 1 points at /dev/null meanwhile."""
    import os
    import sys

    import highspy
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return h


def _peak_upper_bound(problem: Problem) -> float:
    """The peak of the profile where every node holds its largest usage: no plan's live usage
    exceeds it at any time point, so a cap at or above it never binds."""
    k = problem.num_strategies
    big = np.maximum.reduceat(problem.node_usages, problem.strategy_offsets[:-1]) if len(k) else np.zeros(0)
    em = problem.edge_memory
    ts, live = usage_profile(problem, big, times_too=None if em is None else em.time_points())
    if em is not None:
        live = live + em.upper_profile(ts)
    return float(live.max()) if len(live) else 0.0


def solve_ilp(problem: Problem, objective: str = "time", memory_cap_bytes=None, max_step_time_s=None,
              time_limit_s: float = 60, weights: dict | None = None, verbose: bool = False,
              reduce: bool = True, mip_rel_gap: float = 1e-6, threads: int = 2,
              initial_plan=None, forbid: bool = True, initial_plans=None,
              relax_cap: bool = True) -> tuple[list[int], SolveInfo]:
    """Plan ``problem`` exactly (see the module docstring). Returns (strategies, SolveInfo).

    ``initial_plan`` / ``initial_plans``: candidate plans (strategy lists); the best one that meets
    the cap and the step-time bound seeds the solver (e.g. baseline plans: with the memory
    objective under ``max_step_time_s`` the answer's peak is never above the best such seed).

    ``relax_cap``: with the time objective under a memory cap, first solve without the cap
    (``_relax_cap``); worth it when the cap often does not bind (traced models on big devices),
    a waste of up to RELAX_SHARE of the time limit where it always binds (IOPDDL instances).

    Raises InfeasibleError when no plan meets the memory cap / step-time bound, and
    RuntimeError when HiGHS finds no feasible plan within ``time_limit_s``.
    """
    t0 = time.perf_counter()
    if not isinstance(problem, Problem):
        raise ValueError(f"solve_ilp needs a Problem, got {type(problem).__name__}")
    w, lexi = _weights_for(objective, weights)
    cap = problem.usage_limit
    if memory_cap_bytes is not None:
        if memory_cap_bytes < 0:
            raise ValueError(f"memory_cap_bytes must be >= 0, got {memory_cap_bytes}")
        cap = float(memory_cap_bytes) if cap is None else min(cap, float(memory_cap_bytes))
    if max_step_time_s is not None and not np.isfinite(max_step_time_s):
        raise ValueError(f"max_step_time_s must be finite, got {max_step_time_s}")
    if time_limit_s is None or not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    seeds = _check_seeds(problem, ([] if initial_plan is None else [initial_plan]) + list(initial_plans or []))
    if cap is not None and _peak_upper_bound(problem) <= cap:
        cap = None  # no plan can reach the cap: dropping it is exact and unlocks the reductions
    o = _Opts(t0=t0, deadline=t0 + float(time_limit_s), reduce=reduce, threads=threads,
              rel_gap=mip_rel_gap, verbose=verbose, forbid=forbid, memory_cap_bytes=memory_cap_bytes)
    if lexi and objective == "memory":
        return _solve_memory(problem, o, cap, max_step_time_s, seeds)
    if lexi:
        return _solve_redundancy(problem, o, cap, max_step_time_s, seeds)
    need_m = w["memory"] > 0
    m_lo = 0.0
    if need_m:   # a proven lower bound on the peak
        m_lo = _node_min_peak(problem) if problem.edge_memory is not None else _min_usage(problem)[1]
    key = (lambda c: w["time"] * c.total + w["memory"] * c.peak_memory_bytes
           + w["redundancy"] * c.redundant_memory_bytes)
    start = _best_seed(problem, seeds, cap, max_step_time_s, key)
    out = None
    if relax_cap and cap is not None and not need_m:
        out = _relax_cap(problem, o, w, objective, cap, max_step_time_s)
    if out is None:
        out = _core(problem, o, w=w, objective=objective, cap=cap, need_m=need_m, max_time=max_step_time_s,
                    start=start, m_lo=m_lo)
    if out is None:
        _explain_infeasible(problem, cap, max_step_time_s, o)
    return out


def _relax_cap(problem, o, w, objective, cap, max_time):
    """Solve the LP relaxation without the memory cap first (up to RELAX_SHARE of the time left;
    no branch-and-bound: a fractional LP ends the attempt at once). Dropping the cap
    relaxes the problem, so a proven optimum of the relaxation whose peak fits under the cap is
    a proven optimum of the capped problem; and the relaxation is much smaller (nodes whose
    usage varies can be eliminated, no memory rows). gpt 1.3b on h100-2x8 (80 GiB): the
    uncapped LP is integral, peaks at 23.9 GiB and is proven in 19 s; the capped LP does not finish
    in 140 s. -> the answer, or None when the relaxed LP is fractional or its plan breaks the cap."""
    out = _core(problem, o.until(time.perf_counter() + RELAX_SHARE * o.left()), w=w,
                objective=objective, cap=None, need_m=False, max_time=max_time, lp_only=True)
    if out is None or out[1].peak_memory_bytes > cap:
        return None
    plan, info = out
    red = dict(info.reduction)
    red["memory_cap_relaxed"] = True
    return plan, _with(info, wall_s=time.perf_counter() - o.t0, reduction=red)


# ---- helpers for the objectives -----------------------------------------------------------------
@dataclass
class _Opts:
    t0: float
    deadline: float
    reduce: bool
    threads: int
    rel_gap: float
    verbose: bool
    forbid: bool
    memory_cap_bytes: float | None = None

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def until(self, deadline: float) -> "_Opts":
        return _Opts(self.t0, min(self.deadline, deadline), self.reduce, self.threads, self.rel_gap,
                     self.verbose, self.forbid, self.memory_cap_bytes)


def _check_seeds(problem: Problem, seeds) -> list[list[int]]:
    out = []
    for s in seeds:
        s = getattr(s, "strategies", s)   # a Plan works too
        try:
            arr = as_strategy_array(problem, s)
        except Exception as e:  # noqa: BLE001 - PlanError or a shape error
            raise ValueError(f"initial_plan(s): not a plan of {problem.name!r}: {e}") from e
        out.append([int(x) for x in arr])
    return out


def _minmax(problem: Problem, vals: np.ndarray, allowed: np.ndarray | None = None):
    """Per-node min and max of ``vals`` (one entry per strategy) over the allowed strategies."""
    offs = problem.strategy_offsets[:-1]
    if allowed is None:
        return np.minimum.reduceat(vals, offs), np.maximum.reduceat(vals, offs)
    return (np.minimum.reduceat(np.where(allowed, vals, np.inf), offs),
            np.maximum.reduceat(np.where(allowed, vals, -np.inf), offs))


def _argmin_plan(problem: Problem, vals: np.ndarray) -> list[int]:
    """Per node the strategy with the least ``vals`` (ties: least node cost, then index)."""
    out = []
    offs = problem.strategy_offsets
    for i in range(problem.num_nodes):
        v = vals[offs[i]:offs[i + 1]]
        c = problem.node_costs[offs[i]:offs[i + 1]]
        out.append(int(np.lexsort((np.arange(len(v)), c, v))[0]))
    return out


def _min_usage(problem: Problem):
    """(the plan giving every node its least usage, its peak = the lowest peak of any plan).
    Usage is per node and the live profile a sum over nodes, so this plan minimises the live
    usage at every time point at once: its peak is the memory optimum (without a time bound)."""
    plan = _argmin_plan(problem, problem.node_usages)
    return plan, evaluate(problem, plan).peak_memory_bytes


def _range_min(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min(a[lo[i]:hi[i]]) for every i (inf where the range is empty): a sparse table."""
    out = np.full(len(lo), np.inf)
    ok = hi > lo
    if not len(a) or not ok.any():
        return out
    table = [np.asarray(a, dtype=np.float64)]
    j = 1
    while 2 * j <= len(a):
        prev = table[-1]
        table.append(np.minimum(prev[:-j], prev[j:]))
        j *= 2
    length = np.where(ok, hi - lo, 1)
    lev = np.floor(np.log2(length)).astype(np.int64)
    for lv in np.unique(lev[ok]):
        idx = ok & (lev == lv)
        t = table[lv]
        out[idx] = np.minimum(t[lo[idx]], t[hi[idx] - (1 << int(lv))])
    return out


def _tighten(problem: Problem, allowed, prune_cap, row_level):
    """Exact tightening of the memory part. Returns (allowed, memory_free, row_times).

    * Strategy pruning (``prune_cap``): with every other node at its least usage, node i's
      strategy s raises the live usage at each of i's time points t to lmin(t) + u_s - umin_i; if
      that exceeds the cap at some t, no plan within the cap uses s.
    * Rows (``row_level``): with every node at its largest remaining usage the live usage at t is
      lmax(t); a row at t with lmax(t) <= row_level can never bind (for a cap row_level = cap; for
      the peak variable M, row_level = a proven lower bound on M). Only the others are kept.
    * Nodes with no kept row in their interval are memory-free: their usage cannot matter, so the
      reductions may treat them like nodes without memory (dominance, leaf/chain elimination).
    """
    k = problem.num_strategies
    n = problem.num_nodes
    node_of = np.repeat(np.arange(n), k)
    use = problem.node_usages
    allowed = np.ones(len(use), dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool).copy()
    umin, _ = _minmax(problem, use, allowed)
    em = problem.edge_memory   # copies only add memory: lmin stays a lower bound; lmax gets them all
    ts, lmin = usage_profile(problem, umin, times_too=None if em is None else em.time_points())
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    live = en > st
    lo = np.where(live, np.searchsorted(ts, st, side="left"), 0)
    hi = np.where(live, np.searchsorted(ts, en, side="left"), 0)
    if prune_cap is not None:
        ms = _range_min(prune_cap - lmin, lo, hi)
        tol = 1e-9 * max(abs(float(prune_cap)), 1.0)
        drop = allowed & ((use - umin[node_of]) > ms[node_of] + tol)
        keep = allowed & ~drop
        empty = np.add.reduceat(keep.astype(np.int64), problem.strategy_offsets[:-1]) == 0
        keep |= allowed & np.repeat(empty, k)   # cap below this node's least usage: infeasible anyway
        allowed = keep
    _, umax = _minmax(problem, use, allowed)
    _, lmax = usage_profile(problem, umax, times_too=None if em is None else em.time_points())
    if em is not None:
        lmax = lmax + em.upper_profile(ts)
    if row_level is None:
        bind = np.ones(len(ts), dtype=bool)
    else:
        bind = lmax > row_level
    cb = np.concatenate([[0], np.cumsum(bind)])
    free = ((cb[hi] - cb[lo]) == 0) | (umax <= umin) | ~live
    if em is not None:
        free &= ~em.involved(n)
    return allowed, free, ts[bind]


def _best_seed(problem, seeds, cap, max_time, key):
    best, best_key = None, None
    for s in seeds:
        c = evaluate(problem, s)
        if (cap is not None and c.peak_memory_bytes > cap) or (max_time is not None and c.total > max_time):
            continue
        kk = key(c)
        if best_key is None or kk < best_key:
            best, best_key = s, kk
    return best


def _core(problem, o: _Opts, *, w=None, objective="time", lexi=False, cap=None, need_m=False,
          max_time=None, start=None, allowed=None, m_lo=0.0, cutoff_time=None, lp_only=False):
    """One exact HiGHS solve (the model of the module docstring) after the exact tightenings and
    reductions. Returns (plan, SolveInfo), or None when the model is infeasible. ``allowed``: a
    strategy mask the caller proved safe; ``m_lo``: a proven lower bound on the peak M."""
    if w is None:
        w = {"time": 1.0, "memory": 0.0, "redundancy": 0.0}
    memory_matters = cap is not None or need_m
    red_matters = w["redundancy"] > 0
    free, row_times = None, None
    if memory_matters:
        allowed, free, row_times = _tighten(problem, allowed, cap, m_lo if need_m else cap)
    attempts = [True, False] if o.forbid and not lp_only else [o.forbid]
    for use_forbid in attempts:
        if o.reduce:
            classes = (problem.edge_memory.strategy_classes(problem.num_strategies)
                       if memory_matters and problem.edge_memory is not None else None)
            red = reduce_problem(problem, memory_matters=memory_matters, redundancy_matters=red_matters,
                                 forbidden=FORBIDDEN_COST if use_forbid else None,
                                 allowed=allowed, memory_free=free, copy_classes=classes)
        else:
            red = identity_reduction(problem)
        out = _solve_reduced(problem, red, w, lexi, cap, need_m, max_time, o.deadline, o.t0, use_forbid,
                             o.threads, o.rel_gap, o.verbose, start, objective, row_times=row_times,
                             m_lo=m_lo, col_mask=None if o.reduce else allowed, cutoff_time=cutoff_time,
                             lp_only=lp_only)
        if out is not None:
            return out
    return None


def _with(info: SolveInfo, **kw) -> SolveInfo:
    d = info.to_dict()
    d.update(kw)
    return SolveInfo(**d)


def _solve_memory(problem, o: _Opts, cap, max_time, seeds):
    """Memory objective: min peak, then min time at that peak (lexicographic).

    Phase 1 without a step-time bound is exact and free: M* = the peak of the min-usage plan
    (``_min_usage``). Phase 2 is a time objective under the cap M*, seeded with that plan.
    With a bound T: if the min-time plan among the peak-M* plans meets T, that is the answer.
    Otherwise a bisection on the peak M between LB (no plan with peak <= LB meets T) and UB (the
    lowest peak of a known plan within T): each step solves min time under the cap C, which
    either yields a plan within T (UB = its peak) or proves none exists (LB = C). Peaks of
    integral usages are integral, so UB <= floor(LB) + 1 proves UB optimal; otherwise the
    min-M model closes the rest with the tight bounds. At the time limit the best plan is
    returned with status "time_limit", bound LB and gap (UB - LB) / UB.
    """
    p0, mstar = _min_usage(problem)
    copies = problem.edge_memory is not None
    if copies:   # the min-usage plan's peak is then only an upper bound: M* needs the min-M model
        mstar = _node_min_peak(problem)
    if cap is not None and mstar > cap:
        _raise_cap(problem, cap, o, mstar)
    seeds = seeds + [p0]
    time_key = (lambda c: c.total)
    c0 = evaluate(problem, p0)
    if copies and max_time is None:
        return _min_peak_model(problem, o, cap, seeds, mstar)
    if not copies and (max_time is None or c0.total <= max_time):
        polished = _PeakShaver(problem).shave(p0, mstar, time.perf_counter() + 0.1 * o.left())
        start = _best_seed(problem, seeds + ([polished] if polished else []), mstar, None, time_key)
        out = _core(problem, o, cap=mstar, start=start)
        assert out is not None, "the min-usage plan fits its own peak"
        plan, info = out
        return plan, _with(info, objective=info.peak_memory_bytes, bound=mstar, gap=0.0,
                           objective_name="memory")
    # ---- with a step-time bound ----
    integral = bool(np.all(problem.node_usages == np.round(problem.node_usages)))
    best = _best_seed(problem, seeds, cap, max_time, lambda c: (c.peak_memory_bytes, c.total))
    if best is None:   # no seed meets T: the min-time plan under the cap is the natural one
        out = _core(problem, o, cap=cap, start=_best_seed(problem, seeds, cap, None, time_key))
        if out is None:
            _explain_infeasible(problem, cap, max_time, o)
        plan_t, info_t = out
        if evaluate(problem, plan_t).total > max_time:
            if info_t.status == "optimal":
                _raise_time(problem, cap, max_time, mstar, evaluate(problem, plan_t).total)
            raise RuntimeError(f"HiGHS found no plan within max_step_time_s={max_time:.6g} for "
                               f"{problem.name!r} within the time limit; raise time_limit_s")
        best = plan_t
    bc = evaluate(problem, best)
    ub, lb, lb_strict = bc.peak_memory_bytes, mstar, False
    lexi_done = False          # is ``best`` known to be the min-time plan under the cap ub?
    steps = []

    def closed():
        if ub <= lb:
            return True
        return lb_strict and integral and ub <= np.floor(lb) + 1

    # heuristic bisection for a low UB fast (seconds), from every seed and the min-usage plan
    shaver = _PeakShaver(problem) if not copies else CopyShaver(problem)
    h_until = time.perf_counter() + max(HEURISTIC_SHARE * o.left(), min(2.0, o.left()))
    h_lo = mstar
    starts = seeds   # the seeds (caller's plans first) and p0
    while time.perf_counter() < h_until and (ub - h_lo) > 1e-3 * ub:
        c = h_lo + 0.5 * (ub - h_lo)
        if copies:   # the lower bound is weak with copies: step down from the best plan instead
            c = max(c, 0.9 * ub)
        if integral:
            c = float(np.floor(c))
        if not h_lo < c < ub:
            break
        got = None
        for st in ([best] if copies else [best] + starts):
            r = shaver.shave(st, c, h_until)
            if r is None:
                continue
            rc = evaluate(problem, r)
            if rc.total <= max_time and (cap is None or rc.peak_memory_bytes <= cap) and \
                    (got is None or (rc.peak_memory_bytes, rc.total) < (got[1].peak_memory_bytes, got[1].total)):
                got = (r, rc)
        steps.append((float(c), "heuristic " + ("found" if got else "none"), None))
        if got is not None and (got[1].peak_memory_bytes, got[1].total) < (ub, bc.total):
            best, bc, ub = got[0], got[1], got[1].peak_memory_bytes
            lexi_done = False
        else:
            h_lo = c       # not a proof: only steers the heuristic

    c_next = mstar
    while not closed() and o.left() > 0.5 and (ub - lb) > 1e-4 * ub:
        c = c_next
        budget = max(0.4 * o.left(), min(5.0, o.left()))
        tstep = time.perf_counter()
        try:
            out = _core(problem, o.until(time.perf_counter() + budget),
                        cap=c if cap is None else min(c, cap), start=p0, cutoff_time=max_time)
        except RuntimeError:
            out = "timeout"
        if out is None:   # only when the cap alone is infeasible: cannot happen for c >= M*
            lb, lb_strict, res = c, True, "infeasible"
        elif out == "timeout":
            res = "timeout"
        else:
            plan, info = out
            pc = evaluate(problem, plan)
            if pc.total <= max_time:
                res = "feasible"
                if (pc.peak_memory_bytes, pc.total) < (ub, bc.total):
                    best, bc, ub = plan, pc, pc.peak_memory_bytes
                    lexi_done = info.status == "optimal"
            elif info.status == "optimal" or info.bound > max_time:
                lb, lb_strict, res = c, True, "none within T"
            else:
                res = "undecided"
        steps.append((float(c), res, round(time.perf_counter() - tstep, 2)))
        if res in ("timeout", "undecided"):
            c_next = c + 0.5 * (ub - c)     # an easier cap next
        else:
            c_next = lb + 0.5 * (ub - lb)
        if integral:
            c_next = float(np.floor(c_next))
            if lb_strict and c_next <= lb:
                c_next = float(np.floor(lb) + 1)
        if c_next >= ub:
            break
    status = "optimal" if closed() else "time_limit"
    if status != "optimal" and o.left() > 1.0 and (ub - lb) <= 0.02 * ub:
        # close the last bit with the min-peak model between the proven bounds
        out = _core(problem, o, w={"time": 0.0, "memory": 1.0, "redundancy": 0.0}, objective="memory",
                    lexi=True, cap=ub if cap is None else min(ub, cap), need_m=True, max_time=max_time,
                    start=best, m_lo=lb)
        if out is not None:
            plan, info = out
            pc = evaluate(problem, plan)
            if pc.total <= max_time and (pc.peak_memory_bytes, pc.total) <= (ub, bc.total):
                best, bc, ub = plan, pc, pc.peak_memory_bytes
                lexi_done = info.status == "optimal"
            if info.status == "optimal":
                status, lb = "optimal", ub
            elif np.isfinite(info.bound):
                lb = max(lb, info.bound)
    if not lexi_done and o.left() > 0.5:
        out = _core(problem, o, cap=ub, start=best)
        if out is not None:
            plan, info = out
            pc = evaluate(problem, plan)
            if pc.peak_memory_bytes <= ub and pc.total <= bc.total:
                best, bc = plan, pc
            lexi_done = info.status == "optimal"
    if not lexi_done:
        status = "time_limit"
    gap = 0.0 if status == "optimal" else (ub - lb) / max(ub, 1e-300)
    red_stats = {"bisection": steps, "min_usage_peak": mstar}
    return best, SolveInfo(
        status=status, objective=bc.peak_memory_bytes, bound=float(lb if status != "optimal" else ub),
        gap=float(gap), wall_s=time.perf_counter() - o.t0, num_vars=0, num_rows=0,
        reduced_nodes=0, objective_name="memory", step_time_s=bc.total,
        peak_memory_bytes=bc.peak_memory_bytes, redundant_memory_bytes=bc.redundant_memory_bytes,
        reduction=red_stats)


def _node_min_peak(problem: Problem) -> float:
    """The peak of the least node usages without the copies: a lower bound on every plan's peak
    (copies only add memory); the optimum when the problem has no edge memory."""
    umin = np.minimum.reduceat(problem.node_usages, problem.strategy_offsets[:-1])
    return float(max(usage_profile(problem, umin)[1].max(), 0.0))


def _min_peak_model(problem, o: _Opts, cap, seeds, m_lo):
    """Min peak, then min time at it, for a problem with copy groups (``edge_memory``): the min-M
    model between ``m_lo`` (a proven lower bound) and the best seed's peak, seeded with it."""
    best = _best_seed(problem, seeds, cap, None, lambda c: (c.peak_memory_bytes, c.total))
    ub = evaluate(problem, best).peak_memory_bytes
    # heuristic bisection on the cap for a lower start (the exact model is big with copies)
    shaver, c_lo = CopyShaver(problem), m_lo
    h_until = time.perf_counter() + HEURISTIC_SHARE * o.left()
    while time.perf_counter() < h_until and ub - c_lo > 1e-3 * ub:
        c = c_lo + 0.5 * (ub - c_lo)
        r = shaver.shave(best, c, h_until)
        rp = None if r is None else evaluate(problem, r).peak_memory_bytes
        if rp is not None and rp < ub:
            best, ub = r, rp
        else:
            c_lo = c
    out = _core(problem, o, w={"time": 0.0, "memory": 1.0, "redundancy": 0.0}, objective="memory", lexi=True,
                cap=ub if cap is None else min(ub, cap), need_m=True, start=best, m_lo=m_lo)
    if out is None:  # pragma: no cover - the seed fits its own peak
        raise AssertionError("the best seed fits its own peak")
    plan, info = out
    red = dict(info.reduction)
    red["min_usage_peak"] = m_lo
    pc = evaluate(problem, plan)
    if info.status != "optimal" and (pc.peak_memory_bytes, pc.total) > (ub, evaluate(problem, best).total):
        plan = list(best)   # HiGHS's incumbent at the time limit is worse than its start
        pc = evaluate(problem, plan)
    return plan, _with(info, objective_name="memory", reduction=red, objective=pc.peak_memory_bytes,
                       step_time_s=pc.total, peak_memory_bytes=pc.peak_memory_bytes,
                       redundant_memory_bytes=pc.redundant_memory_bytes)


class _PeakShaver:
    """Fast heuristic plans for "lowest peak within a step-time bound" (no proof; the exact
    bisection in ``_solve_memory`` supplies the bounds). From a start plan, ``shave(s, cap)``
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


def _solve_redundancy(problem, o: _Opts, cap, max_time, seeds):
    """Redundancy objective: min redundant bytes, then min time at that optimum.

    Phase 1 is free: R* = Σ_i min_s redundant[i, s] (a sum over nodes); a plan reaches R* iff
    every node uses one of its least-redundancy strategies, so phase 2 is the time objective on
    those strategies alone (under the cap and T). Only when that restricted problem has no plan
    (the cap or T rules all out) does the full two-phase model run, seeded with the best
    feasible plan R_inc and with every strategy whose excess over its node's minimum is above
    R_inc - R* dropped (such a strategy alone makes a plan worse than the seed).
    """
    rd = problem.node_redundant
    rmin, _ = _minmax(problem, rd)
    node_of = np.repeat(np.arange(problem.num_nodes), problem.num_strategies)
    at_min = rd <= rmin[node_of]
    p0 = _argmin_plan(problem, rd)
    rstar = evaluate(problem, p0).redundant_memory_bytes
    time_key = (lambda c: c.total)
    sub_seeds = [s for s in seeds + [p0] if at_min[problem.strategy_offsets[:-1] + np.asarray(s)].all()]
    out = _core(problem, o, cap=cap, max_time=max_time, allowed=at_min,
                start=_best_seed(problem, sub_seeds, cap, max_time, time_key))
    if out is not None:
        plan, info = out
        return plan, _with(info, objective=info.redundant_memory_bytes, bound=rstar, gap=0.0,
                           objective_name="redundancy")
    # the least-redundancy strategies cannot meet the cap / T: the full model
    best = _best_seed(problem, seeds, cap, max_time, lambda c: (c.redundant_memory_bytes, c.total))
    if best is None:
        out = _core(problem, o, cap=cap, start=_best_seed(problem, seeds, cap, None, time_key))
        if out is None:
            _explain_infeasible(problem, cap, max_time, o)
        plan_t, info_t = out
        if max_time is not None and evaluate(problem, plan_t).total > max_time:
            if info_t.status == "optimal":
                _raise_time(problem, cap, max_time, None, evaluate(problem, plan_t).total)
            raise RuntimeError(f"HiGHS found no plan within max_step_time_s={max_time:.6g} for "
                               f"{problem.name!r} within the time limit; raise time_limit_s")
        best = plan_t
    rinc = evaluate(problem, best).redundant_memory_bytes
    tol = 1e-9 * max(abs(rinc), 1.0)
    allowed = (rd - rmin[node_of]) <= (rinc - rstar) + tol
    out = _core(problem, o, w={"time": 0.0, "memory": 0.0, "redundancy": 1.0}, objective="redundancy",
                lexi=True, cap=cap, max_time=max_time, start=best, allowed=allowed)
    if out is None:  # pragma: no cover - the seed is feasible
        _explain_infeasible(problem, cap, max_time, o)
    return out


def _solve_reduced(problem, red: Reduction, w, lexi, cap, need_m, max_time, deadline, t0, use_forbid,
                   threads, rel_gap, verbose, initial_plan, objective, row_times=None, m_lo=0.0,
                   col_mask=None, cutoff_time=None, lp_only=False):
    p = red.problem
    w2 = dict(w)
    if lexi and w["redundancy"] > 0:
        w2["_lex_red"] = True
    model, mem_scale = _build(p, cap, need_m, max_time, use_forbid, w2, threads, rel_gap, verbose,
                              row_times=row_times, m_lo=m_lo, col_mask=col_mask)
    num_cols = len(model.time_cols)
    ts = model.time_scale
    primary = np.zeros(num_cols)
    if w["time"]:
        primary += w["time"] * model.time_cols / ts
    if w["redundancy"]:
        nzr = np.abs(model.red_cols[model.red_cols != 0])
        rs = float(np.median(nzr)) if nzr.size else 1.0
        primary += w["redundancy"] * model.red_cols / rs
    else:
        rs = 1.0
    if need_m:
        primary[model.m_col] += w["memory"]
    start = None
    if initial_plan is not None:
        c = red.contract(list(initial_plan))
        if c is not None:
            start = _start_vector(p, c, num_cols, model.m_col, use_forbid, mem_scale, model.aux, model.eb, model.copies)
    def integral(a):
        a = a[np.abs(a) < FORBIDDEN_COST]
        return bool(np.all(a == np.round(a)))
    tgap = 0.999 / ts if integral(p.node_costs) and integral(p.edge_costs) else 0.0
    if lexi and need_m:
        agap = 0.999 / mem_scale if integral(p.node_usages) else 0.0
    elif lexi:
        agap = 0.999 / rs if integral(p.node_redundant) else 0.0
    elif w["time"] and not need_m and not w["redundancy"]:
        agap = tgap / w["time"]
    else:
        agap = 0.0
    cutoff = None if cutoff_time is None else cutoff_time / ts   # only with the time objective
    def rounder(xf):
        """The LP solution rounded (each node its largest x), as a start if it meets every bound."""
        plan = _decode(p, xf)
        c = evaluate(p, plan)
        if not c.feasible or (max_time is not None and c.total > max_time):
            return None
        return _start_vector(p, plan, num_cols, model.m_col, use_forbid, mem_scale, model.aux, model.eb,
                             model.copies)

    status, x, obj, bound = _run(model, primary, deadline - time.perf_counter(), start, agap, cutoff,
                                 rounder=rounder, lp_only=lp_only)
    if x is None:
        if status in ("infeasible", "lp_not_integral"):
            return None
        if initial_plan is None:
            raise RuntimeError(f"HiGHS found no feasible plan for {problem.name!r} within the time limit "
                               f"(status {status}); raise time_limit_s")
        # HiGHS has no incumbent of its own yet (big models spend the limit in presolve / the root
        # LP): the feasible seed it was started from is the answer, reported with no bound.
        plan = [int(v) for v in initial_plan]
        cost = evaluate(problem, plan)
        objval = _objective_value(cost, objective, lexi, w)
        return plan, SolveInfo(
            status="time_limit", objective=float(objval), bound=float("nan"), gap=float("nan"),
            wall_s=time.perf_counter() - t0, num_vars=num_cols, num_rows=model.num_rows,
            reduced_nodes=int((p.num_strategies > 1).sum()), objective_name=objective,
            step_time_s=cost.total, peak_memory_bytes=cost.peak_memory_bytes,
            redundant_memory_bytes=cost.redundant_memory_bytes, reduction=dict(red.stats))
    first_status = status
    if lexi:
        # fix the primary objective at its optimum, then minimise time
        h = model.highs
        val = float(primary @ x)
        slack = 1e-9 * max(abs(val), 1.0) + 1e-12
        if need_m:
            h.changeColBounds(model.m_col, float(h.getLp().col_lower_[model.m_col]), val + slack)
        if model.red_row is not None:
            h.changeRowBounds(model.red_row, -np.inf, val * rs + slack * rs)
        remaining = deadline - time.perf_counter()
        if remaining > 0.05:
            st2, x2, _, _ = _run(model, model.time_cols / ts, remaining, x, tgap)
            if x2 is not None:
                x = x2
                if st2 != "optimal":
                    first_status = "time_limit" if first_status == "optimal" else first_status
    plan = red.expand(_decode(p, x))
    cost = evaluate(problem, plan)
    objval = _objective_value(cost, objective, lexi, w)
    # bound back to original units
    if lexi and objective == "memory":
        bnd = bound * mem_scale
    elif lexi and objective == "redundancy":
        bnd = bound * rs
    elif w["time"] and not w["memory"] and not w["redundancy"]:
        bnd = bound * ts / w["time"]
    else:
        bnd = float("nan")  # mixed objective: HiGHS's bound is in normalised units
    if status == "optimal" and agap > 0 and np.isfinite(bnd) and bnd < objval:
        bnd = float(objval)   # integral objective: a gap below one unit proves the optimum
    gap = abs(objval - bnd) / max(abs(objval), 1e-300) if np.isfinite(bnd) else float("nan")
    if first_status == "optimal":
        gap = min(gap, 0.0) if np.isfinite(gap) and gap < 1e-6 else gap
    info = SolveInfo(
        status=first_status, objective=float(objval), bound=float(bnd), gap=float(gap),
        wall_s=time.perf_counter() - t0, num_vars=num_cols, num_rows=model.num_rows,
        reduced_nodes=int((p.num_strategies > 1).sum()), objective_name=objective,
        step_time_s=cost.total, peak_memory_bytes=cost.peak_memory_bytes,
        redundant_memory_bytes=cost.redundant_memory_bytes, reduction=dict(red.stats))
    return plan, info


def _objective_value(cost, objective, lexi, w) -> float:
    """The reported objective of a plan's Cost: the peak or the redundant bytes for the
    lexicographic objectives, else the weighted sum."""
    if objective == "memory" and lexi:
        return cost.peak_memory_bytes
    if objective == "redundancy" and lexi:
        return cost.redundant_memory_bytes
    return (w["time"] * cost.total + w["memory"] * cost.peak_memory_bytes
            + w["redundancy"] * cost.redundant_memory_bytes)


def min_peak_memory(problem: Problem, max_step_time_s=None, time_limit_s: float = 60) -> float:
    """The lowest peak per-device memory any plan reaches (ignoring the problem's usage_limit).
    Without a step-time bound this is the peak of the min-usage plan (no solve)."""
    free = problem.with_usage_limit(None)
    if max_step_time_s is None and problem.edge_memory is None:
        return _min_usage(free)[1]
    plan, _ = solve_ilp(free, objective="memory", max_step_time_s=max_step_time_s, time_limit_s=time_limit_s)
    return evaluate(free, plan).peak_memory_bytes


def _asked(problem, o):
    asked = []
    if o.memory_cap_bytes is not None:
        asked.append(f"memory_cap_bytes={o.memory_cap_bytes:.6g}")
    if problem.usage_limit is not None:
        asked.append(f"the problem's usage_limit={problem.usage_limit:.6g}")
    return " and ".join(asked)


def _raise_cap(problem, cap, o, peak):
    raise InfeasibleError(
        f"no plan fits the memory cap of {cap:.6g} bytes ({_asked(problem, o)}): the lowest peak "
        f"memory any plan reaches is {peak:.6g} bytes; raise the cap to at least that",
        min_peak_bytes=peak)


def _raise_time(problem, cap, max_time, peak, fastest):
    if peak is None:
        peak = _min_usage(problem)[1]
    where = "" if cap is None else f" within the memory cap of {cap:.6g} bytes"
    raise InfeasibleError(
        f"no plan meets max_step_time_s={max_time:.6g}{where}: the fastest step time any plan "
        f"reaches is {fastest:.6g}; raise max_step_time_s to at least that",
        min_peak_bytes=peak, min_step_time_s=fastest)


def _explain_infeasible(problem, cap, max_time, o):
    """Raise the InfeasibleError that says what fails: the cap (with the lowest peak any plan
    reaches, ignoring the step-time bound) or the step-time bound (with the fastest step time
    any plan reaches under the cap)."""
    _, peak = _min_usage(problem)
    if problem.edge_memory is not None:
        peak = _node_min_peak(problem)   # a lower bound (the least peak needs a solve)
    if cap is not None and peak > cap * (1 + 1e-9):
        _raise_cap(problem, cap, o, peak)
    # memory alone is feasible: the step-time bound fails
    o2 = o.until(max(o.deadline, time.perf_counter() + 5.0))
    o2.deadline = max(o.deadline, time.perf_counter() + 5.0)
    out = _core(problem, o2, cap=cap, start=_min_usage(problem)[0])
    if out is None and problem.edge_memory is not None:   # the copies break the cap
        _raise_cap(problem, cap, o, peak)
    if out is None:  # pragma: no cover - the min-usage plan fits the cap
        raise AssertionError("the min-usage plan fits the cap")
    fastest = evaluate(problem, out[0]).total
    _raise_time(problem, cap, max_time, peak, fastest)
