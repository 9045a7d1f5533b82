"""The toulbar2 cost-function-network solver with adaptive memory prices (solvers/cfn.py)."""
from __future__ import annotations

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers.cfn import available, cfn_solve
from tests.ilp_helpers import brute_force, random_problem


def test_pytoulbar2_is_installed():
    """A dependency (pyproject.toml): without it the capped core silently loses toulbar2."""
    assert available()


@pytest.mark.parametrize("seed,integer,forbid", [(0, True, 0.0), (1, False, 0.0), (2, True, 0.15), (3, False, 0.1)])
def test_cfn_is_exact_without_a_limit(seed, integer, forbid):
    """No memory limit: one toulbar2 round is exact branch and bound, so the plan is the
    brute-force optimum, and the bound meets it (non-integer costs go through the scaled, rounded-down
    integer model: the bound stays below the optimum and within 1e-6 of it)."""
    rng = np.random.default_rng(300 + seed)
    p = random_problem(rng, 8, kmax=3, edge_p=0.5, limit_q=None, integer=integer, forbid_p=forbid)
    _, bc = brute_force(p)
    r = cfn_solve(p, 5.0, max_rounds=3)
    assert r.plan is not None and r.cost == pytest.approx(evaluate(p, r.plan).total)
    assert r.cost == pytest.approx(bc.total, rel=1e-9)
    if bc.total < 1e17:
        assert bc.total - 1e-6 * abs(bc.total) <= r.lower_bound <= bc.total + 1e-9 * abs(bc.total)


@pytest.mark.parametrize("seed", range(6))
def test_cfn_plan_fits_and_bound_is_valid_under_a_binding_limit(seed):
    """A binding limit: every plan returned fits, is never worse than the start it was given, and
    the Lagrangian bound never exceeds the brute-force optimum."""
    rng = np.random.default_rng(400 + seed)
    p = random_problem(rng, 8, kmax=3, edge_p=0.5, limit_q=0.3, integer=seed % 2 == 0,
                       forbid_p=0.1 if seed % 3 == 0 else 0.0)
    _, bc = brute_force(p)
    least = [int(np.argmin(p.node_usages[p.node_slice(i)])) for i in range(p.num_nodes)]
    r = cfn_solve(p, 5.0, starts=[least], max_rounds=25)
    c = evaluate(p, r.plan)
    assert c.feasible and c.peak_memory_bytes <= p.usage_limit
    assert c.total <= evaluate(p, least).total + 1e-9
    assert r.cost >= bc.total - 1e-9
    assert r.lower_bound <= bc.total + 1e-6 * max(1.0, abs(bc.total))
    if bc.total < 1e17 and r.cost < 1e17:   # never below the unpriced floor (each node and edge at its minimum)
        floor = sum(float(p.node_costs[p.node_slice(i)].min()) for i in range(p.num_nodes)) + \
            sum(float(p.edge_matrix(e).min()) for e in range(p.num_edges))
        assert r.lower_bound >= floor - 1e-6 * max(1.0, abs(floor))
