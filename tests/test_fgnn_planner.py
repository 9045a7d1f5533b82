"""The factor-graph planner's fast paths (agent/fgnn_planner.py, agent/planner.py, solvers/local/lns.py):
a zero-correction network plans through numpy BP exactly as through its jitted forward, a plan that
meets BP's lower bound gets no search, a checkpoint loads once per process, and the whole-graph MILP
returns a proven optimum before any polish."""
from __future__ import annotations

import numpy as np
import pytest

from agent.fgnn import FGNN, FGConfig
from agent.fgnn_planner import FGPlanner
from costmodel.problem import evaluate
from solvers import bp
from tests.ilp_helpers import brute_force, random_problem
from tests.test_bp import _tree

ROUNDS = 8


@pytest.fixture(scope="module")
def planner():
    net = FGNN(FGConfig(rounds=ROUNDS, hidden=8))
    return FGPlanner(net.params, net.config.to_dict(), source="test")


@pytest.mark.parametrize("seed", range(3))
def test_zero_corrections_plan_through_numpy_bp_as_through_the_network(planner, seed):
    """The raw decode of an untrained network (no live correction: the numpy path) is the jitted
    forward's plan (or one of the same cost where float32 rounding breaks a tie), capped and not."""
    for q in (None, 0.35):
        p = random_problem(np.random.default_rng(700 + seed), 9, kmax=4, edge_p=0.5, limit_q=q)
        x = planner.plan(p, polish=False)
        y = planner.net.plan(p)
        assert x == y or evaluate(p, x).total == pytest.approx(evaluate(p, y).total, rel=1e-9)
        assert x == bp.bp_plan(p, rounds=ROUNDS, memory_prices=True)


def test_a_learned_damping_alone_plans_through_the_network(planner, monkeypatch):
    """Damping is no ``live_parts`` correction, but a trained one is not BP's 0.5: the raw decode
    of parameters whose only change is ``damp`` runs the network (agent/fgnn_es.py trains it), not
    numpy BP."""
    import agent.fgnn_planner as fp
    p = random_problem(np.random.default_rng(710), 9, kmax=4, edge_p=0.5, limit_q=0.35)
    params = {**planner.params, "damp": np.full(ROUNDS, 1.5, np.float32)}
    monkeypatch.setattr(fp, "bp_solve", lambda *a, **k: pytest.fail("numpy BP ignored the learned damping"))
    assert planner.plan(p, polish=False, params=params) == planner.net.plan(p, params=params)


@pytest.mark.parametrize("seed", range(2))
def test_a_plan_at_bp_bound_gets_no_search(seed, monkeypatch):
    """On a tree BP's bound is exact (60 rounds, the shipped count): the raw plan is reported
    proven and improve never runs."""
    import agent.fgnn_planner as fp
    net = FGNN(FGConfig(rounds=60, hidden=8))
    planner = FGPlanner(net.params, net.config.to_dict(), source="test")
    p = _tree(seed, 9)

    def boom(*a, **k):
        raise AssertionError("improve ran on a proven optimum")
    monkeypatch.setattr(fp, "improve", boom)
    x, info = planner.plan(p, return_info=True)
    assert info["proven"] and evaluate(p, x).total == pytest.approx(brute_force(p)[1].total)


def test_planner_load_is_cached_and_independent(monkeypatch):
    """A second load of the shipped network reads nothing again (no ``from_state``) and gives a
    separate planner on the same values: replacing one's parameters leaves the other's alone."""
    import jax

    from agent.planner import Planner
    a = Planner.load("fgnn")

    def boom(*a, **k):
        raise AssertionError("the checkpoint was loaded again")
    monkeypatch.setattr(FGPlanner, "from_state", boom)
    b = Planner.load("fgnn")
    assert a is not b
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
    g0 = float(np.abs(a.params["gate"]).max())
    a.net.params = FGNN.zero_corrections(a.params)
    assert float(np.abs(a.params["gate"]).max()) == 0.0
    assert float(np.abs(b.params["gate"]).max()) == g0 == float(np.abs(Planner.load("fgnn").params["gate"]).max())


@pytest.mark.parametrize("seed", range(2))
def test_improve_returns_the_proven_whole_milp_optimum(seed, monkeypatch):
    """With a whole-graph MILP budget, improve runs the MILP first; when it proves its plan optimal
    that plan (the brute-force optimum) is returned without polish."""
    import solvers.local.lns as lns_mod
    from solvers.local import least_usage_plan
    p = random_problem(np.random.default_rng(800 + seed), 8, kmax=3, edge_p=0.6, limit_q=None)

    def boom(*a, **k):
        raise AssertionError("polish ran after a proven optimum")
    monkeypatch.setattr(lns_mod, "polish", boom)
    out = lns_mod.improve(p, least_usage_plan(p), whole_time_limit_s=5.0)
    assert evaluate(p, out).total == pytest.approx(brute_force(p)[1].total)
    plan, proven = lns_mod.whole_milp(p, least_usage_plan(p), 5.0, return_status=True)
    assert proven and evaluate(p, list(plan)).total == pytest.approx(brute_force(p)[1].total)
    assert 2.0 <= lns_mod.whole_milp_time_limit(p) <= lns_mod.WHOLE_MILP_MAX_S


@pytest.mark.parametrize("seed", range(4))
def test_lagrange_starts_fit_never_worse_and_bound_below_the_optimum(seed):
    """Under a binding cap, the Lagrangian starts fit the cap, never cost more than the fitting
    start, and their bound is at most the brute-force optimum; improve with them fits too."""
    import solvers.local.lns as lns_mod
    from solvers.local import least_usage_plan
    p = random_problem(np.random.default_rng(900 + seed), 8, kmax=3, edge_p=0.5, limit_q=0.3)
    start = least_usage_plan(p)
    assert evaluate(p, start).feasible
    plan, lb = lns_mod.lagrange_starts(p, start, 4.0)
    c = evaluate(p, list(plan))
    opt = brute_force(p)[1].total
    assert c.feasible and c.total <= evaluate(p, start).total
    assert lb <= opt + 1e-9 * abs(opt)
    out = lns_mod.improve(p, start, lagrange_time_limit_s=4.0)
    assert evaluate(p, out).feasible and evaluate(p, out).total <= evaluate(p, start).total


@pytest.mark.parametrize("seed", range(2))
def test_lagrange_starts_return_the_uncapped_optimum_when_it_fits(seed, monkeypatch):
    """A cap the uncapped optimum fits: the first relaxed plan (λ = 0) is the optimum, its bound
    equals its cost, and improve returns it without polish."""
    import solvers.local.lns as lns_mod
    from solvers.local import least_usage_plan
    p = random_problem(np.random.default_rng(950 + seed), 8, kmax=3, edge_p=0.6, limit_q=None)
    best, bc = brute_force(p)
    p = p.with_usage_limit(bc.peak_memory_bytes * 1.5)
    plan, lb = lns_mod.lagrange_starts(p, least_usage_plan(p), 4.0)
    assert evaluate(p, list(plan)).total == pytest.approx(bc.total)
    assert lb == pytest.approx(bc.total)
    assert lns_mod.lagrange_time_limit(p) == lns_mod.LAGRANGE_MIN_S   # 8 nodes: the floor

    def boom(*a, **k):
        raise AssertionError("polish ran after a proven optimum")
    monkeypatch.setattr(lns_mod, "polish", boom)
    assert evaluate(p, lns_mod.improve(p, least_usage_plan(p), lagrange_time_limit_s=4.0)).total == pytest.approx(bc.total)


def test_above_the_numpy_size_capped_problems_with_copies_plan_through_numpy_bp(planner, monkeypatch):
    """Above ``NUMPY_BP_MAX_NODES`` (set to 0 here) a zero-correction network plans through numpy BP where the
    problem has copy groups under a limit (session 28, gpt 7b), and through its jitted forward otherwise; the
    plans are the same either way."""
    from dataclasses import replace

    import agent.fgnn_planner as fp
    from tests.test_edge_memory import _with_random_copies
    rng = np.random.default_rng(720)
    free = _with_random_copies(rng, random_problem(rng, 9, kmax=4, edge_p=0.5, limit_q=None))
    peaks = sorted(evaluate(free, [int(rng.integers(k)) for k in free.num_strategies]).peak_memory_bytes for _ in range(9))
    capped = replace(free, usage_limit=float(peaks[4]))
    monkeypatch.setattr(fp, "NUMPY_BP_MAX_NODES", 0)
    jitted, numpy_bp = [], []
    monkeypatch.setattr(planner.net, "plan", lambda p, params=None: jitted.append(p) or FGNN.plan(planner.net, p, params=params))
    solve = fp.bp_solve
    monkeypatch.setattr(fp, "bp_solve", lambda p, **kw: numpy_bp.append(p) or solve(p, **kw))
    x = planner.plan(capped, polish=False)
    assert len(numpy_bp) == 1 and not jitted
    assert x == FGNN.plan(planner.net, capped)
    planner.plan(free, polish=False)
    planner.plan(replace(capped, edge_memory=None), polish=False)
    assert len(numpy_bp) == 1 and len(jitted) == 2
