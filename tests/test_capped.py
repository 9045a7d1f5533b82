"""The capped-solving core (solvers/capped.py) and the IOPDDL command's watchdog around it."""
from __future__ import annotations

import time

import numpy as np
import pytest

from costmodel.problem import Problem, evaluate
from solvers import capped, capped_phases, iopddl_cli
from solvers.capped import solve_capped
from tests.ilp_helpers import brute_force, random_problem


@pytest.mark.parametrize("seed", range(4))
def test_solve_capped_is_optimal_on_small_problems_and_never_worse_than_a_seed(seed):
    rng = np.random.default_rng(200 + seed)
    p = random_problem(rng, 7, kmax=3, edge_p=0.5, limit_q=0.4)
    best, bc = brute_force(p)
    worst_fit = max((list(s) for s in __import__("itertools").product(*[range(int(k)) for k in p.num_strategies])
                     if evaluate(p, list(s)).feasible), key=lambda s: evaluate(p, s).total)
    r = solve_capped(p, 20.0, seeds=[worst_fit, best])
    assert r.plan is not None and evaluate(p, r.plan).feasible
    assert r.cost == pytest.approx(bc.total)
    assert r.status == "optimal" and r.gap == 0.0
    assert r.bound <= bc.total + 1e-6


def test_solve_capped_none_when_nothing_fits():
    p = Problem.from_lists("nofit", [np.array([1.0, 2.0])], [np.array([5.0, 6.0])], np.array([[0, 1]]), [], [],
                           usage_limit=1.0)
    r = solve_capped(p, 5.0)
    assert r.plan is None and r.status == "infeasible"


def test_iopddl_watchdog_prints_the_streamed_plan_when_the_solver_overruns(monkeypatch, tmp_path):
    """A solver that finds a plan and then hangs (as a native call past its limit would) is killed
    at the deadline; the plan it streamed is the answer, on time."""
    def hang(problem, time_limit_s, progress=None, on_plan=None, **kw):
        on_plan([1, 0], 6.0)
        time.sleep(600)

    monkeypatch.setattr(capped, "solve_capped", hang)
    path = str(tmp_path / "tiny.json")
    Problem.from_lists("tiny", [np.array([1.0, 2.0]), np.array([3.0])], [np.array([1.0, 1.0]), np.array([1.0])],
                       np.array([[0, 2], [1, 2]]), [(0, 1)], [np.array([0.0, 1.0])], usage_limit=5.0).to_iopddl(path)
    t0 = time.perf_counter()
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        plan = iopddl_cli.main_iopddl(path, 4.0, out=f)
    assert time.perf_counter() - t0 < 4.0
    assert plan == [1, 0]
    assert out.read_text().strip().splitlines()[-1] == "[1, 0]"


def test_watchdog_keeps_the_streamed_bound(monkeypatch):
    """A solver killed at the deadline still reports the bound it streamed, and the gap from it."""
    def hang(problem, time_limit_s, progress=None, on_plan=None, on_bound=None, **kw):
        on_plan([1, 0], 6.0)
        on_bound(4.5)
        on_bound(5.0)
        time.sleep(600)

    monkeypatch.setattr(capped, "solve_capped", hang)
    p = Problem.from_lists("tiny", [np.array([1.0, 2.0]), np.array([3.0])], [np.array([1.0, 1.0]), np.array([1.0])],
                           np.array([[0, 2], [1, 2]]), [(0, 1)], [np.array([0.0, 1.0])], usage_limit=5.0)
    t0 = time.perf_counter()
    r = capped.solve_guarded(p, 3.0)
    assert time.perf_counter() - t0 < 3.5
    assert r.plan == [1, 0] and r.cost == 6.0
    assert r.bound == 5.0 and r.gap == pytest.approx(1 / 6) and r.status == "time_limit"


def test_forked_child_runs_highs_after_the_parent_did(monkeypatch):
    """Regression (21f630d): after the parent has run a parallel HiGHS solve, ``solve_guarded``'s
    forked child inherited HiGHS's task scheduler without its worker threads, and its next capped
    MILP waited on them forever (``solvers.ilp.guard.start_child`` resets it: ``solvers.ilp.highs.reset_scheduler``). Without the reset this child
    sits until the deadline (mlp tiny cpu-2x4, cap at 0.8 of the time optimum's peak) and the
    result has no plan from it; with it, the 1 s MILP returns."""
    import shardgym as sg
    import zoo
    from solvers.ilp import solve_ilp

    fn, args = zoo.build("mlp", "tiny")
    p = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset("cpu-2x4"))
    free, _ = solve_ilp(p, time_limit_s=10, threads=2)          # the parent's HiGHS scheduler
    capped_p = p.with_usage_limit(0.8 * evaluate(p, free).peak_memory_bytes)

    def milp_only(problem, time_limit_s, progress=None, **kw):
        # HiGHS's MIP from no start (the LP is fractional here): it hung in the child without the
        # reset; with it, it returns by its 1 s limit, with a plan or (under load) without one
        try:
            solve_ilp(problem, time_limit_s=1.0, threads=2)
        except RuntimeError:
            pass
        progress("child highs returned")
        return capped.CappedResult(None, float("inf"), -float("inf"), None, "time_limit", "none", 0.0)

    monkeypatch.setattr(capped, "solve_capped", milp_only)     # inherited by the forked child
    log = []
    t0 = time.perf_counter()
    capped.solve_guarded(capped_p, 30.0, progress=log.append)   # generous: the machine is shared
    assert "child highs returned" in log, "the forked child's HiGHS call did not return (scheduler hang)"
    assert time.perf_counter() - t0 < 28.0


@pytest.mark.parametrize("load", [0.0, 64.0])
def test_second_search_process_plans_are_kept(monkeypatch, load):
    """On a graph too big for the MILP (here: ``milp_nodes=0``) with an idle core, ``solve_guarded``
    runs a second search process beside the core's child; its plans reach the answer even when the
    child gives none (the child is replaced by one that returns at once without a plan), and they
    fit. On a loaded machine (1-min load 64) it is not started, and nothing comes back."""
    def nothing(problem, time_limit_s, **kw):
        return capped.CappedResult(None, float("inf"), -float("inf"), None, "time_limit", "none", 0.0)

    monkeypatch.setattr(capped, "solve_capped", nothing)       # inherited by the forked child
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (load, load, load))
    p = random_problem(np.random.default_rng(7), 9, kmax=3, edge_p=0.3, limit_q=0.4)
    from solvers.local import least_usage_plan
    anchor = evaluate(p, least_usage_plan(p))
    assert anchor.feasible
    log = []
    t0 = time.perf_counter()
    r = capped.solve_guarded(p, 4.0, progress=log.append,
                             config=capped.CappedConfig(milp_nodes=0, second_min_s=1.0))
    assert time.perf_counter() - t0 < 4.5
    if load > 0:
        assert r.plan is None and not any(m.startswith("second search:") for m in log)
        return
    assert r.plan is not None and r.source == "second search" and evaluate(p, r.plan).feasible
    assert r.cost == pytest.approx(evaluate(p, r.plan).total) and r.cost <= anchor.total
    assert any(m.startswith("second search:") for m in log)


@pytest.mark.parametrize("seed", range(6))
def test_binding_cap_iff_some_plan_breaks_it(seed):
    """``solvers.dispatch.binding_cap`` (its lexsort picks each node's largest usage): without copy
    groups the cap binds iff some plan's peak is over it (brute force over every plan)."""
    from solvers.dispatch import binding_cap
    from tests.ilp_helpers import all_plans
    rng = np.random.default_rng(500 + seed)
    p = random_problem(rng, 6, kmax=3, edge_p=0.4, limit_q=None)
    peaks = sorted(evaluate(p, list(s)).peak_memory_bytes for s in all_plans(p))
    for cap in (peaks[0], peaks[len(peaks) // 2], peaks[-1] - 0.5, peaks[-1], peaks[-1] + 1.0):
        q = p.with_usage_limit(float(cap))
        assert (binding_cap(q) is not None) == (peaks[-1] > cap), (cap, peaks[-1])


@pytest.mark.parametrize("seed", range(3))
def test_later_phases_run_when_no_start_found_a_plan(monkeypatch, seed):
    """With copy groups, the anchor, BP and the search may find no plan that fits while one does: a
    finite bound (here BP's 0) must not count as proving the missing plan optimal, so the MILP still
    runs and finds the optimum (it did not: every phase after the search was skipped)."""
    from types import SimpleNamespace

    from tests.test_edge_memory import _with_random_copies
    rng = np.random.default_rng(700 + seed)
    p = _with_random_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(6)]
    p = p.with_usage_limit(max(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[2], 0.5))
    best, bc = brute_force(p, "time")
    assert best is not None
    monkeypatch.setattr(capped, "fitting_least_usage_plan", lambda *a, **k: None)
    monkeypatch.setattr(capped, "solve_large", lambda *a, **k: None)
    monkeypatch.setattr(capped, "bp_solve", lambda *a, **k: SimpleNamespace(plan=None, lower_bound=0.0, rounds=0))
    monkeypatch.setattr(capped, "cfn_available", lambda: False)
    r = solve_capped(p, 10.0)
    assert r.plan is not None and evaluate(p, r.plan).feasible
    assert r.cost == pytest.approx(bc.total)


def test_toulbar2_time_capped_on_milp_sized_graphs_with_copies(monkeypatch):
    """toulbar2's bound prices node usages alone, so with copy groups it says ~nothing on tight caps
    (~1e-7 s on traced cells whose plans cost ~1e-3 s): there the capped core gives it at most
    ``cfn_copies_max_s`` (0: not at all) and the Lagrangian the rest. Without copies (IOPDDL's B and
    G, which it proves) that field changes nothing. The answer fits either way."""
    import sys
    sys.path.insert(0, "tests")
    from test_edge_memory import _with_random_copies
    calls = []

    def fake_cfn(problem, time_limit_s, **kw):
        calls.append(time_limit_s)
        from solvers.cfn import CFNResult
        return CFNResult(None, float("inf"), -float("inf"), 0, 0.0)

    def called(p, config) -> list:
        calls.clear()
        r = solve_capped(p, 8.0, config=config)
        assert r.plan is None or evaluate(p, r.plan).feasible
        return list(calls)

    monkeypatch.setattr(capped_phases, "cfn_solve", fake_cfn)   # toulbar2's phase lives there
    monkeypatch.setattr(capped, "cfn_available", lambda: True)
    short, off = capped.CappedConfig(cfn_copies_max_s=0.6), capped.CappedConfig(cfn_copies_max_s=0.0)
    ran_with_copies = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        p = random_problem(rng, 6, kmax=3, limit_q=None)
        peaks = sorted(evaluate(p, [int(rng.integers(k)) for k in p.num_strategies]).peak_memory_bytes
                       for _ in range(20))
        plain = p.with_usage_limit(peaks[10])
        assert bool(called(plain, off)) == bool(called(plain, capped.DEFAULT))
        pc = _with_random_copies(rng, p)
        pc = pc.with_usage_limit(sorted(evaluate(pc, [int(rng.integers(k)) for k in p.num_strategies]).peak_memory_bytes
                                        for _ in range(20))[10])
        assert not called(pc, off)
        limits = called(pc, short)
        assert all(t <= 0.6 for t in limits)
        ran_with_copies += bool(limits)
        if ran_with_copies:
            break
    assert ran_with_copies


def test_a_seed_at_the_uncapped_bound_skips_bp_and_the_search(monkeypatch):
    """A seed that costs the uncapped optimum's bound is the capped optimum: the core answers it, "optimal", without
    BP or the search (session 28: outside:mixer cpu-2x4 capped, the policy seed at that bound; 6 s of search, now none)."""
    rng = np.random.default_rng(2811)
    p = random_problem(rng, 8, kmax=3, edge_p=0.5, limit_q=0.5)
    best, bc = brute_force(p)

    def boom(*a, **k):
        raise AssertionError("ran past a seed at the bound")
    monkeypatch.setattr(capped, "uncapped_bound", lambda problem, *a, **k: (bc.total, False, None))
    monkeypatch.setattr(capped, "bp_solve", boom)
    monkeypatch.setattr(capped, "solve_large", boom)
    r = solve_capped(p, 20.0, seeds=[list(best)], config=capped.CappedConfig(uncapped_share=0.15))
    assert r.status == "optimal" and r.cost == pytest.approx(bc.total) and r.source == "seed 0"


@pytest.mark.parametrize("load, want", [(1.5, 1), (0.5, 2)])
def test_busy_threads_on_a_busy_machine(monkeypatch, load, want):
    """``CappedConfig.busy_threads``: with less than one idle core (cores - 1-min load < 1) the core's HiGHS phases
    get that many threads, else min(cores, 8) (two here); seen at the uncapped MILP, the first of them."""
    from dataclasses import replace
    seen = []
    real = capped.uncapped_bound

    def spy(problem, time_limit_s, threads, *a, **kw):
        seen.append(threads)
        return real(problem, time_limit_s, threads, *a, **kw)

    monkeypatch.setattr(capped, "uncapped_bound", spy)
    monkeypatch.setattr(capped.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (load, load, load))
    p = random_problem(np.random.default_rng(7), 6, kmax=3, edge_p=0.5, limit_q=0.4)
    r = solve_capped(p, 8.0, config=replace(capped.DEFAULT, uncapped_share=0.15, busy_threads=1))
    assert seen == [want] and r.cost == pytest.approx(brute_force(p)[1].total)
