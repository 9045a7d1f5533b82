"""A seed computed beside the capped core (``solvers.capped.solve_guarded``'s ``late``; the policy
seed of ``solve(method="ilp")`` under a binding cap): the core's later phases start from it, it is
a candidate answer, and a seed still running at the limit never delays the answer."""
from __future__ import annotations

import itertools
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers import capped, dispatch
from solvers.ilp.guard import start_child
from tests.ilp_helpers import brute_force, random_problem


def _case(seed=3):
    rng = np.random.default_rng(900 + seed)
    p = random_problem(rng, 7, kmax=3, edge_p=0.5, limit_q=0.4)
    best, bc = brute_force(p)
    fits = [list(s) for s in itertools.product(*[range(int(k)) for k in p.num_strategies]) if evaluate(p, list(s)).feasible]
    worst = max(fits, key=lambda s: evaluate(p, s).total)
    assert evaluate(p, worst).total > bc.total * (1 + 1e-6)
    return p, [int(x) for x in best], bc.total, worst


def _weak_core(monkeypatch, worst, tmp_path):
    """The core's phases can only keep their start (the worst fitting plan); the MILP phase records its start."""
    def milp(problem, time_limit_s, best, *a, **k):
        (tmp_path / "milp_start.json").write_text(json.dumps(best[0]))
        return None
    monkeypatch.setattr(capped, "fitting_least_usage_plan", lambda *a, **k: list(worst))
    monkeypatch.setattr(capped, "bp_solve", lambda *a, **k: SimpleNamespace(plan=None, lower_bound=-np.inf, rounds=0))
    monkeypatch.setattr(capped, "cfn_available", lambda: False)
    monkeypatch.setattr(capped, "solve_large", lambda problem, t, starts=(), **k: time.sleep(1.5) or starts[0])
    monkeypatch.setattr(capped, "capped_milp", milp)
    monkeypatch.setattr(capped, "refine", lambda problem, plan, *a, **k: plan)


def _seed_child(plan, delay_s):
    return start_child(lambda send: time.sleep(delay_s) or send.send(("plan", plan, delay_s)))


def test_late_seed_reaches_the_core_and_the_answer(monkeypatch, tmp_path):
    p, best, cost, worst = _case()
    _weak_core(monkeypatch, worst, tmp_path)
    r = capped.solve_guarded(p, 8.0, late=_seed_child(best, 0.5))
    assert r.cost == pytest.approx(cost) and evaluate(p, r.plan).feasible
    # the seed arrived during the (slow) search: the MILP phase started from it
    assert json.loads((tmp_path / "milp_start.json").read_text()) == best
    # without it the weak core keeps its start
    r0 = capped.solve_guarded(p, 8.0)
    assert r0.cost == pytest.approx(evaluate(p, worst).total)


def test_a_seed_still_running_at_the_limit_is_killed_not_waited_for(monkeypatch, tmp_path):
    p, best, cost, worst = _case()
    _weak_core(monkeypatch, worst, tmp_path)
    late = _seed_child(best, 60.0)
    t = time.perf_counter()
    r = capped.solve_guarded(p, 3.0, late=late)
    assert time.perf_counter() - t < 3.5 and not late[0].is_alive()
    assert r.plan is not None and evaluate(p, r.plan).feasible and r.source != "late seed"


def test_policy_seed_runs_beside_the_core_and_bounds_the_answer(monkeypatch, tmp_path):
    p, best, cost, worst = _case()
    _weak_core(monkeypatch, worst, tmp_path)
    monkeypatch.setattr(dispatch, "POLICY_SEED_MIN_S", 0.0)
    monkeypatch.setattr(dispatch, "_beside", lambda: True)      # as with an idle core
    primed = []

    def policy(q):
        assert not primed or primed == ["parent"]    # primed in the parent, before the fork
        time.sleep(0.5)
        return best
    policy.prime = lambda: primed.append("parent")
    t = time.perf_counter()
    plan, info = dispatch.solve_capped_time(p, 6.0, t, policy_seed=policy)
    assert primed == ["parent"] and time.perf_counter() - t < 6.5
    assert evaluate(p, plan).total == pytest.approx(cost) and evaluate(p, plan).feasible

    def no_plan(q):
        raise ValueError("nothing fits")
    plan, info = dispatch.solve_capped_time(p, 4.0, time.perf_counter(), policy_seed=no_plan)
    assert evaluate(p, plan).feasible


def test_busy_machine_runs_the_policy_first_and_skips_the_cores_bp_with_copies(monkeypatch, tmp_path):
    """No idle core: the planner runs inline before the core (its plan a seed); with copy groups the
    core then skips its own BP (the planner's decode is BP), without them it keeps it."""
    from tests.test_edge_memory import _with_random_copies
    rng = np.random.default_rng(905)
    monkeypatch.setattr(dispatch, "POLICY_SEED_MIN_S", 0.0)
    monkeypatch.setattr(dispatch, "_beside", lambda: False)

    def bp(*a, **k):
        (tmp_path / "bp_ran").write_text("1")
        return SimpleNamespace(plan=None, lower_bound=-np.inf, rounds=0)
    monkeypatch.setattr(capped, "bp_solve", bp)
    for copies in (False, True):
        p = random_problem(rng, 7, kmax=3, edge_p=0.5, limit_q=None)
        if copies:
            p = _with_random_copies(rng, p)
        plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
        p = p.with_usage_limit(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[4])
        best, bc = brute_force(p, "time")
        (tmp_path / "bp_ran").unlink(missing_ok=True)
        log = []
        plan, info = dispatch.solve_capped_time(p, 6.0, time.perf_counter(), policy_seed=lambda q: best, progress=log.append)
        assert any(m.startswith("policy seed: ") and "beside" not in m for m in log), log   # waited for, inline
        assert evaluate(p, plan).feasible and evaluate(p, plan).total <= bc.total * (1 + 1e-9)
        assert (tmp_path / "bp_ran").exists() != copies


def test_busy_machine_waits_for_the_policy_seed_only_its_share(monkeypatch, tmp_path):
    """On a busy machine the core waits for the planner at most ``POLICY_SEED_SHARE`` of the limit;
    a planner still running then finishes beside the core, and its plan is still the answer."""
    p, best, cost, worst = _case()
    _weak_core(monkeypatch, worst, tmp_path)
    monkeypatch.setattr(dispatch, "POLICY_SEED_MIN_S", 0.0)
    monkeypatch.setattr(dispatch, "_beside", lambda: False)
    monkeypatch.setattr(dispatch, "POLICY_SEED_SHARE", 0.25)    # 2 s of 8
    log = []
    t = time.perf_counter()
    plan, info = dispatch.solve_capped_time(p, 8.0, t, policy_seed=lambda q: time.sleep(4.0) or best,
                                            progress=lambda m: log.append((time.perf_counter() - t, m)))
    assert time.perf_counter() - t < 8.5
    waited = [at for at, m in log if "still running" in m]
    assert waited and 1.5 < waited[0] < 3.5, log           # the core started at the share, not after the planner
    assert evaluate(p, plan).total == pytest.approx(cost) and evaluate(p, plan).feasible


def test_with_copies_the_seed_is_the_planners_raw_decode(monkeypatch, tmp_path):
    """On a busy machine, with copy groups, the core is seeded with the planner's raw decode (the
    callable's ``raw``; ``dispatch.POLICY_SEED_SEARCH``: the core runs the planner's search itself);
    without copies, with ``POLICY_SEED_SEARCH``, or beside the core on an idle core, with its full
    plan. Primed in the parent either way; the answer fits and is never worse than the seed."""
    from tests.test_edge_memory import _with_random_copies
    rng = np.random.default_rng(906)
    monkeypatch.setattr(dispatch, "POLICY_SEED_MIN_S", 0.0)
    for copies, search, idle in ((True, False, False), (False, False, False), (True, True, False), (True, False, True)):
        monkeypatch.setattr(dispatch, "POLICY_SEED_SEARCH", search)
        monkeypatch.setattr(dispatch, "_beside", lambda idle=idle: idle)
        p = random_problem(rng, 6, kmax=3, edge_p=0.5, limit_q=None)
        if copies:
            p = _with_random_copies(rng, p)
        plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
        p = p.with_usage_limit(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[4])
        seed = min((s for s in plans if evaluate(p, s).feasible), key=lambda s: evaluate(p, s).total)
        for f in tmp_path.iterdir():
            f.unlink()

        def policy(q):
            (tmp_path / "search").write_text("1")
            return seed
        policy.raw = lambda q: (tmp_path / "raw").write_text("1") and seed
        policy.prime = lambda: (tmp_path / "primed").write_text("1")
        plan, info = dispatch.solve_capped_time(p, 2.5, time.perf_counter(), policy_seed=policy)
        ran = sorted(f.name for f in tmp_path.iterdir())
        assert ran == ["primed", "raw" if copies and not (search or idle) else "search"], (copies, search, idle, ran)
        assert evaluate(p, plan).feasible and evaluate(p, plan).total <= evaluate(p, seed).total * (1 + 1e-9)


def test_busy_machine_with_copies_gets_the_planners_search_after_its_raw_decode(monkeypatch, tmp_path):
    """``dispatch.POLICY_SEARCH_AFTER_RAW``: on a busy machine with copy groups the core starts from the
    planner's raw decode at once, and the planner's full plan (``method="policy"``'s search), computed
    after it in the same child beside the core, is a late seed: the answer is never dearer than it. Here
    the raw decode is the dearest fitting plan, the full plan the brute-force optimum and the core
    (``_weak_core``) cannot leave its start: without the switch the answer is the raw decode."""
    from tests.test_edge_memory import _with_random_copies
    rng = np.random.default_rng(907)
    p = _with_random_copies(rng, random_problem(rng, 6, kmax=3, edge_p=0.5, limit_q=None))
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
    p = p.with_usage_limit(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[4])
    best, bc = brute_force(p, "time")
    fits = [list(s) for s in itertools.product(*[range(int(k)) for k in p.num_strategies]) if evaluate(p, list(s)).feasible]
    worst = max(fits, key=lambda s: evaluate(p, s).total)
    assert p.edge_memory is not None and (bc.total, evaluate(p, worst).total) == (205.0, 321.0)   # by brute force, 18 fit
    _weak_core(monkeypatch, worst, tmp_path)
    monkeypatch.setattr(dispatch, "POLICY_SEED_MIN_S", 0.0)
    monkeypatch.setattr(dispatch, "_beside", lambda: False)

    def policy(q):
        time.sleep(1.0)       # the search: the core has started from the raw decode by then
        return [int(x) for x in best]
    policy.raw = lambda q: list(worst)
    for after, want in ((True, bc.total), (False, evaluate(p, worst).total)):
        monkeypatch.setattr(dispatch, "POLICY_SEARCH_AFTER_RAW", after)
        log = []
        t = time.perf_counter()
        plan, info = dispatch.solve_capped_time(p, 4.0, t, policy_seed=policy, progress=log.append)
        assert time.perf_counter() - t < 4.5
        assert evaluate(p, plan).feasible and evaluate(p, plan).total == pytest.approx(want), (after, log)
        assert any(m.startswith("policy seed: ") for m in log)                # the raw decode, waited for inline
        assert any(m.startswith("late seed: ") for m in log) == after, log   # the search's plan, beside


def test_beside_the_planner_sends_its_raw_decode_then_its_plan_stopped_before_the_limit(monkeypatch, tmp_path):
    """On an idle core a planner with ``limited`` (``shardgym.api._policy_plan``) sends its raw decode first (a seed
    at once), then its full plan under a limit that ends ``BESIDE_MARGIN_S`` before the core's: the answer is that plan
    (the weak core keeps its start), and the limit the planner got is the time left less the margin."""
    p, best, cost, worst = _case()
    _weak_core(monkeypatch, worst, tmp_path)
    monkeypatch.setattr(dispatch, "POLICY_SEED_MIN_S", 0.0)
    monkeypatch.setattr(dispatch, "_beside", lambda: True)
    said = tmp_path / "limit.txt"     # the planner runs in a forked child

    def policy(q):
        raise AssertionError("beside, the planner with a limit is called through .raw and .limited")
    policy.raw = lambda q: list(worst)
    policy.limited = lambda q, seconds: said.write_text(repr(seconds)) or time.sleep(0.3) or best
    t = time.perf_counter()
    plan, info = dispatch.solve_capped_time(p, 8.0, t, policy_seed=policy)
    assert time.perf_counter() - t < 8.5
    assert evaluate(p, plan).total == pytest.approx(cost) and evaluate(p, plan).feasible
    assert 8.0 - dispatch.BESIDE_MARGIN_S - 1.0 < float(said.read_text()) <= 8.0 - dispatch.BESIDE_MARGIN_S
