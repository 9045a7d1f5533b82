"""Spatial partitioning of convolutions: halo widths by hand, and what XLA compiles for them."""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardgym as sg
from costmodel.cluster import Cluster
from costmodel.cost import Mesh, collective, public_spec
from costmodel.halo import SpatialDim, conv_halo, halo_widths
from costmodel.strategies import enumerate_strategies
from costmodel.trace import flatten_program
from runtime.hlo import parse_collectives, summarize

sys.path.insert(0, os.path.dirname(__file__))
from plan_helpers import assert_memory, env_episode, fidelity_line, forced_plan  # noqa: E402


def test_halo_widths_by_hand():
    # 3-tap SAME conv, stride 1 (pad 1, 1): every shard needs one row from each neighbour
    assert halo_widths(SpatialDim(32, 3, 32, pad_lo=1, pad_hi=1), 4) == (1, 1)
    # stride 2, TF-SAME on an even size (pad 0, 1): outputs 8k..8k+7 read rows 16k..16k+16 -> (0, 1)
    assert halo_widths(SpatialDim(32, 3, 16, stride=2, pad_lo=0, pad_hi=1), 2) == (0, 1)
    # stride 2 with symmetric padding (1, 1): rows 16k-1 .. 16k+15 -> (1, 0)
    assert halo_widths(SpatialDim(32, 3, 16, stride=2, pad_lo=1, pad_hi=1), 2) == (1, 0)
    # dilation 2: the window spans 5 rows, pad (2, 2) -> two rows each side
    assert halo_widths(SpatialDim(32, 3, 32, rhs_dilation=2, pad_lo=2, pad_hi=2), 4) == (2, 2)
    # 2x2 stride-2 transposed conv (lhs dilation 2, pad 1, 1): outputs 8k..8k+7 read rows 4k..4k+3 only
    assert halo_widths(SpatialDim(8, 2, 16, lhs_dilation=2, pad_lo=1, pad_hi=1), 2) == (0, 0)
    # weight gradient of the 3-tap SAME conv (window = the 16-row output gradient, 3 outputs):
    # taps 8k..8k+7 for outputs 0..2 read rows 8k-1 .. 8k+8 -> (1, 1)
    assert halo_widths(SpatialDim(16, 16, 3, pad_lo=1, pad_hi=1), 2) == (1, 1)
    # not exact: 3 does not divide 32; a 5-row halo does not fit a 4-row shard
    assert halo_widths(SpatialDim(32, 3, 32, pad_lo=1, pad_hi=1), 3) is None
    assert halo_widths(SpatialDim(16, 11, 16, pad_lo=5, pad_hi=5), 4) is None


def test_halo_bytes_by_hand():
    # lhs shard f32[1, 8, 32, 8] split on H (dim 1) in 2 and W (dim 2) in 4 (local 8 cols): H first, 1 row
    # each side = 8 cols x 8 ch x 4 B = 256 B; then W on the 10-row tile: 10 x 8 x 4 = 320 B each side
    dims = [SpatialDim(16, 3, 16, pad_lo=1, pad_hi=1), SpatialDim(32, 3, 32, pad_lo=1, pad_hi=1)]
    h = conv_halo(dims, (1, 8, 8, 8), (1, 2), 4, [("x",), ("y",)], [2, 4])
    assert [c[2] for c in h.collectives] == [256.0, 256.0, 320.0, 320.0]
    assert [c[1] for c in h.collectives] == [("x",), ("x",), ("y",), ("y",)]
    assert h.copy_bytes == 10 * 10 * 8 * 4


def _conv_step(stride, dil, lhs_dil=1, k=3, pad="SAME"):
    def f(x, w):
        def loss(x, w):
            y = jax.lax.conv_general_dilated(x, w, (stride,) * 2, pad, lhs_dilation=(lhs_dil,) * 2,
                                             rhs_dilation=(dil,) * 2, dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jnp.sum(jnp.sin(y))
        return jax.grad(loss, argnums=(0, 1))(x, w)
    return f, (jax.ShapeDtypeStruct((2, 16, 16, 4), jnp.float32), jax.ShapeDtypeStruct((k, k, 4, 4), jnp.float32))


@pytest.mark.parametrize("cfg", [dict(stride=1, dil=1), dict(stride=2, dil=1), dict(stride=1, dil=2),
                                 dict(stride=1, dil=1, lhs_dil=2, k=2, pad=((1, 1), (1, 1)))],
                         ids=["stride1", "stride2", "dilation2", "transposed"])
def test_every_spatial_strategy_is_what_xla_runs(cfg):
    """Each spatial strategy of the forward, data-gradient and weight-gradient convs, compiled alone
    on the 2x4 CPU mesh with its operand / output specs: the collective-permutes move exactly the
    predicted halo bytes and nothing is all-gathered (no involuntary rematerialisation). CPU lowers
    reduce-scatter to all-reduce (DESIGN.md), so a predicted reduce-scatter is compared as one."""
    cl = Cluster.preset("cpu-2x4")
    mesh = Mesh(cl)
    jm = jax.make_mesh(tuple(cl.mesh_shape), tuple(cl.axis_names), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    fn, args = _conv_step(**cfg)
    flat = flatten_program(fn, *args)
    checked = 0
    for si, (kind, eqn, _ins, _outs, _c) in enumerate(flat.steps):
        if kind != "eqn" or eqn.primitive.name != "conv_general_dilated":
            continue
        node = flat.graph.nodes[flat.step_node[si]]
        lsp = node.params["dimension_numbers"]["lhs_spec"][2:]
        spatial = [s for s in enumerate_strategies(node, mesh) if any(s.operand_specs[0][d] for d in lsp)]
        for s in spatial[::3]:  # every third keeps the test short; the full sweep found no mismatch
            la, ra = eqn.invars[0].aval, eqn.invars[1].aval
            osp = s.out_specs[0] if node.outputs[0].shape == eqn.outvars[0].aval.shape else None
            insh = tuple(NamedSharding(jm, P(*public_spec(sp))) for sp in s.operand_specs[:2])

            def g(lhs, rhs, eqn=eqn, osp=osp):
                y = eqn.primitive.bind(lhs, rhs, **eqn.params)
                return y if osp is None else jax.lax.with_sharding_constraint(y, NamedSharding(jm, P(*public_spec(osp))))
            text = jax.jit(g, in_shardings=insh).lower(jax.ShapeDtypeStruct(la.shape, la.dtype),
                                                       jax.ShapeDtypeStruct(ra.shape, ra.dtype)).compile().as_text()
            meas = {d["kind"]: d["wire_bytes"] for d in summarize(parse_collectives(text, 8))}
            pred: dict = {}
            for kd, ax, B in s.collectives:
                kd = "all-reduce" if kd == "reduce-scatter" else kd
                pred[kd] = pred.get(kd, 0.0) + collective(kd, ax, B, mesh)[1]
            assert set(meas) == set(pred), (node.role, s.name, meas, pred)
            for kd in pred:
                assert meas[kd] == pytest.approx(pred[kd], rel=0.01), (node.role, s.name, kd, meas, pred)
            checked += 1
    assert checked >= 3


def test_alpa_space_has_no_spatial_conv():
    fn, args = _conv_step(1, 1)
    g = sg.trace(fn, *args)
    full = sg.build_problem(g, "cpu-2x4")
    alpa = sg.build_problem(g, "cpu-2x4", space="alpa")
    names = lambda p: [n for st in p.meta.strategy_names for n in st]
    assert any("collective-permute" in n for n in names(full))
    assert not any("collective-permute" in n for n in names(alpa))
    with pytest.raises(ValueError, match="space must be"):
        sg.build_problem(g, "cpu-2x4", space="bogus")


def test_ilp_and_policy_see_spatial_strategies():
    """The issue's example: a 3x3 conv stack on one 1024x1024 field at batch 1 over h100-2x8. The
    unforced ILP splits the field (collective-permute strategies) and beats Alpa's space's; the policy's
    env offers every spatial strategy unmasked and prices a plan of them as evaluate does."""
    def step(params, x):
        def loss(p):
            h = x
            for w in p:
                h = jax.nn.relu(jax.lax.conv_general_dilated(h, w, (1, 1), "SAME",
                                                             dimension_numbers=("NHWC", "HWIO", "NHWC")))
            return jnp.mean(h ** 2)
        val, grad = jax.value_and_grad(loss)(params)
        return [w - 0.1 * gw for w, gw in zip(params, grad)], val
    params = [jax.ShapeDtypeStruct((3, 3, 32, 32), jnp.float32)] * 3
    args = (params, jax.ShapeDtypeStruct((1, 1024, 1024, 32), jnp.float32))
    g = sg.trace(step, *args)
    full, alpa = sg.build_problem(g, "h100-2x8"), sg.build_problem(g, "h100-2x8", space="alpa")
    pf = sg.solve(full, method="ilp", time_limit_s=10)
    pa = sg.solve(alpa, method="ilp", time_limit_s=10)
    convs = [i for i, nd in enumerate(g.nodes) if nd.primitive == "conv_general_dilated"]
    picked = [full.meta.strategy_names[i][pf.strategies[i]] for i in convs]
    assert sum("collective-permute" in x for x in picked) >= len(convs) // 2, picked
    # measured 0.385 vs 0.416 ms (Alpa's space splits channels: the field's element-wise work dominates)
    assert sg.evaluate(full, pf).step_time_s < 0.95 * sg.evaluate(alpa, pa).step_time_s
    assert env_episode(full, pf).step_time_s == sg.evaluate(full, pf).step_time_s
    pol = sg.solve(full, method="policy", search=False)
    assert all(0 <= s < k for s, k in zip(pol.strategies, full.num_strategies))


def _conv_stack(second: str = "stride2"):
    """A batch-1 step of two 3x3 SAME convs on a 64x64 field; the second has stride 2 or dilation 2."""
    stride, dil = (2, 1) if second == "stride2" else (1, 2)

    def conv(x, w, s, d=1):
        return jax.lax.conv_general_dilated(x, w, (s, s), "SAME", rhs_dilation=(d, d),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def step(params, batch):
        def loss(p):
            h = jax.nn.relu(conv(batch["x"], p["w1"], 1))
            h = jax.nn.relu(conv(h, p["w2"], stride, dil))
            return jnp.mean((h - batch["y"]) ** 2)
        val, grad = jax.value_and_grad(loss)(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, grad), val
    k = jax.random.split(jax.random.key(0), 4)
    params = {"w1": jax.random.normal(k[0], (3, 3, 16, 32)) * 0.2, "w2": jax.random.normal(k[1], (3, 3, 32, 32)) * 0.2}
    n = 64 // stride
    batch = {"x": jax.random.normal(k[2], (1, 64, 64, 16)), "y": jax.random.normal(k[3], (1, n, n, 32))}
    return step, (params, batch)


@pytest.mark.parametrize("second", ["stride2", "dilation2"])
def test_spatial_plan_executes(second):
    """A batch-1 conv stack (a stride-1 conv, then a stride-2 or a dilation-2 one), every conv
    (forward and both gradients) forced onto a spatial strategy (the ILP picks the rest): numerics
    match; collective bytes and memory within 10% of the prediction."""
    step, args = _conv_stack(second)
    g = sg.trace(step, *args, schedule="xla")   # the model's steps in XLA's order (costmodel/schedule.py)
    p = sg.build_problem(g, "cpu-2x4")
    plan, chosen = forced_plan(p, g, "conv_general_dilated", "collective-permute")
    assert len(chosen) == 5 and all("collective-permute" in c for c in chosen)
    r = sg.execute(step, args, g, plan, problem=p)
    print(fidelity_line(f"spatial-conv-{second}", r))
    assert r.max_rel_err < 1e-4 and r.loss_rel_err < 1e-5
    kinds = {c["kind"]: c for c in r.collectives}
    assert kinds["collective-permute"]["count"] >= 5
    assert r.collective_wire_bytes == pytest.approx(r.predicted_comm_bytes, rel=0.10)
    # memory, priced in XLA's step order (sg.trace(..., schedule="xla"), costmodel/schedule.py):
    # stride2 997,380 B predicted vs XLA's 964,652 B (1.034; 1.000 in the trace's order, since session
    # 9's rules in costmodel/copy_lists.py); dilation2 1,656,836 B vs 1,796,140 B (0.922; 0.849 in the
    # trace's order, an xfail until session 12). XLA peaks at position 34 of 53, where the loss
    # residual (h - y)**2, computed 8-way on W, is all-gathered to the 2-way layout of the loss
    # reduce_sum's strategy (all-gather f32[1,64,32,32], 30-34) and relaid out for it (wrapped_copy,
    # 34-38; 256 KiB each) beside the backward pass's buffers: XLA runs that reduce after the loss
    # gradient's fusions (the unsharded step) or after the first weight-gradient conv (this plan's own
    # program, 0.998 in that order), while the trace puts it right after the forward pass
    assert_memory(r)
    assert np.isfinite(r.loss)
