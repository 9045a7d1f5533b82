"""The iteration-space rule of each primitive (``rule_of``), for ``costmodel.space.space_of``.

Per node kind: dot_general (batch / lhs-free / rhs-free ``par``, contracting ``sum``),
conv_general_dilated (batch, out-feature ``par``, in-feature ``sum`` when feature_group_count =
batch_group_count = 1; spatial dims, see ``SearchSpace``: ``fixed`` in Alpa's space, else ``par``
where the output is split and ``sum`` where the window is — a weight gradient — with the halo
exchange of costmodel.halo and only the splits XLA runs as one, see ``costmodel.halo.strategy_halo``),
reductions (reduced dims ``sum``), cumulative ops / sort (scan dim ``fixed``), fft (Alpa's space:
replicated only, as XLA runs it, see ``SearchSpace.xla_fft_replicated``, else transformed dims
``whole``; full space: costmodel.fft_plan's batch-sharded and transposing strategies, which the
runtime runs with shard_map), gather (index batch dims and full-slice window dims ``par``,
point-indexed operand dims ``sum``: masked lookup + all-reduce, Megatron's vocab-parallel
embedding), scatter-add (window dims and scattered-into operand dims ``par``: each device applies
the updates that land in its rows, except a dim the update covers as a partial block, which XLA
all-gathers, so ``fixed``; update/index dims ``sum``: partial results all-reduced; plain
scatter: update dims ``fixed``; a row gather / scatter-add also gets costmodel.graph_part's halo
strategies in the full space: nodes and edges sharded on the same axes, the halo rows moved by
collective-permutes, run by shard_map), transpose (permuted), reshape/squeeze/expand_dims (dims that
map through; merging or splitting dims maps the sharding of the major dim of the group),
broadcast_in_dim, and everything else whose operands have the output's rank (element-wise,
concatenate, pad, slice, dynamic_slice, select_n, ...): an operand dim follows the output dim of
the same size (trailing alignment), otherwise it is read replicated. Element-wise ops folded into a
node (``params["num_head_operands"]``) follow the head: ``space_of`` aligns their extra operands
with the output, and every output of the group takes the head's spec.

A rule gets (primitive, params, operand shapes, output shape, number of head operands, the
``SearchSpace``, ``new(size, kind)`` that creates an iteration dim and returns its index) and
returns (the head operands' dim maps, the output's dim map, the number of head operands it keeps).
"""
from __future__ import annotations

from costmodel.halo import spatial_dims
from costmodel.primitives import SCATTER_COMBINE

#: primitives whose reduced dims are ``sum`` dims (``primitives.REDUCTIONS`` less the cumulative ops,
#: which are SCANS, and the generic variadic ``reduce``, which takes the default same-rank rule)
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                        "reduce_xor", "argmax", "argmin"})
#: cumulative ops: the scanned dim is ``fixed``
SCANS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})
#: the scatters that combine into the operand (add, sub, mul, min, max): costmodel.primitives
SCATTER_ADD = SCATTER_COMBINE
#: dims that map through (a bitcast on the CPU backend: costmodel.memory.TRANSPARENT)
RESHAPES = frozenset({"reshape", "squeeze", "expand_dims"})


def align(shape, out_shape, out_map):
    """Trailing-aligned map of an operand of ``shape`` onto the output: dim -> iteration dim of the
    output dim with the same size (> 1), else None."""
    r, ro = len(shape), len(out_shape)
    m = []
    for i in range(r):
        j = ro - r + i
        m.append(out_map[j] if 0 <= j < ro and shape[i] == out_shape[j] and shape[i] > 1 else None)
    return tuple(m)


def reshape_map(in_shape, out_shape):
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


def _dot_general(prim, p, ops, out0, nh, search, new):
    """dot_general: batch / lhs-free / rhs-free dims ``par``, contracting dims ``sum``."""
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
    return head_maps, out_map, nh


def _conv(prim, p, ops, out0, nh, search, new):
    """conv_general_dilated: batch, out-feature ``par``, in-feature ``sum``; spatial dims per ``search``."""
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
    return head_maps, out_map, nh


def _reduction(prim, p, ops, out0, nh, search, new):
    """reductions: reduced dims ``sum``, the others ``par``."""
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
    return head_maps, out_map, nh


def _scan_or_sort(prim, p, ops, out0, nh, search, new):
    """cumulative ops and sort: the scanned dim ``fixed``."""
    ax = int(p.get("axis", p.get("dimension", -1)))
    x = ops[0]
    ax = ax % len(x) if x else 0
    om = tuple(new(x[d], "fixed" if d == ax else "par") for d in range(len(x)))
    out_map = om
    head_maps = [om] * (nh if prim == "sort" else 1)
    return head_maps, out_map, nh


def _fft(prim, p, ops, out0, nh, search, new):
    """fft: ``fixed`` dims as XLA runs it (``search.xla_fft_replicated``), else transformed dims ``whole``."""
    n = len(p.get("fft_lengths", ()))
    x = ops[0]
    om = tuple(new(min(x[d], out0[d]), "fixed" if search.xla_fft_replicated else ("whole" if d >= len(x) - n else "par"))
               for d in range(len(x)))

    out_map = om
    head_maps = [om]
    nh = 1
    return head_maps, out_map, nh


def _follow_operand(ops, out0, new, src_of):
    """The output's dims, output dim d mapped onto operand 0's dim ``src_of[d]`` (None: none)."""
    om = tuple(new(out0[d]) for d in range(len(out0)))
    lm = [None] * len(ops[0])
    for d, src in enumerate(src_of):
        if src is not None:
            lm[src] = om[d]
    return [tuple(lm)], om, 1


def _transpose(prim, p, ops, out0, nh, search, new):
    """transpose: the output dims, permuted onto the operand."""
    return _follow_operand(ops, out0, new, [int(a) for a in p["permutation"]])


def _reshape(prim, p, ops, out0, nh, search, new):
    """reshape / squeeze / expand_dims: the dims that map through (``reshape_map``)."""
    return _follow_operand(ops, out0, new, reshape_map(ops[0], out0))


def _broadcast(prim, p, ops, out0, nh, search, new):
    """broadcast_in_dim: the operand follows its broadcast dims (size > 1)."""
    om = tuple(new(out0[d]) for d in range(len(out0)))
    bd = [int(a) for a in p["broadcast_dimensions"]]
    x = ops[0]
    head_maps = [tuple(om[bd[i]] if x[i] == out0[bd[i]] and x[i] > 1 else None for i in range(len(x)))]
    out_map = om
    nh = 1
    return head_maps, out_map, nh


def _gather(prim, p, ops, out0, nh, search, new):
    """gather: index batch and full-slice window dims ``par``, point-indexed operand dims ``sum``."""
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
    return head_maps, out_map, nh


def _scatter(prim, p, ops, out0, nh, search, new):
    """scatter(-add): window and scattered-into dims ``par`` (``fixed`` where the update is a partial block of
    the dim); update / index dims ``sum`` (combining) or ``fixed``."""
    dn = p["dimension_numbers"]
    uwd = [int(a) for a in dn["update_window_dims"]]
    iwd = [int(a) for a in dn["inserted_window_dims"]]
    obd = [int(a) for a in dn.get("operand_batching_dims", ()) or ()]
    opnd, idx, upd = ops[0], ops[1], ops[2]
    window_op = [d for d in range(len(opnd)) if d not in iwd and d not in obd]
    sdod = {int(a) for a in dn.get("scatter_dims_to_operand_dims", ()) or ()}
    # a scattered-into dim whose update window is a partial block (1 < window < dim, e.g. FNO's
    # out_ft.at[:, :m, :m].set(block)): XLA's partitioner all-gathers the operand (measured on the
    # 2x4 CPU mesh, set and add alike; a window of the whole dim or a row scatter is run sharded)
    block = {d_op for d_op, d_up in zip(window_op, uwd) if d_op in sdod and 1 < upd[d_up] < opnd[d_op]}
    om = tuple(new(out0[d], "fixed" if d in block else "par") for d in range(len(out0)))
    um = [None] * len(upd)
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
    return head_maps, out_map, nh


def _same_rank(prim, p, ops, out0, nh, search, new):
    """same-rank structural and element-wise ops: every operand follows the output by size."""
    om = tuple(new(out0[d]) for d in range(len(out0)))
    out_map = om
    head_maps = [align(s, out0, om) for s in ops[:nh]]
    return head_maps, out_map, nh


def rule_of(prim: str):
    """The iteration-space rule of a primitive: (prim, params, operand shapes, output shape, head
    operand count, search space, new dim) -> (head operand maps, output map, head operand count)."""
    if prim == "dot_general":
        return _dot_general
    if prim == "conv_general_dilated":
        return _conv
    if prim in REDUCTIONS:
        return _reduction
    if prim in SCANS or prim == "sort":
        return _scan_or_sort
    if prim == "fft":
        return _fft
    if prim == "transpose":
        return _transpose
    if prim in RESHAPES:
        return _reshape
    if prim == "broadcast_in_dim":
        return _broadcast
    if prim == "gather":
        return _gather
    if prim in SCATTER_ADD or prim == "scatter":
        return _scatter
    return _same_rank
