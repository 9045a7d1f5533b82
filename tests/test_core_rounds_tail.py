"""The capped core runs the planner's tail (``solvers.local.budgeted.rounds_tail``: repair the relaxed plans, the union
MILP over those nearest the cap, polish, LNS) on its own Lagrangian rounds' plans by default (``CappedConfig.rounds_tail``,
on since session 28), and keeps its plan. Why on: bench_capped ``--compare rounds_tail=1`` over 19 cells of gpt / vit /
fno / meshgraphnet tiny on cpu-2x4 and h100-2x8 (results/s27a_rounds_tail_ab.json, s27_rounds_tail_ab_h100.json):
cheaper in 4 (vit tiny cpu-2x4 50 % 1.131 -> 0.996 of the policy's plan), equal in 14, dearer in 1."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers import capped
from tests.ilp_helpers import brute_force, random_problem
from tests.test_edge_memory import _with_random_copies


@pytest.mark.parametrize("on", [True, False])
def test_the_core_runs_the_planners_tail_on_its_rounds(monkeypatch, on):
    rng = np.random.default_rng(2028)
    p = _with_random_copies(rng, random_problem(rng, 7, kmax=3, edge_p=0.5, limit_q=None))
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
    p = p.with_usage_limit(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[4])
    best, bc = brute_force(p, "time")
    fits = [s for s in plans if evaluate(p, s).feasible]
    worst = max(fits, key=lambda s: evaluate(p, s).total)
    assert evaluate(p, worst).total > bc.total * (1 + 1e-6)
    seen = []

    def tail(problem, round_plans, start, deadline=None, **k):
        seen.append((len(round_plans), list(start)))
        return list(best)
    # a core whose other phases keep their start (the worst plan that fits), so only the tail can find the optimum
    monkeypatch.setattr(capped, "rounds_tail", tail)
    monkeypatch.setattr(capped, "fitting_least_usage_plan", lambda *a, **k: list(worst))
    monkeypatch.setattr(capped, "bp_solve", lambda *a, **k: SimpleNamespace(plan=None, lower_bound=-np.inf, rounds=0))
    monkeypatch.setattr(capped, "cfn_available", lambda: False)
    monkeypatch.setattr(capped, "solve_large", lambda problem, t, starts=(), **k: starts[0])
    monkeypatch.setattr(capped, "lagrangian_bound", lambda problem, t, **k: SimpleNamespace(
        bound=-np.inf, rounds=3, plans=[list(s) for s in plans[:3]]))
    monkeypatch.setattr(capped, "union_plan", lambda problem, ps, t, start, threads: start)
    monkeypatch.setattr(capped, "capped_milp", lambda *a, **k: None)
    monkeypatch.setattr(capped, "refine", lambda problem, plan, *a, **k: plan)
    config = capped.CappedConfig() if on else capped.CappedConfig(rounds_tail=False)
    r = capped.solve_capped(p, 12.0, config=config)
    assert evaluate(p, r.plan).feasible
    if on:
        assert seen == [(3, [int(x) for x in worst])]
        assert r.source == "rounds tail" and r.cost == pytest.approx(bc.total)
    else:
        assert not seen and r.cost == pytest.approx(evaluate(p, worst).total)
