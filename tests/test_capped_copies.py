"""Capped solving on problems whose resharded copies are edge memory (``Problem.edge_memory``):
every solver that runs under a cap prices the copies itself (the surrogate-cap heuristic in the API,
``solvers.dispatch.fit_copies``, is gone). Checked on tiny problems against brute force and
``evaluate`` (which prices the copies), solver by solver, and end to end on gpt tiny.

Before: the least-usage plan anchored the capped core and the search, and "no plan fits" was
answered whenever its copies put it over the cap, although other plans fit (unet tiny on cpu-2x4,
the cap halfway between the memory plan's and the time optimum's peaks)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import shardgym as sg
import zoo
from agent.beam import beam_search
from costmodel.problem import evaluate
from costmodel.profile import live_on
from solvers.bp import bp_solve
from solvers.capped import solve_capped
from solvers.cfn import available as cfn_available
from solvers.cfn import cfn_solve
from solvers.local import CopyMoves, fitting_least_usage_plan, least_usage_plan, repair_memory
from solvers.search import solve_large

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, check_lagrangian_bound, random_problem  # noqa: E402
from test_edge_memory import _problem, _with_random_copies  # noqa: E402


def _copy_bytes_at(p, s, t) -> float:
    a, b, by = p.edge_memory.intervals(np.asarray(s, dtype=np.int64))
    return float(live_on(np.array([t]), a, b, by)[0])


def _ordered(em) -> bool:
    """Every reader's step at or after its producer's (as in traces; the random generator also
    makes readers before the producer, whose early copy then has an empty interval)."""
    return bool(np.all(em.member_time >= em.group_time[em.member_group]))


def _dual_role(em) -> set:
    """Nodes that produce and read one group's copy, or read it twice (CopyMoves' approximation)."""
    out = set()
    for g in range(em.num_groups):
        readers = em.member_node[em.member_offsets[g]:em.member_offsets[g + 1]].tolist()
        out |= {v for v in readers if readers.count(v) > 1 or v == int(em.group_node[g])}
    return out


def test_copy_moves_match_repricing_every_single_move():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(40):
        p = _with_random_copies(rng, random_problem(rng, int(rng.integers(2, 6)), kmax=3, limit_q=None))
        cm, em, offs = CopyMoves(p), p.edge_memory, p.strategy_offsets
        if not _ordered(em):
            continue
        skip = _dual_role(em)
        for _ in range(3):
            s = np.array([rng.integers(k) for k in p.num_strategies])
            for t in em.time_points().tolist():
                saved, base = cm.saved_at(s, t), _copy_bytes_at(p, s, t)
                for i in set(range(p.num_nodes)) - skip:
                    for b in range(int(p.num_strategies[i])):
                        s2 = s.copy()
                        s2[i] = b
                        assert saved[offs[i] + b] == pytest.approx(base - _copy_bytes_at(p, s2, t)), (i, b, t)
                        checked += 1
    assert checked > 500


def test_hand_case_least_usage_plan_breaks_the_cap_but_the_solvers_fit():
    """The 4-node case of test_edge_memory: the least-usage plan (producer A, readers B) holds the
    10-byte shared copy over [0, 6): peak 15 > cap 6. Plans that fit: no reader of B under a
    producer in A. Optimum: everything in A, cost 3 (everything in B costs 5)."""
    p = _problem(usage_limit=6.0)
    assert not evaluate(p, least_usage_plan(p)).feasible
    fit = fitting_least_usage_plan(p)
    assert fit is not None and evaluate(p, fit).feasible
    best, bc = brute_force(p, "time")
    assert bc.total == 3.0
    r = solve_capped(p, 4.0)
    assert r.plan is not None and evaluate(p, r.plan).feasible and r.cost == pytest.approx(3.0)
    assert r.bound <= 3.0 + 1e-9
    s = solve_large(p, 2.0)
    assert s is not None and evaluate(p, s).feasible
    b = bp_solve(p, rounds=30)
    assert b.lower_bound <= 3.0 + 1e-9 and (b.plan is None or evaluate(p, b.plan).feasible)
    assert evaluate(p, beam_search(p, width=2)).feasible    # its bound sees node usages only


@pytest.mark.parametrize("seed", range(4))
def test_capped_solvers_against_brute_force_with_copies(seed):
    rng = np.random.default_rng(100 + seed)
    p = _with_random_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
    cap = max(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[3], 0.5)
    p = p.with_usage_limit(cap)
    best, bc = brute_force(p, "time")
    r = solve_capped(p, 4.0)
    if best is None:
        assert r.plan is None
        return
    opt = bc.total
    assert r.plan is not None and evaluate(p, r.plan).feasible
    assert r.cost == pytest.approx(opt) and r.bound <= opt + 1e-6 * abs(opt)
    b = bp_solve(p, rounds=30)      # its prices see node usages: a relaxation, so the bound holds
    assert b.lower_bound <= opt + 1e-6 * abs(opt)
    assert b.plan is None or (evaluate(p, b.plan).feasible and b.cost >= opt - 1e-9)
    s = solve_large(p, 1.5, starts=[r.plan])
    assert s is not None and evaluate(p, s).feasible and evaluate(p, s).total >= opt - 1e-9
    rep = repair_memory(p, least_usage_plan(p))
    assert rep is None or evaluate(p, rep).feasible
    if cfn_available():
        c = cfn_solve(p, 2.0, starts=[r.plan])
        assert c.lower_bound <= opt + 1e-6 * abs(opt)
        assert c.plan is None or evaluate(p, c.plan).feasible


@pytest.fixture(scope="module")
def gpt_capped():
    fn, args = zoo.build("gpt", "tiny", abstract=True)
    p = sg.build_problem(sg.trace(fn, *args), sg.Cluster.preset("cpu-2x4")).with_usage_limit(None)
    assert p.edge_memory is not None
    fast = sg.solve(p, method="ilp", time_limit_s=10)
    cap = 0.84 * sg.evaluate(p, fast).peak_memory_bytes
    assert not sg.evaluate(p.with_usage_limit(cap), fast).feasible   # the cap binds
    return p, cap


@pytest.mark.parametrize("kw", [dict(method="ilp", time_limit_s=15), dict(method="policy", search=False)],
                         ids=["ilp", "policy-raw"])
def test_binding_cap_with_copies_gives_a_plan_that_fits(gpt_capped, kw):
    p, cap = gpt_capped
    plan = sg.solve(p, memory_cap_bytes=cap, **kw)
    cost = sg.evaluate(p.with_usage_limit(cap), plan)
    assert cost.feasible, (cost.peak_memory_bytes, cap)
    if kw["method"] == "ilp" and plan.info.get("bound") is not None:   # a bound that holds for the copies
        assert plan.info["bound"] <= cost.total * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_memory_objective_with_copies_reports_a_bound_at_its_time_limit(monkeypatch, seed):
    """The min-peak model with copies, stopped before HiGHS has a dual bound (as gpt tiny cpu-2x4 at
    15 s: bound -inf, gap NaN before): the answer's bound is the copy-free least peak, a valid
    lower bound (copies only add bytes), and the gap is measured from it."""
    import solvers.ilp.memory as mem
    from solvers.ilp import solve_ilp

    real = mem.core

    def timed_out(problem, o, req):
        out = real(problem, o, req)
        if out is None or req.objective != "memory":
            return out
        plan, info = out
        return plan, info.but(status="time_limit", bound=float("nan"), gap=float("nan"))

    monkeypatch.setattr(mem, "core", timed_out)
    rng = np.random.default_rng(300 + seed)
    p = _with_random_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    best, bc = brute_force(p, "memory")
    plan, info = solve_ilp(p, objective="memory", time_limit_s=5)
    peak = evaluate(p, plan).peak_memory_bytes
    assert info.status == "time_limit" and np.isfinite(info.bound) and np.isfinite(info.gap)
    assert info.bound <= bc.peak_memory_bytes + 1e-9 <= peak + 1e-9
    assert info.gap == pytest.approx((peak - info.bound) / peak)


def test_repair_tied_prices_the_copy_a_move_makes_live():
    """Producer 0 (1 byte both ways, [0, 2)); reader 1 at step 1 (A 5 bytes, B 1; B is cheaper) needs
    a 10-byte copy when it reads B from a producer in A; node 2 over [0, 2) (X 4 bytes, Y 0; Y costs 3).
    Plan (A, A, X) holds 10 at step 1, cap 6. By node bytes, reader 1 to B saves 4 for nothing and
    is taken, and the pruned graph's profile (no copies) then calls (A, B, X) fitting: 16 bytes with
    its copy. Priced with the copy (saves 4 - 10), only node 2 to Y helps: (A, A, Y), 6 bytes, fits."""
    from costmodel.edge_memory import CopyGroups
    from costmodel.problem import Problem
    from solvers.local import prepare, repair_tied
    em = CopyGroups.from_lists([(0, 10.0, [(1, 1, [False, True], [False, True])])])
    p = Problem.from_lists("tied-copy", [[0.0, 10.0], [1.0, 0.0], [0.0, 3.0]], [[1.0, 1.0], [5.0, 1.0], [4.0, 0.0]],
                           [[0, 2], [1, 2], [0, 2]], [[0, 1]], [[0.0, 0.0, 0.0, 0.0]], usage_limit=6.0, edge_memory=em)
    pr, g2, C, gc = prepare(p)
    sc = C.contract(pr.from_orig(np.array([0, 0, 0])))
    old = repair_tied(C, gc, sc, 2.0)                 # node bytes only
    assert old is None or not evaluate(p, pr.to_orig(C.expand(old))).feasible
    rep = repair_tied(C, gc, sc, 2.0, pr=pr)
    assert rep is not None
    plan = pr.to_orig(C.expand(rep))
    assert plan.tolist() == [0, 0, 1] and evaluate(p, plan).feasible


def test_lns_subproblem_prices_the_copies_of_its_moves():
    """Every plan of an LNS neighbourhood (the rest fixed at a fitting plan) fits in the subproblem
    iff the whole plan fits with its copies, and costs the same up to a constant."""
    from solvers.ilp import solve_ilp
    from solvers.local import LocalCosts
    from solvers.local.lns import _subproblem
    from tests.test_lns_sub import neighbourhood_plans
    rng = np.random.default_rng(7)
    checked = solved = 0
    for _ in range(60):
        p = _with_random_copies(rng, random_problem(rng, int(rng.integers(3, 6)), kmax=3, limit_q=None))
        plans = [np.array([rng.integers(k) for k in p.num_strategies]) for _ in range(8)]
        peaks = sorted(evaluate(p, x).peak_memory_bytes for x in plans)
        p = p.with_usage_limit(max(peaks[4], 0.5))
        s = next((x for x in plans if evaluate(p, x).feasible), None)
        if s is None:
            continue
        g = LocalCosts(p)
        sel = np.sort(rng.choice(p.num_nodes, size=int(rng.integers(1, p.num_nodes)), replace=False))
        sub, _ = _subproblem(g, s, sel)
        plans = neighbourhood_plans(p, s, sel, sub)   # each: fits sub iff fits whole, same cost + constant
        best = min((cf.total for _, cf in plans if cf.feasible), default=np.inf)
        checked += len(plans)
        pad = [0] * (sub.num_nodes - len(sel))
        if solved < 10:                 # the MILP on it (copy columns) finds the neighbourhood's optimum
            plan, _ = solve_ilp(sub, time_limit_s=5.0, initial_plan=[int(x) for x in s[sel]] + pad, reduce=True,
                                relax_cap=False)
            t = s.copy()
            t[sel] = plan[:len(sel)]
            assert evaluate(p, t).feasible and evaluate(p, t).total == pytest.approx(best)
            solved += 1
    assert checked > 100 and solved == 10


@pytest.mark.parametrize("early", [True, False])
def test_lagrangian_bound_sees_the_copies_on_the_hand_case(early):
    """The 4-node case at cap 10: every plan reading layout B from a producer in A holds the
    10-byte copy beside the producer's 4 and a reader's 1 (15 > 10), so the capped optimum is 3
    (producer A, every reader A; brute force). Node usages alone never pass 5 bytes: every bound
    that ignores the copies is the uncapped optimum, 0. The Lagrangian bound with the copies' edge
    terms is valid (<= 3) and above 0. Short-lived copies (one per reader's step) are priced
    exactly by their terms, so it reaches the Lagrangian dual: with one price μ per reader step,
    min(3 - 15μ, 15μ) at μ = 0.1 is 1.5 (every other plan is dearer at that μ)."""
    from dataclasses import replace

    from solvers.lagrange import lagrangian_bound
    p = _problem(usage_limit=10.0, early=early)
    best, bc = brute_force(p, "time")
    assert bc.total == 3.0
    free = replace(p, edge_memory=None)
    assert lagrangian_bound(free, 5.0, upper=3.0).bound == pytest.approx(0.0, abs=1e-9)
    assert bp_solve(p, rounds=30).lower_bound <= 1e-9
    b = lagrangian_bound(p, 10.0, upper=3.0).bound
    assert 0.4 < b <= 3.0 + 1e-9
    if not early:
        assert b == pytest.approx(1.5, rel=0.02)


@pytest.mark.parametrize("restart", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_lagrangian_bound_is_below_the_brute_force_capped_optimum(seed, restart):
    """Random 5-node problems with random copy groups (early and short-lived, members before the
    producer's step, readers sharing a step), caps that bind: the bound never passes the capped
    optimum, whichever plan picks the representatives, with or without the restarts from the best
    prices; every relaxed plan is a complete plan."""
    rng = np.random.default_rng(300 + seed)
    check_lagrangian_bound(rng, _with_random_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None)), restart=restart)


def test_least_peak_cap_gets_a_plan_where_the_anchor_repair_fails():
    """At the least achievable peak (brute force, copies priced) the repaired least-usage plan
    (``fitting_least_usage_plan``) can still break the cap; the capped core's memory-first phase
    (``solvers.capped_phases.least_peak``: the memory objective's plans) finds one that fits, and so does
    ``solve_capped``. (vit tiny cpu-2x4 at a 25 % cap: no plan in 60 s, session 11.)"""
    from solvers.capped_phases import least_peak
    anchor_failed = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        p = _with_random_copies(rng, random_problem(rng, int(rng.integers(4, 8)), kmax=3, limit_q=None))
        _, least = brute_force(p, "memory")
        pc = p.with_usage_limit(least.peak_memory_bytes)
        a = fitting_least_usage_plan(pc, time_limit_s=1.0)
        if a is not None and evaluate(pc, a).feasible:
            continue
        anchor_failed += 1
        fits = []
        least_peak(pc, 5.0, 1, lambda s, tag: fits.append(evaluate(pc, s).feasible), lambda m: None)
        assert any(fits), seed
        r = solve_capped(pc, 5.0)
        assert r.plan is not None and evaluate(pc, r.plan).feasible, seed
    assert anchor_failed >= 1


@pytest.mark.parametrize("seed", range(8))
def test_union_plan_is_the_capped_optimum_over_the_plans_strategies(seed):
    """``solvers.lagrange.union_plan``: the capped MILP over the strategies some given plan uses, copies
    priced: its plan fits, is no dearer than the start, and is the brute-force optimum among the plans
    that pick each node's strategy from those (the capped optimum when one of the plans is it)."""
    import itertools

    from solvers.lagrange import union_plan
    rng = np.random.default_rng(500 + seed)
    p = _with_random_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(4)]
    cap = max(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[1], 0.5)
    p = p.with_usage_limit(cap)
    start = min((s for s in plans if evaluate(p, s).feasible), key=lambda s: evaluate(p, s).total)
    allowed = [sorted({s[i] for s in plans}) for i in range(p.num_nodes)]
    fits = [c for c in (evaluate(p, list(s)) for s in itertools.product(*allowed)) if c.feasible]
    u = union_plan(p, plans, 5.0, start=start)
    assert u is not None and evaluate(p, u).feasible and all(u[i] in allowed[i] for i in range(p.num_nodes))
    assert evaluate(p, u).total <= evaluate(p, start).total + 1e-12
    assert evaluate(p, u).total == pytest.approx(min(c.total for c in fits), rel=1e-6, abs=1e-12)
    best, bc = brute_force(p, "time")
    u2 = union_plan(p, plans + [best], 5.0, start=start)
    assert evaluate(p, u2).total == pytest.approx(bc.total, rel=1e-6, abs=1e-12)
    assert union_plan(p, [], 1.0) is None
    from solvers.ilp import solve_ilp
    with pytest.raises(ValueError, match="allowed needs one flag per strategy"):
        solve_ilp(p, allowed=np.ones(2, dtype=bool), time_limit_s=1.0)
