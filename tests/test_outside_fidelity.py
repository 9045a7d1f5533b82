"""Memory of train steps written outside the zoo (tests/data/outside_steps.py: kinds the zoo lacks)
against XLA's compiled figure, for plans the solvers emit, compiled abstractly (nothing runs).

Measured on cpu-2x4 (pred / XLA, compile-only; ``python`` of the loop below): moe dp 0.90,
megatron 0.80, fsdp 0.78, ilp-time 0.82, ilp-memory 0.88; convae dp 1.12, megatron 0.75,
fsdp 0.84, ilp-time 0.87, ilp-memory 0.73; rnn (lax.scan) dp 0.41, fsdp 0.18, megatron 1.29,
ilp-time 1.10, ilp-memory 0.70. The issue's target is ±10%: it holds on 2 of those 15 rows. This
test pins what holds now (moe and convae under the time ILP's plan within ±25%; two cases, to keep
the suite's time), so a change that makes the model worse on these kinds fails; the scan's
while-loop buffers are not modelled.
"""
from __future__ import annotations

import os
import sys

import jax
import pytest

import shardgym as sg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "data"))
from outside_steps import STEPS  # noqa: E402

CASES = [("moe", "ilp-time"), ("convae", "ilp-time")]
TOL = 0.25


@pytest.mark.parametrize("name,plan_name", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_outside_step_memory_close_to_xla(name, plan_name):
    step, args = STEPS[name]()
    graph = sg.trace(step, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    method, _, objective = plan_name.partition("-")
    plan = sg.solve(problem, method=method, objective=objective or "time", time_limit_s=10)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tuple(args))
    r = sg.execute(step, abstract, graph, plan)
    ratio = sg.evaluate(problem, plan).peak_memory_bytes / r.xla_memory_bytes
    assert abs(ratio - 1) <= TOL, f"{name} {plan_name}: predicted / XLA memory {ratio:.3f}"
