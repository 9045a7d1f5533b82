"""``heuristic_plan(problem)``: the best plan the library's heuristics give without a policy.

The cheapest feasible of {greedy-by-cost, and for traced problems the replicated / dp / megatron /
fsdp baselines (``solvers.baselines``)}, each memory-repaired and polished (0.5 s). The teacher for
imitation and the per-problem reward scale for PPO (agent/ppo.py); not used by ``Planner.plan``.
Exported lazily by ``solvers.local`` (the baselines import the library).
"""
from __future__ import annotations

import numpy as np

from costmodel.problem import Problem, evaluate
from solvers.baselines import baseline_plan
from solvers.local.costs import LocalCosts
from solvers.local.greedy import greedy_by_cost
from solvers.local.polish import polish
from solvers.local.repair import repair_memory


def heuristic_plan(problem: Problem) -> tuple[list[int] | None, str]:
    """(plan, the name of the start it came from); (None, "") when no start can be repaired to fit."""
    lc = LocalCosts(problem)
    starts = {"greedy": greedy_by_cost(problem)}
    if problem.meta is not None:
        try:
            for m in ("replicated", "dp", "megatron", "fsdp"):
                starts[m] = baseline_plan(problem, m)
        except Exception:  # baselines not applicable to this problem (no roles / graph, ...)
            pass
    best, best_cost, best_name = None, np.inf, ""
    for name, s in starts.items():
        s = repair_memory(problem, s, lc=lc)
        if s is None:
            continue
        s = polish(problem, s, lc=lc, time_limit_s=0.5)
        c = evaluate(problem, s)
        if c.feasible and c.total < best_cost:
            best, best_cost, best_name = s, c.total, name
    return best, best_name
