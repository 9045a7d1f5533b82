"""Min-sum BP (solvers/bp.py): exact on trees, decode within the memory limit, a valid bound."""
from __future__ import annotations

import numpy as np
import pytest

from costmodel.problem import Problem, evaluate
from solvers.bp import bp_plan, bp_solve
from tests.ilp_helpers import brute_force, random_problem


def _tree(seed: int, n: int = 8, forbid: bool = False) -> Problem:
    rng = np.random.default_rng(seed)
    ks = rng.integers(1, 5, size=n)
    edges = [(int(rng.integers(0, j)), j) for j in range(1, n)]        # each node hangs off an earlier one
    if seed % 2:                                                       # some edges point backwards
        edges = [(v, u) if rng.random() < 0.5 else (u, v) for u, v in edges]
    ecosts = []
    for u, v in edges:
        m = rng.random(int(ks[u] * ks[v])) * 10
        if forbid:
            m[rng.random(len(m)) < 0.2] = 1e18
            m[0] = min(m[0], 5.0)
        ecosts.append(m)
    costs = [rng.random(k) * 10 for k in ks]
    return Problem.from_lists("tree", costs, [np.zeros(k) for k in ks], np.zeros((n, 2), dtype=np.int64),
                              edges, ecosts)


@pytest.mark.parametrize("seed", range(6))
def test_bp_is_exact_on_trees(seed):
    """On a tree, converged min-sum messages are min-marginals: the decode is the optimum and the
    bound equals it."""
    p = _tree(seed, forbid=seed >= 4)
    _, bc = brute_force(p)
    r = bp_solve(p, rounds=60, damping=0.3)
    assert r.cost == pytest.approx(bc.total, rel=1e-9)
    assert evaluate(p, r.plan).total == pytest.approx(bc.total, rel=1e-9)
    if bc.total < 1e17:
        assert r.lower_bound == pytest.approx(bc.total, rel=1e-6)
    assert r.gap is not None and r.gap <= 1e-6


@pytest.mark.parametrize("seed", range(12))
def test_bp_bound_below_optimum_and_decode_fits(seed):
    """Loopy random problems with a binding limit: the decode always fits (the lowest-usage plan
    does), and the bound, with or without memory prices, never exceeds the brute-force optimum."""
    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, 7, kmax=3, edge_p=0.5, limit_q=0.3, forbid_p=0.1 if seed % 3 == 0 else 0.0)
    best, bc = brute_force(p)
    assert best is not None
    for prices in (True, False):
        r = bp_solve(p, rounds=40, memory_prices=prices, price_every=3)
        assert r.plan is not None
        c = evaluate(p, r.plan)
        assert c.feasible and c.peak_memory_bytes <= p.usage_limit
        assert r.cost == pytest.approx(c.total)
        assert r.cost >= bc.total - 1e-9
        assert r.lower_bound <= bc.total + 1e-6 * max(1.0, abs(bc.total))


def test_bp_prices_help_where_the_limit_binds():
    """A chain where the cheap strategy of every node is the big one and only a few fit: the
    priced run's bound is above the unpriced one (which ignores the limit) and still valid."""
    n = 6
    costs = [np.array([1.0, 3.0]) for _ in range(n)]
    usages = [np.array([10.0, 1.0]) for _ in range(n)]
    intervals = np.array([[0, n]] * n)
    edges = [(i, i + 1) for i in range(n - 1)]
    ecosts = [np.array([0.0, 1.0, 1.0, 0.0]) for _ in edges]
    p = Problem.from_lists("chain", costs, usages, intervals, edges, ecosts, usage_limit=24.0)
    best, bc = brute_force(p)                     # two nodes at 10 bytes, four at 1 byte
    plain = bp_solve(p, rounds=30, memory_prices=False)
    priced = bp_solve(p, rounds=60, memory_prices=True, price_every=2)
    assert plain.lower_bound <= priced.lower_bound + 1e-9 <= bc.total + 1e-6
    assert priced.lower_bound > plain.lower_bound
    assert evaluate(p, priced.plan).feasible and evaluate(p, bp_plan(p)).feasible


def test_bp_none_when_nothing_fits():
    p = Problem.from_lists("nofit", [np.array([1.0])], [np.array([5.0])], np.array([[0, 1]]), [], [],
                           usage_limit=1.0)
    r = bp_solve(p)
    assert r.plan is None and r.cost == float("inf") and r.gap is None


def _reference_decode(mp, c, to_u, to_v, tries: int = 4):
    """The decode as written before the fast path (session 7): every neighbour looked up per node,
    every strict try logged and undone. The fast one must give the same plan, bit for bit."""
    from solvers.bp_decode import _Domains
    g = mp.g
    b = mp.belief(c, to_u, to_v)
    d = _Domains(g)
    cap = g.cap
    if d.floor is not None and d.floor.max(initial=0.0) > cap:
        d.alive[:] = True
        d.mc = np.minimum.reduceat(g.usage, g.offs[:-1])
        d.floor = g.profile_of(np.where(g.live_mask, d.mc, 0.0))
        if d.floor.max(initial=0.0) > cap:
            return None
    x = d.x
    for i in range(g.n):
        lo, hi, ki = int(g.offs[i]), int(g.offs[i + 1]), int(g.k[i])
        sc = b[lo:hi].copy()
        for q in range(g.adj_ptr[i], g.adj_ptr[i + 1]):
            j = int(g.adj[q])
            if x[j] < 0:
                continue
            e = int(g.adj_edge[q])
            base = int(g.eoff[e])
            if g.eu[e] == i:
                sc += mp.ec[base + np.arange(ki) * int(g.k[j]) + x[j]] - to_u[mp.su[e]:mp.su[e + 1]]
            else:
                sc += mp.ec[base + x[j] * ki: base + (x[j] + 1) * ki] - to_v[mp.sv[e]:mp.sv[e + 1]]
        if d.floor is not None and g.live_mask[i] and g.hi[i] > g.lo[i]:
            room = cap - d.floor[g.lo[i]:g.hi[i]].max()
            sc = np.where(g.usage[lo:hi] - d.mc[i] <= room, sc, np.inf)
        al = d.alive[lo:hi]
        sc = np.where(al, sc, np.where(np.isfinite(sc), sc + 1e300, sc))
        order = np.argsort(sc, kind="stable")
        done = False
        for s in order[:tries].tolist():
            if not np.isfinite(sc[s]) or not al[s]:
                break
            log: list = []
            if d.decide(i, s, strict=True, log=log):
                done = True
                break
            d.undo(log)
        if not done:
            d.decide(i, int(order[0]), strict=False)
    return x


@pytest.mark.parametrize("case", range(6))
def test_fast_decode_is_the_reference_decode(case):
    """The decode's precomputed neighbour terms and log-free tries (solvers/bp_decode.py) change no
    decision: the same plan as the reference decode, uncapped and under tight limits, with and
    without forbidden entries, on BP messages and on perturbed ones, edges in both directions."""
    from env.workloads import random_problem as layered
    from solvers.bp import Messages
    from solvers.bp_decode import decode
    from solvers.local import LocalCosts
    rng = np.random.default_rng(40 + case)
    if case < 4:
        p = layered(rng, 300, 8, memory_cap_fraction=(None, 0.3, 0.1, 0.02)[case])
    elif case == 4:
        p = random_problem(rng, 40, kmax=5, edge_p=0.2, limit_q=None, forbid_p=0.2)
        least = [int(np.argmin(p.node_usages[a:b])) for a, b in zip(p.strategy_offsets[:-1], p.strategy_offsets[1:])]
        p = p.with_usage_limit(1.2 * evaluate(p, least).peak_memory_bytes)
    else:                               # a tree with edges pointing backwards and forbidden entries
        p = _tree(7, n=60, forbid=True)
    mp = Messages(LocalCosts(p))
    u, v = np.zeros(int(mp.su[-1])), np.zeros(int(mp.sv[-1]))
    seen = 0
    for r in range(12):
        u, v = mp.update(mp.cost, u, v, 0.5)
        if r % 4 == 3:
            noisy = u + rng.normal(0.0, 0.05 * (np.abs(u).mean() + 1e-9), len(u))
            for tu in (u, noisy):
                ref, got = _reference_decode(mp, mp.cost, tu, v), decode(mp, mp.cost, tu, v)
                assert (ref is None and got is None) or np.array_equal(ref, got)
                seen += ref is not None
    assert seen > 0


def _mixed(rng, n: int = 60) -> Problem:
    """Edges both ways, some forbidden node strategies (none on the edges) and a limit 5 % over the
    least-usage peak: the decode's dead-strategy and lenient paths."""
    ks = rng.integers(1, 6, size=n)
    costs = [rng.integers(0, 50, k).astype(float) for k in ks]
    for c in costs:
        c[rng.random(len(c)) < 0.2] = 1e18
    usages = [rng.integers(0, 20, k).astype(float) for k in ks]
    st = rng.integers(0, 12, size=n)
    edges, ecosts = [], []
    for j in range(1, n):
        for i in rng.choice(j, size=min(j, 2), replace=False).tolist():
            edges.append((i, j) if rng.random() < 0.5 else (j, i))
            ecosts.append(rng.integers(0, 30, int(ks[i] * ks[j])).astype(float))
    p = Problem.from_lists("mixed", costs, usages, np.stack([st, st + rng.integers(1, 6, size=n)], 1), edges, ecosts)
    least = [int(np.argmin(np.where(c < 1e15, u, np.inf))) if (c < 1e15).any() else 0 for c, u in zip(costs, usages)]
    return p.with_usage_limit(1.02 * evaluate(p, least).peak_memory_bytes)


def _rounding(lenient: bool = False) -> Problem:
    """Node 1's cheap strategy passes the room check (1.1 <= 1.7 - 0.6) and breaks the floor check
    (0.6 + 1.1 > 1.7 in float64): the decode's failed try and its undo. ``lenient``: its four cheapest
    all do, so it goes leniently over the limit, and node 2 then finds no room at all."""
    k = 5 if lenient else 2
    return Problem.from_lists("rounding", [np.array([0.0]), np.arange(k, dtype=float), np.array([0.0, 1.0])],
                              [np.array([0.6]), np.r_[np.full(k - 1, 1.1), 0.0], np.array([0.5, 0.0])],
                              np.array([[0, 2], [0, 2], [1, 2]]), [], [], usage_limit=1.7)


@pytest.mark.parametrize("case", range(8))
def test_decodes_run_together_are_the_decodes_one_by_one(case):
    """``decode_many`` (all of a run's decode points in one pass over the nodes) gives each snapshot
    the plan ``decode`` gives it alone, bit for bit: snapshots with different priced costs and
    perturbed messages (so their decisions, floors and failed tries differ), uncapped and under tight
    limits; with forbidden entries (case 4) it falls back to one decode each. ``DecodeQueue`` hands them
    over in the order asked, a change of ``mp.ec`` between them included; the unpriced run resumed
    from r rounds is the run from zero."""
    from env.workloads import random_problem as layered
    from solvers.bp import DecodeQueue, Messages
    from solvers.bp_decode import _start, decode, decode_many
    from solvers.local import LocalCosts
    rng = np.random.default_rng(70 + case)
    if case < 4:
        p = layered(rng, 250, 8, memory_cap_fraction=(None, 0.3, 0.1, 0.02)[case])
    elif case == 4:
        p = random_problem(rng, 40, kmax=5, edge_p=0.2, limit_q=None, forbid_p=0.2)
    else:
        p = _mixed(rng) if case == 5 else _rounding(lenient=case == 7)
    mp = Messages(LocalCosts(p))
    g = mp.g
    assert _start(g) is None or _start(g).free == (case != 4)
    u, v = np.zeros(int(mp.su[-1])), np.zeros(int(mp.sv[-1]))
    snaps = []
    for r in range(10):
        u, v = mp.update(mp.cost, u, v, 0.5)
        lam = rng.exponential(1.0, len(g.times)) * np.median(np.abs(mp.cost)) / max(float(np.median(g.usage)), 1e-30)
        c = mp.cost + g.usage * g.interval_sums(lam * (r % 3))[g.node_of]
        snaps.append((c, u + rng.normal(0.0, 0.05 * (np.abs(u).mean() + 1e-9), len(u)) * (r % 2), v))
    many = decode_many(mp, snaps)
    one = [decode(mp, *s) for s in snaps]
    assert len(many) == len(one) == 10
    for a, b in zip(one, many):
        assert (a is None and b is None) or np.array_equal(a, b)
    assert sum(a is not None for a in one) > 0 and len({a.tobytes() for a in one if a is not None}) > (case < 6)
    if case >= 6:        # the unpriced snapshot takes the paths named in _rounding
        assert one[0].tolist() == ([0, 0, 0] if case == 7 else [0, 1, 0])
    got = []
    q = DecodeQueue(mp, got.append, max_pending=4)
    ec0 = mp.ec
    for k, sn in enumerate(snaps):
        if k == 6:
            mp.ec = ec0 + 1.0          # a new edge-cost array: the waiting decodes run first, at the old one
        q.add(*sn)
    q.flush()
    want = one[:6] + [decode(mp, *sn) for sn in snaps[6:]]
    mp.ec = ec0
    assert all((a is None and b is None) or np.array_equal(a, b) for a, b in zip(want, got)) and len(got) == 10
    r0 = mp.unpriced(4)
    assert all(np.array_equal(a, b) for a, b in zip(mp.unpriced(9), mp.unpriced(9, start=(4, *r0))))


def test_price_step_grows_gently_and_decays():
    """``price_step`` (session 17: ×1.5 over the limit, at least base·10·overload; ×0.8 under it;
    ×2.5/×0.9 overshot on the held-out meshgraphnet caps): the rule on three points."""
    from solvers.bp import PRICE_DECAY, PRICE_UP, price_step
    lam = np.array([2.0, 2.0, 0.0])
    out = price_step(lam, np.array([1.01, 0.5, 1.2]), base=1.0)
    assert out == pytest.approx([max(PRICE_UP * 2.0, 0.1), PRICE_DECAY * 2.0, 2.0])
    assert (PRICE_UP, PRICE_DECAY) == (1.5, 0.8)


@pytest.mark.parametrize("seed", range(4))
def test_lagrangian_bp_fits_and_is_near_the_optimum_on_small_capped_problems(seed):
    """Random 7-node problems under a cap between the least and greatest peak: Lagrangian BP's plan
    fits and is within 1.5x of the brute-force optimum."""
    rng = np.random.default_rng(100 + seed)
    p = random_problem(rng, n=7, kmax=3)
    lo = evaluate(p, [int(np.argmin(p.node_usages[p.strategy_offsets[i]:p.strategy_offsets[i + 1]]))
                      for i in range(p.num_nodes)]).peak_memory_bytes
    hi = evaluate(p, [int(np.argmax(p.node_usages[p.strategy_offsets[i]:p.strategy_offsets[i + 1]]))
                      for i in range(p.num_nodes)]).peak_memory_bytes
    p = p.with_usage_limit(lo + 0.4 * (hi - lo))
    _, bc = brute_force(p)
    r = bp_solve(p, rounds=60, memory_prices=True)
    assert r.plan is not None and evaluate(p, r.plan).feasible
    assert r.cost <= 1.5 * bc.total + 1e-9


def test_copy_aware_decode_is_the_plain_one_where_that_fits_with_its_copies():
    """The rule ``DecodeQueue`` skips copy-aware decodes by (session 28): on random capped problems with
    random copy groups and no forbidden entry, at random messages, wherever the plain decode fits with its
    copies the copy-aware decode returns the same plan; and bp_solve returns the same plan and cost with
    the skip turned off."""
    from dataclasses import replace

    from solvers.bp import Messages, decode
    from solvers.bp_decode import DecodeQueue
    from solvers.local import LocalCosts
    from tests.test_edge_memory import _with_random_copies
    hits = 0
    for seed in range(60):
        rng = np.random.default_rng(4000 + seed)
        p = _with_random_copies(rng, random_problem(rng, 9, kmax=4, edge_p=0.5, limit_q=None))
        peaks = sorted(evaluate(p, [int(rng.integers(k)) for k in p.num_strategies]).peak_memory_bytes for _ in range(12))
        p = replace(p, usage_limit=float(peaks[int(rng.integers(2, 10))]))
        g = LocalCosts(p)
        mp = Messages(g)
        for _ in range(6):
            tu, tv = rng.random(int(mp.su[-1])) * 30, rng.random(int(mp.sv[-1])) * 30
            x = decode(mp, mp.cost, tu, tv)
            if x is not None and g.feasible(x):
                hits += 1
                assert np.array_equal(decode(mp, mp.cost, tu, tv, copies=True), x)
        r = bp_solve(p, rounds=20)
        old = DecodeQueue.twin_fits
        try:
            DecodeQueue.twin_fits = lambda self, x: False
            r0 = bp_solve(p, rounds=20)
        finally:
            DecodeQueue.twin_fits = old
        assert r.plan == r0.plan and r.cost == r0.cost
    assert hits >= 100, hits


@pytest.mark.parametrize("seed", range(4))
def test_bp_solve_logs_each_cheaper_fitting_plan_it_found(seed):
    """``BPResult.found`` (session 28, experiments/anytime.py's curve points): times within the run, costs
    falling, the last one the returned plan's cost, and each one a fitting plan's: bp_solve's plan priced."""
    p = random_problem(np.random.default_rng(5000 + seed), 12, kmax=4, edge_p=0.4, limit_q=0.4)
    r = bp_solve(p, rounds=30)
    assert r.plan is not None and r.found
    ts, cs = zip(*r.found)
    assert list(ts) == sorted(ts) and 0 <= ts[0] and ts[-1] <= r.wall_s
    assert all(b < a for a, b in zip(cs, cs[1:]))
    assert cs[-1] == r.cost == evaluate(p, r.plan).total
