"""Activation recomputation (``jax.checkpoint``) through trace, cost model and executor: the trace
puts a differentiated remat's operands through one ``optimization_barrier`` node and keeps the
recomputed ops as nodes of their own (FLOPs by hand), the executor's replay keeps the saving by
XLA's count (its memory, not just its numerics), and gpt's ``remat_attention`` step runs sharded
with the unsharded step's numbers."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import shardgym as sg
import zoo
from costmodel.plan import Plan
from costmodel.schedule import NODE_SCOPE
from costmodel.trace import flatten_program
from runtime import program
from runtime.core import execute
from zoo import gpt
from zoo.common import _FAST_COMPILE, build_step
from zoo.gpt import _core_attention

_CFG = dataclasses.replace(zoo.config("gpt", "tiny"), remat_attention=True, d_model=32, d_ff=64, vocab=64, seq_len=16)


def test_gpt_remat_trace_has_barriers_and_recomputed_scores():
    """Per layer: one barrier node over q, k, v and the attention output's cotangent (all
    [B, T, h, d_head]); the only extra dot is the recomputed scores q.k^T, 2*B*T*T*d FLOPs
    (probs.v is not recomputed: the backward needs probs, not its product with v)."""
    c = _CFG
    plain = sg.trace(*_step(dataclasses.replace(c, remat_attention=False)))
    remat = sg.trace(*_step(c))
    bars = [n for n in remat.nodes if n.primitive == "optimization_barrier"]
    assert not [n for n in plain.nodes if n.primitive == "optimization_barrier"]
    assert len(bars) == c.n_layers
    bthd = (c.batch, c.seq_len, c.n_heads, c.d_head)
    assert all(len(n.outputs) == 4 and {tuple(t.shape) for t in n.outputs} == {bthd} and n.flops == 0 for n in bars)
    dots = [sum(n.flops_by_primitive.get("dot_general", 0) for n in g.nodes) for g in (plain, remat)]
    assert dots[1] - dots[0] == c.n_layers * 2 * c.batch * c.seq_len * c.seq_len * c.d_model


def _step(cfg):
    fn, args = build_step(gpt, cfg, abstract=True)
    return fn, *args


def _replay_temp(step, args, tie: bool) -> int:
    """XLA's temp bytes of the executor's replay of ``step`` (no sharding constraints, one device);
    ``tie=False`` replays the recomputation with the bare barrier (JAX's own lowering of it)."""
    flat = flatten_program(step, *args)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    plan = Plan(strategies=[], mesh_shape=(1,), axis_names=("x",),
                node_specs=[(i, None) for i in range(len(flat.graph.nodes))])
    saved = program._tied_barrier
    if not tie:
        program._tied_barrier = lambda ops: list(jax.lax.optimization_barrier(tuple(ops)))
    try:   # the replay binds the barrier when jit traces it
        run, _ = program._constrained_program(step, args, None, plan, mesh)
        return jax.jit(run).lower(*args).compile().memory_analysis().temp_size_in_bytes
    finally:
        program._tied_barrier = saved


def test_replay_keeps_the_recomputation_saving():
    """L layers of causal attention, each under jax.checkpoint. Without recomputation XLA CPU keeps
    two [b, h, t, t] buffers per layer (exp and the probabilities) from the forward pass to the
    backward (tests/test_attention_memory.py). With the bare barrier (as JAX lowers it, and as
    plain jax.jit of this step measures) XLA still holds them: it drops the barrier before
    scheduling and hoists every recomputation into the forward pass. The replay's tied barrier
    waits for the cotangent, so one layer's recomputation is live at a time: at least the other
    L - 1 layers' probabilities fewer (measured: 3.78 buffers fewer at L = 3, 6.04 at L = 4)."""
    L, x = 3, jax.ShapeDtypeStruct((2, 128, 4, 32), jnp.float32)
    ws = [jax.ShapeDtypeStruct((4, 32, 32), jnp.float32)] * L
    core = jax.checkpoint(_core_attention, static_argnums=(3,))

    def loss(ws, x):
        for w in ws:
            q = jnp.tanh(jnp.einsum("bthd,hde->bthe", x, w))
            x = x + core(q, q, x, True)
        return jnp.sum(x ** 2)

    step = jax.grad(loss)
    probs = 2 * 4 * 128 * 128 * 4
    tied, bare = _replay_temp(step, (ws, x), True), _replay_temp(step, (ws, x), False)
    assert bare - tied >= (L - 1) * probs, (bare, tied)


def test_gpt_remat_step_runs_sharded_with_the_unsharded_numbers():
    fn, args = build_step(gpt, dataclasses.replace(_CFG, n_layers=1))
    graph = sg.trace(fn, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    r = execute(fn, args, graph, sg.solve(problem, method="megatron"), problem=problem, iters=1, warmup=0,
                compiler_options=_FAST_COMPILE)   # numerics only: XLA's cheap passes
    assert r.max_rel_err < 1e-4 and r.loss_rel_err < 1e-6, (r.max_rel_err, r.loss_rel_err)
    # the tie reads one element of each sharded operand: a scalar collective, never the operand
    # (x.ravel()[0] made XLA all-gather q, k, v and the cotangent whole)
    bars = {n.id for n in graph.nodes if n.primitive == "optimization_barrier"}
    at = [c for c in r.collective_list if any(f"{NODE_SCOPE}{b}/" in (c["op_name"] or "") for b in bars)]
    assert bars and all(c["bytes"] <= 64 for c in at), at


def test_gpt_remat_mlp_recomputes_gelu_only():
    """``remat_mlp``: per layer one more barrier, over fc1's output [B, T, f] and fc2's output
    cotangent [B, T, d], largest first (fc2's kernel, a program input, stays out; gelu's output and
    tanh are not kept); the step's FLOPs
    grow by exactly one gelu forward on [B, T, f] per layer, and no dot is recomputed (fc2's
    backward needs gelu's output and the cotangent, not fc2's result)."""
    c = _CFG
    base, mlp = (sg.trace(*_step(dataclasses.replace(c, remat_mlp=m))) for m in (False, True))
    b, t, d, f = c.batch, c.seq_len, c.d_model, c.d_ff
    bars = [n for n in mlp.nodes if n.primitive == "optimization_barrier"]
    assert len(bars) == 2 * c.n_layers
    mlp_bars = [n for n in bars if len(n.operands) == 2]
    assert len(mlp_bars) == c.n_layers and all(
        [tuple(t_.shape) for t_ in n.operand_types] == [(b, t, f), (b, t, d)] for n in mlp_bars)
    gelu = sg.trace(lambda x: jax.nn.gelu(x), jax.ShapeDtypeStruct((b, t, f), jnp.float32))
    gelu_flops = sum(n.flops for n in gelu.nodes)
    assert gelu_flops >= b * t * f
    assert sum(n.flops for n in mlp.nodes) - sum(n.flops for n in base.nodes) == c.n_layers * gelu_flops
    dots = [sum(n.flops_by_primitive.get("dot_general", 0) for n in g.nodes) for g in (base, mlp)]
    assert dots[0] == dots[1]
