"""Test helper: a plan whose nodes of one primitive all take a strategy of a given kind."""
from __future__ import annotations

import dataclasses

import shardgym as sg


def forced_plan(problem, graph, primitive: str, must_contain: str, time_limit_s: float = 20):
    """The ILP's min-time plan after adding 1 s to every strategy of a ``primitive`` node whose name
    lacks ``must_contain`` (e.g. "collective-permute" for spatial convs): the ILP picks the rest.
    Returns (plan, chosen strategy names of the primitive's nodes)."""
    pen = problem.node_costs.copy()
    o = problem.strategy_offsets
    for i, nd in enumerate(graph.nodes):
        if nd.primitive == primitive:
            for s, nm in enumerate(problem.meta.strategy_names[i]):
                if must_contain not in nm:
                    pen[o[i] + s] += 1.0
    plan = sg.solve(dataclasses.replace(problem, node_costs=pen), method="ilp", time_limit_s=time_limit_s)
    chosen = [problem.meta.strategy_names[i][s] for i, s in enumerate(plan.strategies)
              if graph.nodes[i].primitive == primitive]
    return plan, chosen
