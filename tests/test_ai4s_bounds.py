"""experiments/ai4s_bounds.py's Lagrangian step-time bound against a brute-forced capped optimum."""
import itertools

import numpy as np

from costmodel.problem import Problem, evaluate
from experiments.ai4s_bounds import block_lower_bound, lagrangian_bound, lagrangian_time_bound


def _problem():
    # four nodes live together on [0, 4): fast and big (1 s, 10 B) or slow and small (3 s, 2 B); a fifth
    # live later on its own, big and cheap; one edge charging a switch between nodes 0 and 1. Cap 20 B:
    # at most one of the four takes its fast strategy (10 + 3 * 2 = 16, 2 * 10 + 2 * 2 = 24).
    costs = [[1.0, 3.0]] * 4 + [[0.5, 2.0]]
    usages = [[10.0, 2.0]] * 4 + [[18.0, 1.0]]
    intervals = [[0, 4]] * 4 + [[5, 6]]
    return Problem.from_lists("lag", costs, usages, intervals, [[0, 1]], [[0.0, 0.25, 0.25, 0.0]], usage_limit=20.0)


def _capped_optimum(p):
    best = np.inf
    for s in itertools.product(range(2), repeat=p.num_nodes):
        c = evaluate(p, list(s))
        if c.feasible:
            best = min(best, c.step_time_s)
    return best


def test_lagrangian_bound_is_below_the_capped_optimum_and_above_the_uncapped_one():
    p = _problem()
    opt = _capped_optimum(p)
    # by hand: one fast node among 2..3 (0 or 1 would pay the 0.25 s switch), node 4 fast: 1 + 3 * 3 + 0.5
    assert abs(opt - 10.5) < 1e-9
    uncapped = block_lower_bound(p)   # cap dropped (no strategy is over the cap on its own): all fast, 4.5 s
    assert abs(uncapped - 4.5) < 1e-6
    for lam in (0.0, 0.1, 0.25, 0.5, 2.0):
        b, _ = lagrangian_bound(p, lam, [0], time_limit_s=10)
        assert b <= opt + 1e-6, (lam, b, opt)
    # at 0.25 s/B both of a live node's strategies cost 3.5 s: 4 * 3.5 + 0.5 - 0.25 * 20 = 9.5
    b, _ = lagrangian_bound(p, 0.25, [0], time_limit_s=10)
    assert abs(b - 9.5) < 1e-6
    best = lagrangian_time_bound(p, upper=opt, iters=8, time_limit_s=10)
    assert uncapped + 1.0 < best <= opt + 1e-6
