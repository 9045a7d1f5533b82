"""The capped MILP with its memory rows as running sums, resharded copies included, and the capped LP's bound
computed beside the core (``solvers.capped_phases.lp_beside``, ``CappedConfig.lp_beside_idle``), against brute force."""
from __future__ import annotations

import itertools
import os
import sys
import time

import numpy as np
import pytest

import solvers.capped as capped
import solvers.capped_phases as capped_phases
from costmodel.problem import evaluate
from solvers.capped import CappedConfig
from solvers.capped_phases import lp_beside
from solvers.ilp import IlpConfig, solve_ilp
from solvers.ilp.guard import stop_child

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402
from test_edge_memory import _with_random_copies  # noqa: E402


def _capped(seed: int):
    """A random 5-node problem with copy groups, its cap at the 4th lowest peak of 8 random plans."""
    rng = np.random.default_rng(300 + seed)
    p = _with_random_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
    return p.with_usage_limit(max(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[3], 0.5))


@pytest.mark.parametrize("seed", range(6))
def test_running_sums_with_copies_give_the_brute_force_optimum(seed):
    """Memory as running sums (``IlpConfig(dense_memory_nonzeros=-1)``), the copies' z columns entering the
    sums at their spans' ends: the same optimum as the dense rows and as enumeration priced by evaluate."""
    p = _capped(seed)
    best, bc = brute_force(p, "time")
    if best is None:
        return
    for dense in (-1, IlpConfig().dense_memory_nonzeros):
        plan, info = solve_ilp(p, time_limit_s=10, relax_cap=False, config=IlpConfig(dense_memory_nonzeros=dense))
        c = evaluate(p, plan)
        assert info.status == "optimal" and c.feasible and c.total == pytest.approx(bc.total)


@pytest.mark.parametrize("seed", range(4))
def test_lp_beside_sends_a_bound_at_or_below_the_optimum(seed):
    """The child's LP relaxation (and root) of the capped MILP: a finite bound, never above the brute-force
    optimum, sent well within its limit on these 5-node problems."""
    p = _capped(seed)
    best, bc = brute_force(p, "time")
    if best is None:
        return
    proc, recv = lp_beside(p, [None, best], 5.0)
    try:
        assert recv.poll(8.0)
        kind, b = recv.recv()
    finally:
        stop_child(proc)
    assert kind == "bound" and np.isfinite(b) and b <= bc.total + 1e-6 * abs(bc.total)


@pytest.mark.parametrize("on", [True, False])
def test_solve_guarded_reports_the_lp_beside_bound(monkeypatch, on):
    """A core that streams one plan and no bound, then hangs past the limit, on an idle machine: with
    ``lp_beside_idle=1`` the answer's bound is the LP child's (finite, at or below the optimum, said in the log),
    without it -inf."""
    p = _capped(2)
    best, bc = brute_force(p, "time")
    worst = max((s for s in itertools.product(*[range(k) for k in p.num_strategies]) if evaluate(p, list(s)).feasible),
                key=lambda s: evaluate(p, list(s)).total)

    def hang(problem, time_limit_s, progress=None, on_plan=None, on_bound=None, **kw):
        on_plan([int(x) for x in worst], evaluate(p, list(worst)).total)
        time.sleep(600)

    monkeypatch.setattr(capped, "solve_capped", hang)   # inherited by the forked core
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (0.0, 0.0, 0.0))   # an idle core (the LP's gate)
    log = []
    t0 = time.perf_counter()
    r = capped.solve_guarded(p, 2.5, seeds=[list(worst)], progress=log.append,
                             config=CappedConfig(lp_beside_idle=1.0 if on else float("inf"), guard_margin_s=0.5))
    assert time.perf_counter() - t0 < 3.0
    assert r.plan == [int(x) for x in worst]
    if on:
        assert np.isfinite(r.bound) and r.bound <= bc.total + 1e-6 * abs(bc.total)
        assert any(m.startswith("lp beside: bound") for m in log)
    else:
        assert r.bound == -np.inf and not any("lp beside" in m for m in log)


def test_lp_beside_waits_for_an_idle_core(monkeypatch):
    """On a busy machine (1-min load >= cores - 1) no LP child is started: the bound stays the core's."""
    p = _capped(2)
    seen = []
    monkeypatch.setattr(capped_phases, "lp_beside", lambda *a, **k: seen.append(a))   # started by start_besides
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (float(os.cpu_count() or 1), 0.0, 0.0))
    r = capped.solve_guarded(p, 2.5, config=CappedConfig(lp_beside_idle=1.0, guard_margin_s=0.5))
    assert not seen and r.plan is not None
