"""Copy prices on the edges (solvers/bp_copies.py) in Lagrangian BP (solvers/bp.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers import bp
from solvers.bp_copies import copy_prices
from solvers.local import LocalCosts
from tests.ilp_helpers import brute_force, random_problem
from tests.test_edge_memory import _problem, _with_random_copies


def test_copy_prices_sit_on_the_entries_that_make_the_copy():
    """Producer 0 in A and a consumer in B make the 10-byte copy (made early: live from step 0 to the
    member's step + 1): only entry (A, B) of each edge is priced, at bytes × Σλ over that span."""
    g = LocalCosts(_problem(usage_limit=8.0))
    cp = copy_prices(g)
    assert not cp(np.zeros(len(g.times))).any()
    lam = np.ones(len(g.times))
    priced = cp(lam).reshape(len(g.eu), 2, 2)
    assert (priced[:, 0, 1] > 0).all() and not priced[:, [0, 1, 1], [0, 0, 1]].any()
    for e, v in enumerate(g.ev.tolist()):     # the consumer's step s: span [0, s + 1) on the grid
        assert priced[e, 0, 1] == pytest.approx(10.0 * np.searchsorted(g.times, g.p.intervals[v][0] + 1))


def test_priced_copies_find_the_optimum_where_the_copy_cannot_fit():
    """Limit 8: the fastest plan's copy (10 bytes) cannot fit; the optimum reads A everywhere (cost 3)."""
    p = _problem(usage_limit=8.0)
    r = bp.bp_solve(p)
    cost = brute_force(p)[1].total
    assert evaluate(p, r.plan).feasible and r.cost == pytest.approx(cost) and r.lower_bound <= cost + 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_bound_stays_valid_and_plans_fit_with_copies(seed):
    """Random capped problems with random copy groups: BP's bound never exceeds the brute-force
    optimum, and a plan it returns fits (copies included) and costs what evaluate says."""
    rng = np.random.default_rng(700 + seed)
    p = _with_random_copies(rng, random_problem(rng, 6, kmax=3, edge_p=0.6, limit_q=None))
    peaks = sorted(evaluate(p, list(x)).peak_memory_bytes for x in np.ndindex(*p.num_strategies))
    p = replace(p, usage_limit=float(peaks[len(peaks) // 4]))
    r = bp.bp_solve(p)
    cost = brute_force(p)[1].total
    assert r.lower_bound <= cost + 1e-9 * abs(cost)
    if r.plan is not None:
        c = evaluate(p, r.plan)
        assert c.feasible and c.total == pytest.approx(r.cost)


def test_copy_priced_phase_runs_copy_rounds_times_the_rounds():
    """``_problem`` with the consumers live to step 6 and B at 2 bytes: the fastest plan (B
    everywhere) is over the limit 8 by its node usages, so the copies are priced and the run goes on
    for ``COPY_ROUNDS`` (3, session 17; 2 before) times the rounds asked; its plan fits and is optimal."""
    from costmodel.problem import Problem
    p = _problem(usage_limit=8.0)
    p = Problem.from_lists("copies", [[0.0, 5.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]],
                           [[4.0, 4.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], [[0, 6], [1, 6], [3, 6], [5, 6]],
                           [[0, 1], [0, 2], [0, 3]], [[0.0] * 4] * 3, usage_limit=8.0, edge_memory=p.edge_memory)
    r = bp.bp_solve(p, rounds=20)
    assert bp.COPY_ROUNDS == 3 and r.rounds == bp.COPY_ROUNDS * 20
    assert evaluate(p, r.plan).feasible and r.cost == pytest.approx(brute_force(p)[1].total)
