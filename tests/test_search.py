"""Large-instance heuristics and the IOPDDL command body."""
from __future__ import annotations

import io
import itertools
import json
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402

from costmodel.problem import Problem, evaluate  # noqa: E402
from solvers.iopddl_cli import main_iopddl  # noqa: E402
from solvers.local import Contraction, LocalCosts, Pruning, forest_dp, least_usage_plan, polish, range_max, refine  # noqa: E402
from solvers.search import solve_large  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "iopddl")
EXAMPLE = os.path.join(SHARED, "example.json")
B = os.path.join(SHARED, "asplos-2025-iopddl-B.json.gz")
A = os.path.join(SHARED, "asplos-2025-iopddl-A.json.gz")


def test_solve_large_small_random_is_feasible_and_often_optimal():
    hits = 0
    for seed in range(10):
        p = random_problem(np.random.default_rng(seed), 6, kmax=3, limit_q=0.5)
        plan = solve_large(p, 0.5, use_lns=False, seed=seed)
        best, bc = brute_force(p)
        assert plan is not None and evaluate(p, plan).feasible
        assert evaluate(p, plan).total >= bc.total - 1e-9
        hits += evaluate(p, plan).total == bc.total
    assert hits >= 5        # forest DP + ICM on 6-node graphs finds most optima


def test_solve_large_reports_no_plan_when_nothing_fits():
    p = Problem.from_iopddl(EXAMPLE).with_usage_limit(49)   # the lowest peak is 50
    assert solve_large(p, 2.0) is None


def test_solve_large_on_B_within_budget():
    p = Problem.from_iopddl(B)
    t0 = time.perf_counter()
    plan = solve_large(p, 10.0, seed=0)
    wall = time.perf_counter() - t0
    assert wall < 11.0
    c = evaluate(p, plan)
    assert c.feasible and c.total < 1e15      # no 1e18 "impossible" strategy


def test_main_iopddl_example_last_line():
    buf = io.StringIO()
    t0 = time.perf_counter()
    plan = main_iopddl(EXAMPLE, 5, out=buf)
    assert time.perf_counter() - t0 < 5
    last = buf.getvalue().strip().splitlines()[-1]
    assert json.loads(last) == plan == [0, 0, 2, 1, 0]     # the proven optimum, cost 445


def test_main_iopddl_infeasible_prints_empty(tmp_path):
    p = Problem.from_iopddl(EXAMPLE).with_usage_limit(49)
    path = str(tmp_path / "tight.json")
    p.to_iopddl(path)
    buf = io.StringIO()
    with pytest.raises(ValueError, match="usage_limit 49 fits no plan"):   # the CLI: one line, exit 2
        main_iopddl(path, 5, out=buf)
    assert buf.getvalue().strip().splitlines()[-1] == "[]"


def test_main_iopddl_bad_timeout():
    with pytest.raises(ValueError, match="TIMEOUT_S"):
        main_iopddl(EXAMPLE, 0, out=io.StringIO())


# ---- permutation ties (contraction) ------------------------------------------------------------
def _perm_problem():
    """a -(identity)- b -(swap)- c, plus a free edge a-c and a forbidden entry on node c.
    Ties: b = a, c = swap(b) = swap(a), so one component with a's 2 strategies."""
    F = 1e18
    costs = [[1, 5], [2, 2], [10, F]]
    usages = [[1, 1], [1, 1], [1, 1]]
    edges = [(0, 1), (1, 2), (0, 2)]
    ecosts = [[0, F, F, 3],        # identity: (0,0) free, (1,1) costs 3
              [F, 4, 7, F],        # swap: (0,1) costs 4, (1,0) costs 7
              [1, 2, 3, 4]]        # an ordinary edge
    return Problem.from_lists("ties", costs, usages, [(0, 1)] * 3, edges, ecosts)


def test_contraction_merges_permutation_chain_by_hand():
    p = _perm_problem()
    C = Contraction(LocalCosts(p))
    assert C.problem.num_nodes == 1 and list(C.problem.num_strategies) == [2]
    # component strategy 0: a=0, b=0, c=1 -> 1 + 2 + F + 0 + 4 + 2 ; strategy 1: a=1, b=1, c=0 -> 5+2+10+3+7+3
    assert list(C.expand(np.array([0]))) == [0, 0, 1]
    assert list(C.expand(np.array([1]))) == [1, 1, 0]
    assert C.problem.node_costs[1] == 5 + 2 + 10 + 3 + 7 + 3 == evaluate(p, [1, 1, 0]).total
    assert C.problem.node_costs[0] >= 1e18
    assert list(C.contract(np.array([1, 1, 0]))) == [1]
    assert C.contract(np.array([1, 0, 0])) is None        # breaks the a=b tie
    assert solve_large(p, 2.0) == [1, 1, 0]


def test_contraction_is_exact_on_random_tied_problems():
    rng = np.random.default_rng(3)
    for trial in range(5):
        p = random_problem(rng, 12, kmax=3, edge_p=0.3, limit_q=None, forbid_p=0.2)
        # turn some edges with k_u == k_v into random permutation ties
        k = p.num_strategies
        ec = p.edge_costs.copy()
        for e, (u, v) in enumerate(p.edges):
            if k[u] == k[v] > 1 and rng.random() < 0.6:
                M = np.full((k[u], k[v]), 1e18)
                M[np.arange(k[u]), rng.permutation(int(k[u]))] = rng.integers(0, 9, int(k[u]))
                ec[p.edge_offsets[e]:p.edge_offsets[e + 1]] = M.ravel()
        p = Problem(p.name, p.strategy_offsets, p.node_costs, p.node_usages, p.intervals, p.edges,
                    p.edge_offsets, ec)
        C = Contraction(LocalCosts(p))
        assert C.problem.num_nodes <= p.num_nodes
        for _ in range(20):
            sc = rng.integers(0, C.problem.num_strategies)
            s = C.expand(sc)
            assert evaluate(p, s).total == pytest.approx(evaluate(C.problem, sc).total, rel=1e-12)
            assert np.array_equal(C.contract(s), sc)
        # every forbidden-free original plan follows the ties, so it is some component plan
        best, bc = brute_force(p)
        if bc.total < 1e17:
            assert C.contract(np.asarray(best)) is not None


def _head(p: Problem, n: int, limit_frac: float) -> Problem:
    """The induced subproblem on nodes 0..n-1 (contest graphs list producers first), with the
    usage limit set ``limit_frac`` of the way from the lowest-usage plan's peak to the peak of
    the plan of cheapest strategies, so that memory binds."""
    offs = p.strategy_offsets[:n + 1]
    keep = np.nonzero((p.edges[:, 0] < n) & (p.edges[:, 1] < n))[0]
    lo, hi = p.edge_offsets[keep], p.edge_offsets[keep + 1]
    idx = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])
    eoffs = np.concatenate([[0], np.cumsum(hi - lo)])
    sub = Problem(f"{p.name}[:{n}]", offs, p.node_costs[:offs[-1]], p.node_usages[:offs[-1]],
                  p.intervals[:n], p.edges[keep], eoffs, p.edge_costs[idx])
    g = LocalCosts(sub)
    minu = np.asarray(least_usage_plan(sub))
    cheap = g.seg_argmin(g.cost)
    a, b = g.profile(minu).max(), g.profile(cheap).max()
    return sub.with_usage_limit(float(a + limit_frac * (b - a)))


@pytest.mark.slow
def test_solve_large_on_head_of_A_is_feasible_forbidden_free_and_improves():
    p = _head(Problem.from_iopddl(A), 6000, 0.3)
    anchor = least_usage_plan(p, avoid_forbidden=True)
    anchor_cost = evaluate(p, anchor).total
    t0 = time.perf_counter()
    plan = solve_large(p, 8.0, seed=1)
    assert time.perf_counter() - t0 < 9.0
    c = evaluate(p, plan)
    assert c.feasible and c.peak_memory_bytes <= p.usage_limit
    assert c.total < 1e15 <= anchor_cost          # the naive anchor hits forbidden entries; we do not


# ---- pruning -------------------------------------------------------------------------------------
def test_range_max_matches_slices():
    rng = np.random.default_rng(0)
    a = rng.random(37)
    lo = rng.integers(0, 37, 200)
    hi = lo + rng.integers(0, 12, 200)
    hi = np.minimum(hi, 37)
    got = range_max(a, lo, hi)
    want = [a[x:y].max() if y > x else -np.inf for x, y in zip(lo, hi)]
    assert np.array_equal(got, want)


def test_pruning_by_hand():
    """Node 0: strategy 1 uses 9 bytes; node 1 (live at the same time) needs >= 2; cap 10, so
    0/1 can never fit. Edge 1-2: column 2 of node 2 is all forbidden, so node 2 loses strategy 2.
    Node 2's strategy 0 is forbidden itself."""
    F = 1e18
    costs = [[5, 1], [1, 1], [F, 2, 0]]
    usages = [[1, 9], [2, 3], [0, 0, 0]]
    intervals = [(0, 2), (1, 3), (0, 0)]
    edges = [(1, 2)]
    ecosts = [[1, 2, F, 3, 4, F]]
    p = Problem.from_lists("prune", costs, usages, intervals, edges, ecosts, usage_limit=10)
    pr = Pruning(LocalCosts(p))
    assert pr.keep.tolist() == [True, False, True, True, False, True, False]
    assert list(pr.problem.num_strategies) == [1, 2, 1]
    assert list(pr.problem.edge_costs) == [2, 4]             # column 1 of the 2x3 matrix
    assert list(pr.to_orig(np.array([0, 1, 0]))) == [0, 1, 1]
    assert pr.from_orig(np.array([1, 0, 1])) is None
    assert solve_large(p, 2.0) == [0, 0, 1]                   # 5 + 1 + 2 + 2 = 10


def test_pruning_keeps_the_best_forbidden_free_plan():
    rng = np.random.default_rng(5)
    checked = 0
    for trial in range(30):
        p = random_problem(rng, 7, kmax=3, edge_p=0.4, limit_q=0.3, forbid_p=0.15)
        best, bc = brute_force(p)
        if bc is None or bc.total >= 1e17:
            continue
        pr = Pruning(LocalCosts(p))
        s2 = pr.from_orig(np.asarray(best))
        assert s2 is not None                                  # the optimum survives pruning
        assert evaluate(pr.problem, s2).total == pytest.approx(bc.total)
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize("seed", range(8))
def test_forest_dp_is_exact_on_a_tree(seed):
    """On a graph that is a tree every node joins the random induced forest, so one forest move
    from any plan is the optimum (the planner's polish and the contest search both use it). Edges
    point either way; the forest's leaves are solved in one batch (``moves._leaf_messages``)."""
    rng = np.random.default_rng(seed)
    n = 7
    ks = rng.integers(1, 4, size=n)
    edges = [(int(rng.integers(0, j)), j) for j in range(1, n)]          # each node hangs off an earlier one
    edges = [(v, u) if rng.random() < 0.5 else (u, v) for u, v in edges]
    p = Problem.from_lists("tree", [rng.random(k) * 10 for k in ks], [np.zeros(k) for k in ks],
                           np.zeros((n, 2), dtype=np.int64), edges,
                           [rng.random(int(ks[u] * ks[v])) * 10 for u, v in edges])
    g = LocalCosts(p)
    start = np.array([int(rng.integers(k)) for k in ks])
    out = forest_dp(g, start, g.cost, rng, np.inf)
    best = min(evaluate(p, list(s)).total for s in itertools.product(*[range(int(k)) for k in ks]))
    assert evaluate(p, list(out)).total == pytest.approx(best)


def test_refine_makes_the_all_or_nothing_move_that_polish_cannot():
    """K4 with two strategies: each node saves 1 by switching, each disagreeing edge costs 3. One,
    two or three switched nodes cost more than none (+8, +10, +6), all four save 4. The polish's
    moves (single nodes, edge pairs, induced forests: at most 2 nodes of a K4) stall at all-zero;
    refine's MILP neighbourhood covers the graph and finds all-one (cost 4 -> 0)."""
    edges = [(u, v) for u in range(4) for v in range(u + 1, 4)]
    p = Problem.from_lists("k4", [np.array([1.0, 0.0])] * 4, [np.zeros(2)] * 4,
                           np.zeros((4, 2), dtype=np.int64), edges, [np.array([0.0, 3.0, 3.0, 0.0])] * 6)
    start = [0, 0, 0, 0]
    assert evaluate(p, start).total == 4.0
    assert list(polish(p, start, time_limit_s=2.0)) == start
    out = refine(p, start, 2.0)
    assert list(out) == [1, 1, 1, 1] and evaluate(p, list(out)).total == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_whole_milp_reaches_the_optimum_and_never_returns_worse(seed):
    """The planners' whole-graph MILP (used when the cap does not bind): from the lowest-usage plan
    of a small random problem it returns the brute-force optimum; a zero time limit and a graph over
    WHOLE_MILP_MAX_NODES return the seed unchanged; the K4 all-or-nothing move is made."""
    from solvers.local.lns import whole_milp
    p = random_problem(np.random.default_rng(300 + seed), 8, kmax=3, edge_p=0.6, limit_q=None)
    start = np.asarray(least_usage_plan(p))
    out = whole_milp(p, start, 5.0)
    _, best = brute_force(p)
    assert evaluate(p, list(out)).total == pytest.approx(best.total)
    assert list(whole_milp(p, start, 0.0)) == list(start)
    edges = [(u, v) for u in range(4) for v in range(u + 1, 4)]
    k4 = Problem.from_lists("k4", [np.array([1.0, 0.0])] * 4, [np.zeros(2)] * 4,
                            np.zeros((4, 2), dtype=np.int64), edges, [np.array([0.0, 3.0, 3.0, 0.0])] * 6)
    assert list(whole_milp(k4, [0, 0, 0, 0], 5.0)) == [1, 1, 1, 1]
    import solvers.local.lns as lns_mod
    old = lns_mod.WHOLE_MILP_MAX_NODES
    try:
        lns_mod.WHOLE_MILP_MAX_NODES = 3
        assert list(whole_milp(k4, [0, 0, 0, 0], 5.0)) == [0, 0, 0, 0]
    finally:
        lns_mod.WHOLE_MILP_MAX_NODES = old


@pytest.mark.parametrize("seed", range(4))
def test_refine_never_worse_stays_feasible_and_is_exact_on_small_graphs(seed):
    """Under a memory limit, from the lowest-usage plan: refine's result fits the limit, is no
    worse than its start, and (the 10-node graph lies inside one 60-node neighbourhood when it is
    connected) equals the brute-force optimum then."""
    p = random_problem(np.random.default_rng(100 + seed), 8, kmax=3, edge_p=0.6, limit_q=0.4)
    g = LocalCosts(p)
    start = np.asarray(least_usage_plan(p))
    assert evaluate(p, list(start)).feasible
    out = refine(p, start, 1.5, seed=seed)
    c = evaluate(p, list(out))
    assert c.feasible and c.total <= evaluate(p, list(start)).total
    _, best = brute_force(p)
    free = np.nonzero(g.k > 1)[0]
    if len(free) and len(g.adj) and _connected(g, free):
        assert c.total == pytest.approx(best.total)
    low = evaluate(p, list(start)).peak_memory_bytes
    if low > 0:
        with pytest.raises(ValueError, match="fits the memory limit"):
            refine(p.with_usage_limit(low - 1), start, 0.1)


def _connected(g: LocalCosts, nodes) -> bool:
    """Whether ``nodes`` are reachable from one another through nodes with a choice (as _bfs walks)."""
    seen = {int(nodes[0])}
    stack = [int(nodes[0])]
    while stack:
        i = stack.pop()
        for j in g.adj[g.adj_ptr[i]:g.adj_ptr[i + 1]].tolist():
            if j not in seen and g.k[j] > 1:
                seen.add(j)
                stack.append(j)
    return set(int(x) for x in nodes) <= seen

