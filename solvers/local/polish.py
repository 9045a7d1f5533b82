"""Polish: the local-search library's improvement loop for any plan.

``polish(problem, plan, time_limit_s)``: best response and edge pair moves (``solvers.local.moves``)
to a local optimum, then up to ``tree_moves`` forest moves (``forest_dp``: a random induced forest
re-optimised exactly by tree DP, every other node held), each memory-repaired if needed
(``repair_memory``), followed by the same local optimisation and kept only if it lowers the true
cost within the memory limit; stops after ``max_fails`` failed forest moves in a row or when
``time_limit_s`` is spent. Never makes a plan worse or infeasible.
"""
from __future__ import annotations

import time

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.local.costs import LocalCosts
from solvers.local.moves import best_response, forest_dp, pair_moves
from solvers.local.repair import repair_memory


def polish(problem: Problem, plan, time_limit_s: float = 1.0, lc: LocalCosts | None = None,
           tree_moves: int = 64, seed: int = 0, max_fails: int = 10) -> list[int]:
    """See the module docstring."""
    t0 = time.perf_counter()
    lc = lc or LocalCosts(problem)

    def left():
        return max(0.0, time_limit_s - (time.perf_counter() - t0))

    def local_opt(x):
        x = best_response(problem, x, time_limit_s=left(), lc=lc)
        for _ in range(5):
            y = pair_moves(problem, x, lc, time_limit_s=left())
            y = best_response(problem, y, time_limit_s=left(), lc=lc)
            if np.array_equal(np.asarray(y), np.asarray(x)):
                break
            x = y
        return x

    cur = local_opt(plan)
    cost = evaluate(problem, cur).total
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(tree_moves):
        if fails >= max_fails or time.perf_counter() - t0 > time_limit_s or problem.num_edges == 0:
            break
        cand = forest_dp(lc, np.asarray(cur, dtype=np.int64), lc.cost, rng, np.inf)
        c = evaluate(problem, cand)
        if not c.feasible:
            rep = repair_memory(problem, cand, lc=lc)
            if rep is None:
                fails += 1
                continue
            cand = rep
        cand = local_opt(cand)
        c = evaluate(problem, cand)
        if c.feasible and c.total < cost * (1 - 1e-12):
            cur, cost, fails = cand, c.total, 0
        else:
            fails += 1
    return [int(x) for x in cur]
