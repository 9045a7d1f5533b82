"""The exact MILP of the *tied* graph (the exact reductions' component graph) with memory rows
added lazily, and its phase in the capped core (``tied_phase``, called by ``solvers.capped`` on
problems without copy groups: the IOPDDL case).

``TiedGraph(problem)`` runs the exact reductions (``solvers.local.prepare``: pruning and
permutation ties; IOPDDL A: 34,932 nodes -> 285 components with a choice) and keeps, per choice
component c and strategy a, its cost (edges to fixed components folded in), the edges between two
choice components, and each member node's usage excess over its least usage. ``model(S, sc)``:
the MILP over the choice components ``S`` with every other component at its strategy in ``sc``:

* x_{c,a} binary, Σ_a x_{c,a} = 1; y per entry of an edge inside S (continuous ≥ 0, marginals equal
  to x); an edge from S to a component outside folds into the unary costs at that component's strategy.
* memory row at compressed time point t: Σ_{c∈S,a} exc_{c,a}(t) x_{c,a} ≤ limit − live_t(sc) +
  Σ_{c∈S} exc_{c,sc_c}(t), where exc_{c,a}(t) = Σ over members i live at t of u_i(a) − min u_i
  (so with S = every choice component the right side is limit − Σ_i min u_i). Rows are added lazily
  (``Sub.add_rows``): a MILP over fewer rows is a relaxation.

``Sub.solve`` returns the full component plan and HiGHS's dual bound plus ``Sub.offset`` (the cost
of everything the model does not see). With S = all choice components that bound is a lower bound
of the *forbidden-free* optimum (the reductions' premise: they drop what only plans with an entry
≥ ``FORBIDDEN_COST`` use); ``bound_all`` makes it a bound of every plan: min(bound,
FORBIDDEN_COST + the sum of every node's and edge's most negative entry (0 when none is negative)),
since a plan that uses a forbidden entry costs at least that. Integer costs (IOPDDL) stop HiGHS at
an absolute gap below 1, which proves the optimum; other costs at a relative gap of 1e-7.

``tied_phase`` (the capped core's phase): when the tied graph is small enough (``TiedLimits``:
choice components, strategies, edge entries between choice components; chosen by the figures in
its docstring) and it has ``TiedLimits.min_s`` at least, it solves the whole MILP from the best plan
so far, memory rows first where that plan's profile is within 1 % of the limit (none when the plan
does not follow the ties, as the core's anchor on A), then the worst rows an answer breaks, solved
again, until an answer fits every row or the phase's time is spent. An answer that fits is offered to the core;
one that HiGHS proved optimal is the optimum (of forbidden-free plans; of all plans under the
``bound_all`` condition). Larger tied graphs are skipped (IOPDDL M: 1.9e6 entries).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem, evaluate
from solvers.ilp.highs import new_highs, set_threads
from solvers.local import prepare


class TiedGraph:
    """The reductions' component graph with what ``model`` needs (module docstring)."""

    def __init__(self, problem: Problem, prepared=None):
        assert problem.edge_memory is None, "the tied MILP prices node usages only (no copy groups)"
        self.problem = problem
        self.pr, g, C, _ = prepared if prepared is not None else prepare(problem)
        self.g, self.C = g, C
        cp = C.problem
        self.k = k = cp.num_strategies.astype(np.int64)
        self.offs = offs = cp.strategy_offsets.astype(np.int64)
        self.choice = choice = k > 1
        self.choice_nodes = np.nonzero(choice)[0]
        unary = cp.node_costs.astype(np.float64).copy()
        pu, pv, mats = [], [], []
        for e, (u, v) in enumerate(cp.edges.tolist()):
            M = cp.edge_costs[cp.edge_offsets[e]:cp.edge_offsets[e + 1]].reshape(int(k[u]), int(k[v]))
            if choice[u] and choice[v]:
                pu.append(u)
                pv.append(v)
                mats.append(M)
            elif choice[u]:
                unary[offs[u]:offs[u + 1]] += M[:, 0]
            elif choice[v]:
                unary[offs[v]:offs[v + 1]] += M[0, :]
        self.unary, self.pu, self.pv, self.mats = unary, np.array(pu, np.int64), np.array(pv, np.int64), mats
        self.adj: dict[int, list[int]] = {}
        for p, (u, v) in enumerate(zip(pu, pv)):
            self.adj.setdefault(u, []).append(p)
            self.adj.setdefault(v, []).append(p)
        mn = np.minimum.reduceat(g.live_usage, g.offs[:-1])
        mx = np.maximum.reduceat(g.live_usage, g.offs[:-1])
        var = np.nonzero((mx > mn) & g.live_mask)[0]
        self.num_varying = len(var)
        r = np.nonzero(np.isin(g.node_of, var))[0]             # flat rows of the varying nodes
        r_comp = C.cid[g.node_of[r]]
        assert choice[r_comp].all(), "a node with varying usage in a fixed component"
        order = np.argsort(r_comp, kind="stable")
        r = r[order]
        self.r_comp, self.r_node = r_comp[order], g.node_of[r]
        self.r_cflat = C.cflat[r]
        self.r_val = g.live_usage[C.oflat[r]] - mn[self.r_node]
        self.r_ptr = np.searchsorted(self.r_comp, np.arange(cp.num_nodes + 1))
        self.cap = float(g.cap) if g.cap is not None else None
        self.integral = bool(np.all(problem.node_costs == np.round(problem.node_costs))
                             and np.all(problem.edge_costs == np.round(problem.edge_costs)))
        # a plan with an entry >= FORBIDDEN_COST costs at least this (bound_all)
        neg = np.minimum(np.minimum.reduceat(problem.node_costs, problem.strategy_offsets[:-1]), 0).sum() \
            if problem.num_nodes else 0.0
        if len(problem.edge_costs):
            neg += np.minimum(np.minimum.reduceat(problem.edge_costs, problem.edge_offsets[:-1]), 0).sum()
        self.forbidden_floor = FORBIDDEN_COST + float(neg)

    def bound_all(self, bound: float) -> float:
        """A lower bound of every plan from one of the forbidden-free plans (module docstring)."""
        return min(float(bound), self.forbidden_floor)

    # ---- plans -------------------------------------------------------------------------------
    def comp_plan(self, plan):
        """The component plan of an original plan (None: it breaks a tie or uses a pruned strategy)."""
        s2 = self.pr.from_orig(np.asarray(plan, dtype=np.int64))
        return None if s2 is None else self.C.contract(s2)

    def orig_plan(self, sc) -> np.ndarray:
        return self.pr.to_orig(self.C.expand(np.asarray(sc, dtype=np.int64)))

    def total(self, sc) -> float:
        return float(evaluate(self.problem, self.orig_plan(sc)).total)

    def profile(self, sc) -> np.ndarray:
        return self.g.profile(self.C.expand(np.asarray(sc, dtype=np.int64)))

    def violated(self, sc) -> np.ndarray:
        """Compressed time points where the plan's profile is over the limit, worst first."""
        if self.cap is None:
            return np.zeros(0, np.int64)
        live = self.profile(sc)
        over = np.nonzero(live > self.cap)[0]
        return over[np.argsort(-(live[over] - self.cap))]

    def neighbours(self, c: int) -> list[int]:
        return [int(self.pv[p]) if self.pu[p] == c else int(self.pu[p]) for p in self.adj.get(c, [])]

    def model(self, S, sc, time_points=(), threads: int = 1) -> Sub:
        return Sub(self, np.asarray(sorted(set(int(c) for c in S)), dtype=np.int64), np.asarray(sc, np.int64),
                   time_points, threads)


class Sub:
    """One HiGHS model over the choice components S, the others fixed at ``sc``."""

    def __init__(self, T: TiedGraph, S: np.ndarray, sc: np.ndarray, time_points=(), threads: int = 1):
        self.T, self.S, self.sc = T, S, sc.copy()
        inS = np.zeros(len(T.k), bool)
        inS[S] = True
        self.inS = inS
        self.xbase = np.concatenate([[0], np.cumsum(T.k[S])])      # x columns of S[j]: xbase[j]:xbase[j+1]
        pos = np.full(len(T.k), -1, np.int64)
        pos[S] = np.arange(len(S))
        self.pos = pos
        nx = int(self.xbase[-1])
        cost = [T.unary[T.offs[c]:T.offs[c + 1]].copy() for c in S.tolist()]
        ycost, rows, self.inner = [], [], []
        ny = 0
        for p in sorted({p for c in S.tolist() for p in T.adj.get(c, [])}):
            u, v, M = int(T.pu[p]), int(T.pv[p]), T.mats[p]
            if inS[u] and inS[v]:
                base = nx + ny
                idx = base + np.arange(M.size).reshape(M.shape)
                rows += [(idx[a], self.xbase[pos[u]] + a) for a in range(M.shape[0])]
                rows += [(idx[:, b], self.xbase[pos[v]] + b) for b in range(M.shape[1])]
                ycost.append(M.ravel())
                self.inner.append((u, v, base))
                ny += M.size
            elif inS[u]:
                cost[pos[u]] += M[:, sc[v]]
            else:
                cost[pos[v]] += M[sc[u], :]
        self.cost = np.concatenate(cost + ycost)
        self.nx, self.ny = nx, ny
        h = self.h = new_highs()
        n = nx + ny
        h.addVars(n, np.zeros(n), np.concatenate([np.ones(nx), np.full(ny, highspy.kHighsInf)]))
        h.changeColsCost(n, np.arange(n, dtype=np.int32), self.cost)
        h.changeColsIntegrality(nx, np.arange(nx, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * nx))
        st, idx, val = [], [], []
        for j in range(len(S)):
            st.append(len(idx))
            idx += list(range(int(self.xbase[j]), int(self.xbase[j + 1])))
            val += [1.0] * int(T.k[S[j]])
        n1 = len(st)
        for ys, xc in rows:
            st.append(len(idx))
            idx += [int(y) for y in ys] + [int(xc)]
            val += [1.0] * len(ys) + [-1.0]
        lo = np.concatenate([np.ones(n1), np.zeros(len(st) - n1)])
        h.addRows(len(st), lo, lo.copy(), len(idx), np.array(st, np.int32), np.array(idx, np.int32), np.array(val))
        if T.integral:
            h.setOptionValue("mip_rel_gap", 0.0)
            h.setOptionValue("mip_abs_gap", 0.99)     # integer costs: a gap below 1 proves the optimum
        else:
            h.setOptionValue("mip_rel_gap", 1e-7)
        set_threads(h, threads)   # resets HiGHS's scheduler if a run here started it with another count
        # as solvers.ilp.highs.configure: HiGHS 1.16's MIP restart can hang past the time limit; on IOPDDL A
        # the phase proved the optimum in 13.1 and 19.0 s without it, 13.9 s with it (load 3-3.5)
        h.setOptionValue("mip_allow_restart", False)
        # memory: the entries of S's varying members, and the plan's profile
        sel = np.concatenate([np.arange(T.r_ptr[c], T.r_ptr[c + 1]) for c in S.tolist()]) if len(S) else np.zeros(0, np.int64)
        self.e_node, self.e_val = T.r_node[sel], T.r_val[sel]
        self.e_col = self.xbase[pos[T.r_comp[sel]]] + (T.r_cflat[sel] - T.offs[T.r_comp[sel]])
        self.live = T.profile(sc)
        self.x0 = self.vector(sc)
        self.offset = T.total(sc) - float(self.x0 @ self.cost)
        self.rows_t: set[int] = set()
        self.add_rows(time_points)

    def vector(self, sc) -> np.ndarray:
        x = np.zeros(self.nx + self.ny)
        x[self.xbase[:-1] + sc[self.S]] = 1.0
        for u, v, base in self.inner:
            x[base + sc[u] * int(self.T.k[v]) + sc[v]] = 1.0
        return x

    def add_rows(self, ts) -> int:
        """Add the memory rows of the time points ``ts`` not in the model yet (one per distinct row)."""
        g, seen = self.T.g, {}
        if self.T.cap is None:
            return 0
        for t in ts:
            t = int(t)
            if t in self.rows_t:
                continue
            self.rows_t.add(t)
            on = (g.lo[self.e_node] <= t) & (g.hi[self.e_node] > t)
            vals = np.bincount(self.e_col[on], weights=self.e_val[on], minlength=self.nx)
            cols = np.nonzero(vals)[0]
            if not len(cols):
                continue
            rhs = self.T.cap - self.live[t] + float(vals @ self.x0[:self.nx])
            key = (cols.tobytes(), vals[cols].tobytes())
            if key not in seen or rhs < seen[key][2]:
                seen[key] = (cols, vals[cols], rhs)
        for cols, vals, rhs in seen.values():
            self.h.addRow(-highspy.kHighsInf, rhs, len(cols), cols.astype(np.int32), vals)
        return len(seen)

    def solve(self, time_limit_s: float, start=None):
        """(full component plan or None, its model objective + offset, dual bound + offset, status)."""
        h = self.h
        h.setOptionValue("time_limit", float(time_limit_s))
        sol = highspy.HighsSolution()
        sol.col_value = list(self.x0 if start is None else self.vector(start))
        sol.value_valid = True
        h.setSolution(sol)
        h.run()
        info = h.getInfo()
        status = h.modelStatusToString(h.getModelStatus())
        bound = float(info.mip_dual_bound) + self.offset
        if info.primal_solution_status == 0:
            return None, float("inf"), bound, status
        x = np.asarray(h.getSolution().col_value)
        sc = self.sc.copy()
        for j, c in enumerate(self.S.tolist()):
            sc[c] = int(np.argmax(x[self.xbase[j]:self.xbase[j + 1]]))
        return sc, float(info.objective_function_value) + self.offset, bound, status


@dataclass(frozen=True)
class TiedLimits:
    """``tied_phase`` builds the whole tied MILP only up to these sizes (``tied_size``). Measured
    (session 20, ``shardgym iopddl FILE 60`` or the phase alone with 40-50 s, 2 cores at load 3.5-6), strategies /
    entries -> time to the proof: IOPDDL A 2,434 / 49,321 -> 24 s; B 2,824 / 61,871 -> 9 s; G 3,630 / 60,792 -> 15 s;
    fno tiny (bench) 3,968 / 103,878 -> 13 s; not proven in ~40 s: meshgraphnet tiny 5,933 / 82,964 (its incumbent
    18 % above the best-known), gpt tiny 6,249 / 149,170, unet tiny 8,341 / 194,813; M 59,927 / 1.9e6: no root LP in
    300 s (session 19). The last four are MILP-sized graphs, which the core hands to the whole MILP instead."""

    components: int = 2_000       # choice components
    strategies: int = 4_500       # their strategies (x columns)
    entries: int = 150_000        # entries of the edges between two choice components (y columns)
    near: float = 0.01            # first rows: where the start plan's profile is within this share of the limit
    add: int = 400                # at most this many violated rows added per round, the worst first
    min_s: float = 24.0           # skipped with less time (A's proof: 13-24 s at load 3-5; with 10 s of a 20 s CLI
                                  # run it found none and the search's 3 s gave 6,561,173,715 against 6,549,018,455)


@dataclass(frozen=True)
class TiedResult:
    """``bound``: a lower bound of every plan (−inf when none: skipped, or no HiGHS bound in time);
    ``proven``: the plan offered last is optimal; ``size``: ``tied_size``; ``rounds``: HiGHS solves."""
    bound: float
    proven: bool
    size: dict
    rounds: int = 0


def tied_size(prepared) -> dict:
    """What decides whether the whole MILP is worth building (``TiedLimits``): the choice components, their
    strategies and the entries of the edges between two of them, from ``prepare``'s answer without building
    the TiedGraph (M: 1.2 s saved)."""
    cp = prepared[2].problem
    k = cp.num_strategies.astype(np.int64)
    eu, ev = cp.edges[:, 0], cp.edges[:, 1]
    both = (k[eu] > 1) & (k[ev] > 1)
    return {"components": int((k > 1).sum()), "strategies": int(k[k > 1].sum()),
            "entries": int((k[eu] * k[ev])[both].sum())}


def fits(size: dict, limits: TiedLimits) -> bool:
    return all(size[key] <= getattr(limits, key) for key in ("components", "strategies", "entries"))


def tied_phase(problem: Problem, time_limit_s: float, best, consider, say, prepared=None, threads: int = 1,
               limits: TiedLimits = TiedLimits()) -> TiedResult:
    """The whole tied MILP with lazy memory rows (module docstring), within ``time_limit_s``
    (approximate by one TiedGraph build and one HiGHS model build: ~1 s on IOPDDL A), HiGHS started
    from ``best[0]`` where that follows the ties, else from strategy 0 everywhere (on A, from the
    anchor, 24 s to the proof at load 4, against 29 s after a 5 s search for a start).
    ``consider(plan, tag)`` gets each plan that fits."""
    deadline = time.perf_counter() + float(time_limit_s)
    if time_limit_s < limits.min_s:
        say(f"tied milp: skipped, {time_limit_s:.1f}s < {limits.min_s:g}s")
        return TiedResult(-float("inf"), False, {})
    prepared = prepared if prepared is not None else prepare(problem)
    z = tied_size(prepared)
    if not fits(z, limits):
        say(f"tied milp: skipped, tied graph {z} over {limits}")
        return TiedResult(-float("inf"), False, z)
    T = TiedGraph(problem, prepared)
    sc = T.comp_plan(best[0]) if best[0] is not None else None
    fresh = sc is None
    if fresh:          # (its rows and offset do not depend on the start with S = every choice component)
        say("tied milp: no start plan that follows the ties: from strategy 0 of every component")
        sc = np.zeros(len(T.k), np.int64)
    near = ()
    if T.cap is not None and not fresh:    # rows where the start plan is near the limit (it fits), the highest
        live = T.profile(sc)               # ``add`` (each row is a pass over the varying members: not timed)
        near = np.nonzero(live >= (1.0 - limits.near) * T.cap)[0]
        near = near[np.argsort(-live[near], kind="stable")[:limits.add]]
    sub = T.model(T.choice_nodes, sc, near, threads=threads)
    bound, proven, rounds, start = -float("inf"), False, 0, sc
    while True:
        left = deadline - time.perf_counter()
        if left < 0.2:
            break
        got, obj, b, status = sub.solve(left, start=start)
        rounds += 1
        bound = max(bound, b) if np.isfinite(b) else bound    # fewer rows: a relaxation, still a bound
        over = T.violated(got) if got is not None else np.zeros(0, np.int64)
        say(f"tied milp round {rounds}: {status}, objective {obj:.10g}, bound {b:.10g}, "
            f"{len(sub.rows_t)} rows, {len(over)} points over ({deadline - time.perf_counter():.1f}s left)")
        if got is not None and not len(over):
            consider(list(T.orig_plan(got)), "tied milp")
            start = got
            proven = status == "Optimal"
            break
        if status != "Optimal" or got is None or not sub.add_rows(over[:limits.add]):
            break
    if proven and T.integral:    # integer costs: the optimum is an integer above bound > cost - 1
        bound = max(bound, T.total(start))
    return TiedResult(T.bound_all(bound) if np.isfinite(bound) else bound, proven, z, rounds)
