"""Construction: the one decision order, the one greedy construction and the one least-usage (least-measure) plan.

* ``decision_order(problem)``: Kahn's topological order over the edges (producer before consumer),
  smallest ready node id first; a cycle (IOPDDL B and G have some) is broken by taking the
  smallest remaining id. A traced Problem, whose node order is already topological, is walked
  0..n-1. The env, the policy's decode, beam search and ``greedy_by_cost`` all walk this order.
* ``greedy_by_cost(problem, order=None, avoid_forbidden=False, time_limit_s=None)``: each node in
  ``order`` takes the strategy with the least incremental cost

      Δ_i(s) = (c_i[s] + Σ_{decided neighbours j, in decision order} E[s, s_j]) + E_ii[s, s]

  ties to the lowest index; memory ignored. Summed in exactly this order, so beam search of width 1
  (``agent.beam``, which adds the same terms in the same order) returns the same plan.
  ``avoid_forbidden`` (the env's reference plan, as its action mask): on a problem with
  "impossible" costs (>= ``FORBIDDEN_COST``), skip a strategy that costs that much now or leaves
  an undecided neighbour no allowed choice, where an allowed one remains. ``time_limit_s``: the
  nodes not reached in time take their cheapest node cost.
* ``least_usage_plan(problem, avoid_forbidden=False)``: each node's least-usage strategy, ties
  to the least node cost, then the lowest index: the plan of least peak memory (node usages), so
  feasible iff any plan is. ``avoid_forbidden`` ranks strategies with a forbidden node cost last.
"""
from __future__ import annotations

import heapq
import time

import numpy as np

from costmodel.problem import FORBIDDEN_COST, Problem
from solvers.local.costs import incidence


def decision_order(problem: Problem) -> np.ndarray:
    """Topological order (Kahn, smallest ready id first; cycles broken by the smallest remaining id)."""
    n = problem.num_nodes
    edges = problem.edges[problem.edges[:, 0] != problem.edges[:, 1]] if problem.num_edges else np.zeros((0, 2), np.int64)
    indeg = np.bincount(edges[:, 1], minlength=n).astype(np.int64) if len(edges) else np.zeros(n, np.int64)
    if len(edges) == 0 or np.all(edges[:, 0] < edges[:, 1]):
        return np.arange(n, dtype=np.int64)
    srt = np.argsort(edges[:, 0], kind="stable")
    dst = edges[srt, 1]
    ptr = np.searchsorted(edges[srt, 0], np.arange(n + 1))
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    done = np.zeros(n, bool)
    order = []
    nxt = 0
    while len(order) < n:
        if not heap:  # cycle: take the smallest remaining node
            while done[nxt]:
                nxt += 1
            indeg[nxt] = 0
            heap = [nxt]
        i = heapq.heappop(heap)
        if done[i]:
            continue
        done[i] = True
        order.append(i)
        for j in dst[ptr[i]:ptr[i + 1]]:
            indeg[j] -= 1
            if indeg[j] == 0 and not done[j]:
                heapq.heappush(heap, int(j))
    return np.asarray(order, dtype=np.int64)


def greedy_by_cost(problem: Problem, order: np.ndarray | None = None, avoid_forbidden: bool = False,
                   time_limit_s: float | None = None) -> list[int]:
    """The greedy construction (see the module docstring)."""
    order = decision_order(problem) if order is None else order
    deadline = None if time_limit_s is None else time.perf_counter() + float(time_limit_s)
    k, offs, eoffs = problem.num_strategies, problem.strategy_offsets, problem.edge_offsets
    ptr, eid, nbr, is_src = incidence(problem)
    costs = [problem.node_costs[offs[i]:offs[i + 1]].astype(np.float64) for i in range(problem.num_nodes)]
    resh = [np.zeros(int(x)) for x in k]
    strat = np.full(problem.num_nodes, -1, np.int64)
    forbidden = avoid_forbidden and bool((problem.node_costs >= FORBIDDEN_COST).any()
                                         or (problem.edge_costs >= FORBIDDEN_COST).any())
    for i in order:
        i = int(i)
        if deadline is not None and time.perf_counter() > deadline:
            break
        incr = costs[i] + resh[i]
        for p in range(ptr[i], ptr[i + 1]):
            if nbr[p] == i:   # self-loop: its diagonal
                incr = incr + np.diagonal(problem.edge_matrix(int(eid[p])))
        if forbidden:
            ok = incr < FORBIDDEN_COST
            for p in range(ptr[i], ptr[i + 1]):
                j = int(nbr[p])
                if strat[j] >= 0 or j == i:
                    continue
                mat = problem.edge_matrix(int(eid[p]))
                mat = mat if is_src[p] else mat.T
                ok_j = ((mat + (costs[j] + resh[j])[None, :]) < FORBIDDEN_COST).any(axis=1)
                if (ok & ok_j).any():
                    ok &= ok_j
            if ok.any():
                incr = np.where(ok, incr, np.inf)
        s = int(np.argmin(incr))
        strat[i] = s
        for p in range(ptr[i], ptr[i + 1]):
            j = int(nbr[p])
            if strat[j] >= 0:
                continue
            e = int(eid[p])
            if is_src[p]:
                kv = int(k[j])
                resh[j] += problem.edge_costs[eoffs[e] + s * kv: eoffs[e] + (s + 1) * kv]
            else:
                resh[j] += problem.edge_costs[eoffs[e] + s: eoffs[e + 1]: int(k[i])]
    rest = np.nonzero(strat < 0)[0]
    for i in rest.tolist():
        strat[i] = int(np.argmin(costs[i]))
    return [int(x) for x in strat]


def least_usage_plan(problem: Problem, avoid_forbidden: bool = False) -> list[int]:
    """Each node's least-usage strategy, ties to the least node cost, then the lowest index."""
    return least_measure_plan(problem, problem.node_usages, avoid_forbidden)


def least_measure_plan(problem: Problem, vals: np.ndarray, avoid_forbidden: bool = False) -> list[int]:
    """Each node's strategy of least ``vals`` (one value per strategy, flat like node_costs), ties
    to the least node cost, then the lowest index; with ``avoid_forbidden`` a forbidden strategy
    (node cost >= FORBIDDEN_COST) only where the node has nothing else."""
    k, offs = problem.num_strategies, problem.strategy_offsets
    node_of = np.repeat(np.arange(problem.num_nodes), k)
    local = np.arange(len(problem.node_costs)) - offs[:-1][node_of]
    keys = [local, problem.node_costs, np.asarray(vals)]
    if avoid_forbidden:
        keys.append((problem.node_costs >= FORBIDDEN_COST).astype(np.int64))
    order = np.lexsort(tuple(keys) + (node_of,))
    return [int(x) for x in local[order[offs[:-1]]]]
