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


def env_episode(problem, plan):
    """Step the policy's env (env.sharding_env.ShardingEnv) through ``plan``: every action must be
    unmasked (the policy can pick it) and the episode's cost must be ``evaluate``'s. Returns it."""
    from costmodel.problem import evaluate
    from env.sharding_env import ShardingEnv
    env = ShardingEnv(workloads=problem, skip_trivial=False)
    env.reset(options={"problem": problem})
    done, info = False, {}
    while not done:
        a = int(plan.strategies[int(env._cur)])
        assert env.action_masks()[a], (int(env._cur), a)
        _, _, done, _, info = env.step(a)
        assert not info["invalid_action"]
    assert info["plan"] == [int(s) for s in plan.strategies]
    assert info["cost"].total == evaluate(problem, plan).total
    return info["cost"]


def fidelity_line(label: str, report) -> str:
    """One line of an executed plan's figures (numerics, collective bytes, memory), printed by the
    plan tests (``pytest -s``) and read into results/ai4s_fidelity.json."""
    r = report
    return (f"FIDELITY {label}: rel {r.max_rel_err:.2g}, collectives {r.collective_wire_bytes:,.0f} B XLA vs "
            f"{r.predicted_comm_bytes:,.0f} predicted, memory {r.predicted_memory_bytes:,.0f} B predicted vs "
            f"{r.xla_memory_bytes:,.0f} XLA ({r.predicted_memory_bytes / r.xla_memory_bytes:.3f})")


def assert_memory(report, known_gap: float | None = None, reason: str = ""):
    """Predicted per-device memory within 10% of XLA's (the issue's bar). Where a plan has a known,
    measured gap (``known_gap``: predicted / XLA), a ratio outside 10% but no worse than the gap less
    0.02 marks the test xfail with ``reason``; anything worse, or any plan without a known gap, fails."""
    import pytest
    ratio = report.predicted_memory_bytes / report.xla_memory_bytes
    if abs(ratio - 1) <= 0.10:
        return
    if known_gap is not None and abs(ratio - 1) <= abs(known_gap - 1) + 0.02:
        pytest.xfail(f"memory predicted / XLA {ratio:.3f} (known gap {known_gap}): {reason}")
    assert report.predicted_memory_bytes == pytest.approx(report.xla_memory_bytes, rel=0.10)
