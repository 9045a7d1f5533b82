"""The LNS neighbourhood MILP (solvers/local/subproblem.py, solvers/local/lns.py): the fixed outside usage is merged into one
background node per run of time points with no neighbourhood event, which must keep "a sub plan
fits iff the whole plan fits"; and ``improve`` with two starts refines only the cheaper polished one."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import solvers.local.lns as lns_mod
import solvers.local.subproblem as sub_mod
from costmodel.problem import evaluate
from solvers.local import LocalCosts
from tests.ilp_helpers import random_problem
from tests.test_edge_memory import _with_random_copies


def neighbourhood_plans(p, s, sel, sub) -> list:
    """Every plan of the neighbourhood ``sel`` (the rest at ``s``) as (whole plan, its cost): each
    asserted to fit ``sub`` iff the whole plan fits, at the same cost up to a constant."""
    pad = [0] * (sub.num_nodes - len(sel))
    base = evaluate(p, s).total - evaluate(sub, [int(x) for x in s[sel]] + pad).total
    out = []
    for x in itertools.product(*[range(int(p.num_strategies[i])) for i in sel]):
        t = s.copy()
        t[sel] = x
        cs, cf = evaluate(sub, list(x) + pad), evaluate(p, t)
        assert cs.feasible == cf.feasible, (x, cs.peak_memory_bytes, cf.peak_memory_bytes, p.usage_limit)
        assert cs.total + base == pytest.approx(cf.total)
        out.append((t, cf))
    return out


def test_merged_background_keeps_fit_iff_and_merges_long_runs():
    """Long intervals and a 1-2-node neighbourhood: the background has fewer nodes than covered
    time points, and every plan of the neighbourhood fits the subproblem iff the whole plan fits,
    at the same cost up to a constant."""
    rng = np.random.default_rng(3)
    checked = merged = 0
    for _ in range(40):
        p = random_problem(rng, 10, kmax=3, limit_q=None, tmax=24)
        if rng.random() < 0.5:
            p = _with_random_copies(rng, p)
        plans = [np.array([rng.integers(k) for k in p.num_strategies]) for _ in range(8)]
        p = p.with_usage_limit(max(sorted(evaluate(p, x).peak_memory_bytes for x in plans)[4], 0.5))
        s = next((x for x in plans if evaluate(p, x).feasible), None)
        if s is None:
            continue
        g = LocalCosts(p)
        sel = np.sort(rng.choice(p.num_nodes, size=int(rng.integers(1, 3)), replace=False))
        seen = []
        real = sub_mod._background
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sub_mod, "_background", lambda t, cover, *a: seen.append(int((cover > 0).sum()))
                       or seen.append(len(out := real(t, cover, *a))) or out)
            sub, _ = sub_mod.subproblem(g, s, sel)
        merged += seen[1] < seen[0]
        checked += len(neighbourhood_plans(p, s, sel, sub))
    assert checked > 50 and merged > 10


def test_background_runs_split_at_events_and_gaps():
    """Runs break where a neighbourhood event falls or a point is uncovered; each holds its maximum."""
    times = np.array([0, 2, 4, 6, 8, 10])
    cover = np.array([1, 1, 1, 0, 1, 1])
    bg = np.array([5.0, 7.0, 3.0, 9.0, 1.0, -2.0])
    assert sub_mod._background(times, cover, bg, np.array([4])) == [(0, 4, 7.0), (4, 6, 3.0), (8, 11, 1.0)]


def test_improve_with_two_starts_refines_the_cheaper_polished_one_once(monkeypatch):
    """A Lagrangian start that differs from the plan: both polished, one refine (the full limit)
    from the cheaper, the answer fits and costs at most either polished start."""
    p = random_problem(np.random.default_rng(11), 9, kmax=3, edge_p=0.5, limit_q=0.6)
    from solvers.local import least_usage_plan, polish
    a = np.asarray(least_usage_plan(p))
    uniform = (np.array([j % k for k in p.num_strategies]) for j in range(3))   # all first, all second, ...
    b = next((x for x in uniform if evaluate(p, x).feasible and not np.array_equal(x, a)), None)
    assert evaluate(p, a).feasible and b is not None
    monkeypatch.setattr(lns_mod, "lagrange_starts", lambda *args, **kw: (b, -np.inf))
    calls = []
    real = lns_mod.refine
    monkeypatch.setattr(lns_mod, "refine", lambda prob, x, t, seed=0: calls.append(t) or real(prob, x, t, seed=seed))
    out = lns_mod.improve(p, a, refine_time_limit_s=0.3, lagrange_time_limit_s=1.0)
    assert calls == [0.3]
    c = evaluate(p, out)
    polished = [evaluate(p, polish(p, x, time_limit_s=0.5)).total for x in (a, b)]
    assert c.feasible and c.total <= min(polished) + 1e-9
