"""The capped core's descent on the memory cap (``solvers.minmem_bisect.core_descent``) and its place in the
memory objective with a long limit (``solvers.dispatch.solve_exact``): against brute force on tiny problems."""
from __future__ import annotations

import os
import sys
import time

import pytest

from costmodel.problem import evaluate

sys.path.insert(0, os.path.dirname(__file__))
from test_minmem_bisect import _case  # noqa: E402
from test_minmem_lns import _brute, _chains  # noqa: E402


def _core(cp, seconds, seeds):
    from solvers.dispatch import _core_step
    return _core_step(cp, seconds, seeds, None)


def test_core_descent_reaches_the_brute_force_optimum_from_the_replicated_plan():
    """Chains that only move as a whole (tests/test_minmem_lns.py): 36 B at the start, 9 B optimal within
    9.95 s. Each step caps the problem and asks the capped core for the least time under the cap; a plan
    within T lowers the best peak, and the steps stop when lo and ub meet."""
    from solvers.minmem_bisect import core_descent

    p, t = _chains(9.95)
    assert _brute(p, t) == 9.0
    t0 = time.perf_counter()
    plan, info = core_descent(p, t, [0] * p.num_nodes, t0 + 20.0, _core, step_s=3.0, min_step_s=0.5)
    c = evaluate(p, plan)
    assert c.total <= t and c.peak_memory_bytes == 9.0
    assert info["peak_before"] == 36.0 and info["ub"] == 9.0 and info["lo"] <= 9.0
    assert any(r.startswith("within T") for _, r, _ in info["steps"])
    # a cap below the optimum is answered with a plan over T (or none): lo rises and the steps end
    assert info["lo"] > 0.0 and time.perf_counter() - t0 < 20.0


def test_core_descent_keeps_its_start_when_no_step_fits_in_time():
    from solvers.minmem_bisect import core_descent

    p, t = _chains(9.95)
    plan, info = core_descent(p, t, [0] * p.num_nodes, time.perf_counter() + 1.0, _core, min_step_s=5.0)
    assert plan == [0] * p.num_nodes and info["steps"] == []
    with pytest.raises(ValueError, match="step-time bound"):
        core_descent(p, 8.0, [0] * p.num_nodes, time.perf_counter() + 1.0, _core)


@pytest.mark.parametrize("seed", range(2))
def test_memory_objective_with_a_long_limit_descends_with_the_core(seed, monkeypatch):
    """With the limit at or above ``CORE_DESCENT_MIN_S`` (lowered here) the memory objective runs the core's
    steps after the bisection; its answer meets T and is the brute-force optimum's peak."""
    from ilp_helpers import brute_force

    import solvers.dispatch as d

    monkeypatch.setattr(d, "CORE_DESCENT_MIN_S", 3.0)
    monkeypatch.setattr(d, "CORE_BISECT_MAX_S", 0.5)
    import solvers.minmem_bisect as mb
    monkeypatch.setattr(mb, "CORE_STEP_MIN_S", 0.5)
    monkeypatch.setattr(mb, "CORE_STEP_S", 1.5)
    p, max_time, seeds = _case(seed)
    _, bc = brute_force(p, "memory", max_time=max_time)
    t0 = time.perf_counter()
    plan, info = d.solve_exact(p, objective="memory", max_step_time_s=max_time, time_limit_s=6, initial_plans=seeds)
    c = evaluate(p, plan)
    assert c.total <= max_time * (1 + 1e-12)
    assert c.peak_memory_bytes == pytest.approx(bc.peak_memory_bytes)
    d_info = info["core_descent"]
    assert d_info["peak_after"] <= d_info["peak_before"] and d_info["lo"] <= c.peak_memory_bytes + 1e-9
    assert time.perf_counter() - t0 < 6 + 1.5
