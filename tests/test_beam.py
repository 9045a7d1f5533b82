"""Beam search at width 1 is the greedy construction (solvers.local.greedy_by_cost), plan for plan,
on traced-like DAGs and on IOPDDL graphs with cycles (one decision order, the same sums)."""
from __future__ import annotations

import os

import numpy as np

from agent.beam import beam_search
from costmodel.problem import Problem
from env.workloads import random_problem
from solvers.local import decision_order, greedy_by_cost

B_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "iopddl", "asplos-2025-iopddl-B.json.gz")


def test_width_one_is_greedy_on_random_dags():
    for seed in range(3):
        p = random_problem(np.random.default_rng(seed), 50, 5)
        assert beam_search(p, width=1) == greedy_by_cost(p)


def test_width_one_is_greedy_on_an_iopddl_graph_with_cycles():
    b = Problem.from_iopddl(B_PATH).with_usage_limit(None)
    order = decision_order(b)
    assert not (b.edges[:, 0] < b.edges[:, 1]).all()        # B is not in topological index order
    rank = np.empty(b.num_nodes, int)
    rank[order] = np.arange(b.num_nodes)
    assert not (rank[b.edges[:, 0]] < rank[b.edges[:, 1]]).all()   # it has cycles: some edge goes back
    assert beam_search(b, width=1) == greedy_by_cost(b)
