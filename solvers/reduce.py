"""Exact problem reductions before a solver runs, with the map back to the original plan.

``reduce_problem(problem, ...)`` returns a ``Reduction``: a smaller Problem with the same nodes
(node i keeps the strategies ``keep[i]`` of the original, in order) and fewer edges, plus the
records needed to rebuild an original plan (``Reduction.expand``). For every reduced plan r,
``evaluate(original, red.expand(r)).total <= evaluate(red.problem, r).total`` holds with equality
(up to float rounding of the folded sums), the peak memory and redundant bytes are the same, and
the optimum of every objective is preserved. The reductions:

1. **Forbidden strategies** (optional, ``forbidden=costmodel.problem.FORBIDDEN_COST``): a strategy
   whose node cost is at least the threshold, or whose row/column in some incident edge is all at
   least the threshold, is dropped (unless it is the node's last). IOPDDL marks impossible
   shardings with cost 1e18. This one is *not* exact in general: the caller re-solves without it
   if the reduced problem turns out infeasible (see ``solvers.ilp.reduced``).
2. **Dominated strategies**: strategy a of node i is dropped when another strategy b of i is no
   worse in every respect that matters: node cost, usage (only when memory matters and the node's
   interval is non-empty), redundant bytes (only when redundancy matters), and every entry of its
   row (or column) in every incident edge. Ties keep the lower index.
3. **Single-strategy nodes**: their edges are folded into the neighbour's node costs
   (c_w[t] += E[0, t]); the node keeps its cost and usage.
4. **Separable edges**: an edge with E[s, t] = a[s] + b[t] (e.g. all-zero) folds into both ends.
5. **Leaf and series elimination** (classic DP variable elimination), only for nodes whose choice
   does not touch memory or redundancy (memory does not matter, or the node's interval is empty,
   or all its strategies use the same bytes; likewise for redundancy): a degree-1 node v with
   neighbour u adds min_t(E[s, t] + c_v[t]) to c_u[s]; a degree-2 node v between u and w becomes a
   new u-w edge N[s, r] = min_t(E_uv[s, t] + c_v[t] + E_vw[t, r]) (merged with an existing u-w
   edge). The argmins are kept; v stays in the reduced problem as a single zero-cost strategy that
   carries its (constant) usage and redundant bytes, so the memory profile is unchanged.

Parallel edges between the same two nodes are merged first. The worklist repeats 2-5 until
nothing changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem


@dataclass(frozen=True, eq=False)
class Reduction:
    """A reduced Problem plus the map back. ``keep[i]``: original strategy index of each of node
    i's reduced strategies. ``records``: eliminations, replayed in reverse by ``expand``."""

    original: Problem
    problem: Problem
    keep: list
    records: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    def expand(self, reduced_plan) -> list[int]:
        """Original strategy indices for a plan of the reduced problem."""
        r = np.asarray(reduced_plan, dtype=np.int64)
        s = np.array([int(self.keep[i][r[i]]) for i in range(len(r))], dtype=np.int64)
        for rec in reversed(self.records):
            if rec[0] == "leaf":
                _, v, u, table = rec
                s[v] = table[s[u]]
            else:
                _, v, u, w, table = rec
                s[v] = table[s[u], s[w]]
        return [int(x) for x in s]

    def contract(self, plan) -> list[int] | None:
        """Reduced indices of an original plan, or None if the plan uses a dropped strategy
        (eliminated nodes are ignored: their choice is recomputed by ``expand``)."""
        out = []
        elim = {rec[1] for rec in self.records}
        for i, si in enumerate(plan):
            if i in elim:
                out.append(0)
                continue
            hit = np.nonzero(self.keep[i] == si)[0]
            if not len(hit):
                return None
            out.append(int(hit[0]))
        return out


def identity_reduction(problem: Problem) -> Reduction:
    keep = [np.arange(k) for k in problem.num_strategies]
    return Reduction(problem, problem, keep, [], {"reduced": False})


def reduce_problem(problem: Problem, memory_matters: bool = True, redundancy_matters: bool = False,
                   forbidden: float | None = None, eliminate: bool = True,
                   max_dominance_work: float = 2e7, max_chain_work: float = 4e6,
                   allowed: np.ndarray | None = None, memory_free: np.ndarray | None = None,
                   copy_classes: list | None = None) -> Reduction:
    """Apply the reductions in the module docstring. ``memory_matters``: a memory cap or a memory
    objective is in play; ``redundancy_matters``: redundant bytes enter the objective.

    ``allowed``: optional boolean mask over all strategies (``problem.node_costs``'s layout); the
    others are dropped first (a node keeps at least one). The caller vouches that no optimal plan
    needs a dropped strategy (e.g. ``solvers.ilp`` drops strategies that break a memory cap on
    their own). ``memory_free``: optional boolean mask over nodes whose usage the caller proved
    cannot matter (every memory row they sit in is slack for any choice); they are treated like
    nodes with constant usage (dominance ignores their usage and they may be eliminated), and the
    caller must not put memory rows over their intervals. ``copy_classes``: optional, per node None
    or a class id per strategy (``CopyGroups.strategy_classes``): such a node is never eliminated
    and dominance only drops a strategy for one of its class (the same copy flags), so the copies
    of ``problem.edge_memory`` price the same (their masks follow the kept strategies into the
    reduced problem). Pass it when memory matters."""
    n = problem.num_nodes
    k0 = problem.num_strategies
    offs = problem.strategy_offsets
    strats = [np.arange(int(k0[i])) for i in range(n)]
    cost = [problem.node_costs[offs[i]:offs[i + 1]].astype(np.float64).copy() for i in range(n)]
    usage = [problem.node_usages[offs[i]:offs[i + 1]] for i in range(n)]
    red = [problem.node_redundant[offs[i]:offs[i + 1]] for i in range(n)]
    live = problem.intervals[:, 1] > problem.intervals[:, 0]
    placeholder = np.zeros(n, dtype=bool)

    # ---- edges: merge parallel ones; store oriented (a, b) with a < b ----------------------
    edges: dict[int, list] = {}       # eid -> [a, b, M (k_a x k_b)]
    pair: dict[tuple, int] = {}
    adj: list[set] = [set() for _ in range(n)]
    next_eid = 0

    def add_edge(a, b, M):
        nonlocal next_eid
        if a > b:
            a, b, M = b, a, M.T
        key = (a, b)
        if key in pair:
            edges[pair[key]][2] = edges[pair[key]][2] + M
            return pair[key]
        eid = next_eid
        next_eid += 1
        edges[eid] = [a, b, np.array(M, dtype=np.float64)]
        pair[key] = eid
        adj[a].add(eid)
        adj[b].add(eid)
        return eid

    def remove_edge(eid):
        a, b, _ = edges.pop(eid)
        del pair[(a, b)]
        adj[a].discard(eid)
        adj[b].discard(eid)

    for e in range(problem.num_edges):
        u, v = int(problem.edges[e, 0]), int(problem.edges[e, 1])
        M = problem.edge_matrix(e)
        if u == v:  # self loop: only the diagonal can ever be paid
            cost[u] = cost[u] + np.diag(M)
            continue
        add_edge(u, v, M)
    stats = {"nodes": n, "strategies_before": int(k0.sum()), "edges_before": problem.num_edges}

    def oriented(eid, i):
        """(other node, matrix with i's strategies as rows)."""
        a, b, M = edges[eid]
        return (b, M) if a == i else (a, M.T)

    def prune(i, mask):
        if mask.all():
            return False
        strats[i] = strats[i][mask]
        cost[i] = cost[i][mask]
        usage[i] = usage[i][mask]
        red[i] = red[i][mask]
        for eid in adj[i]:
            a, b, M = edges[eid]
            edges[eid][2] = M[mask, :] if a == i else M[:, mask]
        return True

    free_mask = np.zeros(n, dtype=bool) if memory_free is None else np.asarray(memory_free, dtype=bool)
    if free_mask.shape != (n,):
        raise ValueError(f"memory_free must be a boolean mask of {n} nodes, got shape {free_mask.shape}")

    classes = [None] * n if copy_classes is None else list(copy_classes)
    pin = np.array([c is not None for c in classes], dtype=bool)

    def mem_free(i):
        if pin[i]:
            return False
        return (not memory_matters) or (not live[i]) or free_mask[i] or np.ptp(usage[i]) == 0

    def red_free(i):
        return (not redundancy_matters) or np.ptp(red[i]) == 0

    # ---- 0. strategies the caller ruled out ------------------------------------------------
    dropped_disallowed = 0
    if allowed is not None:
        allowed = np.asarray(allowed, dtype=bool)
        if allowed.shape != (int(k0.sum()),):
            raise ValueError(f"allowed must be a boolean mask of {int(k0.sum())} strategies, got shape {allowed.shape}")
        for i in range(n):
            m = allowed[offs[i]:offs[i + 1]]
            if m.any() and not m.all():
                dropped_disallowed += int((~m).sum())
                prune(i, m)

    # ---- 1. forbidden ----------------------------------------------------------------------
    dropped_forbidden = 0
    if forbidden is not None:
        for i in range(n):
            bad = cost[i] >= forbidden
            for eid in adj[i]:
                _, M = oriented(eid, i)
                bad |= (M >= forbidden).all(axis=1)
            if bad.all():
                continue
            if bad.any():
                dropped_forbidden += int(bad.sum())
                prune(i, ~bad)

    # ---- 2. dominance ----------------------------------------------------------------------
    def dominance(i):
        """Dead-end elimination (Goldstein's criterion): drop a when some surviving b gives
        D[a, b] = c[a] - c[b] + sum_e min_t (E_e[a, t] - E_e[b, t]) >= 0, i.e. switching i from a
        to b never costs more whatever the neighbours pick (and b uses no more memory / redundant
        bytes where those matter). Survivors are scanned in order, so every dropped strategy
        points at one that was alive when it was dropped and some optimal plan avoids them all."""
        k = len(strats[i])
        if k <= 1:
            return False
        mats = [oriented(eid, i)[1] for eid in adj[i]]
        if k * k * sum(M.shape[1] for M in mats) > max_dominance_work:
            return False
        D = cost[i][:, None] - cost[i][None, :]
        for M in mats:
            D = D + (M[:, None, :] - M[None, :, :]).min(axis=2)
        ok = D >= 0
        if not mem_free(i):
            ok &= usage[i][None, :] <= usage[i][:, None]
        if redundancy_matters:
            ok &= red[i][None, :] <= red[i][:, None]
        if pin[i]:   # only within a copy class: the same copies whatever it switches to
            cl = np.asarray(classes[i])[strats[i]]
            ok &= cl[None, :] == cl[:, None]
        np.fill_diagonal(ok, False)
        if not ok.any():
            return False
        alive = np.ones(k, dtype=bool)
        for a in np.nonzero(ok.any(axis=1))[0]:
            if (ok[a] & alive).any():
                alive[a] = False
        return prune(i, alive)

    records: list = []

    def fold_single(i):
        """Node i has one strategy: fold its edges into the neighbours."""
        changed = []
        for eid in list(adj[i]):
            j, M = oriented(eid, i)
            cost[j] = cost[j] + M[0, :]
            remove_edge(eid)
            changed.append(j)
        return changed

    def separable(eid):
        a, b, M = edges[eid]
        big = np.abs(M) >= FORBIDDEN_COST
        if big.any():   # 1e18 entries swamp float precision: never call those separable
            return None
        ra = M[:, 0] - M[0, 0]
        rb = M[0, :]
        scale = max(1.0, float(np.abs(M).max()))
        if np.abs(M - ra[:, None] - rb[None, :]).max() <= 1e-12 * scale:
            cost[a] = cost[a] + ra
            cost[b] = cost[b] + rb
            remove_edge(eid)
            return (a, b)
        return None

    def eliminate_node(v):
        deg = len(adj[v])
        if deg == 1:
            eid = next(iter(adj[v]))
            u, M = oriented(eid, v)          # M: rows v, cols u
            tot = M + cost[v][:, None]
            arg = np.argmin(tot, axis=0)
            cost[u] = cost[u] + tot[arg, np.arange(tot.shape[1])]
            table = np.full(int(k0[u]), -1, dtype=np.int64)
            table[strats[u]] = strats[v][arg]
            records.append(("leaf", v, u, table))
            remove_edge(eid)
            _make_placeholder(v)
            return [u]
        if deg == 2:
            e1, e2 = list(adj[v])
            u, A = oriented(e1, v)           # rows v, cols u
            w, B = oriented(e2, v)           # rows v, cols w
            kv, ku, kw = A.shape[0], A.shape[1], B.shape[1]
            if ku * kv * kw > max_chain_work:
                return []
            tot = A.T[:, :, None] + cost[v][None, :, None] + B[None, :, :]   # u x v x w
            arg = np.argmin(tot, axis=1)
            N = np.take_along_axis(tot, arg[:, None, :], axis=1)[:, 0, :]
            table = np.full((int(k0[u]), int(k0[w])), -1, dtype=np.int64)
            table[np.ix_(strats[u], strats[w])] = strats[v][arg]
            records.append(("chain", v, u, w, table))
            remove_edge(e1)
            remove_edge(e2)
            add_edge(u, w, N)
            _make_placeholder(v)
            return [u, w]
        return []

    def _make_placeholder(v):
        strats[v] = strats[v][:1]
        cost[v] = np.zeros(1)
        usage[v] = usage[v][:1]
        red[v] = red[v][:1]
        placeholder[v] = True

    # ---- worklist --------------------------------------------------------------------------
    for eid in list(edges):
        if eid in edges:
            separable(eid)
    work = list(range(n))
    in_work = np.ones(n, dtype=bool)
    eliminated = 0
    while work:
        i = work.pop()
        in_work[i] = False
        if placeholder[i]:
            continue
        touched = []
        if dominance(i):
            touched.extend(oriented(eid, i)[0] for eid in adj[i])
        if len(strats[i]) == 1:
            touched.extend(fold_single(i))
        elif eliminate and len(adj[i]) <= 2 and mem_free(i) and red_free(i):
            if len(adj[i]) == 0:
                j = int(np.argmin(cost[i]))
                prune(i, np.arange(len(strats[i])) == j)
            else:
                got = eliminate_node(i)
                if got:
                    eliminated += 1
                    touched.extend(got)
                    for eid in list(adj[got[0]]):
                        if eid in edges and separable(eid):
                            pass
        for j in touched:
            if not in_work[j] and not placeholder[j]:
                in_work[j] = True
                work.append(j)

    # ---- build the reduced problem -----------------------------------------------------------
    k = np.array([len(s) for s in strats], dtype=np.int64)
    offs_r = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(k, out=offs_r[1:])
    eids = sorted(edges)
    e_arr = np.array([[edges[e][0], edges[e][1]] for e in eids], dtype=np.int64).reshape(-1, 2)
    mats = [edges[e][2].ravel() for e in eids]
    ek = np.array([len(m) for m in mats], dtype=np.int64)
    eoffs = np.zeros(len(eids) + 1, dtype=np.int64)
    np.cumsum(ek, out=eoffs[1:])
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0))
    reduced = Problem(
        name=f"{problem.name}[reduced]",
        strategy_offsets=offs_r,
        node_costs=cat(cost),
        node_usages=cat([np.asarray(u, dtype=np.float64) for u in usage]),
        intervals=problem.intervals,
        edges=e_arr,
        edge_offsets=eoffs,
        edge_costs=cat(mats),
        usage_limit=problem.usage_limit,
        node_redundant=cat([np.asarray(r, dtype=np.float64) for r in red]),
        # copies are priced in the reduced problem only where its nodes were kept whole (pinned)
        edge_memory=None if problem.edge_memory is None or copy_classes is None else problem.edge_memory.restrict(strats),
    )
    stats.update({
        "reduced": True,
        "strategies_after": int(k.sum()),
        "edges_after": len(eids),
        "free_nodes_after": int((k > 1).sum()),
        "eliminated_nodes": eliminated,
        "dropped_forbidden": dropped_forbidden,
        "dropped_disallowed": dropped_disallowed,
        "memory_free_nodes": int(free_mask.sum()),
        "edge_entries_before": int(len(problem.edge_costs)),
        "edge_entries_after": int(ek.sum()),
    })
    return Reduction(problem, reduced, strats, records, stats)
