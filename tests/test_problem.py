"""shardgym.evaluate against the contest rules, on the shared IOPDDL instances."""
import gzip
import json
import os

import numpy as np
import pytest

import shardgym as sg
from costmodel.problem import PlanError, Problem

IOPDDL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "iopddl")
INSTANCES = [f"asplos-2025-iopddl-{k}.json.gz" for k in "ABGMS"]


def contest_cost(doc: dict, plan: list[int]) -> tuple[float, bool]:
    """The contest rules written out plainly: Σ node costs + Σ edge costs (row-major, producer's
    strategy first); infeasible if at any time point t the usages of the nodes with
    start <= t < end sum above the limit (checked at every point of a per-time-point array)."""
    p = doc["problem"]
    nodes, edges = p["nodes"], p["edges"]
    total = 0
    for i, s in enumerate(plan):
        total += nodes["costs"][i][s]
    for (u, v), costs in zip(edges["nodes"], edges["costs"]):
        kv = len(nodes["costs"][v])
        total += costs[plan[u] * kv + plan[v]]
    limit = p.get("usage_limit")
    feasible = True
    if limit is not None and nodes["intervals"]:
        horizon = max(end for _, end in nodes["intervals"]) + 1
        delta = [0] * (horizon + 1)
        for i, (start, end) in enumerate(nodes["intervals"]):
            if end > start:
                delta[start] += nodes["usages"][i][plan[i]]
                delta[end] -= nodes["usages"][i][plan[i]]
        live = 0
        for t in range(horizon):
            live += delta[t]
            if live > limit:
                feasible = False
                break
    return total, feasible


def test_example_costs():
    p = Problem.from_iopddl(os.path.join(IOPDDL, "example.json"))
    assert sg.evaluate(p, [0, 0, 2, 0, 0]).total == 545
    assert sg.evaluate(p, [0, 0, 2, 1, 0]).total == 445
    with open(os.path.join(IOPDDL, "example.json")) as f:
        doc = json.load(f)
    for plan in ([0, 0, 2, 0, 0], [0, 0, 2, 1, 0], [0, 1, 1, 1, 0]):
        c = sg.evaluate(p, plan)
        assert (c.total, c.feasible) == contest_cost(doc, plan)


def test_plan_validation():
    p = Problem.from_iopddl(os.path.join(IOPDDL, "example.json"))
    with pytest.raises(PlanError):
        sg.evaluate(p, [0, 0, 0])
    with pytest.raises(PlanError):
        sg.evaluate(p, [0, 0, 3, 0, 0])


@pytest.mark.parametrize("name", INSTANCES)
def test_random_plans_match_contest_rules(name):
    path = os.path.join(IOPDDL, name)
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    p = Problem.from_iopddl(path)
    k = [len(c) for c in doc["problem"]["nodes"]["costs"]]
    assert p.num_nodes == len(k) and p.num_edges == len(doc["problem"]["edges"]["nodes"])
    rng = np.random.default_rng(0)
    usages = doc["problem"]["nodes"]["usages"]
    plans = [[int(rng.integers(n)) for n in k] for _ in range(3)]
    # the plan of least usage per node: more likely feasible, so both verdicts get exercised
    plans.append([int(np.argmin(u)) for u in usages])
    for plan in plans:
        c = sg.evaluate(p, plan)
        total, feasible = contest_cost(doc, plan)
        assert c.total == pytest.approx(total, rel=1e-12), name
        assert c.feasible == feasible, name
