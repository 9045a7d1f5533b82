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

from costmodel.limits import LimitError  # noqa: E402
from costmodel.problem import Problem, evaluate  # noqa: E402
from solvers.ilp import IlpConfig, InfeasibleError, SolveInfo, solve_ilp  # noqa: E402
from solvers.ilp import highs as ilp_highs  # noqa: E402
from solvers.reduce import reduce_problem  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "iopddl")
EXAMPLE = os.path.join(SHARED, "example.json")


def _check(p, objective, cap=None, max_time=None, reduce=True, config=IlpConfig()):
    """ILP == brute force (including the infeasible case and its minimum peak)."""
    best, bc = brute_force(p, objective, cap=cap, max_time=max_time)
    if best is None:
        with pytest.raises(InfeasibleError) as ei:
            solve_ilp(p, objective=objective, memory_cap_bytes=cap, max_step_time_s=max_time,
                      time_limit_s=20, reduce=reduce, config=config)
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
                           time_limit_s=20, reduce=reduce, config=config)
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
    # usages and costs are integers: 0.5 stands for a bound of 0, which Limits rejects
    cap = max(float(peaks[0]), 0.5) if bound in ("cap", "both") else None
    max_time = max(float(times[len(times) // 2]), 0.5) if bound in ("time", "both") else None
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
    for bad in (-1, 0, float("nan")):      # the one validation, costmodel.limits.Limits
        with pytest.raises(LimitError, match="memory_cap_bytes"):
            solve_ilp(p, memory_cap_bytes=bad)
    with pytest.raises(LimitError, match="max_step_time_s"):
        solve_ilp(p, max_step_time_s=0.0)


def test_memory_cap_tightens_the_usage_limit_never_relaxes_it():
    # node 0: usage 10 / 4 / 20 at cost 1 / 5 / 9; node 1: usage 3, cost 1; both live at t = 1.
    # Plans by node 0's strategy: peak 13 time 2, peak 7 time 6, peak 23 time 10.
    p = Problem.from_lists("cap", [[1.0, 5.0, 9.0], [1.0]], [[10.0, 4.0, 20.0], [3.0]], [[0, 2], [1, 3]], [], [])
    assert solve_ilp(p.with_usage_limit(10.0), memory_cap_bytes=100.0)[0] == [1, 0]   # min(10, 100) = 10
    assert solve_ilp(p.with_usage_limit(100.0), memory_cap_bytes=10.0)[0] == [1, 0]
    assert solve_ilp(p.with_usage_limit(100.0), memory_cap_bytes=13.0)[0] == [0, 0]   # 13 fits exactly
    with pytest.raises(InfeasibleError, match="memory_cap_bytes=6"):
        solve_ilp(p.with_usage_limit(100.0), memory_cap_bytes=6.0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 7), objective=st.sampled_from(["memory", "redundancy"]),
       bound=st.sampled_from(["time", "both"]), nseeds=st.integers(0, 3))
def test_seeded_memory_and_redundancy_match_brute_force(seed, n, objective, bound, nseeds):
    """The two-phase objectives under a step-time bound, with caller seeds (the bisection, the
    heuristic and the pruning relative to the seed all run) equal brute force."""
    rng = np.random.default_rng(seed)
    p = random_problem(rng, n, kmax=4, limit_q=None)
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(6)]
    costs = [evaluate(p, s) for s in plans]
    max_time = max(float(sorted(c.total for c in costs)[3]), 0.5)   # 0.5: integer data's 0 (see above)
    cap = max(float(sorted(c.peak_memory_bytes for c in costs)[4]), 0.5) if bound == "both" else None
    seeds = plans[:nseeds]
    best, bc = brute_force(p, objective, cap=cap, max_time=max_time)
    if best is None:
        _check(p, objective, cap=cap, max_time=max_time)
        return
    plan, info = solve_ilp(p, objective=objective, memory_cap_bytes=cap, max_step_time_s=max_time,
                           time_limit_s=20, initial_plans=seeds)
    c = evaluate(p, plan)
    assert info.status == "optimal" and info.gap == 0.0
    assert c.total <= max_time + 1e-9 and (cap is None or c.peak_memory_bytes <= cap)
    key = "peak_memory_bytes" if objective == "memory" else "redundant_memory_bytes"
    assert getattr(c, key) == pytest.approx(getattr(bc, key))
    assert info.objective == pytest.approx(getattr(bc, key))
    assert c.total == pytest.approx(bc.total)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 6), q=st.floats(0.0, 1.0))
def test_tighten_is_exact(seed, n, q):
    """tighten's pruning keeps every strategy some plan within the cap uses, and the rows it
    drops never bind for a plan of kept strategies (checked on all plans)."""
    from ilp_helpers import all_plans

    from costmodel.problem import usage_profile
    from solvers.ilp.bounds import tighten
    rng = np.random.default_rng(seed)
    p = random_problem(rng, n, kmax=4, limit_q=None)
    peaks = sorted(evaluate(p, list(s)).peak_memory_bytes for s in all_plans(p))
    cap = float(np.quantile(peaks, q))
    allowed, free, rows = tighten(p, None, cap, cap)
    offs = p.strategy_offsets[:-1]
    for s in all_plans(p):
        s = np.asarray(s)
        flat = offs + s
        times, live = usage_profile(p, p.node_usages[flat])
        if live.max(initial=0.0) <= cap:
            assert allowed[flat].all()             # no feasible plan loses a strategy
        if allowed[flat].all():
            over = times[live > cap]
            assert np.isin(over, rows).all()       # a point over the cap always keeps its row
    # a memory-free node sits at no kept row, or its kept strategies all use the same bytes
    st_, en_ = p.intervals[:, 0], p.intervals[:, 1]
    for i in np.nonzero(free)[0]:
        sl = p.node_slice(i)
        if ((rows >= st_[i]) & (rows < en_[i])).any():
            assert np.ptp(p.node_usages[sl][allowed[sl]]) == 0


def test_tighten_by_hand():
    # two nodes live over [0, 2) with usages (1, 5) and (2, 3); cap 5: node 0's 5 needs node 1 at
    # >= 2 -> 7 > 5, dropped; then max live = 1 + 3 = 4 <= 5: no row binds, both nodes are free
    p = Problem.from_lists("hand", [np.array([3.0, 1.0]), np.array([1.0, 2.0])],
                           [np.array([1.0, 5.0]), np.array([2.0, 3.0])], [(0, 2), (0, 2)], [], [])
    from solvers.ilp.bounds import tighten
    allowed, free, rows = tighten(p, None, 5.0, 5.0)
    assert allowed.tolist() == [True, False, True, True]
    assert free.tolist() == [True, True] and len(rows) == 0
    # cap 3.5: lmin = 1 + 2 = 3, slack 0.5 prunes both nodes' larger usage: no row left either
    allowed, free, rows = tighten(p, None, 3.5, 3.5)
    assert allowed.tolist() == [True, False, True, False] and len(rows) == 0
    # usages (1, 2) and (2, 3) under cap 4: both excesses (1) fit the slack (1), but together
    # 2 + 3 = 5 > 4: the row at t = 0 stays and both nodes keep memory
    q = Problem.from_lists("hand2", [np.array([3.0, 1.0]), np.array([3.0, 1.5])],
                           [np.array([1.0, 2.0]), np.array([2.0, 3.0])], [(0, 2), (0, 2)], [], [])
    allowed, free, rows = tighten(q, None, 4.0, 4.0)
    assert allowed.all() and rows.tolist() == [0] and free.tolist() == [False, False]
    plan, info = solve_ilp(q, memory_cap_bytes=4.0)
    assert plan == [1, 0] and info.objective == 4.0          # 1 + 3 beats 3 + 1.5 (both peak 4)
    plan, info = solve_ilp(p, objective="memory")
    assert info.objective == 3.0 and plan == [0, 0] and info.status == "optimal"


def test_min_usage_phase_one_and_seed_errors():
    p = Problem.from_iopddl(EXAMPLE).with_usage_limit(None)
    from solvers.ilp import min_peak_memory
    assert min_peak_memory(p) == 50.0                        # by hand, see the cap test above
    with pytest.raises(ValueError, match="initial_plan"):
        solve_ilp(p, objective="memory", initial_plans=[[0, 0]])
    with pytest.raises(ValueError, match="time_limit_s"):
        solve_ilp(p, time_limit_s=0)


@pytest.mark.slow
def test_memory_objective_never_above_seeded_baselines():
    """shardgym.solve seeds the memory objective under a step-time bound with the baseline plans:
    with T = Megatron's step time the answer's peak is at most Megatron's (mlp tiny, cpu-2x4)."""
    import shardgym as sg
    from shardgym import workflow
    _, _, _, p = workflow.model_problem("mlp", "tiny", sg.Cluster.preset("cpu-2x4"))
    meg = sg.evaluate(p, sg.solve(p, method="megatron"))
    plan = sg.solve(p, method="ilp", objective="memory", max_step_time_s=meg.step_time_s, time_limit_s=10)
    c = sg.evaluate(p, plan)
    assert c.step_time_s <= meg.step_time_s * (1 + 1e-12)
    assert c.peak_memory_bytes <= meg.peak_memory_bytes
    assert plan.info["objective_name"] == "memory" and plan.info["peak_memory_bytes"] == c.peak_memory_bytes


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(2, 7), objective=st.sampled_from(["time", "memory"]),
       limit=st.sampled_from([None, 0.5]), reduce=st.booleans(), running_sums=st.booleans())
def test_block_edges_match_brute_force(seed, n, objective, limit, reduce, running_sums):
    """Edge matrices with repeated rows and columns (one y per block in the model), with memory
    as dense rows or as running-sum columns (what big models get): still the brute-force optimum."""
    p = random_problem(np.random.default_rng(seed), n, kmax=4, limit_q=limit, blocks=True)
    _check(p, objective, reduce=reduce, config=IlpConfig(dense_memory_nonzeros=-1) if running_sums else IlpConfig())


def test_config_switches_memory_to_running_sums():
    """IlpConfig(dense_memory_nonzeros=-1) builds the memory part as running sums: the same plan,
    with a u column per node whose usage varies and an L column per checked time point."""
    q = Problem.from_lists("hand2", [np.array([3.0, 1.0]), np.array([3.0, 1.5])],
                           [np.array([1.0, 2.0]), np.array([2.0, 3.0])], [(0, 2), (0, 2)], [], [])
    kw = dict(memory_cap_bytes=4.0, reduce=False, relax_cap=False)
    dense = solve_ilp(q, **kw)
    sums = solve_ilp(q, **kw, config=IlpConfig(dense_memory_nonzeros=-1))
    assert dense[0] == sums[0] == [1, 0]
    assert sums[1].num_vars == dense[1].num_vars + 2 + 1   # u for both nodes, L at t = 0


def test_block_compression_shrinks_the_model():
    p = Problem.from_lists("blocks", [[1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]], [[0, 0, 0], [0, 0, 0, 0]],
                           [[0, 1], [0, 1]], [(0, 1)],
                           [np.array([[0, 5, 0, 5], [0, 5, 0, 5], [7, 0, 7, 0]], float).ravel()])
    plan, info = solve_ilp(p, reduce=False)
    # 3 + 4 strategy columns and 2 x 2 blocks instead of 12 edge entries
    assert info.num_vars == 7 + 4
    assert evaluate(p, plan).total == 2.0 and info.status == "optimal"   # node costs 1 + 1, edge 0


def test_lp_first_agrees_with_the_mip(monkeypatch):
    """The LP relaxation tried first (integral vertex = proven optimum) gives the optimum the
    branch-and-bound gives without it; on gpt tiny the LP alone proves it."""
    from shardgym.workflow import model_problem
    _, _, _, p = model_problem("gpt", "tiny", "cpu-2x4")
    calls = []
    real = ilp_highs.try_lp

    def spy(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(ilp_highs, "try_lp", spy)
    plan, info = solve_ilp(p, time_limit_s=60)
    assert info.status == "optimal" and calls and all(calls)
    monkeypatch.setattr(ilp_highs, "try_lp", lambda *a, **k: None)
    plan2, info2 = solve_ilp(p, time_limit_s=60)
    assert info2.status == "optimal"
    assert evaluate(p, plan).total == pytest.approx(evaluate(p, plan2).total, rel=1e-6)
    for seed in range(6):
        q = random_problem(np.random.default_rng(seed), 7, kmax=4, limit_q=0.4, blocks=seed % 2 == 0)
        monkeypatch.setattr(ilp_highs, "try_lp", real)
        a = evaluate(q, solve_ilp(q)[0]).total
        monkeypatch.setattr(ilp_highs, "try_lp", lambda *a, **k: None)
        assert evaluate(q, solve_ilp(q)[0]).total == pytest.approx(a)


def test_cap_relaxation_only_when_the_cap_does_not_bind():
    # node 0: strategy 0 is fast and big (usage 10), 1 slow and small (4), 2 slow and huge (20,
    # so that the caps below can bind and are not dropped up front)
    p = Problem.from_lists("relax", [[1.0, 5.0, 9.0], [1.0]], [[10.0, 4.0, 20.0], [3.0]], [[0, 2], [1, 3]],
                           [], [])
    plan, info = solve_ilp(p.with_usage_limit(13.0))      # the fast plan peaks at 13: fits
    assert plan == [0, 0] and info.status == "optimal"
    assert info.reduction.get("memory_cap_relaxed") is True
    plan, info = solve_ilp(p.with_usage_limit(12.0))      # it does not fit: the capped model decides
    assert plan == [1, 0] and info.status == "optimal" and info.objective == 6.0
    assert not info.reduction.get("memory_cap_relaxed")
    plan, info = solve_ilp(p.with_usage_limit(13.0), relax_cap=False)
    assert plan == [0, 0] and not info.reduction.get("memory_cap_relaxed")


def test_time_objective_under_a_cap_replication_breaks():
    """When the replicated plan breaks the cap, shardgym.solve seeds the time objective with the
    baselines; the answer fits the cap and is no slower than any baseline that fits."""
    import shardgym as sg
    from shardgym import workflow
    _, _, _, p = workflow.model_problem("mlp", "tiny", sg.Cluster.preset("cpu-2x4"))
    rep = sg.evaluate(p, sg.solve(p, method="replicated"))
    cap = 0.5 * rep.peak_memory_bytes
    plan = sg.solve(p, method="ilp", memory_cap_bytes=cap, time_limit_s=20)
    c = sg.evaluate(p, plan)
    assert c.peak_memory_bytes <= cap
    for m in ("dp", "megatron", "fsdp"):
        b = sg.evaluate(p, sg.solve(p, method=m))
        if b.peak_memory_bytes <= cap:
            assert c.step_time_s <= b.step_time_s * (1 + 1e-9)


def test_memory_objective_with_copies_when_no_seed_fits_the_limit():
    """Producer 0 (A: cost 0, B: cost 5) feeds consumers at steps 1, 3, 5 that are faster in B
    (cost 0 vs 1); a consumer in B reading a producer in A needs a shared 10-byte copy. Every
    usage ties, so the least-usage plan takes the fastest strategies: A, B, B, B, peak 4 + 1 + 10
    = 15, over the limit 12. The min-peak model then runs from no start: all A, peak 5, time 3
    (by hand: no copy; the time-3 alternative all B costs 5)."""
    from costmodel.edge_memory import CopyGroups
    want_b = [False, True]
    em = CopyGroups.from_lists([(0, 10.0, [(1, 1, want_b, want_b), (2, 3, want_b, want_b),
                                           (3, 5, want_b, want_b)], 0, [True, False])])
    p = Problem.from_lists("copies", [[0.0, 5.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], [[4.0, 4.0]] + [[1.0, 1.0]] * 3,
                           [[0, 6], [1, 2], [3, 4], [5, 6]], [[0, 1], [0, 2], [0, 3]], [[0.0] * 4] * 3,
                           usage_limit=12.0, edge_memory=em)
    assert evaluate(p, [0, 1, 1, 1]).peak_memory_bytes == 15.0
    plan, info = solve_ilp(p, objective="memory")
    assert plan == [0, 0, 0, 0] and info.status == "optimal"
    assert evaluate(p, plan).peak_memory_bytes == 5.0 and evaluate(p, plan).total == 3.0
    with pytest.raises(InfeasibleError, match="lowest peak memory any plan reaches is 5"):
        solve_ilp(p.with_usage_limit(4.0), objective="memory")
