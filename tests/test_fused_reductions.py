"""Reductions XLA CPU fuses into their reader (costmodel/fused_reductions.py), checked against XLA's
compiled HLO and, on rnn ilp-time (the stored session-13 plan), against its memory figure. Real
compiles on the 8 virtual CPU devices, a few seconds."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardgym as sg
from costmodel import memory
from costmodel.fused_reductions import MAX_REDUCTIONS_IN_FUSION, trivial_reduction
from costmodel.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from outside_steps import STEPS  # noqa: E402


def _accumulate(m, xs, w):
    """An unrolled accumulation of eight small reductions (rnn's bias gradient): each product is a
    dot operand too, so it is a buffer either way; the sum feeds an element-wise update."""
    outs, g = [], 0.0
    for t in range(xs.shape[0]):
        p = jnp.tanh(xs[t]) * w
        outs.append(p @ w.T)
        g = g + p.sum(0)
    return 0.9 * m + g, jnp.stack(outs)


def _reduces_per_kernel(fn, *args) -> list[tuple[str, int]]:
    """(entry instruction, reduces in the computation it calls) for each kernel holding a reduce."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    comps = {m.group(1): m.group(2) for m in re.finditer(r"^%(\S+) \(.*?\) -> .*? \{\n(.*?)\n\}", hlo, re.S | re.M)}
    out = []
    for line in hlo[hlo.index("ENTRY"):].splitlines():
        c = re.search(r"calls=%([\w.\-]+)", line)
        if c and " reduce(" in comps.get(c.group(1), ""):
            out.append((line.split("=")[0].strip(), comps[c.group(1)].count(" reduce(")))
    return out


@pytest.mark.parametrize("batch", [16, 64])
def test_at_most_six_small_reductions_fuse_into_their_reader(batch):
    args = (jnp.zeros(64), jnp.ones((8, batch, 64)), jnp.ones((batch, 64)))
    kernels = _reduces_per_kernel(_accumulate, *args)
    g = sg.trace(_accumulate, *args)
    kept, _ = memory.materialised_outputs(g)
    reduces = [nd.id for nd in g.nodes if nd.primitive == "reduce_sum"]
    assert len(reduces) == 8
    if batch == 16:   # f32[16,64] operands: loop-fusible; the latest six fuse into the update, two stay apart
        assert sorted(n for _, n in kernels) == [1, 1, MAX_REDUCTIONS_IN_FUSION]
        assert [bool(kept[i]) for i in reduces] == [True, True] + [False] * 6
    else:             # 4096 elements: YNNPACK custom fusions, one each, written out
        assert [n for _, n in kernels] == [1] * 8 and all("ynn" in k for k, _ in kernels)
        assert all(kept[i] for i in reduces)


def test_a_reduction_over_size_one_dims_is_a_reshape():
    def f(x, y):
        return (x.reshape(1, 64) * 2.0).sum(0) + y

    args = (jnp.ones(64), jnp.ones(64))
    assert _reduces_per_kernel(f, *args) == []
    g = sg.trace(f, *args)
    assert [trivial_reduction(nd) for nd in g.nodes if nd.primitive == "reduce_sum"] == [True]


def test_rnn_ilp_time_holds_the_products_its_bias_fusion_reads(monkeypatch):
    """rnn (tests/data/outside_steps.py) under session 13's ilp-time plan (tests/data/rnn_ilp_time_plan.json:
    results/fidelity_s13c_outside_program.json). XLA's ``add_add_fusion.2`` sums the last six per-step
    bias reductions, so their operands (tanh' x dh, f32[16,64]) live to it, at XLA's peak (134,724 B);
    the model without the rule, 117,760 B (0.874), with it 135,680 B (1.007)."""
    step, args = STEPS["rnn"]()
    graph = sg.trace(step, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    plan = Plan.from_json(os.path.join(os.path.dirname(__file__), "data", "rnn_ilp_time_plan.json"))
    assert Plan.for_problem(problem, plan.strategies).node_specs == plan.node_specs, "strategies renumbered"
    r = sg.execute(step, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tuple(args)), graph, plan)
    xla = r.xla_memory_bytes
    assert sg.evaluate(problem, plan.strategies).peak_memory_bytes == pytest.approx(xla, rel=0.02)
    monkeypatch.setattr(memory, "fused_reductions", lambda *a: set())
    without = sg.evaluate(sg.build_problem(graph, "cpu-2x4"), np.asarray(plan.strategies)).peak_memory_bytes
    assert without < 0.9 * xla


def test_a_reduction_whose_partial_sum_is_all_reduced_is_written_out():
    """rnn under Megatron: each per-step bias reduction is a partial sum that XLA all-reduces (its
    combined ``all-reduce.26``), so all eight stay apart (``wrapped_reduce`` to ``.7``, written out)
    and each product dies at its reduction (``slice_layout.fused_read_groups``: a reader whose own
    strategy all-reduces its result is not fused). Holding the products to the bias fusion priced
    1.088 of XLA's memory (124,488 B); 1.030 without."""
    step, args = STEPS["rnn"]()
    graph = sg.trace(step, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    plan = sg.solve(problem, method="megatron")
    r = sg.execute(step, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tuple(args)), graph, plan)
    assert sg.evaluate(problem, plan.strategies).peak_memory_bytes == pytest.approx(r.xla_memory_bytes, rel=0.05)
