"""Graphs too big for the capped MILP (``solvers.capped.milp_ok`` false: gpt 125m and up on h100-2x8) under a
cap: ``shardgym.solve(method="ilp")`` goes through the capped core too, with the uncapped MILP beside it
(``solvers.capped_phases.uncapped_beside``, on an idle core). Before (session 25), those graphs went to the plain
guarded ILP, which found no plan in 60 s on gpt 7b h100-2x8 at 58.6 GB and on gpt 125m h100-2x8 at cap fraction
0.05 (no seed fits there) and answered 65 s into a 60 s limit. Here the core is made to find nothing, so the
answer, the proof and the bound can only come from the child beside it; the graphs are tiny, "too big" forced
by ``milp_nodes=0``."""
from __future__ import annotations

import os
import sys
from dataclasses import replace

import numpy as np
import pytest

import shardgym as sg
from costmodel.problem import evaluate
from solvers import capped, dispatch
from solvers.ilp import solve_ilp

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force  # noqa: E402
from ilp_helpers import random_problem as tiny_problem  # noqa: E402
from test_edge_memory import _with_random_copies  # noqa: E402

BIG = capped.CappedConfig(milp_nodes=0, uncapped_beside=True, second_search=False, cfn_min_s=1e9)


def _nothing(problem, time_limit_s, **kw):
    """A core that finds no plan (inherited by the forked child)."""
    return capped.CappedResult(None, float("inf"), -float("inf"), None, "time_limit", "none", 0.0)


def _case(seed: int, binds: bool):
    """A random problem with copy groups and its uncapped optimum, capped at that optimum's peak (``binds``
    False: the cap does not bind it) or 1 B under it (True; the problem is None when no plan fits that cap)."""
    rng = np.random.default_rng(seed)
    p = _with_random_copies(rng, tiny_problem(rng, 7, kmax=3, limit_q=None))
    free, _ = solve_ilp(p, time_limit_s=10)
    peak = evaluate(p, free).peak_memory_bytes
    if not binds:
        return p.with_usage_limit(peak), free
    cap = peak - 1.0      # integral usages and bytes: every plan that fits is 1 B or more under the peak
    opt, _ = brute_force(p, "time", cap=cap)
    return (p.with_usage_limit(cap) if opt is not None and cap > 0 else None), free


@pytest.mark.parametrize("seed", range(4))
def test_a_cap_that_does_not_bind_is_proven_by_the_uncapped_milp_beside(monkeypatch, seed):
    monkeypatch.setattr(capped, "solve_capped", _nothing)
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    p, free = _case(seed, binds=False)
    log = []
    r = capped.solve_guarded(p, 8.0, progress=log.append, config=BIG)
    assert r.plan is not None and evaluate(p, r.plan).feasible, log
    assert r.status == "optimal" and r.cost == pytest.approx(evaluate(p, free).total, rel=1e-9), (r, log)
    assert any("proven by the uncapped milp beside" in m for m in log), log


@pytest.mark.parametrize("seed", range(8))
def test_under_a_binding_cap_its_bound_is_the_uncapped_optimum_and_below_the_capped_one(monkeypatch, seed):
    monkeypatch.setattr(capped, "solve_capped", _nothing)
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    p, free = _case(seed, binds=True)
    if p is None:
        pytest.skip("no cap between the least and the uncapped optimum's peak here")
    opt, oc = brute_force(p, "time", cap=p.usage_limit)
    r = capped.solve_guarded(p, 8.0, config=BIG)
    fc = evaluate(p.with_usage_limit(None), free).total
    assert r.bound == pytest.approx(fc, rel=1e-9) and r.bound <= oc.total * (1 + 1e-9)
    if r.plan is not None:    # the uncapped optimum, repaired with its copies priced
        c = evaluate(p, r.plan)
        assert c.feasible and c.total >= oc.total * (1 - 1e-9) and r.gap == pytest.approx((c.total - fc) / c.total)


def test_not_started_on_a_loaded_machine(monkeypatch):
    monkeypatch.setattr(capped, "solve_capped", _nothing)
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    p, _ = _case(0, binds=False)
    log = []
    r = capped.solve_guarded(p, 4.0, progress=log.append, config=BIG)
    assert r.plan is None and any("no uncapped milp beside" in m for m in log), log


@pytest.mark.parametrize("seed", range(6))
def test_solve_ilp_sends_a_big_capped_graph_to_the_core(monkeypatch, seed):
    """``shardgym.solve(method="ilp")`` under a cap on a graph with copy groups that the core's MILP cannot hold
    runs the core (with the uncapped MILP beside it) and answers a plan that fits, no dearer than the optimum
    found by brute force here (these graphs are tiny)."""
    monkeypatch.setattr(dispatch, "milp_ok", lambda problem, config=None: False)
    monkeypatch.setattr(dispatch, "TRACED", replace(dispatch.TRACED, milp_nodes=0))
    monkeypatch.setattr(capped.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    p, _ = _case(seed, binds=True)
    if p is None or dispatch.binding_cap(p) is None:     # (its rule: every node at its largest usage breaks it)
        pytest.skip("no binding cap here")
    opt, oc = brute_force(p, "time", cap=p.usage_limit)
    log = []
    plan = sg.solve(p, method="ilp", time_limit_s=8, progress=log.append)
    c = evaluate(p, plan)
    assert c.feasible and c.total <= oc.total * (1 + 1e-6), log
    assert any("uncapped milp beside" in m for m in log), log
