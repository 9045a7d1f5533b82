"""XLA CPU's YNNPACK reductions and the broadcasts they read as buffers (``reduce_broadcast_lists``),
as copy-group lists (``costmodel.edge_memory.CopyGroups.from_lists``; the builder appends them to
``Problem.edge_memory`` on a CPU cluster).
"""
from __future__ import annotations

import numpy as np

from costmodel.cost import Mesh, local_bytes, local_shape
from costmodel.graph import OpGraph
from costmodel.memory import materialising, non_fusible

#: reductions XLA CPU emits as YNNPACK fusions (``ynn_fusion`` with a ``reduce`` root)
YNN_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})
#: the fewest elements of a reduction's (per-device) operand XLA CPU offloads to YNNPACK (probed:
#: f32[64,64] and f32[1,4096] are ``ynn_fusion``s, f32[63,65] and f32[1,4095] loop fusions)
YNN_MIN_ELEMENTS = 4096


def reduce_broadcast_lists(graph: OpGraph, strats, mesh: Mesh, kept, intervals) -> list:
    """The broadcasts a YNNPACK reduction reads as full-size buffers, one copy group per
    (producer u, broadcast operand (w, j), layout L).

    XLA CPU emits reduce_sum / max / min as a YNNPACK fusion (``__ynn_fusion``), which takes in
    the element-wise ops and broadcasts feeding the reduce only when the reduce is their one user.
    An HLO instruction with another user is written out as its own buffer, and the other user
    recomputes it. Probed on f32[64,256] (``jax.jit(f).lower(...).compile()``):
    ``sum(y * s)`` alone is one fusion reading y and s; with ``x * s * 2`` also returned, the
    broadcast of s is CSE'd between the two and XLA writes ``wrapped_broadcast`` f32[64,256]; so
    for an f32[64,1] statistic (``bitcast_broadcast_fusion``); ``sum((x * y) * s)`` with ``x * y``
    also read writes the product out (``wrapped_multiply``). A broadcast along the reduced dims only
    (an operand of size 1 in every reduced dim) is hoisted out of the reduce by the algebraic
    simplifier, ``sum_k(a_k * r) = r * sum_k(a_k)``: no buffer.

    In a traced train step this is LayerNorm's backward: the group that recomputes ``dy * scale``
    and ``(x - mean) * rsqrt`` (u, folded into the input-gradient dot) is read by the reductions over
    the hidden dim and over the batch dims, and the forward output ``xhat * scale + bias`` reads
    the same scale and rsqrt. XLA writes out the scale broadcast for the reduction over the hidden
    dim and the rsqrt broadcast for the one over the batch dims, each of the activation's full
    shape, and its scheduler issues it as soon as its source exists (the scale before the forward
    pass: it is state; the rsqrt at its forward LayerNorm), live to the backward reduction. XLA's
    buffer assignment, gpt tiny on cpu-2x4: replicated, ``wrapped_broadcast.2-6`` and
    ``bitcast_broadcast_fusion.1-4`` (f32[8,32,64], 64 KiB each, two per LayerNorm, positions
    147-223 to 254-463 of ~800); the ILP's min-memory plan, the two of ln1 in both blocks; under
    1.05 x Megatron's step time, only the two scales of ln1 (the other reductions read an
    all-gathered copy, written out before the collective: no broadcast of their own).

    Rule: a reduction R in ``YNN_REDUCTIONS`` reading output o of a node u that keeps no buffer for
    it (``kept``: fused into its readers) in u's own layout L (no resharding between them), where u
    reads an operand (w, j) of fewer elements than o and the same rank, of size > 1 in some reduced
    dim of R, that some other fusible node also reads (the CSE'd broadcast): one buffer of o's
    shape in L, from w's step (``intervals``: 0 for a value of the state) to R's. Members are the
    reductions (want: R's strategies reading L; free: u's strategies not storing L). Approximate:
    which of u's folded ops reads w is not recorded, so each qualifying reduction of u is a member
    (and the dims condition stands in for it: XLA itself writes out a shared broadcast whatever
    dims it varies in, f32[1,1,1,8] under a reduce over [0,1,2] included; GroupNorm's
    f32[8,1,1,8] statistics in unet tiny are not written out because the product they feed is
    read by two reductions and written out whole, which the graph cannot tell apart);
    broadcasts of another rank are not charged; XLA's placement of the buffer is taken as its
    source's step. Not expressible in a copy group: XLA shares the broadcast only when the
    forward reader v is in layout L too (after partitioning the two broadcasts have different
    local shapes otherwise), a condition on a third node's strategy (meshgraphnet tiny megatron:
    the forward LayerNorms sharded, their backward chains replicated: XLA writes 2 broadcasts,
    the rule charges 6). Re-priced (experiments.fidelity --reprice, fidelity_s11b): gpt
    replicated 0.914 -> 1.012, megatron 0.926 -> 1.034, ilp-time 0.921 -> 1.019, ilp-memory
    0.897 -> 0.985, ilp-memory-1.05 0.885 -> 0.974; but vit ilp-time 1.071 -> 1.118, policy 1.017
    -> 1.101, meshgraphnet megatron 0.983 -> 1.225, policy 0.978 -> 1.138, gpt policy 1.146 ->
    1.187: zoo within 10% 36 -> 34 of 40 (outside the zoo 17 of 24, unchanged)."""
    nodes = graph.nodes
    cmap = graph.consumers()
    groups: dict = {}
    for r in nodes:
        if r.primitive not in YNN_REDUCTIONS or r.is_input or not r.operands or len(strats[r.id]) == 0:
            continue
        u, o = r.operands[0]
        if u < 0 or nodes[u].is_input or o in kept[u]:
            continue
        ten = r.operand_types[0]
        axes = [int(a) for a in r.params.get("axes", ())]
        size = int(np.prod(ten.shape))
        itemsize = np.dtype(ten.dtype).itemsize
        src = [s.out_specs[o] for s in strats[u]]
        dst = [s.operand_specs[0] for s in strats[r.id]]
        nh = int(nodes[u].params.get("num_head_operands", 0)) if materialising(nodes[u]) else 0
        for (w, j), t in list(zip(nodes[u].operands, nodes[u].operand_types))[nh:]:
            varies = [d for d in range(len(t.shape)) if int(t.shape[d]) > 1]
            if (w < 0 or len(t.shape) != len(ten.shape) or int(np.prod(t.shape)) >= size
                    or not varies or not set(varies) <= set(axes)
                    or not any(c != u and not non_fusible(nodes[c]) for c, _ in cmap.get((w, j), ()))):
                continue
            for L in dict.fromkeys(dst):
                if int(np.prod(local_shape(ten.shape, L, mesh))) < YNN_MIN_ELEMENTS:
                    continue   # a loop fusion: its operands stay fused
                want = np.array([d == L for d in dst])
                free = np.array([s != L for s in src])
                if free.all():
                    continue
                key = (u, w, j, L)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = (u, local_bytes(ten.shape, itemsize, L, mesh), [],
                                       int(intervals[w, 0]), np.ones(len(src), dtype=bool))
                g[2].append((r.id, r.order, want, free))
    return list(groups.values())
