"""agent/fgnn_es.py: the ES subspace round-trips, its zero point is the untrained network (Lagrangian
BP: every score 0), a far point still plans; the Adam step. (Resume is not tested here: main
builds the zoo training split.)"""
from __future__ import annotations

import numpy as np
import pytest

from agent import fgnn_es
from agent.fgnn import FGNN, FGConfig
from costmodel.problem import evaluate
from solvers import bp
from tests.ilp_helpers import random_problem

ROUNDS = 10


@pytest.fixture(scope="module")
def net():
    return FGNN(FGConfig(rounds=ROUNDS, hidden=8))


def test_subspace_round_trips_and_leaves_the_rest(net):
    sub = fgnn_es.Subspace(net.params, ["price_out", "damp", "pgate"])
    assert sub.size == 8 + 1 + 2 * ROUNDS
    v = np.arange(sub.size, dtype=np.float64) / 7.0
    p2 = sub.put(net.params, v)
    assert np.allclose(sub.flat(p2), v)
    assert np.allclose(sub.flat(net.params), sub.flat(sub.put(net.params, sub.flat(net.params))))
    assert np.allclose(np.asarray(p2["damp"]), v[9:9 + ROUNDS])     # leaves in --leaves order
    for k in ("msg", "read", "gate", "soft", "gout"):       # untouched leaves are the same objects' values
        a, b = net.params[k], p2[k]
        la = a if not isinstance(a, dict) else a["Dense_2"]["kernel"]
        lb = b if not isinstance(b, dict) else b["Dense_2"]["kernel"]
        assert np.array_equal(np.asarray(la), np.asarray(lb))
    assert not np.any(np.asarray(net.params["price"]["Dense_2"]["kernel"]))   # the original is not mutated


def test_zero_point_is_lagrangian_bp_and_scores_zero(net):
    """θ at the start (the untrained network) plans Lagrangian BP's plan (same cost), f = 0 on every
    problem; a large price correction changes the score (the objective sees the decode)."""
    items = [(f"p{s}", random_problem(np.random.default_rng(600 + s), 12, kmax=4, edge_p=0.5, limit_q=0.35))
             for s in range(3)]
    sc = fgnn_es.Scorer(net, items)
    assert len(sc.items) == 3
    for j, (_, p, _, c0) in enumerate(sc.items):
        ref = bp.bp_solve(p, rounds=ROUNDS, memory_prices=True, bound=False)
        assert c0 == pytest.approx(ref.cost, rel=1e-9)
        assert sc.f(j, net.params) == 0.0
    assert sc.score(net.params)["score"] == 1.0
    sub = fgnn_es.Subspace(net.params, ["price_out", "damp"])
    far = sub.put(net.params, np.full(sub.size, 3.0))
    fs = [sc.f(j, far) for j in range(3)]
    assert all(np.isfinite(f) or f == np.log(fgnn_es.OVER_CAP_RATIO) for f in fs)
    for _, p, inp, _ in sc.items:
        x = net.plan(p, params=far, inputs=inp)
        assert len(x) == p.num_nodes and evaluate(p, x).total > 0


def test_adam_step_moves_against_the_gradient():
    g = np.array([1.0, -2.0, 0.0])
    step, m, v = fgnn_es._adam(g, np.zeros(3), np.zeros(3), 1, 0.1)
    assert np.allclose(step, [0.1, -0.1, 0.0], atol=1e-6)
