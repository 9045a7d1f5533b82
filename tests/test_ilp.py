"""The exact ILP and the reductions against brute force on small random problems."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402

from costmodel.ilp import InfeasibleError, SolveInfo, solve_ilp  # noqa: E402
from costmodel.problem import Problem, evaluate  # noqa: E402
from costmodel.reduce import reduce_problem  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "iopddl")
EXAMPLE = os.path.join(SHARED, "example.json")


def _check(p, objective, cap=None, max_time=None, reduce=True):
    """ILP == brute force (including the infeasible case and its minimum peak)."""
    best, bc = brute_force(p, objective, cap=cap, max_time=max_time)
    if best is None:
        with pytest.raises(InfeasibleError) as ei:
            solve_ilp(p, objective=objective, memory_cap_bytes=cap, max_step_time_s=max_time,
                      time_limit_s=20, reduce=reduce)
        _, free = brute_force(p.with_usage_limit(None), "memory")
        assert ei.value.min_peak_bytes == pytest.approx(free.peak_memory_bytes)
        lim = p.usage_limit if cap is None else (cap if p.usage_limit is None else min(cap, p.usage_limit))
        if lim is not None and free.peak_memory_bytes > lim:
            assert f"{free.peak_memory_bytes:.6g}" in str(ei.value)
        else:  # the step-time bound is what fails: the message names the fastest step time
            _, fast = brute_force(p, "time", cap=cap)
            assert ei.value.min_step_time_s == pytest.approx(fast.total)
        return
    plan, info = solve_ilp(p, objective=objective, memory_cap_bytes=cap, max_step_time_s=max_time,
                           time_limit_s=20, reduce=reduce)
    c = evaluate(p, plan)
    lim = p.usage_limit if cap is None else (cap if p.usage_limit is None else min(cap, p.usage_limit))
    assert lim is None or c.peak_memory_bytes <= lim
    assert max_time is None or c.total <= max_time + 1e-9
    assert info.status == "optimal"
    if objective == "time":
        assert c.total == pytest.approx(bc.total)
        assert info.objective == pytest.approx(bc.total)
    elif objective == "memory":
        assert c.peak_memory_bytes == pytest.approx(bc.peak_memory_bytes)
        assert c.total == pytest.approx(bc.total)       # lexicographic tie-break on time
    else:
        assert c.redundant_memory_bytes == pytest.approx(bc.redundant_memory_bytes)
        assert c.total == pytest.approx(bc.total)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 7), objective=st.sampled_from(["time", "memory", "redundancy"]),
       limit=st.sampled_from([None, 0.3, 0.7]), bound=st.sampled_from([None, "cap", "time", "both"]))
def test_ilp_matches_brute_force(seed, n, objective, limit, bound):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, n, kmax=4, limit_q=limit)
    peaks = sorted({evaluate(p, [int(rng.integers(k)) for k in p.num_strategies]).peak_memory_bytes
                    for _ in range(5)})
    times = sorted(evaluate(p, [int(rng.integers(k)) for k in p.num_strategies]).total for _ in range(5))
    cap = float(peaks[0]) if bound in ("cap", "both") else None
    max_time = float(times[len(times) // 2]) if bound in ("time", "both") else None
    _check(p, objective, cap=cap, max_time=max_time)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(2, 7), memory=st.booleans(), forbid=st.booleans(),
       integer=st.booleans())
def test_reductions_preserve_optimum(seed, n, memory, forbid, integer):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, n, kmax=4, edge_p=0.5, limit_q=0.5 if memory else None,
                       forbid_p=0.2 if forbid else 0.0, integer=integer)
    red = reduce_problem(p, memory_matters=memory, forbidden=1e15 if forbid else None)
    best, bc = brute_force(p)
    rbest, rbc = brute_force(red.problem)
    if bc is None:                       # nothing fits: the reduced problem cannot fit either
        assert rbc is None
        return
    if forbid and bc.total >= 1e15:      # forbidden pruning is allowed to lose such plans
        return
    assert rbc is not None
    full = evaluate(p, red.expand(rbest))
    assert full.feasible
    assert full.total == pytest.approx(bc.total, rel=1e-9)
    # every reduced plan maps to an original plan of the same cost (and memory, if it matters)
    for _ in range(5):
        r = [int(rng.integers(k)) for k in red.problem.num_strategies]
        a, b = evaluate(red.problem, r), evaluate(p, red.expand(r))
        if a.total < 1e15:
            assert b.total == pytest.approx(a.total, rel=1e-9)
        if memory:   # without a memory constraint, eliminated nodes may change the peak
            assert b.peak_memory_bytes == pytest.approx(a.peak_memory_bytes)


def test_reductions_shrink_a_chain():
    # a path 0-1-2-3 of 3-strategy nodes and no memory: elimination leaves at most one free node
    rng = np.random.default_rng(0)
    costs = [rng.integers(0, 9, 3).astype(float) for _ in range(4)]
    p = Problem.from_lists("chain", costs, [np.ones(3)] * 4, [(0, 1)] * 4, [(0, 1), (1, 2), (2, 3)],
                           [rng.integers(0, 9, 9).astype(float) for _ in range(3)])
    red = reduce_problem(p, memory_matters=False)
    assert red.stats["edges_after"] == 0
    assert red.stats["free_nodes_after"] <= 1
    best, bc = brute_force(p)
    plan, info = solve_ilp(p)
    assert evaluate(p, plan).total == bc.total


def test_example_optimum_and_solveinfo():
    p = Problem.from_iopddl(EXAMPLE)
    best, bc = brute_force(p)
    assert best == [0, 0, 2, 1, 0] and bc.total == 445.0       # README: [0,0,2,1,0] costs 445
    plan, info = solve_ilp(p, time_limit_s=10)
    assert plan == best
    assert isinstance(info, SolveInfo) and info.status == "optimal"
    assert info.objective == 445.0 and info.bound == pytest.approx(445.0) and info.gap == pytest.approx(0.0)
    d = info.to_dict()
    assert d["status"] == "optimal" and d["num_vars"] > 0 and d["num_rows"] > 0
    # without reductions the model is bigger and reaches the same optimum
    plan2, info2 = solve_ilp(p, reduce=False)
    assert evaluate(p, plan2).total == 445.0
    assert info2.num_vars > info.num_vars


def test_cap_below_every_plan_names_min_peak():
    p = Problem.from_iopddl(EXAMPLE)
    # lowest peak by hand: at t in [50, 70) nodes 0, 1, 2 are live: 10 + 25 + min(15, 20, 15) = 50
    with pytest.raises(InfeasibleError) as ei:
        solve_ilp(p, memory_cap_bytes=49)
    assert ei.value.min_peak_bytes == 50.0
    assert "50 bytes" in str(ei.value) and "49" in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_step_time_bound_names_fastest():
    p = Problem.from_iopddl(EXAMPLE)
    with pytest.raises(InfeasibleError) as ei:
        solve_ilp(p, max_step_time_s=444)
    assert ei.value.min_step_time_s == 445.0 and "445" in str(ei.value)
    plan, _ = solve_ilp(p, max_step_time_s=445)
    assert evaluate(p, plan).total == 445.0


def test_memory_objective_and_weights_on_example():
    p = Problem.from_iopddl(EXAMPLE).with_usage_limit(None)
    plan, info = solve_ilp(p, objective="memory")
    best, bc = brute_force(p, "memory")
    assert info.objective == bc.peak_memory_bytes == 50.0
    assert evaluate(p, plan).total == bc.total                # fastest among the lowest-peak plans
    # a weighted mix that only counts memory cannot beat the memory optimum
    plan_w, _ = solve_ilp(p, weights={"memory": 1.0, "time": 1e-9})
    assert evaluate(p, plan_w).peak_memory_bytes == 50.0


def test_bad_input():
    p = Problem.from_iopddl(EXAMPLE)
    with pytest.raises(ValueError, match="objective"):
        solve_ilp(p, objective="latency")
    with pytest.raises(ValueError, match="weights"):
        solve_ilp(p, weights={"speed": 1.0})
    with pytest.raises(ValueError, match="memory_cap_bytes"):
        solve_ilp(p, memory_cap_bytes=-1)
