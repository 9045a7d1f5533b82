"""Distributed FFT strategies: every kind runs under shard_map with the predicted all-to-alls and the
unsharded numerics, and a plan that picks them executes end to end."""
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
import zoo
from costmodel.cluster import Cluster
from costmodel.cost import Mesh, collective, public_spec
from costmodel.fft_plan import schedule
from costmodel.strategies import enumerate_strategies
from costmodel.trace import flatten_program
from runtime import dist_fft
from runtime.hlo import parse_collectives, summarize

sys.path.insert(0, os.path.dirname(__file__))
from plan_helpers import env_episode  # noqa: E402

CASES = {
    "rfft2": (lambda x: jnp.fft.rfft2(x), (2, 4, 16, 16), jnp.float32),
    "irfft2": (lambda x: jnp.fft.irfft2(x, s=(16, 16)), (2, 4, 16, 9), jnp.complex64),
    "fft2": (lambda x: jnp.fft.fft2(x), (2, 4, 16, 16), jnp.complex64),
    "ifftn": (lambda x: jnp.fft.ifftn(x, axes=(1, 2, 3)), (2, 8, 8, 8), jnp.complex64),
}


def test_schedule_by_hand():
    sizes = {"x": 2, "y": 4}
    # slab: fft2 over dims (2, 3), operand split on dim 2 by y, result on dim 3: transform 3, transpose, transform 2
    st = schedule("FFT", (2, 4, 16, 16), [16, 16], ((), (), ("y",), ()), ((), (), (), ("y",)), sizes)
    # the all-to-all sees the local f32[2, 4, 4, 16] piece (dim 2 split 4 ways), complex by then
    assert st == [("fft", 3), ("a2a", ("y",), 3, 2, (2, 4, 4, 16), True), ("fft", 2)]
    # pencil: fftn over (1, 2, 3), operand split dim 1 by x and dim 2 by y; result dim 2 by x, dim 3 by y
    st = schedule("FFT", (2, 8, 8, 8), [8, 8, 8], ((), ("x",), ("y",), ()), ((), (), ("x",), ("y",)), sizes)
    assert [s[0] for s in st] == ["fft", "a2a", "fft", "a2a", "fft"]
    assert st[1][1:4] == (("y",), 3, 2) and st[3][1:4] == (("x",), 2, 1)
    # rfft: the real last dim must be whole in the operand
    assert schedule("RFFT", (2, 4, 16, 16), [16, 16], ((), (), (), ("y",)), ((), (), ("y",), ()), sizes) is None
    # irfft: a split of the n//2+1 = 9 dim does not divide
    assert schedule("IRFFT", (2, 4, 16, 9), [16, 16], ((), (), ("y",), ()), ((), (), (), ("y",)), sizes) is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_fft_strategy_matches_and_moves_what_is_predicted(case):
    f, shape, dtype = CASES[case]
    cl = Cluster.preset("cpu-2x4")
    mesh = Mesh(cl)
    jm = jax.make_mesh(tuple(cl.mesh_shape), tuple(cl.axis_names), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == jnp.complex64:
        x = (x + 1j * rng.standard_normal(shape)).astype(np.complex64)
    flat = flatten_program(f, jax.ShapeDtypeStruct(shape, dtype))
    (si, eqn), = [(i, s[1]) for i, s in enumerate(flat.steps) if s[0] == "eqn" and s[1].primitive.name == "fft"]
    node = flat.graph.nodes[flat.step_node[si]]
    ref = np.asarray(eqn.primitive.bind(jnp.asarray(x), **eqn.params))
    strategies = enumerate_strategies(node, mesh)
    kinds = set()
    for s in strategies[1::3]:  # every third one keeps the test short; the full sweep found no mismatch
        ins, outs = public_spec(s.operand_specs[0]), public_spec(s.out_specs[0])
        fn = jax.jit(lambda v, ins=ins, outs=outs: dist_fft.apply(eqn.params, v, ins, outs, jm),
                     in_shardings=NamedSharding(jm, P(*ins)), out_shardings=NamedSharding(jm, P(*outs)))
        compiled = fn.lower(jax.ShapeDtypeStruct(shape, dtype)).compile()
        got = np.asarray(compiled(jax.device_put(x, NamedSharding(jm, P(*ins)))))
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5, s.name
        meas = {d["kind"]: d["wire_bytes"] for d in summarize(parse_collectives(compiled.as_text(), 8))}
        pred: dict = {}
        for kd, ax, B in s.collectives:
            pred[kd] = pred.get(kd, 0.0) + collective(kd, ax, B, mesh)[1]
        assert set(meas) == set(pred), (s.name, meas, pred)
        for kd in pred:
            assert meas[kd] == pytest.approx(pred[kd], rel=0.01), (s.name, meas, pred)
        n_a2a = sum(1 for c in s.collectives if c[0] == "all-to-all")
        kinds.add("batch" if n_a2a == 0 else ("pencil" if n_a2a >= 2 else "transpose"))
    assert "batch" in kinds and "transpose" in kinds
    if case == "ifftn":
        assert "pencil" in kinds


#: fft strategy kinds by name: batch-sharded (a sharded dim, local FFTs), slab (one all-to-all),
#: pencil (an all-to-all per decomposed axis: two)
FFT_KINDS = {
    "batch": lambda n: "all-to-all" not in n and n.split(" = ")[0].strip("R") != "",
    "slab": lambda n: n.count("all-to-all") == 1,
    "pencil": lambda n: n.count("all-to-all") >= 2,
}


@pytest.mark.parametrize("size,cycle", [("tiny", ("batch", "slab")), ("3d-tiny", ("batch", "slab", "pencil"))],
                         ids=["2d-batch-slab", "3d-batch-slab-pencil"])
def test_fno_plan_with_distributed_ffts_executes(size, cycle):
    """FNO at batch 1, its 8 fft nodes forced in turn onto the kinds in ``cycle`` (2-D: rfft2 /
    irfft2, batch-sharded and slab; 3-D: rfftn / irfftn, batch-sharded, slab and 3-D pencil):
    forward and backward numerics match the unsharded step; collectives and memory within 10% of
    the prediction, and the fft all-to-alls move exactly the predicted bytes."""
    import dataclasses

    from costmodel.problem import Plan
    fn, args = zoo.build("fno", size, batch_size=1)
    g = sg.trace(fn, *args)
    p = sg.build_problem(g, "cpu-2x4")
    ffts = [i for i, nd in enumerate(g.nodes) if nd.primitive == "fft"]
    kinds = [FFT_KINDS[c] for c in cycle]
    pen, o = p.node_costs.copy(), p.strategy_offsets
    for k, i in enumerate(ffts):
        pen[o[i]:o[i + 1]] += [0.0 if kinds[k % len(kinds)](nm) else 1.0 for nm in p.meta.strategy_names[i]]
    pl = sg.solve(dataclasses.replace(p, node_costs=pen), method="ilp", time_limit_s=20)
    plan = Plan.for_problem(p, pl.strategies, method="forced")
    names = [p.meta.strategy_names[i][plan.strategies[i]] for i in ffts]
    assert len(ffts) == 8 and all(kinds[k % len(kinds)](nm) for k, nm in enumerate(names)), names
    env_episode(p, plan)   # the policy's env offers and prices these fft strategies too
    r = sg.execute(fn, args, g, plan, problem=p, iters=1)
    assert r.max_rel_err < 1e-4 and r.loss_rel_err < 1e-5
    meas = {c["kind"]: c for c in r.collectives}
    pred = {c["kind"]: c for c in r.predicted_collectives}
    assert meas["all-to-all"]["count"] >= 4
    # the fft all-to-alls as predicted: XLA 69,120 vs 67,584 B (2-D), 129,120 vs 129,024 B (3-D); the
    # excess is XLA's resharding run as all-to-alls (3-D: two of f32[1,2,2], the model's resharding row)
    assert meas["all-to-all"]["wire_bytes"] == pytest.approx(pred["all-to-all"]["wire_bytes"], rel=0.05)
    # measured (this branch, s7-D): 2-D comm 825,136 B both, memory 3.811 MB XLA vs 3.673 predicted
    # (0.96); 3-D comm 902,104 B both, memory 3.430 MB XLA vs 3.559 predicted (1.04). (All eight 3-D
    # ffts on pencil strategies: memory 1.07, comm 0.88 of XLA: XLA gathers the pencil layouts to the
    # replicated dots axis by axis, 1,024,888 B of all-gathers vs 877,528 B of resharding predicted.)
    assert r.collective_wire_bytes == pytest.approx(r.predicted_comm_bytes, rel=0.10)
    assert r.predicted_memory_bytes == pytest.approx(r.xla_memory_bytes, rel=0.10)
