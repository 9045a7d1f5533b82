"""The planner's capped search as the capped core's phase on graphs with copy groups too big for its MILP
(``solvers.capped_phases.planner_search``, ``CappedConfig.big_planner_share``; on in ``solvers.dispatch.TRACED``).
"Too big" is forced by ``milp_nodes=0`` on tiny random problems with copies, checked against brute force."""
from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest

from costmodel.problem import evaluate
from solvers import capped, capped_phases
from solvers.local import least_usage_plan

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force  # noqa: E402
from test_uncapped_beside import _case  # noqa: E402

BIG = capped.CappedConfig(milp_nodes=0, second_search=False, cfn_min_s=1e9, bp_big_share=0.2, big_planner_share=0.9)


@pytest.mark.parametrize("seed", range(6))
def test_planner_search_offers_a_fitting_plan_no_dearer_than_its_start_and_a_valid_bound(seed):
    p, _ = _case(seed, binds=True)
    if p is None:
        pytest.skip("no cap between the least and the uncapped optimum's peak here")
    start = least_usage_plan(p)
    if not evaluate(p, start).feasible:
        pytest.skip("the least-usage plan breaks the cap (its copies)")
    _, oc = brute_force(p, "time", cap=p.usage_limit)
    offered, log = [], []
    lb = capped_phases.planner_search(p, start, 5.0, lambda x, tag: offered.append((x, tag)), log.append)
    assert [t for _, t in offered] == ["planner search"] and log and log[0].startswith("planner search:")
    c = evaluate(p, offered[0][0])
    assert c.feasible and oc.total * (1 - 1e-9) <= c.total <= evaluate(p, start).total * (1 + 1e-12)
    assert lb <= oc.total * (1 + 1e-9)


@pytest.mark.parametrize("share", [0.0, 0.9])
def test_the_core_runs_it_on_big_graphs_with_copies_only_when_its_share_is_set(share):
    for seed in range(8):
        p, _ = _case(seed, binds=True)
        if p is not None:
            break
    _, oc = brute_force(p, "time", cap=p.usage_limit)
    log = []
    r = capped.solve_capped(p, 6.0, progress=log.append, config=replace(BIG, big_planner_share=share))
    assert any(m.startswith("planner search:") for m in log) == (share > 0), log
    assert r.plan is not None and evaluate(p, r.plan).feasible
    assert oc.total * (1 - 1e-9) <= r.cost and r.bound <= oc.total * (1 + 1e-9)
