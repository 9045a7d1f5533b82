"""Reward scaling for the policy: R / C_h per problem (see ``PPOConfig.scale_rewards``).

``heuristic_for(problem)`` is the cached ``heuristic_plan`` of a problem (the teacher of random
starts and the scale's C_h); ``reward_scale(problem, reference_cost)`` = R / C_h, 1 when the
heuristic finds no feasible plan or C_h is not positive and finite.
"""
from __future__ import annotations

import numpy as np

from costmodel.problem import evaluate
from solvers.local import heuristic_plan

_HEURISTIC: dict = {}


def _problem_key(problem):
    return (problem.name, problem.num_nodes, problem.num_edges, float(problem.node_costs.sum()),
            float(problem.edge_costs.sum()), problem.usage_limit)


def heuristic_for(problem):
    """(cached) ``solvers.local.heuristic_plan`` of ``problem`` as an array (None if none is feasible)."""
    key = _problem_key(problem)
    if key not in _HEURISTIC:
        plan, _ = heuristic_plan(problem)
        _HEURISTIC[key] = None if plan is None else np.asarray(plan, np.int64)
    return _HEURISTIC[key]


def reward_scale(problem, reference_cost: float) -> float:
    """R / C_h (see PPOConfig.scale_rewards), cached by the problem's identity and contents."""
    plan = heuristic_for(problem)
    c = evaluate(problem, plan).total if plan is not None else reference_cost
    return float(reference_cost / c) if c > 0 and np.isfinite(c) else 1.0
