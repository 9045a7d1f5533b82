"""The ILP under a step-time bound on problems with IOPDDL's 1e18 "impossible" entries: the 1e18
costs must neither reach HiGHS's rows (passModel rejects ~1e16 coefficients, and the model status
was then "Empty": "no feasible plan") nor vanish from them (a reduced node whose only strategy
carries a folded 1e18 was priced 0 in the time row)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402

from solvers.ilp import solve_ilp  # noqa: E402

MEASURE = {"time": "total", "memory": "peak_memory_bytes", "redundancy": "redundant_memory_bytes"}


def _agree(p, objective, T):
    _, bc = brute_force(p, objective, max_time=T)
    plan, info = solve_ilp(p, objective=objective, max_step_time_s=T, time_limit_s=20)
    assert info.status == "optimal"
    assert info.step_time_s <= T
    assert info.objective == pytest.approx(getattr(bc, MEASURE[objective]))


@pytest.mark.parametrize("seed,n,objective", [(5, 8, "redundancy"), (5, 9, "redundancy"),
                                              (32, 6, "redundancy"), (33, 8, "redundancy")])
def test_forbidden_entries_under_a_step_time_bound(seed, n, objective):
    """(5, 8): HiGHS said "Empty" before; (32, 6) and (33, 8): a plan paying 1e18 came back as
    optimal under T = 1.2 x the fastest plan."""
    p = random_problem(np.random.default_rng(seed), n, forbid_p=0.1)
    _, fast = solve_ilp(p, objective="time", time_limit_s=20)
    _agree(p, objective, 1.2 * fast.objective)


def test_forbidden_sweep_matches_brute_force():
    for seed in range(12):
        p = random_problem(np.random.default_rng(100 + seed), 7, forbid_p=0.15)
        _, fast = solve_ilp(p, objective="time", time_limit_s=20)
        for objective in ("redundancy", "memory", "time"):
            _agree(p, objective, 1.2 * fast.objective)
