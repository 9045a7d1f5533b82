"""A split read in another layout than its producer stores (issue 13, unet tiny ilp-time): XLA cuts
the pieces in the producer's layout and reshards each piece as the split's own output, so no copy of
the whole operand exists; the cost model's copy groups (``slice_layout.splits_before_gather``)
charge none."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

SHAPE = (8, 32, 32, 16)   # 64 KiB per device batch-sharded over 8, 512 KiB whole


def _step(a, w):
    h = a * w
    l, r = jnp.split(h, 2, axis=3)
    return jnp.sin(l) + jnp.cos(r)


def _xla_all_gathers(in_spec) -> list[str]:
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))

    def fn(a, w):
        a = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, in_spec))
        h = jax.lax.with_sharding_constraint(a * w, NamedSharding(mesh, in_spec))
        l, r = jnp.split(h, 2, axis=3)
        rep = NamedSharding(mesh, P())
        return jnp.sin(jax.lax.with_sharding_constraint(l, rep)) + jnp.cos(jax.lax.with_sharding_constraint(r, rep))
    hlo = jax.jit(fn).lower(jnp.ones(SHAPE), jnp.ones(SHAPE[-1:])).compile().as_text()
    return re.findall(r"= (f32\[[\d,]+\])\S* all-gather\(", hlo)


def test_xla_cuts_the_operand_before_gathering_the_pieces():
    """Batch-sharded or sharded along the cut (channel) dim: two all-gathers of the halves
    (f32[8,32,32,8]), none of the whole f32[8,32,32,16] (the channel-sharded one first moves local
    pieces with collective-permutes)."""
    assert sorted(_xla_all_gathers(P(("x", "y")))) == ["f32[8,32,32,8]"] * 2
    assert sorted(_xla_all_gathers(P(None, None, None, ("x", "y")))) == ["f32[8,32,32,8]"] * 2


def test_the_model_charges_no_whole_copy_for_a_split():
    """No copy group of the product is read by the split. By hand, the plan with the input and
    product batch-sharded over both axes and the split replicated peaks at the input's 64 KiB, w's
    64 B and the split's replicated buffer (256 KiB: the half it keeps; the trace fuses the other
    into the sin / cos / add); before, the 512 KiB gathered product on top (832 KiB)."""
    import shardgym as sg

    graph = sg.trace(_step, jnp.ones(SHAPE), jnp.ones(SHAPE[-1:]))
    problem = sg.build_problem(graph, sg.Cluster.preset("cpu-2x4"))
    m = problem.meta
    split = m.primitives.index("split")
    assert split not in set(problem.edge_memory.member_node.tolist())
    names = {"input": ("S01RRR", "R"), "broadcast_in_dim": ("RRRR = R",), "mul": ("S01RRR = S01RRR x RRRR",),
             "split": ("RRRR = RRRR",)}
    seen: dict = {}
    s = []
    for i, p in enumerate(m.primitives):
        s.append(m.strategy_names[i].index(names[p][seen.get(p, 0)]))
        seen[p] = seen.get(p, 0) + 1
    assert sg.evaluate(problem, s).peak_memory_bytes == 64 * 1024 + 64 + 256 * 1024
