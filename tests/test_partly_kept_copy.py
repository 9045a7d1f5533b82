"""A partly kept chain reading its head operand through a collective (issue 13, moe tiny's min-memory
plans, session 22): ``transpose(x @ w) -> silu -> a * g`` keeps ``a * g`` (a dot operand) and s, and the
backward fusion rebuilds the unkept outputs from the head operand. Read as it is, that operand's buffer
lives to the backward (``slice_layout.partly_kept_reads``); read through a collective, XLA keeps the
collective's result there instead, where ``copy_lists.copy_group_lists`` held the copy at the chain's
own step only (moe ilp-memory 0.846 of XLA's memory; ``slice_layout.held_read_steps``)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

SHAPES = ((64, 32), (2, 32, 64), (2, 64, 64), (2, 64, 32))   # h: f32[2,64,64], 32 KiB whole


def _loss(x, w, a, v, shard=lambda t, spec: t):
    h = shard(jnp.einsum("bd,edh->ebh", x, w), P(None, ("x", "y")))   # batch-sharded over all 8
    g = jax.nn.silu(shard(h, P()))                                     # the chain reads it replicated
    return jnp.mean(jnp.einsum("ebh,ehd->ebd", a * g, v) ** 2)


def _step(x, w, a, v):
    return jax.grad(lambda w, v: _loss(x, w, a, v), argnums=(0, 1))(w, v)


def test_xla_keeps_the_gathered_head_operand_for_the_backward_fusion():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))

    def shard(t, spec):
        return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, spec))

    def fn(x, w, a, v):
        return jax.grad(lambda w, v: _loss(x, w, a, v, shard), argnums=(0, 1))(w, v)
    hlo = jax.jit(fn).lower(*(jnp.ones(s) for s in SHAPES)).compile().as_text()
    instr = re.findall(r"^\s*(?:ROOT )?%(\S+) = (\S+) (\S+?)\(([^)]*)\).*?op_name=\"([^\"]*)\"", hlo, re.M)
    gathers = [n for n, shape, op, _, _ in instr if op == "all-gather" and shape.startswith("f32[2,64,64]")]
    assert len(gathers) == 1   # h gathered once, f32[2,64,64]
    op_name = {n: o for n, _, _, _, o in instr}
    readers = [re.findall(r"%(\S+?)(?:[,)]|$)", args) for _, _, _, args, _ in instr
               if "%" + gathers[0] in re.split(r",\s*", args)]
    # a reader of the gathered h also reads the backward dot of the second einsum (dL/d(a*g)): h's
    # gathered copy lives from the forward pass to the backward fusion
    assert any("transpose(jvp(ebh,ehd->ebd))/dot_general" in op_name.get(o, "") for r in readers for o in r)


def test_the_model_holds_the_gathered_copy_to_the_backward_reader():
    """Under that plan (the dot's result batch-sharded over 8, the chain replicated) the all-gathered
    copy of h, 32 KiB per device, lives from the dot's step to the backward dot that reads the chain's
    unkept outputs (before: to the chain's own step)."""
    import shardgym as sg
    from costmodel.problem import as_strategy_array

    graph = sg.trace(_step, *(jnp.ones(s) for s in SHAPES))
    problem = sg.build_problem(graph, sg.Cluster.preset("cpu-2x4"))
    m = problem.meta
    dots = [i for i, p in enumerate(m.primitives) if p == "dot_general"]
    chain = next(i for i, nd in enumerate(graph.nodes) if nd.primitive == "transpose" and "logistic" in nd.folded)
    back = next(i for i in dots if any(u == chain for u, _ in graph.nodes[i].operands[2:]))  # reads s, 1 - s, ...
    s = [0] * problem.num_nodes
    s[dots[0]] = m.strategy_names[dots[0]].index("RRS01 = RRR x S01R")   # (e, h, b): b over all 8
    s[chain] = m.strategy_names[chain].index("RRR = RRR")
    t0, tb = int(problem.intervals[dots[0], 0]), int(problem.intervals[back, 0])
    assert tb > int(problem.intervals[chain, 0]) + 1
    em = problem.edge_memory
    a, b, z = (np.asarray(x) for x in em.intervals(as_strategy_array(problem, s)))
    mine = [(int(p), int(q)) for p, q, y in zip(a, b, z) if y == 32768.0]
    assert (t0, tb + 1) in mine
