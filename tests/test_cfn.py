"""The toulbar2 cost-function-network solver with adaptive memory prices (solvers/cfn.py)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers.cfn import available, cfn_solve
from tests.ilp_helpers import brute_force, random_problem


def test_pytoulbar2_is_installed():
    """A dependency (pyproject.toml): without it the capped core silently loses toulbar2."""
    assert available()


@pytest.mark.parametrize("seed,integer,forbid,stream", [(0, True, 0.0, False), (1, False, 0.0, False),
                                                       (2, True, 0.15, False), (3, False, 0.1, False),
                                                       (0, True, 0.0, True), (3, False, 0.1, True)])
def test_cfn_is_exact_without_a_limit(seed, integer, forbid, stream):
    """No memory limit: one toulbar2 round is exact branch and bound, so the plan is the
    brute-force optimum, and the bound meets it (non-integer costs go through the scaled, rounded-down
    integer model: the bound stays below the optimum and within 1e-6 of it)."""
    rng = np.random.default_rng(300 + seed)
    p = random_problem(rng, 8, kmax=3, edge_p=0.5, limit_q=None, integer=integer, forbid_p=forbid)
    _, bc = brute_force(p)
    r = cfn_solve(p, 5.0, max_rounds=3, stream=stream)
    assert r.plan is not None and r.cost == pytest.approx(evaluate(p, r.plan).total)
    assert r.cost == pytest.approx(bc.total, rel=1e-9)
    if bc.total < 1e17:
        assert bc.total - 1e-6 * abs(bc.total) <= r.lower_bound <= bc.total + 1e-9 * abs(bc.total)


@pytest.mark.parametrize("seed", range(6))
def test_cfn_plan_fits_and_bound_is_valid_under_a_binding_limit(seed):
    _check_binding(seed, stream=False)


@pytest.mark.parametrize("seed", [0, 3])
def test_cfn_streamed_rounds_plan_fits_and_bound_is_valid(seed):
    """The contest-size mode (``give_up_empty``: CPU-second limits, plans streamed) keeps the guarantees."""
    _check_binding(seed, stream=True)


def _check_binding(seed, stream):
    """A binding limit: every plan returned fits, is never worse than the start it was given, and
    the Lagrangian bound never exceeds the brute-force optimum."""
    rng = np.random.default_rng(400 + seed)
    p = random_problem(rng, 8, kmax=3, edge_p=0.5, limit_q=0.3, integer=seed % 2 == 0,
                       forbid_p=0.1 if seed % 3 == 0 else 0.0)
    _, bc = brute_force(p)
    least = [int(np.argmin(p.node_usages[p.node_slice(i)])) for i in range(p.num_nodes)]
    r = cfn_solve(p, 5.0, starts=[least], max_rounds=25, stream=stream)
    c = evaluate(p, r.plan)
    assert c.feasible and c.peak_memory_bytes <= p.usage_limit
    assert c.total <= evaluate(p, least).total + 1e-9
    assert r.cost >= bc.total - 1e-9
    assert r.lower_bound <= bc.total + 1e-6 * max(1.0, abs(bc.total))
    if bc.total < 1e17 and r.cost < 1e17:   # never below the unpriced floor (each node and edge at its minimum)
        floor = sum(float(p.node_costs[p.node_slice(i)].min()) for i in range(p.num_nodes)) + \
            sum(float(p.edge_matrix(e).min()) for e in range(p.num_edges))
        assert r.lower_bound >= floor - 1e-6 * max(1.0, abs(floor))


def test_streamed_plan_is_read_back_from_toulbar2s_output(tmp_path):
    """A streamed round writes each plan toulbar2 finds ("New solution: ..." and a line of values)
    to a file; ``cfn_fork.streamed`` reads the last complete one back: the plan the round returned."""
    from solvers.cfn import _Model, _scale
    from solvers.cfn_fork import forked, streamed
    from solvers.local import prepare
    rng = np.random.default_rng(7)
    p = random_problem(rng, 10, kmax=4, edge_p=0.5, limit_q=None, integer=True, forbid_p=0.0)
    _, _, _, gc = prepare(p)
    model = _Model(gc, _scale(gc))
    path = tmp_path / "sol.txt"
    path.write_text("")
    sc, _, _ = forked(model.solve, (gc.cost, 5.0, None, str(path)), time.perf_counter() + 60.0, 0.5)
    assert sc is not None and "New solution" in path.read_text()
    assert np.array_equal(streamed(str(path), model), sc)


def test_streamed_takes_the_last_complete_solution(tmp_path):
    """A round killed mid-write leaves a partial line: the last complete plan is taken; none: None."""
    from types import SimpleNamespace

    from solvers.cfn_fork import streamed
    gc = SimpleNamespace(n=4, k=np.array([3, 1, 3, 2]))
    model = SimpleNamespace(free=gc.k > 1, gc=gc, expand=lambda x: np.insert(np.asarray(x), 1, 0))
    path = tmp_path / "sol.txt"
    path.write_text("New solution: 9 (0 backtracks)\n 2 2 1\nNew solution: 5 (3 backtracks)\n 1 0 1\n"
                    "New solution: 4 (9 backtracks)\n 0 1")
    assert list(streamed(str(path), model)) == [1, 0, 0, 1]
    path.write_text("New solution: 4 (9 backtracks)\n 0 3 1\n")      # 3 is out of range: not a plan
    assert streamed(str(path), model) is None
    assert streamed(str(tmp_path / "missing.txt"), model) is None


def test_streamed_rounds_are_skipped_when_the_cpu_cannot_reach_a_first_plan(monkeypatch):
    """Contest-size mode: when the CPU share this process gets cannot pay for toulbar2's first plan
    (``CPU_PER_ENTRY_S`` per table entry) by the deadline, no round runs and the time goes back to
    the caller (the search); the plan is still the best start. Without ``give_up_empty`` the
    estimate is not used."""
    import solvers.cfn as cfn
    monkeypatch.setattr(cfn, "CPU_PER_ENTRY_S", 1e6)
    rng = np.random.default_rng(401)
    p = random_problem(rng, 8, kmax=3, edge_p=0.5, limit_q=0.3, integer=True, forbid_p=0.0)
    least = [int(np.argmin(p.node_usages[p.node_slice(i)])) for i in range(p.num_nodes)]
    msgs = []
    r = cfn_solve(p, 5.0, starts=[least], give_up_empty=True, progress=msgs.append)
    assert r.rounds == 0 and any("giving the time back" in m for m in msgs)
    assert evaluate(p, r.plan).feasible and r.cost <= evaluate(p, least).total + 1e-9
    assert cfn_solve(p, 5.0, starts=[least], max_rounds=2).rounds >= 1
