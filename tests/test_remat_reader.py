"""A full rematerialisation read by a later reader (issue 13, gpt tiny ilp-memory, session 21): a value
stored hidden-sharded over both axes and read by two dots, the first batch-sharded, the second
sequence-sharded over y. XLA all-gathers the whole value for the second (its "involuntary full
rematerialization") and slices it; ``copy_lists.copy_group_lists`` charged the whole tensor only at the
first reader of a layout, so the second's was missed (gpt tiny's plan: 256 KiB at XLA's peak)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

SHAPES = ((8, 32, 256), (256,), (256, 64), (256, 64))   # h = a * w: 256 KiB whole, 32 KiB per device


def _step(a, w, k1, k2):
    h = a * w
    return jnp.einsum("bsh,hk->bsk", h, k1), jnp.einsum("bsh,hk->bsk", h, k2)


def test_xla_gathers_the_whole_value_for_the_sequence_sharded_reader():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))

    def fn(a, w, k1, k2):
        h = jax.lax.with_sharding_constraint(a * w, NamedSharding(mesh, P(None, None, ("x", "y"))))
        return (jnp.einsum("bsh,hk->bsk", jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(("x", "y")))), k1),
                jnp.einsum("bsh,hk->bsk", jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P(None, "y"))), k2))
    hlo = jax.jit(fn).lower(*(jnp.ones(s) for s in SHAPES)).compile().as_text()
    assert re.findall(r"= (f32\[[\d,]+\])\S* all-gather\(", hlo) == ["f32[8,32,256]"]


def test_the_model_charges_the_whole_value_the_step_before_the_later_reader():
    """Copies by hand under that plan: the sequence-sharded copy (64 KiB) from the product's step to
    the second dot's, the batch-sharded one (32 KiB) to the first dot's, and the whole value (256 KiB)
    the step before the second dot (before: not charged)."""
    import shardgym as sg
    from costmodel.problem import as_strategy_array

    graph = sg.trace(_step, *(jnp.ones(s) for s in SHAPES))
    problem = sg.build_problem(graph, sg.Cluster.preset("cpu-2x4"))
    m = problem.meta
    pick = {"mul": "RRS01 = RRS01 x RRS01", "broadcast_in_dim": "RRS01 = S01"}
    s = [m.strategy_names[i].index(pick[p]) if p in pick else 0 for i, p in enumerate(m.primitives)]
    d1, d2 = [i for i, p in enumerate(m.primitives) if p == "dot_general"]
    s[d1] = m.strategy_names[d1].index("S01RR = S01RR x RR")
    s[d2] = m.strategy_names[d2].index("RS1R = RS1R x RR")
    t1, t2 = int(problem.intervals[d1, 0]), int(problem.intervals[d2, 0])
    start = int(problem.intervals[m.primitives.index("mul"), 0])
    got = sorted(zip(*(np.asarray(x).tolist() for x in problem.edge_memory.intervals(as_strategy_array(problem, s)))))
    assert got == sorted([(start, t2 + 1, 65536.0), (start, t1 + 1, 32768.0), (t2 - 1, t2, 262144.0)])
