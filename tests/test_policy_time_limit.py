"""``solve(method="policy", time_limit_s=...)`` honours the limit (it used to be dropped: the planner's
capped search ran 114-201 s on fno tiny @ cpu-2x4 under a 60-s default). The limit reaches the capped
search as its ``safety_s`` and BP as its ``time_limit_s``; ``time_limit_s=None`` keeps the unlimited search."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import shardgym as sg
from agent import fgnn_planner
from costmodel.problem import evaluate
from solvers.local import least_usage_plan

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import random_problem  # noqa: E402


def _binding():
    rng = np.random.default_rng(2701)
    p = random_problem(rng, 14, kmax=3, edge_p=0.4, limit_q=None)
    lo = evaluate(p, least_usage_plan(p)).peak_memory_bytes
    free = evaluate(p, sg.solve(p, method="ilp")).peak_memory_bytes
    assert lo < free                                 # a cap between them binds
    return p, lo + 0.3 * (free - lo)


@pytest.mark.parametrize("limit", [7.5, None])
def test_the_policy_passes_its_time_limit_to_the_capped_search_and_to_bp(monkeypatch, limit):
    p, cap = _binding()
    seen = {}
    real_search, real_bp = fgnn_planner.capped_search, fgnn_planner.bp_solve

    def search(problem, plan, budget, **kw):
        seen["safety_s"] = budget.safety_s
        return real_search(problem, plan, budget, **kw)

    def bp(problem, **kw):
        seen["bp_limit"] = kw.get("time_limit_s")
        return real_bp(problem, **kw)
    monkeypatch.setattr(fgnn_planner, "capped_search", search)
    monkeypatch.setattr(fgnn_planner, "bp_solve", bp)
    plan = sg.solve(p, method="policy", memory_cap_bytes=cap, time_limit_s=limit)
    assert evaluate(p.with_usage_limit(cap), plan).feasible
    assert plan.info["time_limit_s"] == limit
    if limit is None:
        assert seen == {"safety_s": fgnn_planner.CAPPED_BUDGET.safety_s, "bp_limit": None}
    else:
        assert 0 < seen["bp_limit"] <= limit and 0 < seen["safety_s"] <= limit
        assert seen["safety_s"] <= seen["bp_limit"]   # what BP left


def test_a_spent_time_limit_still_answers_a_fitting_plan():
    """At a limit already spent, the planner answers its raw decode, repaired to fit (no search)."""
    p, cap = _binding()
    plan = sg.solve(p, method="policy", memory_cap_bytes=cap, time_limit_s=1e-9)
    assert evaluate(p.with_usage_limit(cap), plan).feasible


@pytest.mark.parametrize("seed", range(3))
def test_a_policy_plan_it_proved_optimal_says_so(seed):
    """The default search's proofs (the whole MILP's, BP's bound met, the uncapped optimum fitting) reach
    ``plan.info``: status "optimal", gap 0, bound = the cost, and that cost is the ILP's; the raw decode
    proves nothing ("heuristic")."""
    p = random_problem(np.random.default_rng(2710 + seed), 12, kmax=3, edge_p=0.4, limit_q=None)
    plan = sg.solve(p, method="policy")
    opt = evaluate(p, sg.solve(p, method="ilp")).total
    assert plan.info["status"] == "optimal" and plan.info["gap"] == 0.0
    assert plan.info["bound"] == pytest.approx(evaluate(p, plan).total) == pytest.approx(opt, rel=1e-9)
    raw = sg.solve(p, method="policy", search=False)
    assert raw.info["status"] == "heuristic" and raw.info["gap"] is None
