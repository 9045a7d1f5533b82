"""Run a halo gather / halo scatter-add (costmodel.graph_part): ``jax.shard_map`` over the nodes'
and edges' mesh axes, one ``jax.lax.ppermute`` per halo shift, and a local gather / scatter-add.

XLA's SPMD partitioner all-gathers a row-sharded gather table (or all-reduces a scatter's partial
result), so where a plan picks a halo strategy the runtime's constrained program
(runtime/core.py) calls ``apply`` instead of binding the equation. Per device d (own rows
[d·m, (d+1)·m)):
  gather:      table = [own rows; the rows received per shift]; out = table[pos(idx)]
  scatter-add: part = zeros(m + H rows).at[pos(idx)].add(updates); out = operand + part[:m] +
               the halo partials the other devices send (each added at its local row); the zeros
               are made after the updates (``zeros_after``)
where pos(g) = g − d·m for an own row and the halo slot ``HaloPlan.halo_pos`` of g otherwise (a
``searchsorted`` in the device's sorted halo ids). The plan is built on the host from the real index
array, so the program is exact for that connectivity: an index outside it reads a wrong row
(``check_indices`` rejects such arguments before the run).
"""
from __future__ import annotations

import numpy as np

from costmodel.graph_part import HaloPlan, connectivity, halo_plan, mp_kind


def _pspec(spec):
    from jax.sharding import PartitionSpec as P
    return P(*[None if not e else (e[0] if len(e) == 1 else tuple(e)) for e in spec])


def is_halo(node, operand_specs) -> bool:
    """True when a strategy shards a row gather / scatter-add's node rows and edges on the same
    axes (a halo strategy; generic strategies never do)."""
    return (mp_kind(node) is not None and len(operand_specs) > 1 and bool(operand_specs[0] and operand_specs[0][0])
            and tuple(operand_specs[0][0]) == tuple(operand_specs[1][0]))


def check_indices(idx, n_nodes: int, where: str) -> None:
    """ValueError naming ``where`` unless every index lies in [0, n_nodes)."""
    a = np.asarray(idx)
    if a.size and (a.min() < 0 or a.max() >= n_nodes):
        raise ValueError(f"{where}: a halo plan needs node ids in [0, {n_nodes}); got [{a.min()}, {a.max()}]")


def zeros_after(x, shape):
    """Zeros of ``shape`` (``x``'s dtype) that XLA cannot compute before ``x``: a constant zeros
    buffer feeding an in-place scatter is scheduled at the program start by XLA CPU and held until
    the scatter (measured on the MeshGraphNet test step: the halo scatter-add's f32[44,8] partials,
    live over the whole forward, XLA memory 42,216 -> 40,808 B with this). The zero is x's first
    element's bits shifted out (exact for NaN and inf too), which the algebraic simplifier keeps."""
    import jax
    import jax.numpy as jnp
    if not x.size:
        return jnp.zeros(shape, x.dtype)
    v = x.reshape(-1)[:1]
    v = jnp.real(v) if jnp.iscomplexobj(v) else v
    bits = jax.lax.bitcast_convert_type(v.astype(jnp.float32), jnp.uint32)
    z = jax.lax.shift_right_logical(jax.lax.shift_right_logical(bits, jnp.uint32(16)), jnp.uint32(16))
    return jnp.broadcast_to(z.astype(x.dtype).reshape((1,) * len(shape)), shape)


def apply(kind: str, ops, operand_specs, out_spec, hp: HaloPlan, mesh):
    """The row gather (ops = table, idx) or scatter-add (ops = operand, idx, updates) as the halo
    plan ``hp`` runs it; ``operand_specs`` / ``out_spec`` are the strategy's internal specs."""
    import jax
    import jax.numpy as jnp

    A = tuple(operand_specs[0][0])
    name = A[0] if len(A) == 1 else A
    n, m = hp.n_shards, hp.rows_per_shard
    rows = [jnp.asarray(r) for r in hp.send_rows]
    ids, hpos = jnp.asarray(hp.halo_ids), jnp.asarray(hp.halo_pos)
    offs = np.cumsum((m,) + hp.sizes)[:-1]

    def pos_of(il, d):
        g = il[:, 0]
        if not hp.halo_rows:
            return g - d * m
        k = jnp.clip(jnp.searchsorted(ids[d], g), 0, hp.halo_rows - 1)
        return jnp.where(g // m == d, g - d * m, hpos[d][k])

    def gather(xl, il):
        d = jax.lax.axis_index(name)
        parts = [xl] + [jax.lax.ppermute(xl[r[d]], name, [(j, (j - s) % n) for j in range(n)])
                        for s, r in zip(hp.shifts, rows)]
        table = jnp.concatenate(parts, axis=0) if len(parts) > 1 else xl
        return table[pos_of(il, d)]

    def scatter(ol, il, ul):
        d = jax.lax.axis_index(name)
        part = zeros_after(ul, (m + hp.halo_rows,) + ol.shape[1:]).at[pos_of(il, d)].add(ul)
        out = ol + part[:m].astype(ol.dtype)
        for s, r, o, h in zip(hp.shifts, rows, offs, hp.sizes):
            recv = jax.lax.ppermute(part[o:o + h], name, [(j, (j + s) % n) for j in range(n)])
            out = out.at[r[d]].add(recv.astype(ol.dtype))
        return out

    body, k = (gather, 2) if kind == "gather" else (scatter, 3)
    fn = jax.shard_map(body, mesh=mesh, in_specs=tuple(_pspec(s) for s in operand_specs[:k]),
                       out_specs=_pspec(out_spec), check_vma=False)
    return fn(*ops[:k])


def planned(problem, plan, graph, args, axis_sizes: dict) -> dict:
    """graph node id -> (kind, operand specs, result spec, HaloPlan) of every row gather /
    scatter-add whose chosen strategy is a halo strategy; the halo comes from the real index array
    in ``args`` (ValueError when the args are shapes only: the plan needs the connectivity)."""
    m = getattr(problem, "meta", None)
    if m is None or not m.operand_specs or len(plan.strategies) != problem.num_nodes:
        return {}
    out, conn = {}, None
    for i, si in enumerate(plan.strategies):
        nid = int(m.graph_node[i])
        node = graph.nodes[nid]
        ops = m.operand_specs[i][int(si)]
        if node.primitive not in ("gather", "scatter-add", "scatter_add") or not is_halo(node, _internal(ops)):
            continue
        conn = conn or connectivity(graph, args)
        idx = conn.index_of_node.get(nid)
        if idx is None:
            raise ValueError(f"node {nid} ({node.primitive}) has a halo strategy but its index array is not a "
                             "real integer input of the args (execute it with real arrays, not ShapeDtypeStructs)")
        kind = mp_kind(node)
        n_nodes = node.operand_types[0].shape[0]
        check_indices(idx, n_nodes, f"node {nid} ({node.primitive})")
        ins = _internal(ops)
        n = int(np.prod([axis_sizes[a] for a in ins[0][0]]))
        out[nid] = (kind, ins, _internal([m.out_specs[i][int(si)]])[0], halo_plan(idx, n_nodes, n))
    return out


def _internal(specs):
    """Public PartitionSpec tuples (None / name / tuple per dim) -> internal (tuple of axes per dim)."""
    res = []
    for s in specs:
        res.append(tuple(() if e is None else ((e,) if isinstance(e, str) else tuple(e)) for e in (s or ())))
    return tuple(res)
