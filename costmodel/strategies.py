"""Candidate sharding strategies of each OpGraph node on a device mesh (``enumerate_strategies``).

The iteration space of a node (``costmodel.space.space_of``: per iteration dim a size and a kind,
``par`` / ``sum`` / ``whole`` / ``fixed``, and per operand and output a map from its dims to iteration
dims) says what may be sharded. A strategy assigns each mesh axis to at most one shardable
iteration dim (several axes on one dim are ordered major-first in mesh order); the specs of the
output(s) and operands follow from the maps. Sharding a ``sum`` dim leaves partial sums: an
all-reduce of the result over those axes, or (a second strategy) a reduce-scatter whose result is
sharded along a ``par`` output dim on them; a ``whole`` dim costs an all-to-all of the operand and
one of the result. Conv spatial splits add costmodel.halo's halo exchange, fft nodes in the full
space get costmodel.fft_plan's strategies, row gathers / scatter-adds costmodel.graph_part's
halo strategies. Input nodes: every storage layout of the tensor (replicated, sharded on one or
more dims). Unsupported / replicate-only nodes: one replicated strategy.

Padding: a mesh axis that does not divide a dim is priced with padding (ceil(d / shards) per
device, see costmodel.cost); specs where a dim is smaller than its shard count are excluded.
Input nodes (storage layouts) are the exception: jit arguments must split evenly, so an input
layout whose axes do not divide the dim is excluded.

Cap: at most ``max_strategies`` per node (default 32); a row gather / scatter-add with halo
strategies (costmodel.graph_part) keeps k = min(#halo, max_strategies // 4) of them (fastest own
time first) after max_strategies − k generic ones, so there the full space may lack the slowest of
Alpa's generic strategies. Rule: always keep the fully replicated
strategy, then the others by (beyond Alpa's space, own time = compute + the node's collectives,
per-device memory, enumeration order) ascending: a conv keeps all its Alpa-space strategies before
any spatial one, so the full space contains Alpa's. On 2-D meshes the cap only bites on ops with >= 4 iteration dims.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import numpy as np

from costmodel.cost import Mesh, collective, compute_time, local_bytes, spec_name
from costmodel.fft_plan import fft_strategies
from costmodel.graph import Node
from costmodel.graph_part import halo_strategies, mp_kind
from costmodel.halo import strategy_halo
from costmodel.space import (  # noqa: F401  (re-exported: builder, baselines and tests import them from here)
    ALPA,
    FULL,
    SPACES,
    SearchSpace,
    Space,
    search_space,
    space_of,
)

MAX_STRATEGIES = 32


@dataclass(frozen=True)
class Strategy:
    """One way to run a node. Specs are internal (tuple of axis-name tuples per dim).

    ``flops``: FLOPs per device (padded shard); ``collectives``: the node's own collectives as
    (kind, axes, B bytes as seen by the group, see cost.collective)."""

    name: str
    out_specs: tuple
    operand_specs: tuple
    flops: float
    collectives: tuple
    extra_bytes: float = 0.0   # per-device temporaries the strategy adds (a conv's haloed lhs copy)


# ---- enumeration --------------------------------------------------------------------------------
def _spec(m, assign, extra_dim=None, extra_axes=()):
    """Spec of a tensor whose dims map to iteration dims ``m`` under ``assign`` (iter dim -> axes)."""
    return tuple(tuple(assign.get(k, ())) + (tuple(extra_axes) if k == extra_dim and k is not None else ())
                 if k is not None else () for k in m)


def _fits(shape, spec, mesh: Mesh) -> bool:
    return all(not e or d >= mesh.shards(e) for d, e in zip(shape, spec))


def _divides(shape, spec, mesh: Mesh) -> bool:
    return all(not e or d % mesh.shards(e) == 0 for d, e in zip(shape, spec))


def enumerate_strategies(node: Node, mesh: Mesh, max_strategies: int = MAX_STRATEGIES,
                         search: SearchSpace = FULL) -> list[Strategy]:
    """All candidate strategies of ``node`` on ``mesh`` (capped, see module docstring).
    The fully replicated strategy is always index 0."""
    space = space_of(node, search)
    conv_spatial = node.primitive == "conv_general_dilated" and space is not None and search.spatial_conv
    if node.primitive == "fft" and search.distributed_fft and space is not None:
        return fft_strategies(node, mesh, max_strategies, lambda o, i, f, c: _fft_strategy(node, space, o, i, f, c, mesh),
                              _cap)
    axes = mesh.axis_names
    ops = [t.shape for t in node.operand_types]
    outs = [t.shape for t in node.outputs]
    literal = [src < 0 for src, _ in node.operands]
    if space is None:
        rep = Strategy("replicated", tuple(((),) * len(s) for s in outs),
                       tuple(((),) * len(s) for s in ops), float(node.flops), ())
        return [rep]
    shardable = [k for k, kind in enumerate(space.kinds) if kind != "fixed" and space.sizes[k] > 1]
    sum_dims = {k for k, kind in enumerate(space.kinds) if kind == "sum"}
    out_item = np.dtype(node.outputs[0].dtype).itemsize
    # a mesh axis of size 1 shards nothing: never assigned (its specs would duplicate others)
    choices = [[None] + ([k for k in shardable if space.sizes[k] >= mesh.size[a]] if mesh.size[a] > 1 else [])
               for a in axes]
    is_input = node.is_input
    cands = []
    seen = set()
    for combo in itertools.product(*choices):
        assign: dict[int, tuple] = {}
        for a, k in zip(axes, combo):
            if k is not None:
                assign[k] = assign.get(k, ()) + (a,)
        if any(space.sizes[k] < mesh.shards(v) for k, v in assign.items()):
            continue
        out_specs = tuple(_spec(m, assign) for m in space.out_maps)
        op_specs = tuple(_spec(m, assign) if not literal[i] else ((),) * len(ops[i])
                         for i, m in enumerate(space.operand_maps))
        if not all(_fits(s, sp, mesh) for s, sp in zip(outs, out_specs)):
            continue
        if is_input and not all(_divides(s, sp, mesh) for s, sp in zip(outs, out_specs)):
            continue  # jit arguments need even shards: no padded storage layouts
        if not all(_fits(s, sp, mesh) for s, sp in zip(ops, op_specs)):
            continue
        key = (out_specs, op_specs)
        if key in seen:
            continue
        seen.add(key)
        frac = 1.0
        for k, v in assign.items():
            n = mesh.shards(v)
            frac *= -(-space.sizes[k] // n) / space.sizes[k]
        flops = float(node.flops) * frac
        coll = []
        extra = 0.0
        allow_rs = True
        if conv_spatial:
            halo, allow_rs = strategy_halo(node, space.operand_maps, assign, op_specs[0], mesh)
            if halo is None:
                continue
            coll += halo.collectives
            extra = halo.copy_bytes
        for k, v in assign.items():
            if space.kinds[k] == "whole":
                n = mesh.shards(v)
                coll.append(("all-to-all", v, local_bytes(ops[0], np.dtype(node.operand_types[0].dtype).itemsize,
                                                           op_specs[0], mesh) * n))
                coll.append(("all-to-all", v, local_bytes(outs[0], out_item, out_specs[0], mesh) * n))
        sum_axes = tuple(a for a in axes if any(a in assign.get(k, ()) for k in sum_dims))
        if sum_axes and not is_input:
            B = local_bytes(outs[0], out_item, out_specs[0], mesh)
            cands.append((assign, out_specs, op_specs, flops, tuple(coll) + (("all-reduce", sum_axes, B),), extra))
            # reduce-scatter variants: the result comes out sharded on a par output dim
            nsum = mesh.shards(sum_axes)
            for d, k in enumerate(space.out_maps[0] if allow_rs else ()):
                if k is None or space.kinds[k] != "par":
                    continue
                if outs[0][d] < mesh.shards(assign.get(k, ())) * nsum:
                    continue
                rs_out = tuple(_spec(m, assign, k, sum_axes) for m in space.out_maps)
                if not all(_fits(s, sp, mesh) for s, sp in zip(outs, rs_out)):
                    continue
                cands.append((assign, rs_out, op_specs, flops, tuple(coll) + (("reduce-scatter", sum_axes, B),), extra))
        else:
            cands.append((assign, out_specs, op_specs, flops, tuple(coll), extra))
    strategies = []
    for assign, out_specs, op_specs, flops, coll, extra in cands:
        strategies.append(Strategy(_name(node, out_specs, op_specs, coll, axes, space), out_specs, op_specs,
                                   flops, coll, extra))
    beyond = None
    if search.message_passing and mp_kind(node) is not None:  # halo gathers / scatter-adds (graph_part)
        def make(assign, flops, coll, extra):
            o = tuple(_spec(m, assign) for m in space.out_maps)
            i = tuple(_spec(m, assign) if not literal[k] else ((),) * len(ops[k]) for k, m in enumerate(space.operand_maps))
            return Strategy(_name(node, o, i, coll, axes, space) + " (halo)", o, i, flops, coll, extra)
        mp = sorted(halo_strategies(node, space, mesh, search.connectivity, make), key=lambda st: own_time(st, mesh))
        k = min(len(mp), max_strategies // 4)
        return _cap(strategies, node, mesh, max_strategies - k) + mp[:k]
    if conv_spatial:  # spatial strategies are beyond Alpa's space: the cap keeps Alpa's first
        sp = {space.operand_maps[0][d] for d in node.params["dimension_numbers"]["lhs_spec"][2:]}
        beyond = [any(k in sp for k, v in a.items() if v) for a, *_ in cands]
    return _cap(strategies, node, mesh, max_strategies, beyond)


def _fft_strategy(node: Node, space: Space, out_spec, in_spec, flops: float, coll: tuple, mesh: Mesh) -> Strategy:
    """A Strategy of an fft node from its operand and result specs (costmodel.fft_plan): the fft's
    iteration dims are its result dims, so every other tensor of the group follows ``out_spec``."""
    def follow(m):
        return tuple(tuple(out_spec[k]) if k is not None else () for k in m)
    out_specs = tuple(follow(m) for m in space.out_maps)
    literal = [src < 0 for src, _ in node.operands]
    op_specs = tuple(tuple(in_spec) if i == 0 else (((),) * len(node.operand_types[i].shape) if literal[i] else follow(m))
                     for i, m in enumerate(space.operand_maps))
    return Strategy(_name(node, out_specs, op_specs, coll, mesh.axis_names, space), out_specs, op_specs, flops, coll)


def _name(node, out_specs, op_specs, coll, axes, space) -> str:
    out = spec_name(out_specs[0], axes)
    if node.is_input:
        return out
    nh = int(node.params.get("num_head_operands", len(op_specs)))
    ins = " x ".join(spec_name(s, axes) for s in op_specs[:max(1, nh)] if s is not None)
    s = f"{out} = {ins}" if ins else out
    for kind, ax, _ in coll:
        s += f" ({kind} {','.join(ax)})"
    return s


def own_time(st: Strategy, mesh: Mesh) -> float:
    """Compute + collectives of one strategy, seconds (the cap's ranking key)."""
    t = compute_time(st.flops, mesh)[0]
    for kind, ax, B in st.collectives:
        t += collective(kind, ax, B, mesh)[0]
    return t


def _cap(strategies, node, mesh, cap, beyond=None):
    """The replicated strategy, then up to cap - 1 others by (beyond Alpa's space, own time,
    memory, order): with ``beyond`` flags (spatial conv splits, distributed FFTs) the full space
    keeps every strategy Alpa's space has before adding its own, so it is never smaller."""
    rep = [i for i, s in enumerate(strategies)
           if all(not e for sp in s.out_specs for e in sp) and all(not e for sp in s.operand_specs for e in sp)]
    first = rep[0] if rep else 0
    order = [first] + [i for i in range(len(strategies)) if i != first]
    if len(strategies) <= cap:
        return [strategies[i] for i in order]
    item = [np.dtype(t.dtype).itemsize for t in node.outputs]

    def key(i):
        s = strategies[i]
        mem = sum(local_bytes(t.shape, it, sp, mesh) for t, it, sp in zip(node.outputs, item, s.out_specs))
        return (bool(beyond[i]) if beyond is not None else False, own_time(s, mesh), mem, i)

    rest = sorted(order[1:], key=key)[:cap - 1]
    rest.sort()  # keep enumeration order among the kept
    return [strategies[first]] + [strategies[i] for i in rest]


def node_key(node: Node, search: SearchSpace | None = None) -> tuple:
    """Everything strategy enumeration depends on (for caching across repeated layers); a row
    gather / scatter-add priced from real connectivity also depends on its own index array."""
    params = {k: v for k, v in node.params.items() if k not in ("name_stack", "out_operands")}
    if search is not None and search.connectivity is not None and node.id in search.connectivity.index_of_node:
        params["_index_node"] = node.id
    return (node.primitive, json.dumps(params, sort_keys=True, default=str),
            tuple((t.shape, t.dtype) for t in node.operand_types), tuple((t.shape, t.dtype) for t in node.outputs),
            tuple(src < 0 for src, _ in node.operands), float(node.flops), node.supported, node.is_input)

