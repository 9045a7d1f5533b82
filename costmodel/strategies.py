"""Candidate sharding strategies of each OpGraph node on a device mesh.

Every node is described by an *iteration space* (``Space``): a list of iteration dims, each with a
size and a kind, and for each operand and output a map from its dims to iteration dims (None =
the tensor dim does not follow any iteration dim: the operand must be replicated along it, or the
output cannot be sharded along it). A strategy assigns each mesh axis to at most one shardable
iteration dim (several axes on one dim are ordered major-first in mesh order); the specs of the
output(s) and operands follow from the maps. Kinds:

- ``par``   appears in the output: sharding it is free (an operand that lacks the dim is read
            replicated and sliced locally, e.g. the new dims of broadcast_in_dim);
- ``sum``   reduced away (dot_general contracting dims, reduced dims of reduce_*, the in-feature of
            conv, the indexed dim of a gather, the scatter (update) dims of scatter-add): sharding
            it leaves partial sums -> an all-reduce of the result over those axes, or (a second
            strategy) a reduce-scatter whose result is sharded along a ``par`` output dim on them;
- ``whole`` must be unsharded while computing (the transformed dims of fft): sharding it costs an
            all-to-all of the operand to make it whole and one of the result to shard it back;
- ``fixed`` never sharded (conv spatial dims in Alpa's space, cumsum/sort dims, replicate-only nodes).

Per node kind (``space_of``): dot_general (batch / lhs-free / rhs-free ``par``, contracting
``sum``), conv_general_dilated (batch, out-feature ``par``, in-feature ``sum`` when
feature_group_count = batch_group_count = 1; spatial dims, see ``SearchSpace``: ``fixed`` in Alpa's
space, else ``par`` where the output is split and ``sum`` where the window is — a weight gradient —
with the halo exchange of costmodel.halo and only the splits XLA runs as one, see ``costmodel.halo.strategy_halo``),
reductions (reduced dims ``sum``), cumulative ops / sort (scan dim ``fixed``), fft (Alpa's space:
replicated only, as XLA runs it, see ``XLA_FFT_REPLICATED``, else transformed dims ``whole``; full
space: costmodel.fft_plan's batch-sharded and transposing strategies, which the runtime runs with
shard_map), gather (index batch
dims and full-slice window dims ``par``, point-indexed operand dims ``sum``: masked lookup +
all-reduce, Megatron's vocab-parallel embedding), scatter-add (window dims and scattered-into
operand dims ``par``: each device applies the updates that land in its rows; update/index dims
``sum``: partial results all-reduced; plain scatter: update dims ``fixed``; a row gather /
scatter-add also gets costmodel.graph_part's halo strategies in the full space: nodes and edges
sharded on the same axes, the halo rows moved by collective-permutes, run by shard_map), transpose (permuted),
reshape/squeeze/expand_dims (dims that map through; merging or splitting dims maps the sharding of
the major dim of the group), broadcast_in_dim, and everything else whose operands have the output's
rank (element-wise, concatenate, pad, slice, dynamic_slice, select_n, ...): an operand dim follows
the output dim of the same size (trailing alignment), otherwise it is read replicated. Element-wise
ops folded into a node (``params["num_head_operands"]``) follow the head: their extra operands align
with the output, and every output of the group takes the head's spec. Input nodes: every storage
layout of the tensor (replicated, sharded on one or more dims). Unsupported / replicate-only nodes:
one replicated strategy.

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
from dataclasses import dataclass, field

import numpy as np

from costmodel.cost import Mesh, collective, compute_time, local_bytes, spec_name
from costmodel.fft_plan import fft_strategies
from costmodel.graph import Node
from costmodel.graph_part import Connectivity, halo_strategies, mp_kind
from costmodel.halo import spatial_dims, strategy_halo

MAX_STRATEGIES = 32
#: XLA's SPMD partitioner (Shardy and GSPMD, jax 0.10) all-gathers an FFT's operand whenever it is
#: sharded — even on batch dims only — and runs the FFT replicated (then slices its result): so fft
#: nodes get the replicated strategy only, and the gather is priced on the edge from the producer.
#: False restores the issue's strategies (batch dims ``par``, transformed dims ``whole``).
XLA_FFT_REPLICATED = True

REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
              "reduce_xor", "argmax", "argmin"}
SCANS = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"}
SCATTER_ADD = {"scatter-add", "scatter_add", "scatter-sub", "scatter_sub", "scatter-mul", "scatter_mul",
               "scatter-min", "scatter_min", "scatter-max", "scatter_max"}
RESHAPES = {"reshape", "squeeze", "expand_dims"}


@dataclass(frozen=True)
class SearchSpace:
    """Which strategy families beyond Alpa's the enumerator offers (``build_problem(space=...)``).

    ``spatial_conv``: conv spatial dims are shardable (halo exchange, costmodel.halo); off = Alpa's
    space (batch / feature sharding only, spatial dims ``fixed``).
    ``distributed_fft``: fft nodes get batch-sharded and transposing (slab / pencil) strategies
    (costmodel.fft_plan; the runtime runs them with shard_map); off = replicated, as XLA runs it.
    ``message_passing``: row gathers / scatter-adds also get node-and-edge-sharded strategies with a
    halo exchange (costmodel.graph_part; the runtime runs them with shard_map), priced from
    ``connectivity`` (real index arrays, ``graph_part.space_for``) or, without it, an assumed halo."""

    spatial_conv: bool = True
    distributed_fft: bool = True
    message_passing: bool = True
    connectivity: Connectivity | None = field(default=None, compare=False, repr=False)


FULL = SearchSpace()
ALPA = SearchSpace(spatial_conv=False, distributed_fft=False, message_passing=False)
SPACES = {"full": FULL, "alpa": ALPA}


def search_space(space) -> SearchSpace:
    """A SearchSpace from itself or a name in ``SPACES``."""
    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, str) and space in SPACES:
        return SPACES[space]
    raise ValueError(f"space must be a SearchSpace or one of {sorted(SPACES)}, got {space!r}")


@dataclass(frozen=True)
class Space:
    """Iteration space of a node: dims (size, kind) and, per operand/output, dim -> iteration dim."""

    sizes: tuple[int, ...]
    kinds: tuple[str, ...]
    operand_maps: tuple[tuple, ...]   # per operand: tuple (per operand dim: iter dim or None)
    out_maps: tuple[tuple, ...]       # per output, likewise


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


# ---- iteration spaces ---------------------------------------------------------------------------
def _align(shape, out_shape, out_map):
    """Trailing-aligned map of an operand of ``shape`` onto the output: dim -> iteration dim of the
    output dim with the same size (> 1), else None."""
    r, ro = len(shape), len(out_shape)
    m = []
    for i in range(r):
        j = ro - r + i
        m.append(out_map[j] if 0 <= j < ro and shape[i] == out_shape[j] and shape[i] > 1 else None)
    return tuple(m)


def _reshape_map(in_shape, out_shape):
    """out dim -> in dim (or None): groups of dims with equal products; in each group the major
    non-1 input dim maps to the major non-1 output dim (only if both are the group's first)."""
    res = [None] * len(out_shape)
    i = j = 0
    ni, no = len(in_shape), len(out_shape)
    while i < ni or j < no:
        # skip size-1 dims
        if i < ni and in_shape[i] == 1:
            i += 1
            continue
        if j < no and out_shape[j] == 1:
            j += 1
            continue
        if i >= ni or j >= no:
            break
        gi, gj = [i], [j]
        pi, pj = in_shape[i], out_shape[j]
        while pi != pj:
            if pi < pj:
                i += 1
                if i >= ni:
                    return tuple(res)
                gi.append(i)
                pi *= in_shape[i]
            else:
                j += 1
                if j >= no:
                    return tuple(res)
                gj.append(j)
                pj *= out_shape[j]
        res[gj[0]] = gi[0]
        i += 1
        j += 1
    return tuple(res)


def space_of(node: Node, search: SearchSpace = FULL) -> Space | None:
    """The iteration space of ``node`` (see the module docstring); None = replicate only."""
    prim = node.primitive
    outs = [t.shape for t in node.outputs]
    if not outs:
        return None
    if node.is_input:
        s = tuple(outs[0])
        idx = tuple(range(len(s)))
        return Space(s, ("par",) * len(s), (), (idx,) * len(outs))
    if not node.supported or node.params.get("replicate_only"):
        return None
    ops = [t.shape for t in node.operand_types]
    p = node.params
    nh = int(p.get("num_head_operands", len(ops)))
    out0 = tuple(outs[0])
    sizes: list[int] = []
    kinds: list[str] = []

    def new(size, kind="par"):
        sizes.append(int(size))
        kinds.append(kind)
        return len(sizes) - 1

    head_maps: list[tuple] = []
    if prim == "dot_general":
        (lc, rc), (lb, rb) = p["dimension_numbers"]
        lhs, rhs = ops[0], ops[1]
        lm, rm = [None] * len(lhs), [None] * len(rhs)
        om = []
        for a, b in zip(lb, rb):
            k = new(lhs[a])
            lm[a] = rm[b] = k
            om.append(k)
        for a in range(len(lhs)):
            if a not in lc and a not in lb:
                k = new(lhs[a])
                lm[a] = k
                om.append(k)
        for b in range(len(rhs)):
            if b not in rc and b not in rb:
                k = new(rhs[b])
                rm[b] = k
                om.append(k)
        for a, b in zip(lc, rc):
            k = new(lhs[a], "sum")
            lm[a] = rm[b] = k
        head_maps = [tuple(lm), tuple(rm)]
        out_map = tuple(om)
    elif prim == "conv_general_dilated":
        dn = p["dimension_numbers"]
        ls, rs, os_ = dn["lhs_spec"], dn["rhs_spec"], dn["out_spec"]
        lhs, rhs = ops[0], ops[1]
        lm, rm, om = [None] * len(lhs), [None] * len(rhs), [None] * len(out0)
        grouped = int(p.get("feature_group_count", 1)) != 1 or int(p.get("batch_group_count", 1)) != 1
        kb = new(out0[os_[0]])
        lm[ls[0]] = om[os_[0]] = kb
        if not grouped:
            kf = new(out0[os_[1]])
            rm[rs[0]] = om[os_[1]] = kf
            kc = new(lhs[ls[1]], "sum")
            lm[ls[1]] = rm[rs[1]] = kc
        if grouped or not search.spatial_conv:
            for d in os_[2:] if not grouped else [d for d in range(len(out0)) if d != os_[0]]:
                om[d] = new(out0[d], "fixed")
        else:  # spatial dims (costmodel.halo): output-partitioned ``par`` or window-partitioned ``sum``
            for i, sd in enumerate(spatial_dims(p, lhs, rhs, out0)):
                if sd.regime == "out":
                    k = new(sd.out)
                    lm[ls[2 + i]] = om[os_[2 + i]] = k
                else:
                    k = new(sd.window, "sum")
                    lm[ls[2 + i]] = rm[rs[2 + i]] = k
                    om[os_[2 + i]] = new(sd.out, "fixed")
        head_maps = [tuple(lm), tuple(rm)]
        out_map = tuple(om)
    elif prim in REDUCTIONS:
        axes = set(int(a) for a in p.get("axes", ()))
        x = ops[0]
        lm, om = [], []
        for d in range(len(x)):
            k = new(x[d], "sum" if d in axes else "par")
            lm.append(k)
            if d not in axes:
                om.append(k)
        head_maps = [tuple(lm)]
        out_map = tuple(om)
        nh = min(nh, 1)
    elif prim in SCANS or prim == "sort":
        ax = int(p.get("axis", p.get("dimension", -1)))
        x = ops[0]
        ax = ax % len(x) if x else 0
        om = tuple(new(x[d], "fixed" if d == ax else "par") for d in range(len(x)))
        out_map = om
        head_maps = [om] * (nh if prim == "sort" else 1)
    elif prim == "fft":
        n = len(p.get("fft_lengths", ()))
        x = ops[0]
        om = tuple(new(min(x[d], out0[d]), "fixed" if XLA_FFT_REPLICATED else ("whole" if d >= len(x) - n else "par"))
                   for d in range(len(x)))

        out_map = om
        head_maps = [om]
        nh = 1
    elif prim == "transpose":
        perm = [int(a) for a in p["permutation"]]
        om = tuple(new(out0[d]) for d in range(len(out0)))
        lm = [None] * len(ops[0])
        for d, src in enumerate(perm):
            lm[src] = om[d]
        head_maps = [tuple(lm)]
        out_map = om
        nh = 1
    elif prim in RESHAPES:
        om = tuple(new(out0[d]) for d in range(len(out0)))
        rmap = _reshape_map(ops[0], out0)
        lm = [None] * len(ops[0])
        for d, src in enumerate(rmap):
            if src is not None:
                lm[src] = om[d]
        head_maps = [tuple(lm)]
        out_map = om
        nh = 1
    elif prim == "broadcast_in_dim":
        om = tuple(new(out0[d]) for d in range(len(out0)))
        bd = [int(a) for a in p["broadcast_dimensions"]]
        x = ops[0]
        head_maps = [tuple(om[bd[i]] if x[i] == out0[bd[i]] and x[i] > 1 else None for i in range(len(x)))]
        out_map = om
        nh = 1
    elif prim == "gather":
        dn = p["dimension_numbers"]
        offset = [int(a) for a in dn["offset_dims"]]
        collapsed = [int(a) for a in dn["collapsed_slice_dims"]]
        sim = [int(a) for a in dn["start_index_map"]]
        obd = [int(a) for a in dn.get("operand_batching_dims", ()) or ()]
        ibd = [int(a) for a in dn.get("start_indices_batching_dims", ()) or ()]
        slice_sizes = [int(a) for a in p["slice_sizes"]]
        opnd, idx = ops[0], ops[1]
        om = [None] * len(out0)
        batch_out = [d for d in range(len(out0)) if d not in offset]
        im = [None] * len(idx)
        idx_dims = list(range(len(idx) - 1))  # index_vector_dim is the last
        for j, d in enumerate(batch_out):
            k = new(out0[d])
            om[d] = k
            if j < len(idx_dims):
                im[idx_dims[j]] = k
        opm = [None] * len(opnd)
        for a, b in zip(obd, ibd):
            opm[a] = im[b] if opnd[a] == idx[b] else None
        window = [d for d in range(len(opnd)) if d not in collapsed and d not in obd]
        for d_op, d_out in zip(window, offset):
            if slice_sizes[d_op] == opnd[d_op] and out0[d_out] == opnd[d_op]:
                k = new(opnd[d_op])
                om[d_out] = k
                opm[d_op] = k
            else:
                om[d_out] = new(out0[d_out], "fixed")
        for d in sim:
            if d in collapsed and slice_sizes[d] == 1 and opm[d] is None:
                opm[d] = new(opnd[d], "sum")
        head_maps = [tuple(opm), tuple(im)]
        out_map = tuple(om)
    elif prim in SCATTER_ADD or prim == "scatter":
        dn = p["dimension_numbers"]
        uwd = [int(a) for a in dn["update_window_dims"]]
        iwd = [int(a) for a in dn["inserted_window_dims"]]
        obd = [int(a) for a in dn.get("operand_batching_dims", ()) or ()]
        opnd, idx, upd = ops[0], ops[1], ops[2]
        om = tuple(new(out0[d]) for d in range(len(out0)))
        um = [None] * len(upd)
        window_op = [d for d in range(len(opnd)) if d not in iwd and d not in obd]
        for d_op, d_up in zip(window_op, uwd):
            if upd[d_up] == opnd[d_op]:
                um[d_up] = om[d_op]
        scat = [d for d in range(len(upd)) if d not in uwd]
        im = [None] * len(idx)
        idx_dims = list(range(len(idx) - 1))
        kind = "sum" if prim in SCATTER_ADD and prim not in ("scatter-mul", "scatter_mul") else "fixed"
        if prim in ("scatter-min", "scatter_min", "scatter-max", "scatter_max"):
            kind = "sum"  # partial min/max combine like a sum (all-reduce with min/max)
        sibd = [int(a) for a in dn.get("scatter_indices_batching_dims", ()) or ()]
        for j, d in enumerate(scat):
            ix = idx_dims[j] if j < len(idx_dims) else None
            if ix is not None and ix in sibd and opnd[obd[sibd.index(ix)]] == upd[d]:
                k = om[obd[sibd.index(ix)]]  # a batching dim: same rows in operand, indices, updates
            else:
                k = new(upd[d], kind)
            um[d] = k
            if ix is not None and idx[ix] == upd[d]:
                im[ix] = k
        head_maps = [om, tuple(im), tuple(um)]
        out_map = om
    else:
        # same-rank structural and element-wise ops: follow the output by size
        om = tuple(new(out0[d]) for d in range(len(out0)))
        out_map = om
        head_maps = [_align(s, out0, om) for s in ops[:nh]]
    head_maps = list(head_maps[:nh]) + [()] * max(0, nh - len(head_maps))
    for k in range(len(head_maps)):
        if len(head_maps[k]) != len(ops[k]):
            head_maps[k] = _align(ops[k], out0, out_map)
    extra = [_align(s, out0, out_map) for s in ops[nh:]]
    out_maps = tuple(out_map if tuple(o) == out0 else _align(o, out0, out_map) for o in outs)
    return Space(tuple(sizes), tuple(kinds), tuple(head_maps) + tuple(extra), out_maps)


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
    params = {k: v for k, v in node.params.items() if k != "name_stack"}
    if search is not None and search.connectivity is not None and node.id in search.connectivity.index_of_node:
        params["_index_node"] = node.id
    return (node.primitive, json.dumps(params, sort_keys=True, default=str),
            tuple((t.shape, t.dtype) for t in node.operand_types), tuple((t.shape, t.dtype) for t in node.outputs),
            tuple(src < 0 for src, _ in node.operands), float(node.flops), node.supported, node.is_input)

