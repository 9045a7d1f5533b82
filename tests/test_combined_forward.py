"""XLA CPU's all-reduce combiner beyond the gradients (issue 13, moe ilp-memory, session 22): dots
that contract a dim sharded over x and do not depend on each other run as one tuple all-reduce,
which holds their partial results and sums at once. Here d1 = x @ w1, d2 = tanh(d1) @ w2 (reads
d1) and d3 = x @ w3 (its folded chain multiplies by tanh(d1), its head reads neither): XLA combines
d1 with d3 and d2 apart. An all-reduce that depends on a member waits for a later combination
without closing the open one (closed at d2, as CombineInstructionsByKey reads in older XLA, the
combination would be d2 with d3: f32[64,48] beside f32[64,16]).
``costmodel.combined.independent_all_reduce_lists`` charges d1's and d3's operands (and d1's sum)
at d3's step (before: nothing, every dot here has an all-reducing descendant)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

SHAPES = ((64, 32), (32, 32), (32, 48), (32, 32))
SPECS = (P(None, "x"), P("x", None), P("x", None), P("x", None))   # every contracted dim over x


def _f(x, w1, w2, w3):
    d1 = x @ w1
    d2 = jnp.tanh(d1) @ w2
    d3 = x @ w3
    return jnp.sum(jnp.tanh(d2)) + jnp.sum(jnp.tanh(d3) * jnp.tanh(d1))


def test_xla_combines_the_independent_dots_all_reduces():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, p)) for s, p in zip(SHAPES, SPECS)]
    c = jax.jit(_f, out_shardings=NamedSharding(mesh, P())).lower(*args).compile()
    ars = re.findall(r"= (\(?[^=]*?\)?) all-reduce\(([^)]*)\)", c.as_text())
    cols = [sorted(int(k) for k in re.findall(r"f32\[\d+,(\d+)\]", sh)) for sh, _ in ars]
    # d1 and d3 (64 x 32 each, columns split in two) together; d2 (f32[64,48]) in another
    assert sorted(cols) == [[16, 16], [48]]
    # XLA's temp peak holds both partials and both sums (4 x 4,096 B)
    assert c.memory_analysis().temp_size_in_bytes >= 4 * 64 * 16 * 4


def test_the_model_charges_d1s_all_reduce_at_d3s_step():
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
    assert any(u == d1 for u, _ in graph.nodes[d3].operands[2:])   # d3's folded chain reads d1, its head does not
    s = np.zeros(len(graph.nodes), dtype=np.int64)
    for d in (d1, d2, d3):
        s[d] = names[d].index("RR = RS0 x S0R (all-reduce x)")
    t3 = int(graph.nodes[d3].order)
    a, b, z = (np.asarray(x) for x in rule.intervals(s))
    # d1's and d3's partial results (64 x 32 f32 whole, 8 KiB each) at d3's step; an all-reduce's
    # sum is the node's own (replicated) output, no extra; d2 combines with nothing
    assert set(zip(a.tolist(), b.tolist())) == {(t3, t3 + 1)} and sorted(z.tolist()) == [8192.0, 8192.0]
    s[d1] = names[d1].index("RS0 = RS0 x S0R (reduce-scatter x)")
    a, b, z = (np.asarray(x) for x in rule.intervals(s))
    # on CPU a reduce-scatter is an all-reduce and a slice: d1's whole sum (8 KiB, of which the
    # model's output holds 4 KiB at d1's step only) is held too
    assert set(zip(a.tolist(), b.tolist())) == {(t3, t3 + 1)} and sorted(z.tolist()) == [8192.0, 12288.0]


def test_a_copy_of_a_combined_sum_is_not_held_from_the_dots_step():
    """d1 reduce-scattered and d2 replicated: d2 reads d1's sum all-gathered (8 KiB), which XLA can
    make only after the combined all-reduce (``with_combined_all_reduces``); the graph's order puts
    d2 before d3, so the copy starts at d2's step (before: d1's step, 0)."""
    import shardgym as sg
    from costmodel.problem import as_strategy_array

    graph = sg.trace(_f, *(jnp.ones(s) for s in SHAPES), schedule="program")
    problem = sg.build_problem(graph, sg.Cluster.preset("cpu-2x4"))
    names = problem.meta.strategy_names
    d1, d2, d3 = [i for i, nd in enumerate(graph.nodes) if nd.primitive == "dot_general"]
    s = [0] * problem.num_nodes
    s[d1] = names[d1].index("RS0 = RS0 x S0R (reduce-scatter x)")
    s[d2] = names[d2].index("RR = RR x RR")
    s[d3] = names[d3].index("RR = RS0 x S0R (all-reduce x)")
    a, b, z = (np.asarray(x).tolist() for x in problem.edge_memory.intervals(as_strategy_array(problem, s)))
    t1, t2 = int(problem.intervals[d1, 0]), int(problem.intervals[d2, 0])
    held = [(p, q) for p, q, y in zip(a, b, z) if y == 8192.0 and p < q]
    assert (t2, t2 + 1) in held and not any(p == t1 and q > t1 + 1 for p, q in held)
