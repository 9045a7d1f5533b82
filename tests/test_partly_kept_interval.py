"""A residual LayerNorm block (meshgraphnet's edge update ``e + LayerNorm(Dense(x))``, read by a
concatenate and a dot), forward + backward, replicated, against XLA CPU's optimised HLO:

* the block output ``e + norm * scale + bias`` is read only by the concatenate; XLA frees it there,
  and the backward rebuilds ``rsqrt * scale`` (an unkept output of the same traced chain) from the
  rsqrt. The model held the chain's kept output to that backward reader (``slice_layout.
  buffer_reads``; meshgraphnet large dp 1.124 of XLA's memory, 15 edge and 15 node blocks);
* with at least 4096 rows XLA writes ``rsqrt * scale`` out in the forward pass for the backward's
  YNNPACK fusion (``ynn_reads.shared_product``), below that it does not, whatever the element count.
"""
from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import shardgym as sg
from costmodel.memory import materialised_outputs


def _step(n: int, f: int):
    class Block(nn.Module):
        @nn.compact
        def __call__(self, e, x):
            e = e + nn.LayerNorm()(nn.Dense(f)(x))
            agg = jax.ops.segment_sum(e, jnp.arange(n) // 4, num_segments=n // 4)   # meshgraphnet's scatter-add
            return jnp.sum(nn.Dense(f)(jnp.concatenate([e, x], -1)) ** 2) + jnp.sum(agg ** 2)

    m = Block()
    e = jax.ShapeDtypeStruct((n, f), jnp.float32)   # abstract: traced and compiled, nothing run
    params = jax.eval_shape(m.init, jax.random.PRNGKey(0), e, e)
    return jax.grad(lambda p, e, x: m.apply(p, e, x)), (params, e, e)


def _xla(step, args) -> dict:
    """Forward-pass instructions ("op_name:name", op_name below the Block) -> the instructions reading
    them, each as (name, in the backward pass)."""
    hlo = jax.jit(step).lower(*args).compile().as_text()
    fwd, readers = {}, {}
    for line in hlo[hlo.index("ENTRY"):].splitlines():
        m = re.match(r"\s+(?:ROOT )?%(\S+) = (\S+) (\w[\w-]*)\((.*?)\)(.*)", line)
        if not m:
            continue
        name, ty, op, ops, rest = m.groups()
        op_name = re.search(r'op_name="([^"]*)"', rest)
        for a in re.findall(r"%([\w.\-]+)", ops):
            if a in fwd:
                readers[fwd[a]].append((name, "transpose(" in rest))
        if op != "parameter" and op_name and "transpose(" not in op_name.group(1):
            fwd[name] = op_name.group(1).split("jvp(Block)/")[-1] + ":" + name
            readers[fwd[name]] = []
    return readers


def _model(step, args):
    """(the LayerNorm chain node keeping the block output, the replicated plan's Problem and strategies)."""
    graph = sg.trace(step, *args)
    problem = sg.build_problem(graph, "cpu-2x4")
    kept, _ = materialised_outputs(graph)
    cons = graph.consumers()
    chain = next(nd for nd in graph.nodes if not nd.is_input and nd.folded and kept[nd.id]
                 and len(kept[nd.id]) < len(nd.outputs)
                 and any(graph.nodes[c].primitive == "concatenate" for o in kept[nd.id] for c, _ in cons.get((nd.id, o), ())))
    s = np.asarray(sg.solve(problem, method="replicated").strategies)
    return graph, problem, chain, s


def test_block_output_dies_at_its_reader_and_the_product_is_written_for_4096_rows():
    n, f = 4096, 16
    step, args = _step(n, f)
    xla = _xla(step, args)
    out = [k for k in xla if k.split(":")[0] in ("add", "add_any")]   # e + norm * scale + bias, where written
    assert out and not [r for k in out for r, bwd in xla[k] if bwd], xla
    prod = [k for k in xla if k.startswith("LayerNorm_0/mul:broadcast_multiply")]   # rsqrt * scale
    assert len(prod) == 1 and all(bwd for _, bwd in xla[prod[0]]), xla
    graph, problem, chain, s = _model(step, args)
    cons = graph.consumers()
    concat = max(graph.nodes[c].order for o in range(len(chain.outputs)) for c, _ in cons.get((chain.id, o), ())
                 if graph.nodes[c].primitive == "concatenate")
    first_grad = min(nd.order for nd in graph.nodes if not nd.is_input and nd.role == "gradient")
    assert problem.intervals[chain.id, 1] == concat + 1 < first_grad   # was the backward reader's step + 1
    em = problem.edge_memory
    a, b, z = em.intervals(s)
    mine = [(int(x), int(y)) for x, y, zz, g in zip(a, b, z, range(len(z))) if zz == n * f * 4 and x == chain.order]
    assert len(mine) == 1 and mine[0][1] > first_grad, (mine, first_grad)   # the product, to the backward


def test_no_product_below_4096_rows():
    n, f = 2048, 32                                            # as many elements, half the rows
    step, args = _step(n, f)
    xla = _xla(step, args)
    assert not [k for k in xla if k.startswith("LayerNorm_0/mul:broadcast_multiply")], xla
    graph, problem, chain, s = _model(step, args)
    a, b, z = problem.edge_memory.intervals(s)
    assert not [1 for x, zz in zip(a, z) if zz == n * f * 4 and x == chain.order]
