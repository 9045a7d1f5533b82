"""The Lagrangian bound's proximal bundle step (``solvers.lagrange_bundle``, ``lagrangian_bound(...,
step="bundle")``): its QP against the closed form and a small-u kink by hand, the 4-node hand case's dual optimum reached in a
few rounds, and on small random problems with copy groups the bound never above the brute-force
capped optimum (the model only picks the prices; every reported L is evaluated)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from solvers.lagrange import lagrangian_bound
from solvers.lagrange_bundle import _prox_qp

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import check_lagrangian_bound, random_problem  # noqa: E402
from test_edge_memory import _problem, _with_random_copies  # noqa: E402
from test_lagrange_reps import _with_shared_copies  # noqa: E402


def test_prox_qp_one_cut_is_the_projected_gradient_step():
    """One cut c + g·μ: the maximiser of c + g·μ - (u/2)|μ|² over μ >= 0 is max(g, 0)/u."""
    g = np.array([[0.5, -1.0, 0.2, 0.0]])
    mu = _prox_qp(g, np.array([0.3]), np.zeros(4), 2.0, 5.0)
    assert mu == pytest.approx(np.maximum(g[0], 0) / 2.0, abs=1e-6)


def test_prox_qp_small_u_kink_by_hand():
    """Two cuts with the same direction over two equal time points, a tiny proximal weight (fno tiny tpu-4x4 at
    the 75 % cap, round 11, cut to 2 x 2: HiGHS's QP posed with Hessian u·I ran to its limit there). With s = μ1 + μ2
    the model is min(0.0145 + 0.3 s, 1 - 0.39 s), rising until the kink s* = 0.9855 / 0.69, where the proximal
    term's slope (u/2)(s - 1.036) ~ 5e-4 is far below both cuts' slopes: μ = (s*/2, s*/2) = 0.714130..."""
    g = np.array([[0.3, 0.3], [-0.39, -0.39]])
    mu = _prox_qp(g, np.array([0.0145, 1.0]), np.array([0.518, 0.518]), 0.00268, 1.0)
    assert mu == pytest.approx(np.full(2, 0.9855 / 0.69 / 2), abs=1e-6)


def test_bundle_reaches_the_hand_case_dual_optimum():
    """Short-lived copies only (priced exactly by their terms): the Lagrangian dual is 1.5
    (tests/test_capped_copies.py); the bundle step gets there in a few rounds (the Polyak rule: 23)."""
    p = _problem(usage_limit=10.0, early=False)
    r = lagrangian_bound(p, 10.0, upper=3.0, step="bundle")
    assert r.bound == pytest.approx(1.5, rel=1e-3)
    assert r.rounds <= 8
    assert lagrangian_bound(_problem(usage_limit=10.0, early=True), 5.0, upper=3.0, step="bundle").bound <= 3.0 + 1e-9


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_bundle_bound_is_below_the_brute_force_capped_optimum(seed, shared):
    """Random 5-node problems with random copy groups (one member a group, or several sharing a
    collective-made copy), caps that bind: the bound never passes the capped optimum, whichever
    plan picks the representatives; every relaxed plan is complete."""
    rng = np.random.default_rng(500 + seed)
    base = random_problem(rng, 5, kmax=3, limit_q=None)
    p = _with_shared_copies(rng, base) if shared else _with_random_copies(rng, base)
    check_lagrangian_bound(rng, p, step="bundle")
