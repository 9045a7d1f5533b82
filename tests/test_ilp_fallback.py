"""When HiGHS ends without a plan of its own, the ILP answers with its start plan only if that plan
meets the request's cap and step-time bound (a seed priced without copies can break the cap)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import all_plans, random_problem  # noqa: E402

from costmodel.problem import evaluate  # noqa: E402
from solvers.ilp import reduced  # noqa: E402
from solvers.ilp.types import IlpConfig, Request, RunOptions  # noqa: E402


def _no_incumbent(*args, **kwargs):
    return "time_limit", None, float("nan"), float("nan")


def test_start_plan_is_the_answer_only_within_the_cap(monkeypatch):
    p = random_problem(np.random.default_rng(0), 6, limit_q=None)
    plans = sorted(all_plans(p), key=lambda s: evaluate(p, list(s)).peak_memory_bytes)
    low, high = list(plans[0]), list(plans[-1])
    cap = evaluate(p, low).peak_memory_bytes
    assert evaluate(p, high).peak_memory_bytes > cap
    monkeypatch.setattr(reduced, "run_model", _no_incumbent)
    o = RunOptions(t0=time.perf_counter(), deadline=time.perf_counter() + 5, reduce=True, threads=1,
                   rel_gap=1e-6, verbose=False, forbid=True, memory_cap_bytes=None, config=IlpConfig())
    plan, info = reduced.core(p, o, Request(cap=cap, start=low))
    assert plan == low and info.status == "time_limit"
    with pytest.raises(RuntimeError, match="no feasible plan"):
        reduced.core(p, o, Request(cap=cap, start=high))
    fast = evaluate(p, low).total
    slow = max((list(s) for s in plans), key=lambda s: evaluate(p, s).total)
    if evaluate(p, slow).total > fast:
        with pytest.raises(RuntimeError, match="no feasible plan"):
            reduced.core(p, o, Request(max_step_time_s=fast, start=slow))


def test_guarded_solve_ilp_answers_as_solve_ilp_and_raises_its_errors():
    """``solve_ilp_guarded`` returns the forked child's answer (the same plan and objective as
    ``solve_ilp``) and raises the child's error, with its fields (InfeasibleError's least peak)."""
    from solvers.ilp import InfeasibleError, solve_ilp, solve_ilp_guarded
    rng = np.random.default_rng(7)
    p = random_problem(rng, 5, kmax=3, limit_q=None)
    plan, info = solve_ilp(p, time_limit_s=10)
    gplan, ginfo = solve_ilp_guarded(p, time_limit_s=10)
    assert evaluate(p, gplan).total == pytest.approx(evaluate(p, plan).total) and ginfo.status == info.status
    least = min(evaluate(p, s).peak_memory_bytes for s in all_plans(p))
    with pytest.raises(InfeasibleError) as e:
        solve_ilp_guarded(p, memory_cap_bytes=0.5 * least, time_limit_s=10)
    assert e.value.min_peak_bytes == pytest.approx(least)


def test_guarded_solve_ilp_stops_a_solve_that_overruns(monkeypatch):
    """A solve that ignores its limit (here a sleep standing in for HiGHS's presolve) is killed
    ``grace_s`` past the limit: RuntimeError by then, not 30 s later."""
    from solvers.ilp import guard

    def stuck(problem, time_limit_s=60, **kw):
        time.sleep(30)

    monkeypatch.setattr(guard, "solve_ilp", stuck)      # inherited by the forked child
    p = random_problem(np.random.default_rng(1), 3, kmax=2, limit_q=None)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="overran"):
        guard.solve_ilp_guarded(p, time_limit_s=0.5, grace_s=0.5)
    assert time.perf_counter() - t0 < 10.0


def test_solve_exact_answers_the_best_fitting_seed_when_the_ilp_overruns(monkeypatch):
    """``solvers.dispatch.solve_exact`` (method "ilp") runs the ILP under the watchdog: a solve that
    ignores its limit is stopped 2 s + 5 % past it, and the answer is the seed that is best for the
    objective among those within the cap (status "killed", no bound), not a hang."""
    from solvers import dispatch
    from solvers.ilp import guard

    def stuck(problem, time_limit_s=60, **kw):
        time.sleep(60)

    monkeypatch.setattr(guard, "solve_ilp", stuck)
    p = random_problem(np.random.default_rng(3), 6, limit_q=None)
    plans = [list(s) for s in all_plans(p)]
    by_peak = sorted(plans, key=lambda s: evaluate(p, s).peak_memory_bytes)
    cap = evaluate(p, by_peak[len(by_peak) // 2]).peak_memory_bytes
    capped = p.with_usage_limit(cap)
    over = by_peak[-1]                                  # the cheapest seed in time may break the cap
    fits = [s for s in plans if evaluate(capped, s).feasible]
    seeds = [over] + fits[:5]
    t0 = time.perf_counter()
    plan, info = dispatch.solve_exact(capped, objective="memory", time_limit_s=1.0, initial_plans=seeds)
    assert time.perf_counter() - t0 < 10.0
    assert info["status"] == "killed" and info["bound"] is None
    want = min(fits[:5], key=lambda s: (evaluate(p, s).peak_memory_bytes, evaluate(p, s).total))
    assert evaluate(p, plan).peak_memory_bytes == evaluate(p, want).peak_memory_bytes
    assert info["objective"] == evaluate(p, plan).peak_memory_bytes
    plan, info = dispatch.solve_exact(p, objective="time", time_limit_s=1.0, initial_plans=seeds)
    assert info["status"] == "killed" and info["objective"] == min(evaluate(p, s).total for s in seeds)
    fastest = min(evaluate(p, s).total for s in plans)
    with pytest.raises(RuntimeError, match="no seed plan fits"):
        dispatch.solve_exact(capped, objective="memory", max_step_time_s=fastest - 1, time_limit_s=1.0,
                             initial_plans=seeds)


def test_a_killed_solve_answers_the_best_plan_its_child_found(monkeypatch):
    """The child streams the plans it finds before its last MIP (``solve_ilp(on_incumbent=)``); when
    it is killed the answer is the best of those and the seeds (source "incumbent"), so a kill
    keeps the heuristic work done before HiGHS overran."""
    from solvers import dispatch
    from solvers.ilp import guard
    p = random_problem(np.random.default_rng(0), 6, limit_q=None)
    plans = sorted((list(s) for s in all_plans(p)), key=lambda s: evaluate(p, s).peak_memory_bytes)
    lowest, worst = plans[0], plans[-1]
    assert evaluate(p, lowest).peak_memory_bytes < evaluate(p, worst).peak_memory_bytes

    def finds_then_sticks(problem, time_limit_s=60, on_incumbent=None, **kw):
        on_incumbent(lowest)
        time.sleep(60)

    monkeypatch.setattr(guard, "solve_ilp", finds_then_sticks)
    with pytest.raises(guard.SolveOverrun) as e:
        guard.solve_ilp_guarded(p, time_limit_s=0.5, grace_s=0.5)
    assert e.value.incumbents == [lowest]
    plan, info = dispatch.solve_exact(p, objective="memory", time_limit_s=1.0, initial_plans=[worst])
    assert info["status"] == "killed" and info["source"] == "incumbent"
    assert evaluate(p, plan).peak_memory_bytes == evaluate(p, lowest).peak_memory_bytes


def test_memory_objective_on_gpt_tiny_returns_at_its_limit_well_below_megatron():
    """The contract's call, ``sg.solve(method="ilp", objective="memory")`` on gpt tiny (cpu-2x4),
    hung in HiGHS 1.16's MIP presolve (``strengthenInequalities`` on the copy-memory rows) far past
    its limit; with the MIP's presolve off on models with copy columns HiGHS stops near the limit
    itself (39.7 s of 40 here, under two busy loops). On a loaded 2-core CI run it once overran
    the watchdog's grace (killed at 44.3 s): the answer is then the best plan the child found
    before its last MIP, not a seed. Either way: back by the limit plus the grace, and below
    Megatron's peak (the best seed: the child's plans must beat it). How far below depends on the
    CPU the 40 s get: 0.71x at 40 s with two busy loops, 0.91x under a load of 8 on 2 cores
    (a CI run beside three other jobs); 0.60x at 60 s unloaded (README)."""
    import shardgym as sg
    import zoo
    fn, args = zoo.build("gpt", "tiny", abstract=True)
    problem = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset("cpu-2x4"))
    assert problem.edge_memory is not None
    t0 = time.perf_counter()
    plan = sg.solve(problem, method="ilp", objective="memory", time_limit_s=40)
    assert time.perf_counter() - t0 < 40 + 2 + 0.05 * 40 + 3
    assert plan.info["status"] in ("optimal", "time_limit") or plan.info["source"] == "incumbent"
    megatron = sg.evaluate(problem, sg.solve(problem, method="megatron")).peak_memory_bytes
    assert sg.evaluate(problem, plan).peak_memory_bytes < megatron


def test_refine_skips_a_neighbourhood_whose_milp_overruns(monkeypatch):
    """``solvers.local.refine`` runs each neighbourhood's MILP under the watchdog: a sub-ILP that
    ignores its limit (a sleep standing in for HiGHS, which once ran 20 minutes past a 1.5 s limit
    in the policy's refine) is killed and skipped, so refine returns near its own limit with a
    plan no worse than its start."""
    from solvers.ilp import guard
    from solvers.local.lns import refine

    def stuck(problem, time_limit_s=60, **kw):
        time.sleep(60)

    monkeypatch.setattr(guard, "solve_ilp", stuck)
    p = random_problem(np.random.default_rng(2), 30, kmax=3, limit_q=None)
    start = [0] * p.num_nodes
    t0 = time.perf_counter()
    plan = refine(p, start, time_limit_s=2.0)
    assert time.perf_counter() - t0 < 2.0 + 1.0 + 2.0
    assert list(plan) == start
