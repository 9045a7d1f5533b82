"""Exact reductions the local-search library and the large-instance driver work on.

* ``Pruning(lc)``: drop the strategies no forbidden-free (cost < ``FORBIDDEN_COST``),
  memory-feasible plan can use, to a fixed point; ``prune(problem)`` -> (pruned problem, plan map back).
* ``Contraction(lc)``: merge nodes tied by permutation edges into components (exact).
* ``prepare(problem)`` -> (pruning, pruned LocalCosts, contraction, component LocalCosts).
* ``range_max(a, lo, hi)``: max(a[lo_i:hi_i]) for every i, by a sparse table.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem
from solvers.local.costs import LocalCosts, starts


class Contraction:
    """Merge nodes tied by *permutation edges* into one component node.

    An edge whose allowed entries (cost < ``FORBIDDEN_COST``) form a permutation (k_u = k_v, exactly one
    allowed partner per row and per column) forces v's strategy once u's is chosen: any plan free of
    forbidden entries follows it. Union-find over these edges (each member keeps a map from its
    component root's strategy to its own) turns chains and cycles of such ties — IOPDDL's
    "sharding must propagate" constraints, e.g. a parameter and all its uses — into single nodes, so
    ICM and forest DP move a whole tied group at once instead of being stuck on one forbidden edge.
    Exact: every component plan expands to an original plan with the same cost; an edge inside a
    component becomes a unary cost (a cycle of ties whose permutations disagree just makes those
    component strategies forbidden). Memory stays on the original nodes: ``penalty`` maps
    per-node Lagrangian prices onto component strategies and ``expand`` gives the original plan.

    Row r of the original flat strategy space (node i = node_of[r], a = r - offs[i]) is "node i's
    row for component strategy a": ``MAP[r]`` is node i's own strategy then, ``cflat[r]`` the
    component's flat index and ``oflat[r]`` the original flat index.
    """

    def __init__(self, g: LocalCosts, tie: bool = True):
        n, k = g.n, g.k
        m = len(g.eu) if tie else 0          # tie=False: the identity (one component per node)
        ku, kv = k[g.eu], k[g.ev]
        root = np.arange(n)
        mem: dict[int, list] = {}                 # root -> members (only components of 2+ nodes)
        if m:
            sizes = ku * kv
            ent_edge = np.repeat(np.arange(m), sizes)
            loc = np.arange(len(g.ec)) - g.eoff[ent_edge]
            row, col = loc // kv[ent_edge], loc % kv[ent_edge]
            ok = g.ec < FORBIDDEN_COST
            cnt = np.bincount(ent_edge, weights=ok, minlength=m)
            rowcnt = np.bincount(starts(ku)[ent_edge] + row, weights=ok, minlength=int(ku.sum()))
            colcnt = np.bincount(starts(kv)[ent_edge] + col, weights=ok, minlength=int(kv.sum()))
            row_bad = np.bincount(np.repeat(np.arange(m), ku), weights=rowcnt != 1, minlength=m)
            col_bad = np.bincount(np.repeat(np.arange(m), kv), weights=colcnt != 1, minlength=m)
            perm = (ku == kv) & (ku > 1) & (cnt == ku) & (row_bad == 0) & (col_bad == 0)
            sel = ok & perm[ent_edge]
            sig_all = col[sel]                       # row-major: k entries per permutation edge
            pe = np.nonzero(perm)[0]
            sig_ptr = np.concatenate([[0], np.cumsum(ku[pe])])

            rows: dict[int, np.ndarray] = {}         # member -> (root strategy -> own strategy)

            def row(w):
                r = rows.get(w)
                return np.arange(int(k[w])) if r is None else r

            for t, e in enumerate(pe.tolist()):
                u, v = int(g.eu[e]), int(g.ev[e])
                ru, rv = int(root[u]), int(root[v])
                if ru == rv:
                    continue                         # internal: becomes a unary cost below
                sig = sig_all[sig_ptr[t]:sig_ptr[t + 1]]
                Mu, Mv = mem.get(ru, [ru]), mem.get(rv, [rv])
                mu, mv = row(u), row(v)
                if len(Mu) < len(Mv):                # keep the bigger component's root
                    inv_sig = np.empty_like(sig)
                    inv_sig[sig] = np.arange(len(sig))
                    inv_mu = np.empty_like(mu)
                    inv_mu[mu] = np.arange(len(mu))
                    tau = inv_mu[inv_sig[mv]]        # root_v strategy -> root_u strategy
                    keep, Mo = rv, Mu
                else:
                    inv_mv = np.empty_like(mv)
                    inv_mv[mv] = np.arange(len(mv))
                    tau = inv_mv[sig[mu]]            # root_u strategy -> root_v strategy
                    keep, Mo = ru, Mv
                gone = rv if keep == ru else ru
                for w in Mo:                         # the smaller side is re-rooted: O(n log n) moves
                    rows[w] = row(w)[tau]
                root[np.asarray(Mo)] = keep
                if keep in mem:
                    mem[keep].extend(Mo)
                else:
                    mem[keep] = [keep] + list(Mo)
                mem.pop(gone, None)
        self.roots = roots = np.unique(root)
        nc = len(roots)
        cid = np.searchsorted(roots, root)
        kc = k[roots]
        self.coffs = coffs = np.concatenate([[0], np.cumsum(kc)])
        MAP = g.local_index.copy()                          # identity for singleton components
        for r, M in mem.items():
            for w in M:
                MAP[g.offs[w]:g.offs[w] + k[w]] = row(w)
        self.g, self.cid, self.MAP = g, cid, MAP
        self.cflat = coffs[cid[g.node_of]] + g.local_index
        self.oflat = g.offs[g.node_of] + MAP
        ccost = np.bincount(self.cflat, weights=g.cost[self.oflat], minlength=int(coffs[-1]))
        # edges: inside a component -> unary; between components -> merged comp edges (lo < hi)
        cu, cv = cid[g.eu], cid[g.ev]
        inside = cu == cv
        ie = np.nonzero(inside)[0]
        if len(ie):
            reps = ku[ie]
            e_r = np.repeat(ie, reps)
            a = np.arange(int(reps.sum())) - np.repeat(starts(reps), reps)
            val = g.ec[g.eoff[e_r] + MAP[g.offs[g.eu[e_r]] + a] * kv[e_r] + MAP[g.offs[g.ev[e_r]] + a]]
            ccost += np.bincount(coffs[cu[e_r]] + a, weights=val, minlength=len(ccost))
        xe = np.nonzero(~inside)[0]
        lo, hi = np.minimum(cu[xe], cv[xe]), np.maximum(cu[xe], cv[xe])
        pairs, ce = np.unique(lo * nc + hi, return_inverse=True)
        plo, phi = pairs // nc, pairs % nc
        csz = kc[plo] * kc[phi]
        ceoff = np.concatenate([[0], np.cumsum(csz)])
        cec = np.zeros(int(ceoff[-1]))
        if len(xe):
            sz = kc[lo] * kc[hi]
            e_r = np.repeat(xe, sz)
            ce_r = np.repeat(ce, sz)
            loc = np.arange(int(sz.sum())) - np.repeat(starts(sz), sz)
            khi = np.repeat(kc[hi], sz)
            x, y = loc // khi, loc % khi
            u_is_lo = np.repeat(cu[xe] == lo, sz)
            a = np.where(u_is_lo, x, y)
            b = np.where(u_is_lo, y, x)
            uu, vv = g.eu[e_r], g.ev[e_r]
            val = g.ec[g.eoff[e_r] + MAP[g.offs[uu] + a] * k[vv] + MAP[g.offs[vv] + b]]
            cec += np.bincount(ceoff[ce_r] + loc, weights=val, minlength=len(cec))
        self.problem = Problem(name=f"{g.p.name}[tied]", strategy_offsets=coffs, node_costs=ccost,
                               node_usages=np.zeros(len(ccost)), intervals=np.zeros((nc, 2), dtype=np.int64),
                               edges=np.stack([plo, phi], axis=1).astype(np.int64), edge_offsets=ceoff,
                               edge_costs=cec)

    def expand(self, sc: np.ndarray) -> np.ndarray:
        """Original plan of a component plan."""
        g = self.g
        return self.MAP[g.offs[:-1] + sc[self.cid]]

    def contract(self, s: np.ndarray) -> np.ndarray | None:
        """Component plan of an original plan that follows every tie, else None (a root's map
        is the identity, so the component takes its root's strategy)."""
        sc = np.asarray(s, dtype=np.int64)[self.roots]
        return sc if np.array_equal(self.expand(sc), s) else None

    def usage_at(self, j: int) -> np.ndarray:
        """Per component flat strategy: its members' bytes at compressed time point j of ``g``."""
        g = self.g
        return self.usage_live(g.live_mask & (g.lo <= j) & (g.hi > j))

    def usage_live(self, live: np.ndarray) -> np.ndarray:
        """Per component flat strategy: the bytes of its members with ``live[i]`` (a node mask)."""
        g = self.g
        rows = np.nonzero(live[g.node_of])[0]
        return np.bincount(self.cflat[rows], weights=g.usage[self.oflat[rows]], minlength=len(self.problem.node_costs))

    def penalty(self, node_price: np.ndarray) -> np.ndarray:
        """Component flat costs plus Σ_members usage · node_price[member] (Lagrangian term)."""
        g = self.g
        w = g.usage[self.oflat] * node_price[g.node_of]
        return self.problem.node_costs + np.bincount(self.cflat, weights=w, minlength=len(self.problem.node_costs))


class Pruning:
    """Drop strategies no forbidden-free, memory-feasible plan can use; ``problem`` keeps the rest.

    Repeated until nothing changes (each step vectorised over all strategies / edge entries):

    * forbidden: node cost ≥ ``FORBIDDEN_COST``;
    * no support: on some incident edge, every entry of the strategy's row (column) is forbidden or
      meets a pruned partner (arc consistency);
    * memory: with every other node at its lowest remaining usage, the live usage somewhere in the
      node's interval would exceed the limit: usage_i[a] − min usage_i > cap − max_{t∈interval(i)}
      minlive_t (a range-max query on the lowest-usage profile, by sparse table).

    A node that would lose every strategy keeps the ones it had (the instance then has no
    forbidden-free plan through it, and the solver prices the forbidden entries as costs). Exact for
    the question "the best forbidden-free feasible plan"; the lowest-usage anchor of the original
    problem still proves infeasibility on its own."""

    def __init__(self, g: LocalCosts, rounds: int = 30):
        self.g = g
        n, k = g.n, g.k
        m = len(g.eu)
        ku, kv = k[g.eu], k[g.ev]
        ent_edge = np.repeat(np.arange(m), ku * kv)
        loc = np.arange(len(g.ec)) - g.eoff[ent_edge]
        row, col = loc // kv[ent_edge], loc % kv[ent_edge]
        rflat = g.offs[g.eu[ent_edge]] + row
        cflat = g.offs[g.ev[ent_edge]] + col
        rkey = starts(ku)[ent_edge] + row               # (edge, row) pair id
        ckey = starts(kv)[ent_edge] + col
        rk_flat = np.repeat(g.offs[g.eu], ku) + (np.arange(int(ku.sum())) - np.repeat(starts(ku), ku))
        ck_flat = np.repeat(g.offs[g.ev], kv) + (np.arange(int(kv.sum())) - np.repeat(starts(kv), kv))
        okE = g.ec < FORBIDDEN_COST
        keep = g.cost < FORBIDDEN_COST
        keep = self._guard(g, keep, np.ones_like(keep))
        for _ in range(rounds):
            old = keep
            live_e = okE & keep[rflat] & keep[cflat]
            unsup = np.zeros(len(keep), dtype=bool)
            unsup[rk_flat[np.bincount(rkey, weights=live_e, minlength=len(rk_flat)) == 0]] = True
            unsup[ck_flat[np.bincount(ckey, weights=live_e, minlength=len(ck_flat)) == 0]] = True
            keep = self._guard(g, keep & ~unsup, keep)
            if g.cap is not None:
                keep = self._guard(g, keep & ~self._memory_excess(g, keep), keep)
            if np.array_equal(keep, old):
                break
        self.keep = keep
        nk = np.bincount(g.node_of, weights=keep, minlength=n).astype(np.int64)
        offs = np.concatenate([[0], np.cumsum(nk)])
        ent_keep = keep[rflat] & keep[cflat]
        esz = np.bincount(ent_edge, weights=ent_keep, minlength=m).astype(np.int64)
        p = g.p
        self.orig_local = g.local_index[keep]
        self.problem = Problem(name=f"{p.name}[pruned]", strategy_offsets=offs, node_costs=g.cost[keep],
                               node_usages=g.usage[keep], intervals=p.intervals, edges=p.edges,
                               edge_offsets=np.concatenate([[0], np.cumsum(esz)]),
                               edge_costs=g.ec[ent_keep], usage_limit=p.usage_limit)
        # original flat index -> pruned local index (-1 when pruned)
        self.new_local = np.full(len(keep), -1, dtype=np.int64)
        self.new_local[keep] = np.arange(int(keep.sum())) - np.repeat(offs[:-1], nk)

    @staticmethod
    def _guard(g: LocalCosts, new: np.ndarray, old: np.ndarray) -> np.ndarray:
        """Nodes left with no strategy in ``new`` keep ``old``."""
        empty = np.bincount(g.node_of, weights=new, minlength=g.n) == 0
        return np.where(empty[g.node_of], old, new)

    @staticmethod
    def _memory_excess(g: LocalCosts, keep: np.ndarray) -> np.ndarray:
        u = np.where(keep, g.usage, np.inf)
        mu = np.minimum.reduceat(u, g.offs[:-1])
        minlive = g.profile_of(np.where(g.live_mask, mu, 0.0))
        room = g.cap - range_max(minlive, g.lo, g.hi)
        slack = 1e-9 * max(abs(g.cap), 1.0)     # float sums: a plan exactly at the limit must survive
        return g.live_mask[g.node_of] & (g.usage - mu[g.node_of] > room[g.node_of] + slack)

    def to_orig(self, s2: np.ndarray) -> np.ndarray:
        return self.orig_local[self.problem.strategy_offsets[:-1] + s2]

    def from_orig(self, s: np.ndarray) -> np.ndarray | None:
        s2 = self.new_local[self.g.offs[:-1] + np.asarray(s, dtype=np.int64)]
        return None if (s2 < 0).any() else s2


def prepare(problem: Problem, tie: bool = True, g: LocalCosts | None = None):
    """(pruning, pruned graph, contraction, component graph) of ``problem``: the exact reductions
    ``solve_large`` and ``solvers.cfn`` work on."""
    pr = Pruning(g if g is not None else LocalCosts(problem))
    g2 = LocalCosts(pr.problem)
    C = Contraction(g2, tie)
    return pr, g2, C, LocalCosts(C.problem)


def prune(problem: Problem) -> tuple[Problem, object]:
    """(the problem without the strategies no forbidden-free, memory-feasible plan uses, a function
    mapping its plans back to the original's strategy indices); see ``Pruning``. Unlike
    ``Pruning.problem`` it keeps the resharded copy groups (``CopyGroups.restrict`` to the kept
    strategies), so a pruned plan's profile, and whether it fits, are its original plan's."""
    pr = Pruning(LocalCosts(problem))
    if problem.edge_memory is None:
        return pr.problem, pr.to_orig
    keep = np.split(pr.orig_local, pr.problem.strategy_offsets[1:-1])
    return replace(pr.problem, edge_memory=problem.edge_memory.restrict(keep)), pr.to_orig


def range_max(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(a[lo_i:hi_i]) for every i (−inf where hi_i <= lo_i), by a sparse table."""
    n = len(a)
    out = np.full(len(lo), -np.inf)
    ok = hi > lo
    if not n or not ok.any():
        return out
    table = [a]
    j = 1
    while (1 << j) <= n:
        prev = table[-1]
        half = 1 << (j - 1)
        table.append(np.maximum(prev[:len(prev) - half], prev[half:]))
        j += 1
    L = (hi - lo)[ok]
    lv = np.floor(np.log2(L)).astype(np.int64)
    lo_ok, hi_ok = lo[ok], hi[ok]
    res = np.empty(len(L))
    for j in np.unique(lv).tolist():
        sel = lv == j
        t = table[j]
        res[sel] = np.maximum(t[lo_ok[sel]], t[hi_ok[sel] - (1 << j)])
    out[ok] = res
    return out

