"""The ILP model (Alpa's formulation, on the reduced problem from ``solvers.reduce``), built as one
HiGHS model by ``build_model``:

* x[i, s] ∈ {0, 1}, Σ_s x[i, s] = 1 for every node i (single-strategy nodes are fixed to 1).
* Edge e = (u, v): continuous y[e, s, t] ≥ 0 with Σ_t y[e, s, t] = x[u, s] and
  Σ_s y[e, s, t] = x[v, t]; with x one-hot this forces y = x_u x_vᵀ, so edge costs are linear.
  Continuous linearised edge variables beat integer ones (DESIGN.md: 14 s vs 22 s at 1,000 nodes).
  Edge entries at or above ``FORBIDDEN_COST`` (IOPDDL's 1e18 "impossible") get no variable; if
  that makes the model infeasible it is solved again with them allowed. Strategies with equal
  rows (columns) of an edge matrix share one y per block (``blocks.EdgeBlocks``; same LP and MIP).
* Memory: at every time point just before some interval ends (the live sets there contain all
  others, and usages are ≥ 0), Σ_{i live} Σ_s usage[i, s] x[i, s] ≤ cap, with
  cap = min(problem.usage_limit, memory_cap_bytes). Nodes with one usage add a constant. Big
  models get the same constraint as running sums of per-node usage columns (``blocks.MemAux``).
  Resharded copies (``problem.edge_memory``) add z columns bounded by edge variables
  (``solvers.ilp.copy_rows``); their nodes are kept whole by the reductions (copy classes). On gpt
  tiny the min-M model then has 7,460 integer and 129,680 columns in all (without copies the
  reductions left 3,800 strategies at the minimum peak).
* time = Σ node costs + Σ edge costs (exactly ``evaluate(...).total``); optionally time ≤ the
  step-time bound, the peak column M, and a row of redundant bytes for the lexicographic phase.

Also the two maps between plans and column vectors: ``start_vector`` (a plan -> its x, y, M,
u, L, z values, for HiGHS's setSolution) and ``decode`` (a solution -> the reduced plan).
"""
from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem, evaluate
from solvers.ilp.blocks import EdgeBlocks, MemAux, y_terms
from solvers.ilp.copy_rows import CopyColumns, copy_columns, edge_signatures
from solvers.ilp.highs import configure, new_highs
from solvers.ilp.types import Request, RunOptions
from solvers.local.costs import starts


@dataclass(frozen=True, eq=False)
class Model:
    """A HiGHS model and where its columns are."""

    highs: object
    num_x: int
    m_col: int | None
    red_row: int | None
    time_cols: np.ndarray        # column costs of "time" (node + edge), unscaled
    red_cols: np.ndarray
    time_scale: float
    num_rows: int
    mem_scale: float = 1.0       # bytes per unit of the memory columns and rows
    aux: MemAux | None = None
    eb: EdgeBlocks | None = None
    copies: CopyColumns | None = None   # z columns of the shared resharded copies (edge_memory)

    @property
    def min_peak_with_copies(self) -> bool:
        """The min-M model (a peak column) with copy columns: the one whose MIP HiGHS 1.16's presolve
        does not finish (``highs.run_model``) and whose LP relaxation is not tried first
        (``reduced.solve_reduced``)."""
        return self.copies is not None and self.m_col is not None


def build_model(p: Problem, req: Request, run: RunOptions) -> Model:
    """The model of ``req`` on ``p`` (the module docstring), passed to a fresh HiGHS instance
    configured by ``run``. Uses ``req``'s cap, need_m, max_step_time_s, forbid, row_times
    (memory rows to keep), m_lo (a lower bound on M), col_mask and lex_redundancy."""
    cap, need_m, max_time, forbid = req.cap, req.need_m, req.max_step_time_s, req.forbid
    row_times, m_lo, col_mask = req.row_times, req.m_lo, req.col_mask
    k = p.num_strategies
    n = p.num_nodes
    S = int(k.sum())
    offs = p.strategy_offsets
    node_of = np.repeat(np.arange(n), k)
    # edge y columns, one per allowed block of identical entries (see EdgeBlocks)
    ne = p.num_edges
    copies_in = (cap is not None or need_m) and p.edge_memory is not None
    eb = EdgeBlocks.of(p, forbid, edge_signatures(p) if copies_in else None)
    ycols = np.nonzero(eb.ycol >= 0)[0]          # allowed blocks
    Y = len(ycols)
    mem_scale, m_lower, aux = 1.0, 0.0, None
    if cap is not None or need_m:
        mem_scale = float(max(np.abs(p.node_usages).max() if S else 1.0, cap or 0.0, 1.0))
        aux = MemAux.of(p, row_times, mem_scale, S + Y + (1 if need_m else 0),
                        run.config.dense_memory_nonzeros)
        if aux is not None:
            m_lower = float(aux.const.max())
    cc = None
    if aux is not None and copies_in:
        cc = copy_columns(p, aux.pts, mem_scale, S + Y + (1 if need_m else 0) + aux.num_cols, y_terms(p, eb, S))
    num_extra = (1 if need_m else 0) + (0 if aux is None else aux.num_cols) + (0 if cc is None else cc.num_cols)
    num_cols = S + Y + num_extra
    m_col = S + Y if need_m else None

    # forbidden columns are fixed at 0 below; a node's only strategy keeps its cost (a 1e18 folded
    # there is paid by every plan: the time row under T then has no solution, as it should)
    node_forbidden = (p.node_costs >= FORBIDDEN_COST) & ~np.repeat(k == 1, k) if forbid else np.zeros(S, dtype=bool)
    node_c = np.where(node_forbidden, 0.0, p.node_costs)
    time_cols = np.concatenate([node_c, eb.bcost[ycols], np.zeros(num_extra)])
    red_cols = np.concatenate([p.node_redundant, np.zeros(Y + num_extra)])
    # under a step-time bound T, a column whose own time cost exceeds T (less every negative cost)
    # is 0 in every plan within T: it is fixed at 0 and leaves the rows and the objective. Exact;
    # it keeps IOPDDL's 1e18 entries (forbid=False) out of the time row, where HiGHS rejects the
    # ~1e16 coefficients they scale to (passModel: kError, then model status "Empty")
    over_t = np.zeros(num_cols, dtype=bool)
    if max_time is not None:
        slack_t = max_time - float(time_cols[time_cols < 0].sum())
        over_t = time_cols > slack_t * (1 + 1e-12) + 1e-300
        one = np.zeros(num_cols, dtype=bool)
        one[:S] = np.repeat(k == 1, k)     # a fixed strategy beyond T keeps a (clipped) cost > T
        time_cols = np.where(over_t & ~one, 0.0, np.where(over_t, 2.0 * abs(slack_t) + 1.0, time_cols))
        over_t &= ~one
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
        rstart = starts(gu + gv)
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
        pu_local = np.arange(int(ku_all.sum())) - np.repeat(starts(ku_all), ku_all)
        rows.append(r + rstart[er] + eb.ru)
        cols.append(offs[p.edges[er, 0]] + pu_local)
        vals.append(-np.ones(len(er)))
        ev = np.repeat(np.arange(ne), kv_all)
        pv_local = np.arange(int(kv_all.sum())) - np.repeat(starts(kv_all), kv_all)
        rows.append(r + rstart[ev] + gu[ev] + eb.cv)
        cols.append(offs[p.edges[ev, 1]] + pv_local)
        vals.append(-np.ones(len(ev)))
        nr = int((gu + gv).sum())
        lo.append(np.zeros(nr))
        hi.append(np.zeros(nr))
        r += nr
    # memory (see MemAux)
    if aux is not None and aux.dense:
        # one row per time point t: sum over live (node, strategy) of coef * x <= (cap - const_t) / scale
        P = len(aux.const)
        cnt = aux.hi - aux.lo
        reps = cnt[aux.x_node]
        pt = np.repeat(aux.lo[aux.x_node], reps) + (np.arange(int(reps.sum())) - np.repeat(starts(reps), reps))
        rows.append(r + pt)
        cols.append(np.repeat(aux.x_col, reps))
        vals.append(np.repeat(aux.x_coef, reps))
        if cc is not None:   # a copy's z in every row of its segment
            zr = cc.hi - cc.lo
            rows.append(r + np.repeat(cc.lo, zr) + (np.arange(int(zr.sum())) - np.repeat(starts(zr), zr)))
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
    if cc is not None:   # z >= the y (or x) terms saying the copy is live there (solvers.ilp.copy_rows)
        rows.append(r + cc.rows)
        cols.append(cc.cols)
        vals.append(cc.vals)
        lo.append(cc.row_lo)
        hi.append(np.full(cc.num_rows, np.inf))
        r += cc.num_rows
    red_row = None
    if max_time is not None:
        # fixed strategies are a constant on the right; the row is scaled so that its largest
        # coefficient stays <= 1e9 (T at IOPDDL's 1e18 level: every plan pays a forbidden entry)
        one = np.zeros(num_cols, dtype=bool)
        one[:S] = np.repeat(k == 1, k)
        nz = np.nonzero((time_cols != 0) & ~one)[0]
        row_scale = max(time_scale, float(np.abs(time_cols[nz]).max(initial=0.0)) / 1e9)
        rows.append(np.full(len(nz), r))
        cols.append(nz)
        vals.append(time_cols[nz] / row_scale)
        lo.append(np.array([-np.inf]))
        hi.append(np.array([(max_time - float(time_cols[one].sum())) / row_scale]))
        r += 1
    # a spare row for the lexicographic phase (bounded later)
    if req.lex_redundancy:
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
    col_hi[:S][node_forbidden] = 0.0   # 1e18 "impossible" strategies (folded costs too)
    col_hi[over_t] = 0.0                        # alone slower than the step-time bound
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
    configure(h, run)
    status = h.passModel(lp)
    if status == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS rejected the ILP model of {p.name!r} (passModel: {status}); its "
                           f"largest coefficient is {float(np.abs(V).max(initial=0.0)):.3g}")
    return Model(h, S, m_col, red_row, time_cols, red_cols, time_scale, r, mem_scale, aux, eb, cc)


def decode(p: Problem, x: np.ndarray) -> list[int]:
    """The plan of ``p`` in a solution vector: per node its strategy with the largest x."""
    offs = p.strategy_offsets
    xs = x[: int(offs[-1])]
    out = []
    for i in range(p.num_nodes):
        out.append(int(np.argmax(xs[offs[i]:offs[i + 1]])))
    return out


def start_vector(p: Problem, plan, model: Model, forbid: bool):
    """Column values of a plan (x, y, M, u, L, z) in ``model`` for HiGHS's setSolution; None when
    the plan uses an edge entry the model left out (forbidden)."""
    num_cols, m_col, mem_scale = len(model.time_cols), model.m_col, model.mem_scale
    aux, eb, copies = model.aux, model.eb, model.copies
    v = np.zeros(num_cols)
    s = np.asarray(plan, dtype=np.int64)
    v[p.strategy_offsets[:-1] + s] = 1.0
    if p.num_edges:
        eb = EdgeBlocks.of(p, forbid) if eb is None else eb
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

