"""Copy prices on the edges (solvers/bp_copies.py) in Lagrangian BP (solvers/bp.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers import bp, bp_schedule
from solvers.bp_copies import copy_prices
from solvers.local import LocalCosts
from tests.ilp_helpers import brute_force, random_problem
from tests.test_edge_memory import _problem, _with_random_copies


def test_copy_prices_sit_on_the_entries_that_make_the_copy():
    """Producer 0 in A and a consumer in B make the 10-byte copy (made early: live from step 0 to the
    member's step + 1): only entry (A, B) of each edge is priced, at bytes × Σλ over that span."""
    g = LocalCosts(_problem(usage_limit=8.0))
    cp = copy_prices(g)
    assert not cp(np.zeros(len(g.times))).any()
    lam = np.ones(len(g.times))
    priced = cp(lam).reshape(len(g.eu), 2, 2)
    assert (priced[:, 0, 1] > 0).all() and not priced[:, [0, 1, 1], [0, 0, 1]].any()
    for e, v in enumerate(g.ev.tolist()):     # the consumer's step s: span [0, s + 1) on the grid
        assert priced[e, 0, 1] == pytest.approx(10.0 * np.searchsorted(g.times, g.p.intervals[v][0] + 1))


def test_priced_copies_find_the_optimum_where_the_copy_cannot_fit():
    """Limit 8: the fastest plan's copy (10 bytes) cannot fit; the optimum reads A everywhere (cost 3)."""
    p = _problem(usage_limit=8.0)
    r = bp.bp_solve(p)
    cost = brute_force(p)[1].total
    assert evaluate(p, r.plan).feasible and r.cost == pytest.approx(cost) and r.lower_bound <= cost + 1e-9


@pytest.mark.parametrize("seed", range(20))
def test_bound_stays_valid_and_plans_fit_with_copies(seed):
    """Random capped problems with random copy groups: BP's bound never exceeds the brute-force
    optimum, and a plan it returns fits (copies included) and costs what evaluate says."""
    rng = np.random.default_rng(700 + seed)
    p = _with_random_copies(rng, random_problem(rng, 6, kmax=3, edge_p=0.6, limit_q=None))
    peaks = sorted(evaluate(p, list(x)).peak_memory_bytes for x in np.ndindex(*p.num_strategies))
    p = replace(p, usage_limit=float(peaks[len(peaks) // 4]))
    r = bp.bp_solve(p)
    cost = brute_force(p)[1].total
    assert r.lower_bound <= cost + 1e-9 * abs(cost)
    if r.plan is not None:
        c = evaluate(p, r.plan)
        assert c.feasible and c.total == pytest.approx(r.cost)


def test_copy_priced_phase_runs_copy_rounds_times_the_rounds():
    """``_problem`` with the consumers live to step 6 and B at 2 bytes: the fastest plan (B
    everywhere) is over the limit 8 by its node usages, so the copies are priced and the run goes on
    for ``COPY_ROUNDS`` (3, session 17; 2 before) times the rounds asked; its plan fits and is optimal."""
    from costmodel.problem import Problem
    p = _problem(usage_limit=8.0)
    p = Problem.from_lists("copies", [[0.0, 5.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]],
                           [[4.0, 4.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], [[0, 6], [1, 6], [3, 6], [5, 6]],
                           [[0, 1], [0, 2], [0, 3]], [[0.0] * 4] * 3, usage_limit=8.0, edge_memory=p.edge_memory)
    r = bp.bp_solve(p, rounds=20)
    assert bp.COPY_ROUNDS == 3 and r.rounds == bp.COPY_ROUNDS * 20
    assert evaluate(p, r.plan).feasible and r.cost == pytest.approx(brute_force(p)[1].total)


def test_copies_alone_breaking_the_limit_start_the_copy_priced_phase(monkeypatch):
    """``_problem`` at limit 8: the fastest plan (producer A, every consumer B) holds 5 node bytes, so
    its node usages fit, but its 10-byte copy breaks the limit. The price rule sees that at the first
    price point and runs the copy-priced phase (``COPY_ROUNDS`` x the rounds; before session 25 the
    node usages alone decided, so the run stopped at 20 rounds with every price 0, as it still does
    with ``bp_schedule.COPIES_BIND`` off)."""
    p = _problem(usage_limit=8.0)
    g = LocalCosts(p)
    fastest = np.array([0, 1, 1, 1])
    assert g.profile_of(g.live_usage[g.offs[:-1] + fastest]).max() <= 8.0 < g.profile(fastest).max()
    r = bp.bp_solve(p, rounds=20)
    assert r.rounds == bp.COPY_ROUNDS * 20
    assert evaluate(p, r.plan).feasible and r.cost == pytest.approx(brute_force(p)[1].total)
    monkeypatch.setattr(bp_schedule, "COPIES_BIND", False)
    assert bp.bp_solve(p, rounds=20).rounds == 20


def test_copies_breaking_the_limit_are_priced_on_a_traced_rnn():
    """outside:rnn (tests/data/outside_steps.py, a lax.scan RNN) on cpu-2x4 under the cap half way from
    its least-usage peak to the time-optimal plan's (experiments/eval_outside.py's binding cap): BP's
    argmin plan fits by node usages (0.92 of the cap) and breaks it by its copies. With the copies
    priced BP's plan costs 1.25x the uncapped optimum (1.14x the capped one, ILP 42 s); with the
    prices left at 0 (before session 25) the copy-aware decode, repaired, cost 2.09x (1.90x)."""
    import os
    import sys

    import shardgym as sg
    from experiments.eval_outside import binding_cap
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "data"))
    from outside_steps import STEPS

    step, args = STEPS["rnn"]()
    p = sg.build_problem(sg.trace(step, *args), "cpu-2x4").with_usage_limit(None)
    opt = sg.solve(p, method="ilp", time_limit_s=30)
    cap = binding_cap(p, opt)
    assert cap is not None
    pc = p.with_usage_limit(cap)
    r = bp.bp_solve(pc)
    assert evaluate(pc, r.plan).feasible
    assert r.cost <= 1.5 * evaluate(p, opt).total, r.cost / evaluate(p, opt).total


def _copy_prices_by_member(g):
    """``copy_prices`` as one loop over the members (its form before session 28): the reference."""
    em = g.p.edge_memory
    edge = {(u, v): e for e, (u, v) in enumerate(zip(g.eu.tolist(), g.ev.tolist()))}
    idx, lo, hi, nb = [], [], [], []
    for m in range(len(em.member_node)):
        gi = int(em.member_group[m])
        P, C = int(em.group_node[gi]), int(em.member_node[m])
        e, forward = (edge[(P, C)], True) if (P, C) in edge else (edge.get((C, P)), False)
        if e is None:
            continue
        want = em.member_want[em.want_offsets[m]:em.want_offsets[m + 1]]
        free = em.member_free[em.free_offsets[m]:em.free_offsets[m + 1]]
        act = ~free[:, None] & want[None, :]
        start = np.full(len(free), int(np.searchsorted(g.times, em.member_time[m])))
        early = em.group_early[em.early_offsets[gi]:em.early_offsets[gi + 1]]
        if len(early):
            start = np.where(early, int(np.searchsorted(g.times, em.group_time[gi])), start)
        start = np.broadcast_to(start[:, None], act.shape)
        act, start = (act, start) if forward else (act.T, start.T)
        flat = act.ravel()
        idx.append(g.eoff[e] + np.nonzero(flat)[0])
        lo.append(start.ravel()[flat])
        hi.append(np.full(int(flat.sum()), int(np.searchsorted(g.times, em.member_time[m] + 1))))
        nb.append(np.full(int(flat.sum()), float(em.group_bytes[gi])))
    if not idx or not sum(map(len, idx)):
        return None
    hi_a = np.concatenate(hi)
    return np.concatenate(idx), np.minimum(np.concatenate(lo), hi_a), hi_a, np.concatenate(nb)


@pytest.mark.parametrize("seed", range(30))
def test_vectorised_copy_prices_equal_the_member_loop(seed):
    """Random problems with random copy groups (members on edges either way round, on no edge, early
    copies or not): the vectorised ``copy_prices`` gives the member loop's entries in its order, so the
    priced edge costs are the same bit for bit."""
    rng = np.random.default_rng(900 + seed)
    p = _with_random_copies(rng, random_problem(rng, 7, kmax=4, edge_p=0.5, limit_q=None))
    g = LocalCosts(p)
    cp, ref = copy_prices(g), _copy_prices_by_member(g)
    assert (cp is None) == (ref is None)
    if ref is None:
        return
    for name, a in zip(("idx", "lo", "hi", "nbytes"), ref):
        assert np.array_equal(getattr(cp, name), a) and getattr(cp, name).dtype == a.dtype, name
    lam = rng.random(len(g.times))
    assert np.array_equal(cp(lam), np.bincount(ref[0], ref[3] * np.maximum(np.cumsum(np.r_[0.0, lam])[ref[2]]
                                                                            - np.cumsum(np.r_[0.0, lam])[ref[1]], 0.0),
                                               minlength=len(g.ec)))
