"""A chain behind a non-fusible head, recomputed by its readers, reading an operand through a collective
(issue 13, gpt tiny's min-memory frontier, session 24): ``x = wte[tokens] + wpe`` is a gather whose folded
``+ wpe`` XLA never writes out. It keeps the gather's result and, when wpe arrives hidden-sharded, wpe's
all-gather, and every reader of x (the forward and the backward fusions) recomputes the add from the two.
``copy_lists.copy_group_lists`` held that all-gather for the gather's own step only
(``slice_layout.held_read_steps`` now holds it to the last reader of x)."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ARGS = (jnp.ones((64, 32)), jnp.ones((16, 32)), jnp.ones((32, 32)), jnp.zeros((8, 16), jnp.int32))


def _loss(emb, pos, w, tok):
    x = jnp.take(emb, tok, axis=0) + pos[None]
    return jnp.mean(((x * x) @ w) ** 2)


def _step(emb, pos, w, tok):
    return jax.grad(_loss, argnums=(0, 1, 2))(emb, pos, w, tok)


def _plan():
    """Data-parallel but pos (16 x 32 floats, 2 KiB) hidden-sharded over the mesh's 4-way axis: the
    gather (batch-sharded, its operands replicated in the hidden dim) all-gathers pos for its chain."""
    import shardgym as sg

    graph = sg.trace(_step, *ARGS)
    problem = sg.build_problem(graph, sg.Cluster.preset("cpu-2x4"))
    m = problem.meta
    gather = m.primitives.index("gather")
    nd = graph.nodes[int(m.graph_node[gather])]
    pos_b = nd.operands[2][0]                               # the chain's operand: broadcast(pos)
    pos = graph.nodes[pos_b].operands[0][0]
    ops = [graph.nodes[int(g)].operands for g in m.graph_node]
    back = next(i for i, p in enumerate(m.primitives) if p == "dot_general" and ops[i][2:]
                and ops[i][2][0] == nd.id)   # d(x * x) = 2 x * (g @ w^T), reading x in its chain
    s = list(sg.solve(problem, method="dp").strategies)     # batch-sharded over the 2-way axis, x read so
    s[pos] = m.strategy_names[pos].index("RS1")
    s[pos_b] = m.strategy_names[pos_b].index("RRS1 = RS1")
    s[gather] = m.strategy_names[gather].index("S0RR = RR x S0RR")
    return graph, problem, s, gather, pos_b, back


def test_xla_keeps_the_gathered_chain_operand_for_the_backward_reader():
    import shardgym as sg
    from runtime.core import NODE_SCOPE, execute

    graph, problem, s, gather, pos_b, back = _plan()
    plan = sg.Plan.for_problem(problem, s)
    with tempfile.TemporaryDirectory() as d:
        abstract = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ARGS[:3]) + ARGS[3:]   # compile only
        execute(_step, abstract, graph, plan, problem=problem, compiler_options={"xla_dump_to": d})
        hlo = sorted(Path(d).glob("*after_optimizations.txt"))[-1].read_text()
    entry = hlo[hlo.index("ENTRY"):]
    gathers = re.findall(r"%(all-gather[\w.]*) = f32\[1,16,32\]", entry)
    assert len(gathers) == 1                                # broadcast(pos), gathered once: f32[1,16,32]
    readers = [line for line in entry.splitlines() if re.search(rf"%{re.escape(gathers[0])}[,)]", line)]
    g_gather, g_back = (int(problem.meta.graph_node[i]) for i in (gather, back))
    # read by the forward chain (x * x, in the gather's scope) and by the backward dot's fusion
    # (2 x * (g @ w^T), recomputing x = wte[tokens] + pos): the gathered pos lives from one to the other
    assert any(f"{NODE_SCOPE}{g_gather}/" in line for line in readers), readers
    assert any(f"{NODE_SCOPE}{g_back}/" in line for line in readers), readers


def test_the_model_holds_the_gathered_chain_operand_to_the_backward_reader():
    """The copy of broadcast(pos) in the gather's layout (replicated: 2 KiB per device) lives from the
    program's start to the backward dot's step (before: to the gather's step)."""
    from costmodel.problem import as_strategy_array

    graph, problem, s, gather, pos_b, back = _plan()
    em = problem.edge_memory
    a, b, z = (np.asarray(x) for x in em.intervals(as_strategy_array(problem, s)))
    mine = [(int(p), int(q)) for p, q, y in zip(a, b, z) if y == 16 * 32 * 4]
    tb = int(problem.intervals[back, 0])
    assert tb > int(problem.intervals[gather, 0]) + 1
    assert (0, tb + 1) in mine, mine                        # before: (0, the gather's step + 1)
    assert not any(p == 0 and q < tb + 1 for p, q in mine), mine
