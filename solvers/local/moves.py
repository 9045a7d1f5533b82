"""Moves of the local-search library: the one best response, edge pair moves and forest moves.

* ``best_response(problem, plan, ...)``: iterated best response (ICM). Every round computes all
  local costs (``LocalCosts.local``, on the problem's node costs or on ``node_cost``, e.g.
  Lagrangian prices) and moves a set of improving nodes no two of which share an edge, so the
  total falls by exactly the sum of their gains. Which set: by default the improving nodes whose
  gain beats every improving neighbour's (ties: the lower index); with ``classes`` (a colouring,
  ``LocalCosts.colour_classes``; the large-instance driver's schedule) the improving nodes of the
  next colour class in turn, until a whole pass over the classes moves nothing. With ``memory`` (default) and a usage limit, a batch
  that would break the limit is cut to its moves that do not raise their node's usage, or, when
  none, the round retries among the usage-non-increasing strategies only. Never makes a plan
  worse (in ``node_cost``) or, with ``memory``, infeasible. With copies (``Problem.edge_memory``) a
  move that does not raise its node's usage can still make a copy live: from a plan that fits, a
  batch that breaks the limit is then halved (largest gains kept) until it fits, or the loop stops
  (before this, ``polish`` returned a plan over the cap on unet tiny cpu-2x4 at cap 75 %).
* ``pair_moves(problem, plan, lc)``: for every edge (u, v) the joint best (s, t) given all other
  nodes, J[s, t] = L_u(s) − E[s, t_now] + L_v(t) − E[s_now, t] + E[s, t], for all edges at once;
  moves with positive gain are applied greedily, best first, skipping any that touches a node
  already moved or next to one (so every applied gain is exact).
* ``forest_dp(lc, s, node_cost, rng, deadline)``: a random induced forest re-optimised exactly by
  tree dynamic programming, every other node held at ``s`` (their edges become unary costs); the
  forest's leaves send their messages in one numpy batch, the rest node by node (contest-41k-thin's
  component graph: 0.30 s a call -> 0.26 s, the same plans).
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.local.costs import LocalCosts, starts


def _independent(cand: np.ndarray, gain: np.ndarray, lc: LocalCosts, prio_base: np.ndarray):
    """(priorities by gain, ties to the lower index; the candidates that beat every candidate neighbour)."""
    n = len(cand)
    order = np.lexsort((-prio_base, gain))
    prio = np.empty(n, np.int64)
    prio[order] = np.arange(n)
    prio = np.where(cand, prio, -1)
    return prio, cand & (prio > _nb_max(lc, prio))


def _nb_max(lc: LocalCosts, prio: np.ndarray) -> np.ndarray:
    """Per node, the highest priority among its neighbours (-1: none)."""
    nb = np.full(len(prio), -1, np.int64)
    np.maximum.at(nb, lc.nbr_u, prio[lc.nbr_v])
    np.maximum.at(nb, lc.nbr_v, prio[lc.nbr_u])
    return nb


def best_response(problem: Problem, plan, time_limit_s: float = 1.0, max_rounds: int = 10_000,
                  lc: LocalCosts | None = None, node_cost: np.ndarray | None = None,
                  memory: bool = True, classes: list | None = None) -> list[int]:
    """Iterated best response (see the module docstring)."""
    lc = lc or LocalCosts(problem)
    plan = np.asarray(plan, dtype=np.int64).copy()
    off = lc.offs
    n = lc.n
    limit = lc.cap if memory else None
    t0 = time.perf_counter()
    prio_base = np.arange(n)
    idle = 0                               # colour classes in a row that moved nothing
    for r in range(max_rounds):
        if time.perf_counter() - t0 > time_limit_s:
            break
        tot = lc.local(plan, node_cost)
        cur_flat = off[:-1] + plan
        cur = tot[cur_flat]
        best = lc.seg_argmin(tot)
        gain = cur - tot[off[:-1] + best]
        scale = max(float(np.abs(cur).max()), 1e-30) if n else 1.0
        if classes is not None:            # the next colour class: an independent set already
            move = np.zeros(n, dtype=bool)
            cls = classes[r % len(classes)] if len(classes) else np.zeros(0, np.int64)
            move[cls[gain[cls] > 1e-12 * np.maximum(1.0, np.abs(cur[cls]))]] = True
            idle = 0 if move.any() else idle + 1
            if idle >= max(len(classes), 1):
                break
            if not move.any():
                continue
            prio = np.where(move, gain, -1)
        else:
            cand = gain > 1e-12 * scale
            if not cand.any():
                break
            prio, move = _independent(cand, gain, lc, prio_base)
        new = plan.copy()
        new[move] = best[move]
        if limit is not None and not lc.feasible(new):
            safe = move & (lc.live_usage[off[:-1] + best] <= lc.live_usage[cur_flat])
            if not safe.any():
                # best moves all raise memory: retry restricted to non-increasing usage strategies
                tot2 = np.where(lc.live_usage <= lc.live_usage[cur_flat][lc.node_of], tot, np.inf)
                best2 = lc.seg_argmin(tot2)
                cand2 = cur - tot2[off[:-1] + best2] > 1e-12 * scale
                if not cand2.any():
                    break
                prio2 = np.where(cand2, prio, -1)
                safe = cand2 & (prio2 > _nb_max(lc, prio2))
                if not safe.any():
                    break
                best = best2
            new = plan.copy()
            new[safe] = best[safe]
            if problem.edge_memory is not None and not lc.feasible(new) and lc.feasible(plan):   # a copy made live
                idx = np.flatnonzero(safe)
                idx = idx[np.argsort(-prio[idx], kind="stable")]
                while len(idx) > 1 and not lc.feasible(new):
                    idx = idx[:len(idx) // 2]
                    new = plan.copy()
                    new[idx] = best[idx]
                if not lc.feasible(new):
                    break
        plan = new
    return [int(x) for x in plan]


def pair_moves(problem: Problem, plan, lc: LocalCosts | None = None, time_limit_s: float = 0.5) -> np.ndarray:
    """Edge pair moves (see the module docstring), until no edge improves or the time is spent."""
    p = problem
    lc = lc or LocalCosts(problem)
    plan = np.asarray(plan, dtype=np.int64).copy()
    if p.num_edges == 0:
        return plan
    t0 = time.perf_counter()
    k = p.num_strategies
    off, eoff = p.strategy_offsets, p.edge_offsets
    sizes = np.diff(eoff)
    ent_e = np.repeat(np.arange(p.num_edges), sizes)
    pos = np.arange(len(ent_e)) - eoff[ent_e]
    kv = k[p.edges[ent_e, 1]]
    ent_s, ent_t = pos // kv, pos % kv
    u_of, v_of = p.edges[ent_e, 0], p.edges[ent_e, 1]
    loop = p.edges[:, 0] == p.edges[:, 1]
    limit = p.usage_limit
    while time.perf_counter() - t0 < time_limit_s:
        tot = lc.local(plan)
        su, sv = plan[u_of], plan[v_of]
        J = (tot[off[u_of] + ent_s] - p.edge_costs[eoff[ent_e] + ent_s * kv + sv]
             + tot[off[v_of] + ent_t] - p.edge_costs[eoff[ent_e] + su * kv + ent_t]
             + p.edge_costs)
        nz = sizes > 0
        mins = np.full(p.num_edges, np.inf)
        mins[nz] = np.minimum.reduceat(J, eoff[:-1][nz])
        cur = J[eoff[:-1] + plan[p.edges[:, 0]] * k[p.edges[:, 1]] + plan[p.edges[:, 1]]]
        gain = np.where(loop, 0.0, cur - mins)
        scale = max(float(np.abs(tot).max()), 1e-30)
        cand = np.nonzero(gain > 1e-12 * scale)[0]
        if not len(cand):
            break
        first = np.where(J <= mins[ent_e], np.arange(len(J)), len(J))
        arg = np.full(p.num_edges, 0)
        arg[nz] = np.minimum.reduceat(first, eoff[:-1][nz]) - eoff[:-1][nz]
        locked = np.zeros(p.num_nodes, bool)
        new = plan.copy()
        for e in cand[np.argsort(-gain[cand])]:
            a, b = int(p.edges[e, 0]), int(p.edges[e, 1])
            if locked[a] or locked[b]:
                continue
            new[a], new[b] = divmod(int(arg[e]), int(k[b]))
            for x in (a, b):
                locked[x] = True
                locked[lc.adj[lc.adj_ptr[x]:lc.adj_ptr[x + 1]]] = True
        if limit is not None and not evaluate(p, new).feasible:
            break
        if evaluate(p, new).total >= evaluate(p, plan).total:
            break
        plan = new
    return plan


def forest_dp(lc: LocalCosts, s: np.ndarray, node_cost: np.ndarray, rng, deadline: float) -> np.ndarray:
    """Exact block move on a random induced forest (see the module docstring)."""
    g = lc
    n = g.n
    nbrs, nedges = g.neighbour_lists()
    parent = list(range(n))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    infl = [False] * n
    for i in rng.permutation(n).tolist():
        roots = []
        for j in nbrs[i]:
            if infl[j]:
                r = find(j)
                if r in roots:          # a second path into one tree (or a parallel edge): a cycle
                    break
                roots.append(r)
        else:
            infl[i] = True
            for r in roots:
                parent[r] = i
    inf = np.asarray(infl, dtype=bool)
    # unary costs: node cost (+ self-loops) + edges that leave the forest
    in_edge = inf[g.eu] & inf[g.ev]
    L = node_cost.astype(np.float64, copy=True)
    if g.loop_diag is not None:
        L += g.loop_diag
    if len(g.gu_edge):
        m = ~in_edge[g.gu_edge]
        sv = s[g.ev[g.gu_edge[m]]]
        L += np.bincount(g.gu_flat[m], g.ec[g.eoff[g.gu_edge[m]] + g.gu_loc[m] * g.k[g.ev[g.gu_edge[m]]] + sv],
                         minlength=len(L))
        m = ~in_edge[g.gv_edge]
        su = s[g.eu[g.gv_edge[m]]]
        L += np.bincount(g.gv_flat[m], g.ec[g.eoff[g.gv_edge[m]] + su * g.k[g.ev[g.gv_edge[m]]] + g.gv_loc[m]],
                         minlength=len(L))
    walk = dfs_forest(g, infl, deadline)
    if walk is None:
        return s
    order, par, pedge = walk
    # forest leaves at once (most nodes of a contest graph): each one's message to its parent
    leaf_arg, leaf_seg, L = _leaf_messages(g, L, np.asarray(par), np.asarray(pedge))
    U = [L[g.offs[i]:g.offs[i + 1]] for i in range(n)]
    arg = {}
    eu, eoff, k, ec = g.eu.tolist(), g.eoff.tolist(), g.k.tolist(), g.ec
    for i in reversed(order):
        p = par[i]
        if p < 0 or leaf_seg[i] >= 0:
            continue
        e = pedge[i]
        if eu[e] == i:
            M = ec[eoff[e]:eoff[e + 1]].reshape(k[i], k[p])
        else:                 # rows: i's strategies
            M = ec[eoff[e]:eoff[e + 1]].reshape(k[p], k[i]).T
        tot = U[i][:, None] + M
        a = tot.argmin(axis=0)
        arg[i] = a
        U[p] = U[p] + tot.min(axis=0)
    out = s.copy()
    for i in order:
        p = par[i]
        if p < 0:
            out[i] = int(np.argmin(U[i]))
        elif leaf_seg[i] >= 0:
            out[i] = int(leaf_arg[leaf_seg[i] + out[p]])
        else:
            out[i] = int(arg[i][out[p]])
    return out


def dfs_forest(lc: LocalCosts, member: list, deadline: float = float("inf")):
    """(DFS order, parent, parent edge) over the nodes with ``member[i]`` true and the edges between
    them, from each unvisited member in index order (-1: a root); on a forest (an induced forest, or
    every node when the walk is wanted as a spanning forest) each member is reached once. None when
    ``deadline`` (``time.perf_counter``) passes, checked per tree."""
    nbrs, nedges = lc.neighbour_lists()
    seen = [not x for x in member]
    order, par, pedge = [], [-1] * lc.n, [-1] * lc.n
    for r in range(lc.n):
        if seen[r]:
            continue
        seen[r] = True
        stack = [r]
        while stack:
            i = stack.pop()
            order.append(i)
            for j, e in zip(nbrs[i], nedges[i]):
                if not seen[j]:
                    seen[j] = True
                    par[j] = i
                    pedge[j] = e
                    stack.append(j)
        if time.perf_counter() > deadline:
            return None
    return order, par, pedge


def _leaf_messages(g: LocalCosts, L: np.ndarray, par: np.ndarray, pedge: np.ndarray):
    """The tree DP's step for every forest leaf i (a parent p, no children) at once: the message
    m[b] = min_a L_i[a] + E[a, b] (E oriented i -> p) added to p's unary costs, and its first argmin.
    (best a per (leaf, b) flat, where leaf i's row starts (-1: not a leaf), L with the messages)."""
    n = g.n
    has_child = np.zeros(n, dtype=bool)
    has_child[par[par >= 0]] = True
    leaves = np.nonzero((par >= 0) & ~has_child)[0]
    seg = np.full(n, -1, dtype=np.int64)
    if not len(leaves):
        return np.zeros(0, np.int64), seg, L
    p, e = par[leaves], pedge[leaves]
    ki, kp = g.k[leaves], g.k[p]
    seg[leaves] = starts(kp)
    size = ki * kp
    rep = np.repeat(np.arange(len(leaves)), size)
    t = np.arange(int(size.sum())) - np.repeat(starts(size), size)     # (b, a), a fastest
    kir, kpr = ki[rep], kp[rep]
    b, a = t // kir, t % kir
    fwd = (g.eu[e] == leaves)[rep]                                     # the leaf produces: E is k_i x k_p
    entry = g.eoff[e][rep] + np.where(fwd, a * kpr + b, b * kir + a)
    vals = L[g.offs[leaves][rep] + a] + g.ec[entry]
    seg_start = np.nonzero(a == 0)[0]                                  # one segment per (leaf, b)
    best = np.minimum.reduceat(vals, seg_start)
    seg_of = np.cumsum(a == 0) - 1
    first = np.minimum.reduceat(np.where(vals == best[seg_of], a, np.iinfo(np.int64).max), seg_start)
    L = L.copy()
    np.add.at(L, np.repeat(g.offs[p], kp) + (np.arange(int(kp.sum())) - np.repeat(starts(kp), kp)), best)
    return first, seg, L
