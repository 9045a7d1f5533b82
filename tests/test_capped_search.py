"""The planners' capped search (``solvers.local.budgeted.capped_search``): budgeted in work units, so the
same problem gives the same plan; never worse than the plan it is seeded with; fits the cap; the
uncapped optimum returned at once when it fits; both kinds of Lagrangian rounds (HiGHS, BP)."""
from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers.local import budgeted as lns_mod
from solvers.local import least_usage_plan

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402
from test_edge_memory import _with_random_copies  # noqa: E402

SMALL = dataclasses.replace(lns_mod.CAPPED_BUDGET, rounds=6, neighbourhoods=2)
BP_ROUNDS = dataclasses.replace(SMALL, highs_max_nodes=0)   # bp_relaxed rounds even on a small graph


def _capped(seed: int, copies: bool):
    rng = np.random.default_rng(1600 + seed)
    p = random_problem(rng, 9, kmax=3, edge_p=0.5, limit_q=None)
    if copies:
        p = _with_random_copies(rng, p)
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(12)]
    cap = max(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[4], 0.5)
    return p.with_usage_limit(cap)


@pytest.mark.parametrize("budget", [SMALL, BP_ROUNDS], ids=["highs-rounds", "bp-rounds"])
@pytest.mark.parametrize("seed,copies", [(0, False), (1, True), (2, True)])
def test_capped_search_is_deterministic_fits_and_never_worse_than_its_seed(seed, copies, budget):
    p = _capped(seed, copies)
    start = least_usage_plan(p)
    if not evaluate(p, start).feasible:
        pytest.skip("the least-usage plan breaks the cap (its copies)")
    best, bc = brute_force(p, "time")
    a, info = lns_mod.capped_search(p, start, budget, return_info=True)
    b = lns_mod.capped_search(p, start, budget)
    assert a == b                                   # no wall-clock budget shapes the answer
    ca = evaluate(p, a)
    assert ca.feasible and ca.total <= evaluate(p, start).total * (1 + 1e-12)
    assert ca.total >= bc.total * (1 - 1e-9)
    if info["phase"] != "uncapped optimum":
        assert info["rounds"] <= budget.rounds


def test_capped_search_seeded_with_the_optimum_keeps_it():
    p = _capped(3, True)
    best, bc = brute_force(p, "time")
    out = lns_mod.capped_search(p, best, SMALL)
    assert evaluate(p, out).total == pytest.approx(bc.total)


def test_capped_search_returns_the_uncapped_optimum_when_it_fits(monkeypatch):
    p = random_problem(np.random.default_rng(1650), 8, kmax=3, edge_p=0.6, limit_q=None)
    best, bc = brute_force(p)
    p = p.with_usage_limit(bc.peak_memory_bytes * 1.5)

    def boom(*a, **k):
        raise AssertionError("searched past a fitting uncapped optimum")
    monkeypatch.setattr(lns_mod, "lagrangian_bound", boom)
    out, info = lns_mod.capped_search(p, least_usage_plan(p), SMALL, return_info=True)
    assert info["phase"] == "uncapped optimum" and evaluate(p, out).total == pytest.approx(bc.total)


def test_capped_search_returns_a_start_that_meets_a_lower_bound_at_once(monkeypatch):
    """A start that fits and costs what a lower bound says (the uncapped optimum's, whose own plan does not fit;
    or the Lagrangian's) is optimal: returned at once, phase "at the bound", no rounds / polish / refine (session 28:
    outside:mixer cpu-2x4 capped, whose decode costs the uncapped optimum, took 4.0 s of polish and refine)."""
    p = _capped(3, True)
    best, bc = brute_force(p, "time")
    rng = np.random.default_rng(7)
    over = next(s for s in ([int(rng.integers(k)) for k in p.num_strategies] for _ in range(500))
                if not evaluate(p, s).feasible)
    info_free = type("I", (), {"status": "optimal", "bound": bc.total})()
    monkeypatch.setattr(lns_mod, "solve_ilp", lambda *a, **k: (list(over), info_free))   # an uncapped optimum over the cap

    def boom(*a, **k):
        raise AssertionError("searched past a start at the bound")
    for name in ("lagrangian_bound", "rounds_tail"):
        monkeypatch.setattr(lns_mod, name, boom)
    out, info = lns_mod.capped_search(p, best, SMALL, return_info=True)
    assert info["phase"] == "at the bound" and info["bound"] == bc.total and list(out) == [int(x) for x in best]
    # the same through the Lagrangian's bound (no uncapped optimum in time)
    monkeypatch.setattr(lns_mod, "solve_ilp", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no plan in time")))
    monkeypatch.setattr(lns_mod, "lagrangian_bound", lambda *a, **k: type("R", (), {"rounds": 2, "bound": bc.total,
                                                                                   "plans": []})())
    out, info = lns_mod.capped_search(p, best, SMALL, return_info=True)
    assert info["phase"] == "at the bound" and info["rounds"] == 2 and list(out) == [int(x) for x in best]


def test_lagrangian_rounds_stop_at_max_rounds():
    from solvers.lagrange import bp_relaxed, lagrangian_bound
    p = _capped(4, True)
    start = least_usage_plan(p)
    opt = brute_force(p, "time")[1].total
    for solver in (None, bp_relaxed()):
        r = lagrangian_bound(p, 30.0, upper=evaluate(p, start).total * 10, ref=start, max_rounds=3,
                             round_nodes=50, relaxed_solver=solver)
        assert r.rounds <= 3 and len(r.plans) == r.rounds
        assert r.bound <= opt + 1e-6 * abs(opt)     # BP's tree bound is valid too


def test_capped_search_past_its_time_limit_skips_the_phases_left():
    """``safety_s`` is a caller's time limit too (``solve(method="policy", time_limit_s=...)``): past it, the
    union MILP, polish and refine are not started, and the seed (fitting) comes back, marked stopped."""
    for seed in range(8):
        p = _capped(seed, False)
        start = least_usage_plan(p)
        free = lns_mod.solve_ilp(p.with_usage_limit(None))[0]
        if evaluate(p, start).feasible and not evaluate(p, free).feasible:
            break
    else:
        pytest.skip("no binding cap among the seeds")
    ran = []
    real_polish = lns_mod.polish
    lns_mod.polish = lambda *a, **k: ran.append("polish") or real_polish(*a, **k)
    try:
        out, info = lns_mod.capped_search(p, start, dataclasses.replace(SMALL, safety_s=0.0), return_info=True)
        full, finfo = lns_mod.capped_search(p, start, SMALL, return_info=True)
    finally:
        lns_mod.polish = real_polish
    assert info["stopped"] == "time limit" and info["rounds"] == 0 and "union" not in info and "polish" not in info
    assert ran == ["polish"]                         # only the unlimited search polished
    assert "stopped" not in finfo and "polish" in finfo
    assert evaluate(p, out).feasible and evaluate(p, out).total <= evaluate(p, start).total * (1 + 1e-12)


def test_lagrangian_rounds_stop_once_a_round_repeats_a_plan_without_raising_L():
    """``repeat_stop=1`` (the planner's ``CappedBudget``, session 27): the rounds are those of the
    unrestricted run up to the first one whose plan repeats an earlier round's and whose L is not above
    the best before it (read from the unrestricted run's log), then stop; on this problem that is round 5
    of 16 (plans 1-4 new)."""
    import re

    from env.workloads import random_problem as env_random_problem
    from solvers.bp import bp_solve
    from solvers.lagrange import lagrangian_bound
    p = env_random_problem(np.random.default_rng(0), 80, 4, memory_cap_fraction=0.3)
    start = [int(v) for v in bp_solve(p, rounds=30, memory_prices=True).plan]
    kw = dict(upper=evaluate(p, start).total, ref=start, max_rounds=16, round_nodes=200)
    log = []
    full = lagrangian_bound(p, 60.0, progress=log.append, **kw)
    Ls = [float(m["L"]) for m in (re.match(r"lagrange\[\d+\]: L=(?P<L>\S+) ", s) for s in log) if m]
    assert full.rounds == 16 and len(Ls) == 16
    plans = [tuple(x) for x in full.plans]
    stop = next(i for i in range(1, 16) if plans[i] in plans[:i] and Ls[i] <= max(Ls[:i]))
    assert stop == 4
    r = lagrangian_bound(p, 60.0, repeat_stop=1, **kw)
    assert r.rounds == stop + 1 and r.plans == full.plans[:stop + 1]


def test_capped_search_mid_size_takes_the_union_of_the_uncapped_optimum_and_the_start():
    """Above ``lagrange_max_nodes`` (2,000 nodes shipped; 10 here) with the uncapped optimum in hand,
    ``capped_search`` runs no Lagrangian round: the union MILP over the uncapped optimum and the start
    (root only), and returns it (no polish or refine there). Its plan fits, is the union's and here is
    cheaper than the start."""
    from env.workloads import random_problem as env_random_problem
    from solvers.bp import bp_solve
    from solvers.ilp import IlpConfig, solve_ilp
    from solvers.lagrange import union_plan
    p = env_random_problem(np.random.default_rng(0), 80, 4, memory_cap_fraction=0.3)
    start = [int(v) for v in bp_solve(p, rounds=30, memory_prices=True).plan]
    b = dataclasses.replace(lns_mod.CAPPED_BUDGET, lagrange_max_nodes=10)
    x, info = lns_mod.capped_search(p, start, b, return_info=True)
    free, _ = solve_ilp(p.with_usage_limit(None), time_limit_s=60, initial_plan=start, config=IlpConfig.node_limited(200))
    assert not evaluate(p, free).feasible                # the cap binds
    u = evaluate(p, union_plan(p, [free, start], 60, start=start, max_nodes=0))
    c = evaluate(p, x)
    assert info["rounds"] == 0 and info["phase"] == "free union" and info["free union"] == pytest.approx(u.total, rel=1e-12)
    assert c.feasible and c.total == pytest.approx(u.total, rel=1e-12) and c.total < evaluate(p, start).total * (1 - 1e-6)


def test_capped_search_stops_repeating_bp_rounds_only():
    """``CappedBudget.repeat_stop`` applies to ``bp_relaxed`` rounds alone: HiGHS rounds run all 16 (on
    outside:rnn they repeat plans early, before L rises, and stopping there lost 1.136x -> 1.000x);
    BP rounds on the same problem stop at round 4 with the same plan as 16 rounds give."""
    from env.workloads import random_problem as env_random_problem
    from solvers.bp import bp_solve
    p = env_random_problem(np.random.default_rng(0), 80, 4, memory_cap_fraction=0.3)
    start = [int(v) for v in bp_solve(p, rounds=30, memory_prices=True).plan]
    _, highs = lns_mod.capped_search(p, start, return_info=True)
    assert highs["rounds"] == 16
    bp = dataclasses.replace(lns_mod.CAPPED_BUDGET, highs_max_nodes=0)
    x, info = lns_mod.capped_search(p, start, bp, return_info=True)
    y, full = lns_mod.capped_search(p, start, dataclasses.replace(bp, repeat_stop=None), return_info=True)
    assert info["rounds"] == 4 and full["rounds"] == 16
    assert evaluate(p, x).total == pytest.approx(evaluate(p, y).total, rel=1e-12)


def test_capped_search_mid_size_goes_on_to_the_rounds_when_that_union_gains_nothing():
    """Step 2b returns at once only when its union is cheaper than the start. Started from step 2b's own answer
    (the union of the uncapped optimum and it can only give it back), the rounds run, and here find a
    cheaper plan (vit base @ h100-2x8 0.79 GB: the union kept the decode, 0.017744; the rounds 0.0157)."""
    from env.workloads import random_problem as env_random_problem
    from solvers.bp import bp_solve
    p = env_random_problem(np.random.default_rng(0), 80, 4, memory_cap_fraction=0.3)
    start = [int(v) for v in bp_solve(p, rounds=30, memory_prices=True).plan]
    b = dataclasses.replace(lns_mod.CAPPED_BUDGET, lagrange_max_nodes=10)
    x, info = lns_mod.capped_search(p, start, b, return_info=True)
    assert info["phase"] == "free union" and info["rounds"] == 0
    y, again = lns_mod.capped_search(p, x, b, return_info=True)
    assert again["free union"] == pytest.approx(evaluate(p, x).total, rel=1e-12)      # no gain there
    assert again["phase"] == "search" and again["rounds"] > 0
    assert evaluate(p, y).feasible and evaluate(p, y).total < evaluate(p, x).total * (1 - 1e-6)
