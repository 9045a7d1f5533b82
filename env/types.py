"""The env's public episode spec: ``Episode``, what ``ShardingEnv.episode`` returns after ``reset``.

Everything outside env/ that needs to know about the current episode reads it here (the env's
internal per-problem tables are private): the Problem being decided (with the env's cap applied),
the order its nodes are decided in, the reference plan and cost the rewards are normalised by,
and how many decisions the agent makes.

Observation (all Boxes, padded to max_nodes N, max_edges E, max_strategies K; see env/features.py
for each feature): node_features (N, F_node), action_features (N, K, F_act), edge_index (E, 2)
int32 (producer, consumer), edge_features (E, F_edge), edge_mask (E,), node_mask (N,),
current_node (1,) int64, action_mask (K,) int8. At the terminal step current_node is 0 and
action_mask is [1, 0, ...] (a dummy; the episode is over). By default (``copy_obs=True``) every
``reset``/``step`` returns new, read-only arrays that stay as they were while you hold them (as
check_env's "data not reused" check requires; env/obs_pool.py recycles the buffers you drop, so
this costs ~3 us a step, not a 2.3 MB copy: copy an array before modifying it). With
``copy_obs=False`` they are the env's persistent arrays, updated in place in O(degree x K) per
step: copy them if you keep them (gymnasium's vector envs copy into their own or shared-memory
buffers; agent/ uses this mode). Episode context (memory cap / mem_unit, objective weights) is
broadcast into every node row (see NODE_FEATURES).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.problem import Problem


@dataclass(frozen=True, eq=False)
class Episode:
    """One episode of ``ShardingEnv`` (frozen; the arrays are read-only).

    problem: the Problem decided (its ``usage_limit`` is the effective cap).
    order: node ids in decision order (``solvers.local.decision_order``).
    reference_cost: R > 0, the cost the rewards are divided by (seconds, or contest units).
    reference_name: "dp" (the data-parallel baseline) or "greedy" (``solvers.local.greedy_by_cost``).
    reference_plan: the reference plan's strategy per node.
    num_decisions: the steps the agent takes (nodes with one strategy are skipped when
        ``skip_trivial``; at least 1).
    memory_cap_bytes: the effective cap (None: unbounded).
    weights: the objective weights (time, memory, redundancy, balance), as sorted (name, value) pairs.
    """

    problem: Problem
    order: np.ndarray
    reference_cost: float
    reference_name: str
    reference_plan: tuple
    num_decisions: int
    memory_cap_bytes: float | None
    weights: tuple

    def __post_init__(self):
        order = np.array(self.order, dtype=np.int64)
        order.setflags(write=False)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "reference_plan", tuple(int(x) for x in self.reference_plan))
