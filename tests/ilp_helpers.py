"""Random small Problems and a brute-force oracle, shared by the ILP and search tests."""
from __future__ import annotations

import itertools

import numpy as np

from costmodel.problem import Problem, evaluate, fits


def random_problem(rng: np.random.Generator, n: int, kmax: int = 4, edge_p: float = 0.4,
                   limit_q: float | None = 0.6, forbid_p: float = 0.0, integer: bool = True,
                   tmax: int = 8, dup_p: float = 0.0, blocks: bool = False) -> Problem:
    """A random DAG problem: n nodes with 1..kmax strategies, edges i<j with probability edge_p,
    intervals in [0, tmax), usage_limit at quantile limit_q of the plans' peaks (None: no limit).
    ``blocks``: edge matrices built like traced ones, E[s, t] = B[layout_u(s), layout_v(t)] with
    two layouts a side, so rows and columns repeat (the ILP's block compression is exercised)."""
    ks = rng.integers(1, kmax + 1, size=n)
    rnd = (lambda size, hi: rng.integers(0, hi, size=size).astype(float)) if integer else \
          (lambda size, hi: rng.random(size) * hi)
    costs = [rnd(k, 50) for k in ks]
    usages = [rnd(k, 20) for k in ks]
    red = [rnd(k, 10) for k in ks]
    st = rng.integers(0, tmax, size=n)
    en = st + rng.integers(0, tmax // 2 + 1, size=n)
    edges, ecosts = [], []
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < edge_p:
                edges.append((i, j))
                m = rnd(int(ks[i] * ks[j]), 30)
                if blocks:
                    B = rnd(4, 30).reshape(2, 2)
                    m = B[rng.integers(0, 2, ks[i])][:, rng.integers(0, 2, ks[j])].ravel()
                if forbid_p:
                    m[rng.random(len(m)) < forbid_p] = 1e18
                ecosts.append(m)
                if rng.random() < dup_p:      # a parallel edge, possibly reversed
                    rev = rng.random() < 0.5
                    edges.append((j, i) if rev else (i, j))
                    ecosts.append(rnd(int(ks[i] * ks[j]), 30))
    if forbid_p:
        for c in costs:
            c[rng.random(len(c)) < forbid_p / 2] = 1e18
    p = Problem.from_lists("random", costs, usages, np.stack([st, en], 1), edges, ecosts,
                           node_redundant=red)
    if limit_q is not None:
        peaks = [evaluate(p, list(s)).peak_memory_bytes for s in all_plans(p)]
        p = p.with_usage_limit(float(np.quantile(peaks, limit_q)))
    return p


def all_plans(p: Problem):
    return itertools.product(*[range(int(k)) for k in p.num_strategies])


def brute_force(p: Problem, objective: str = "time", cap=None, max_time=None):
    """(best plan, its cost) under the lexicographic objective of solvers.ilp, or (None, None)."""
    best, best_key = None, None
    for s in all_plans(p):
        c = evaluate(p, list(s))
        lim = p.usage_limit if cap is None else (cap if p.usage_limit is None else min(cap, p.usage_limit))
        if not fits(c.peak_memory_bytes, lim):
            continue
        if max_time is not None and c.total > max_time:
            continue
        key = {"time": (c.total,), "memory": (c.peak_memory_bytes, c.total),
               "redundancy": (c.redundant_memory_bytes, c.total)}[objective]
        if best_key is None or key < best_key:
            best, best_key = list(s), key
    return best, (None if best is None else evaluate(p, best))


def check_lagrangian_bound(rng: np.random.Generator, p: Problem, **kw) -> None:
    """Bind a cap (the third-lowest peak of 8 random plans), then check ``lagrangian_bound(**kw)``
    never passes the brute-force capped optimum from three starts (none, the optimum as the copy
    representatives' plan, a random plan with the uncapped optimum as the first round) and that every
    relaxed plan is complete."""
    from solvers.lagrange import lagrangian_bound
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
    cap = max(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[2], 0.5)
    p = p.with_usage_limit(cap)
    best, bc = brute_force(p, "time")
    if best is None:
        return
    opt = bc.total
    free, fc = brute_force(p.with_usage_limit(None), "time")   # the round at prices 0, given
    for ref, first in ((None, None), (best, None), (plans[0], (fc.total, free))):
        r = lagrangian_bound(p, 1.0, upper=opt * 1.5 + 1.0, ref=ref, first=first, **kw)
        assert r.bound <= opt + 1e-6 * max(abs(opt), 1.0)
        assert all(len(x) == p.num_nodes for x in r.plans)
