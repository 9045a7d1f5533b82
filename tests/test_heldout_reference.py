"""The held-out reference cache (experiments/heldout_reference.py): keyed by a fingerprint that a
changed cost invalidates, the cost only goes down, the bound only up, and a row's reference is the
better of this run's ILP and the cache."""
from dataclasses import replace

import numpy as np

from costmodel.problem import evaluate
from env.workloads import random_problem
from experiments.heldout_reference import load, lookup, problem_fingerprint, record, reference_for
from solvers.local import greedy_by_cost, least_usage_plan


def _problem():
    return random_problem(np.random.default_rng(3), num_nodes=30, memory_cap_fraction=0.6)


def test_fingerprint_sees_costs_and_cap():
    p = _problem()
    assert problem_fingerprint(p) == problem_fingerprint(_problem())
    costs = p.edge_costs.copy()
    costs[0] += 1e-12
    assert problem_fingerprint(replace(p, edge_costs=costs)) != problem_fingerprint(p)
    assert problem_fingerprint(p.with_usage_limit(p.usage_limit * 1.01)) != problem_fingerprint(p)


def test_record_keeps_least_cost_and_greatest_bound(tmp_path):
    path = str(tmp_path / "ref.json")
    p = _problem()
    plans = [least_usage_plan(p), greedy_by_cost(p)]
    plans = [s for s in plans if evaluate(p, s).feasible]
    assert plans
    costs = [evaluate(p, s).total for s in plans]
    for s in plans:
        record("x", p, s, None, "test", path=path)
    e = lookup(load(path), "x", p)
    assert e["cost"] == min(costs)
    assert evaluate(p, e["plan"]).total == min(costs)
    lo = 0.5 * min(costs)
    record("x", p, None, lo, "b1", path=path)
    record("x", p, None, 0.25 * lo, "b2", path=path)      # a weaker bound is not kept
    record("x", p, None, 2.0 * max(costs), "bad", path=path)   # above a known cost: rejected
    e = lookup(load(path), "x", p)
    assert e["bound"] == lo and e["bound_source"] == "b1"
    assert e["cost"] == min(costs) and len(e["runs"]) == len(plans) + 3
    # a changed problem finds nothing; the reference is then this run's ILP
    q = replace(p, node_costs=p.node_costs * 1.5)
    assert lookup(load(path), "x", q) is None
    r = reference_for(load(path), "x", q, 7.0, None)
    assert r == {"ref_cost": 7.0, "ref_source": "ilp", "lower_bound": None}
    r = reference_for(load(path), "x", p, 2 * min(costs), 0.1 * lo)
    assert r["ref_source"] == "cache" and r["ref_cost"] == min(costs) and r["lower_bound"] == lo
    r = reference_for(load(path), "x", p, min(costs), 0.1 * lo)   # ties go to the ILP
    assert r["ref_source"] == "ilp"


def test_guarded_ilp_stopped_answers_the_cheapest_fitting_seed(monkeypatch):
    """eval_policy's 60-s ILP under the watchdog: when HiGHS overruns, the row's plan is the cheapest
    seed that fits, with status "killed" and no bound (not a hang, not a crash)."""
    import solvers.ilp.guard as guard
    from experiments.eval_policy import guarded_ilp
    p = _problem()
    seeds = [s for s in (least_usage_plan(p), greedy_by_cost(p)) if evaluate(p, s).feasible]
    plan, info = guarded_ilp(p, 5.0, seeds)          # the real solve: an answer that fits
    assert evaluate(p, plan).feasible and info.status in ("optimal", "time_limit")

    def overrun(*a, **k):
        raise guard.SolveOverrun("stopped", [])
    monkeypatch.setattr(guard, "solve_ilp_guarded", overrun)
    plan, info = guarded_ilp(p, 5.0, seeds + [[0] * p.num_nodes])
    fits = [evaluate(p, s).total for s in seeds + [[0] * p.num_nodes] if evaluate(p, s).feasible]
    assert info.status == "killed" and info.bound is None
    assert evaluate(p, plan).total == min(fits)
