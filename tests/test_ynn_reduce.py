"""What XLA CPU materialises for a reduction (issues 13 and 15), probed on small programs: the
broadcasts LayerNorm's backward YNNPACK reductions read (costmodel/ynn_reads.py prices them since
session 20; a first rule, commit 42927fb, was reverted in session 11: the module says why its key
differs), a shared product written whole, and YNNPACK's size threshold."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp

from costmodel.fused_reductions import YNN_MIN_ELEMENTS  # the model's threshold, checked against XLA here


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def _broadcasts_read_by_ynn_reductions(hlo: str) -> list[str]:
    """The fusions that only broadcast (a written-out broadcast) read by a ``__ynn_fusion`` whose
    computation holds a reduce."""
    comps = {m.group(1): m.group(2) for m in re.finditer(r"^%(\S+) \(.*?\) -> .*? \{\n(.*?)\n\}", hlo, re.S | re.M)}
    defs = {}
    for line in hlo[hlo.index("ENTRY"):].splitlines():
        m = re.match(r"\s+(?:ROOT )?%(\S+) = \S+ (\w[\w-]*)\((.*?)\)(.*)", line)
        if m:
            defs[m.group(1)] = (m.group(2), m.group(3), m.group(4))

    def body(rest):
        c = re.search(r"calls=%([\w.]+)", rest)
        return comps.get(c.group(1), "") if c else ""

    out = set()
    for op, args, rest in defs.values():
        if op != "fusion" or "__ynn_fusion" not in rest or " reduce(" not in body(rest):
            continue
        for a in re.findall(r"%([\w.\-]+)", args):
            d = defs.get(a)
            if d and d[0] == "fusion" and "__ynn_fusion" not in d[2] and " broadcast(" in body(d[2]) \
                    and not re.search(r" (multiply|add|subtract)\(", body(d[2])):
                out.add(a)
    return sorted(out)


def test_a_broadcast_shared_with_another_reader_is_written_out_for_a_ynn_reduction():
    """``sum(y * s)`` alone is one YNNPACK fusion reading y and s; with ``x * s * 2`` also
    computed, the broadcast of s is shared (CSE) and XLA writes it out, full size, for the
    reduction (``wrapped_broadcast``), while the other reader recomputes it."""
    x = y = jnp.ones((64, 256))
    s = jnp.ones((256,))
    alone = _hlo(lambda x, y, s: jnp.sum(y * s, -1), x, y, s)
    shared = _hlo(lambda x, y, s: (jnp.sum(y * s, -1), x * s * 2), x, y, s)
    assert "__ynn_fusion" in alone and not _broadcasts_read_by_ynn_reductions(alone)
    assert len(_broadcasts_read_by_ynn_reductions(shared)) == 1


def test_a_shared_product_read_by_two_reductions_is_written_out_whole():
    """``x * y * r`` read by two reductions is written out once with the broadcast of r inside
    it (GroupNorm's backward in unet tiny): no broadcast buffer of its own."""
    x = y = jnp.ones((8, 16, 16, 8))
    r = jnp.ones((8, 1, 1, 8))
    hlo = _hlo(lambda x, y, r: (jnp.sum(x * y * r, (0, 1, 2)), jnp.sum(x * y * r * x, (1, 2)), x * r * 2), x, y, r)
    assert "__ynn_fusion" in hlo and not _broadcasts_read_by_ynn_reductions(hlo)


def test_small_reductions_are_loop_fusions():
    n = YNN_MIN_ELEMENTS
    assert "__ynn_fusion" in _hlo(lambda x: jnp.sum(x * x, -1), jnp.ones((1, n)))
    assert "__ynn_fusion" not in _hlo(lambda x: jnp.sum(x * x, -1), jnp.ones((1, n - 1)))
    assert "__ynn_fusion" not in _hlo(lambda x: jnp.sum(x * x, -1), jnp.ones((63, 65)))


def _layernorm_grads(params, x):
    """flax's LayerNorm forward and backward (meshgraphnet's edge / node MLPs end in one)."""
    import flax.linen as nn
    return jax.grad(lambda p, x: jnp.sum(jnp.tanh(nn.LayerNorm().apply({"params": p}, x))), (0, 1))(params, x)


def _model_broadcasts(fn, args, method):
    """The copies ``ynn_reads.shared_broadcast_lists`` charges under ``method``'s plan on cpu-2x4."""
    import numpy as np

    import shardgym as sg
    from costmodel.builder import strategies_of
    from costmodel.cost import Mesh
    from costmodel.edge_memory import CopyGroups
    from costmodel.memory import materialised_outputs
    from costmodel.problem import as_strategy_array
    from costmodel.ynn_reads import shared_broadcast_lists

    graph = sg.trace(fn, *args)
    cluster = sg.Cluster.preset("cpu-2x4")
    problem = sg.build_problem(graph, cluster)
    kept, _ = materialised_outputs(graph)
    groups = CopyGroups.from_lists(shared_broadcast_lists(graph, strategies_of(graph, cluster), Mesh(cluster), kept,
                                                          problem.intervals))
    s = as_strategy_array(problem, sg.solve(problem, method=method).strategies)
    return sorted(np.asarray(groups.intervals(s)[2]).tolist())


def test_layernorm_backward_reads_two_written_out_broadcasts_above_the_ynn_threshold():
    """XLA CPU writes out the rsqrt and scale broadcasts LayerNorm's forward and backward share, read
    by the backward's YNNPACK reductions (2 x f32[rows,128]); the cost model charges the same two,
    replicated (one device's HLO) and under data parallelism (rows sharded over the 8 devices of
    cpu-2x4, 4096+ elements each); below YNNPACK's threshold neither side has any."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    params = {"scale": jnp.ones((128,)), "bias": jnp.zeros((128,))}
    for rows, want in ((64, 2), (16, 0)):   # 8192 / 2048 elements
        x = jnp.ones((rows, 128))
        assert len(_broadcasts_read_by_ynn_reductions(_hlo(_layernorm_grads, params, x))) == want
        assert _model_broadcasts(_layernorm_grads, (params, x), "replicated") == [rows * 128 * 4.0] * want
    mesh = Mesh(jax.devices()[:8], ("d",))
    x = jax.device_put(jnp.ones((512, 128)), NamedSharding(mesh, P("d", None)))
    hlo = jax.jit(_layernorm_grads, out_shardings=NamedSharding(mesh, P())).lower(params, x).compile().as_text()
    assert len(_broadcasts_read_by_ynn_reductions(hlo)) == 2
    assert _model_broadcasts(_layernorm_grads, (params, x), "dp") == [64 * 128 * 4.0] * 2
