"""XLA CPU's all-reduce combiner beyond the gradients (issue 13, moe ilp-memory, session 22):
two dots that contract a dim sharded over x and do not depend on each other run as one tuple
all-reduce, which holds both partial results and both sums at once; a third dot that reads their
product runs its own. ``costmodel.combined.independent_all_reduce_lists`` charges the first dot's
operand and sum at the second's step (before: nothing, both have an all-reducing descendant)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

SHAPES = ((64, 32), (32, 64), (32, 64), (64, 16))
SPECS = (P(None, "x"), P("x", None), P("x", None), P("x", None))   # every contracted dim over x


def _f(x, w1, w2, w3):
    return (jnp.tanh(x @ w1) * jnp.tanh(x @ w2)) @ w3


def test_xla_combines_the_independent_dots_all_reduces():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p)) for s, p in zip(SHAPES, SPECS)]
    c = jax.jit(_f, out_shardings=NamedSharding(mesh, P())).lower(*args).compile()
    ars = re.findall(r"= (\(?[^=]*?\)?) all-reduce\(([^)]*)\)", c.as_text())
    assert sorted(len(ops.split(",")) for _, ops in ars) == [1, 2]   # x@w1 and x@w2 combined; the last apart
    shapes = re.findall(r"f32\[(\d+),(\d+)\]", next(sh for sh, ops in ars if "," in ops))
    per = 4 * int(shapes[0][0]) * int(shapes[0][1])   # each dot's partial result per device
    # XLA's temp peak holds both partials and both sums (4 x 8,192 B, + 16 B)
    assert c.memory_analysis().temp_size_in_bytes >= 4 * per


def test_the_model_charges_the_first_dots_all_reduce_at_the_second_dots_step():
    import shardgym as sg
    from costmodel.builder import strategies_of
    from costmodel.copy_lists import combined_all_reduce_lists
    from costmodel.cost import Mesh
    from costmodel.edge_memory import CopyGroups

    graph = sg.trace(_f, *(jnp.ones(s) for s in SHAPES), schedule="program")
    cluster = sg.Cluster.preset("cpu-2x4")
    strats = strategies_of(graph, cluster)
    names = [[st.name for st in ss] for ss in strats]
    rule = CopyGroups.from_lists(combined_all_reduce_lists(graph, strats, Mesh(cluster)))
    d1, d2, d3 = [i for i, nd in enumerate(graph.nodes) if nd.primitive == "dot_general"]
    assert any(u == d1 for u, _ in graph.nodes[d2].operands)   # d2's folded chain reads d1, its head does not
    s = np.zeros(len(graph.nodes), dtype=np.int64)
    for d in (d1, d2, d3):
        s[d] = names[d].index("RR = RS0 x S0R (all-reduce x)")
    t2 = int(graph.nodes[d2].order)
    a, b, z = (np.asarray(x) for x in rule.intervals(s))
    assert set(zip(a.tolist(), b.tolist())) == {(t2, t2 + 1)}
    at_t2 = sorted(z.tolist())
    # d1's and d2's partial results (64 x 64 f32 whole: 16 KiB each) at d2's step; an all-reduce's
    # sum is the node's own (replicated) output, no extra; d3 combines with nothing
    assert at_t2 == [16384.0, 16384.0]
    s[d1] = names[d1].index("RS0 = RS0 x S0R (reduce-scatter x)")
    a, b, z = (np.asarray(x) for x in rule.intervals(s))
    # on CPU a reduce-scatter is an all-reduce and a slice: d1's whole sum (16 KiB, of which the
    # model's output holds 8 KiB at d1's step only) is held too
    assert set(zip(a.tolist(), b.tolist())) == {(t2, t2 + 1)} and sorted(z.tolist()) == [16384.0, 24576.0]
