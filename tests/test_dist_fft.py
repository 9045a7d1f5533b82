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
from plan_helpers import assert_memory, env_episode, fidelity_line  # noqa: E402

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


#: (fno size, complex FFTs, kind): every fft node of a batch-1 FNO step on that one kind. rfft's real
#: last dim must be whole and its n//2+1 = 17 / 9 dim does not divide, so a 2-D rfft has no pencil and
#: its one-all-to-all strategies move a transformed dim to a batch dim
FNO_CASES = [("tiny", False, "batch"), ("tiny", False, "slab"),
             ("3d-tiny", False, "batch"), ("3d-tiny", False, "slab"), ("3d-tiny", False, "pencil"),
             ("tiny", True, "batch"), ("tiny", True, "slab"), ("tiny", True, "pencil"),
             ("3d-tiny", True, "batch"), ("3d-tiny", True, "slab"), ("3d-tiny", True, "pencil")]
#: (case, schedule) -> predicted / XLA per-device memory outside 10%, in the trace's order ("program")
#: and in XLA's ("xla": ``sg.trace(..., schedule="xla")``); plan_helpers.assert_memory xfails within
#: 0.02 of these and fails beyond. None since session 14. The 3-D fftn pencil plan (0.826 until
#: session 11) held at XLA's peak a gathered activation twice (``costmodel.cost.gather_relaid``).
#: XLA's figure is its true peak: the union of the byte ranges of the temp values live at one position
#: is the temp size to within 1.3 KB (``shardgym.verifier.peak_buffers``; the live-range dump's
#: "(peak)" listing sums 255-720 KB less). Session 13 found, in the 2-D fftn slab plan (0.896 /
#: 0.898), that XLA re-slices the gathered spectra in the weight gradients' pad fusions (outer
#: products at batch 1) instead of reading the slices' buffers, so the spectra live to the backward
#: pass (``memory.recomputed_reads``), and that under the batch plans XLA makes the spectral-weight
#: slices in the spectral dots' layout (4 x 32 KiB where the model charged 4 x 128 KiB replicated:
#: ``slice_layout.reader_layout_slices``, through the squeeze); with both, a sharded fft output read
#: by its gathering transpose dies at the gather (``slice_layout.fused_read_groups``). Session 14,
#: program / XLA order, before -> after (the ILP re-solves each case's plan on the new model): 2-D
#: rfftn batch 1.029 / 1.066 -> 0.915 / 0.952, slab 1.041 / 1.062 -> 0.993 / 1.015, 3-D rfftn batch
#: 1.029 / 1.029 -> 1.029 / 1.029, slab 0.946 -> 1.024 (both), pencil 0.945 -> 1.024 (both), 2-D
#: fftn batch 1.074 / 1.108 -> 0.991 / 1.024, slab 0.896 / 0.898 -> 0.967 / 0.969, pencil 1.064 /
#: 1.076 -> 1.061 / 1.068, 3-D fftn batch 1.000 / 0.963 -> 1.065 / 1.028, slab 0.921 / 0.885 ->
#: 1.060 / 1.023, pencil 0.964 / 0.928 -> 1.026 / 0.991
MEMORY_GAP: dict = {}


def _fno_case_id(case):
    size, cplx, kind = case
    return f"{'3d' if size.startswith('3d') else '2d'}-{'fftn' if cplx else 'rfftn'}-{kind}"


#: XLA's order (opt-in since session 14) on the four cases whose memory it priced worst before
#: session 14 (the MEMORY_GAP comment); every case runs in the default program order. All eleven
#: passed in both orders at session 14's merge (``-k xla`` after widening this list re-checks them)
XLA_ORDER_CASES = [("tiny", True, "batch"), ("tiny", True, "slab"), ("3d-tiny", True, "slab"),
                   ("3d-tiny", True, "pencil")]
FNO_RUNS = [(c, "program") for c in FNO_CASES] + [(c, "xla") for c in XLA_ORDER_CASES]


@pytest.mark.parametrize(("case", "schedule"), FNO_RUNS, ids=[f"{_fno_case_id(c)}-{s}" for c, s in FNO_RUNS])
def test_fno_plan_with_distributed_ffts_executes(case, schedule):
    """FNO at batch 1 on the 2x4 CPU mesh, every fft node forced onto one strategy kind (rfftn /
    irfftn, or fftn / ifftn with ``complex_fft``; 2-D and 3-D): the forward and backward numerics
    match the unsharded step, XLA's collective bytes and per-device memory are within 10% of the
    prediction, and the ffts' all-to-alls are all XLA runs as all-to-alls beyond the resharding;
    priced in the trace's order and in XLA's (``sg.trace(..., schedule=)``)."""
    import dataclasses

    from costmodel.problem import Plan
    from zoo.common import build_step
    size, cplx, kind = case
    fn, args = build_step(zoo.fno, dataclasses.replace(zoo.config("fno", size), batch=1, complex_fft=cplx))
    g = sg.trace(fn, *args, schedule=schedule)
    p = sg.build_problem(g, "cpu-2x4")
    ffts = [i for i, nd in enumerate(g.nodes) if nd.primitive == "fft"]
    want = {"FFT", "IFFT"} if cplx else {"RFFT", "IRFFT"}
    assert len(ffts) == 8 and {g.nodes[i].params["fft_type"] for i in ffts} == want
    pen, o = p.node_costs.copy(), p.strategy_offsets
    for i in ffts:
        pen[o[i]:o[i + 1]] += [0.0 if FFT_KINDS[kind](nm) else 1.0 for nm in p.meta.strategy_names[i]]
    pl = sg.solve(dataclasses.replace(p, node_costs=pen), method="ilp", time_limit_s=20)
    plan = Plan.for_problem(p, pl.strategies, method="forced")
    names = [p.meta.strategy_names[i][plan.strategies[i]] for i in ffts]
    assert all(FFT_KINDS[kind](nm) for nm in names), names
    env_episode(p, plan)   # the policy's env offers and prices these fft strategies too
    r = sg.execute(fn, args, g, plan, problem=p, iters=1)
    meas = {c["kind"]: c for c in r.collectives}
    pred = {c["kind"]: c for c in r.predicted_collectives}
    print(fidelity_line(f"{_fno_case_id(case)} {schedule}", r))
    assert r.max_rel_err < 1e-4 and r.loss_rel_err < 1e-5
    fft_a2a = pred.get("all-to-all", {"wire_bytes": 0.0, "count": 0})
    xla_a2a = meas.get("all-to-all", {"wire_bytes": 0.0, "count": 0})
    assert xla_a2a["count"] >= fft_a2a["count"] == (0 if kind == "batch" else 8 if kind == "slab" else 16)
    # XLA's all-to-alls = the ffts' (exact) + resharding it runs as all-to-alls, priced as resharding
    extra = xla_a2a["wire_bytes"] - fft_a2a["wire_bytes"]
    assert -0.01 * fft_a2a["wire_bytes"] <= extra <= pred.get("resharding", {"wire_bytes": 0.0})["wire_bytes"]
    assert r.collective_wire_bytes == pytest.approx(r.predicted_comm_bytes, rel=0.10)
    assert_memory(r, MEMORY_GAP.get((case, schedule)), "a measured gap, its cause in the MEMORY_GAP comment")
