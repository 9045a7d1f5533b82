"""Memory of a gated (SiLU-GLU) expert layer against XLA's buffer assignment: moe tiny
(tests/data/outside_steps.py) under the ILP's time plan on cpu-2x4 (tests/data/moe_ilp_time_plan.json:
the plan of results/fidelity_s13c_outside_program.json), compiled abstractly (nothing runs).

XLA at its peak (``verifier.peak_buffers``, 283.0 KB per device) holds, beside the parameters:
the two expert dots' results ``x @ w_in`` and ``x @ w_gate`` (``ynn_fusion.5`` / ``.4``) and three
values of the SiLU chain, all kept to the backward pass, where the gate gradient's fusion
rebuilds ``s * (1 - s)`` from the gate dot's result; and y's all-gather with both batch-major copies
the gate-weighted sum and its gradient read (``transpose_copy_fusion``, ``.1``), made together.
The model before session 15 freed the gate dot's result at the chain's step and made the second
copy at its own dot: 241.4 KB, 0.853 of XLA; now 0.998 (``slice_layout.partly_kept_reads``,
``slice_layout.copied_together``).
"""
from __future__ import annotations

import os
import sys

import jax
import numpy as np

import shardgym as sg
from costmodel.copy_lists import dot_operand_order
from costmodel.problem import Plan

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "data"))
from outside_steps import STEPS  # noqa: E402


def _moe_ilp_time():
    step, args = STEPS["moe"]()
    graph = sg.trace(step, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    plan = Plan.from_json(os.path.join(os.path.dirname(__file__), "data", "moe_ilp_time_plan.json"))
    assert Plan.for_problem(problem, plan.strategies).node_specs == plan.node_specs, "strategies renumbered"
    return step, args, graph, problem, plan


def _live_bytes_of(problem, s, u: int, t: int) -> float:
    """Bytes of node u's own buffer or of its copy groups live at step t under plan s."""
    flat = problem.strategy_offsets[u] + s[u]
    own = problem.node_usages[flat] if problem.intervals[u, 0] <= t < problem.intervals[u, 1] else 0.0
    em = problem.edge_memory
    act = em.active(s)
    g_of = em.member_group
    held = 0.0
    for g in np.nonzero(em.group_node == u)[0]:
        ms = np.nonzero((g_of == g) & act)[0]
        if len(ms) and em.early(int(g), int(s[u])) and em.group_time[g] <= t <= em.member_time[ms].max():
            held += em.group_bytes[g]
    return float(own + held)


def test_glu_chain_and_batch_major_copies_priced_as_xla_holds_them():
    step, args, graph, problem, plan = _moe_ilp_time()
    s = np.asarray(plan.strategies)
    nodes = graph.nodes
    chain = next(nd for nd in nodes if "logistic" in nd.folded)          # transpose(x @ w_gate) -> SiLU, h
    gate_dot = chain.operands[0][0]
    assert nodes[gate_dot].primitive == "dot_general"
    backward = max(c for (i, _), cs in graph.consumers().items() if i == chain.id for c, _ in cs)
    # the gate dot's result lives to the backward fusion that rebuilds the chain's unkept values
    assert _live_bytes_of(problem, s, gate_dot, int(nodes[backward].order)) >= 16384
    # y (the experts' outputs) is read by two dots, each in its own batch-major order (XLA's
    # transpose_copy_fusion.1 f32[64,4,32] and transpose_copy_fusion f32[64,32,4]) ...
    readers = [(c, k) for c, k in graph.consumers()[(next(nd.id for nd in nodes if nd.primitive == "dot_general"
                                                          and (chain.id, 4) in nd.operands), 0)]]
    assert sorted(dot_operand_order(nodes[c], k) for c, k in readers) == [(1, 0, 2), (1, 2, 0)]
    # ... while a batched dot whose operand differs by a swap of its last two dims copies nothing:
    # the backward reader is dh = dy @ w_out^T, and XLA's ynn_fusion reads w_out's buffer as it is
    w_out = next(nd.id for nd in nodes if nd.is_input and nd.input_path == "[0]['w_out']")
    assert nodes[backward].primitive == "dot_general" and nodes[backward].operands[1] == (w_out, 0)
    assert dot_operand_order(nodes[backward], 1) is None
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tuple(args))
    r = sg.execute(step, abstract, graph, plan)
    ratio = sg.evaluate(problem, plan).peak_memory_bytes / r.xla_memory_bytes
    assert abs(ratio - 1) <= 0.05, f"moe tiny ilp-time: predicted / XLA memory {ratio:.3f} (0.853 before)"
