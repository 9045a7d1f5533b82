"""XLA CPU's YNNPACK reductions and the broadcasts they read as written-out buffers
(``shared_broadcast_lists``: copy-group lists for ``CopyGroups.from_lists``; the builder appends
them to ``Problem.edge_memory`` on a CPU cluster).

What XLA does (probed, tests/test_ynn_reduce.py). A reduce_sum / max / min of at least
``YNN_MIN_ELEMENTS`` per-device operand elements becomes a YNNPACK custom fusion, which takes in
the element-wise ops and broadcasts feeding the reduce only when the reduce is their one user. An
HLO instruction with another user is written out, full size, and the other user recomputes it.
LayerNorm's backward is where it matters: flax computes ``mul = rsqrt(var + eps)[:, None] *
scale[None, :]`` by broadcasting both to the activation's shape, and the backward's
``reduce_sum(g * broadcast(rsqrt), 0)`` (the scale's gradient) and ``reduce_sum(g *
broadcast(scale), -1)`` (the rsqrt's) read the same broadcasts, CSE'd with the forward's. XLA
writes both out in the forward pass, where their source exists, and holds them to the backward
reduction: meshgraphnet large fsdp on cpu-2x4 (``python -m experiments.fidelity_real diagnose``;
the HLO of session 20): per LayerNorm ``wrapped_broadcast.38`` (the scale, made at position 1100
of ~3100, from its all-gather) and ``bitcast_broadcast_fusion.61`` (the rsqrt, at 1295, right after
the LayerNorm's statistics), each f32[49152,128], read only by ``ynn_fusion.18`` / ``.10`` at
3093-3094, the edge encoder's backward: 2 x 24 MiB per edge LayerNorm, 2 x 4 MiB per node one.

Rule: a reduction R in ``YNN_REDUCTIONS`` whose operand is output o of a node B that keeps no
buffer for it (fused into R), where B reads a value (w, j) of the same rank and fewer elements,
varying only in R's reduced dims (a broadcast along the others is hoisted out of the reduce by the
algebraic simplifier: no buffer), that an earlier fusible node F also reads with an output of R's
operand shape (the forward reader whose broadcast XLA CSEs): one buffer of R's operand shape in
R's operand layout L per (F, w, j, L), from w's step (0 for state: XLA issues every scale
broadcast before the forward pass, positions 1100-1250 above) to the last such R. Members: the
reductions (want: R's strategies reading L, at least ``YNN_MIN_ELEMENTS`` per device); free: F's
strategies whose output is not in L (XLA shares the broadcast only when the forward reader
computes it in the reduction's layout: after partitioning the two have different local shapes).

The product of the two broadcasts (``mul = rsqrt * scale``, an unkept output of the forward LayerNorm
chain that the backward chain B reads whole) is a third such buffer where the per-row reduction has at
least ``YNN_MIN_ELEMENTS`` rows per device (``shared_product``; from the chain's step to the last R,
free where the chain's output is not in L). Before session 23 the model held the chain's kept output
(the block's ``e + norm``) to the backward instead, which XLA does not (``slice_layout.buffer_reads``).

Approximate: XLA's condition is on three strategies (F's, B's and R's layouts agree); a copy group
states two, here F's and R's, so a plan that puts B in another layout than R (an all-gather between
a chain and its reduction) is charged where XLA writes nothing: vit tiny ilp-time, XLA 4
broadcasts, the rule 7 (policy 6 / 8; replicated 11 / 10, megatron 8 / 8). At real size the
counts agree: gpt 125m ilp-time XLA 49, the rule 48; megatron 1 / 0; meshgraphnet large fsdp /
ilp-time 64 / 64 (2 per LayerNorm, 16 edge and 16 node ones). Keyed on F and B instead (members
B), vit tiny ilp-time 4 / 4, but at real size vit megatron 0.996 -> 1.155 and meshgraphnet dp
1.113 -> 1.324 (against 1.124 here). Session 20f probed the third strategy (an evaluator-only gate, not
a rule: results/s20f_gate_*.json): in vit tiny ilp-time the three extra groups are exactly those whose
chain B (the dot whose epilogue multiplies by the broadcast) is sharded (('y',), (), ()) and gathered
into a replicated R (policy: 2 of 8). Dropping a member when B's output is not in L gives 4 / 4 and
6 / 6; re-priced, zoo tiny 43 -> 44 of 48 (vit policy 1.139 -> 1.090 in; gpt policy 1.242 -> 1.120),
real 39, outside 21 and policy rows 4 of 6 unchanged, but (1) vit megatron goes to 6 where XLA writes 8
(the model's B reduce-scatters over y and R gathers it; XLA, not dumped, presumably multiplies in L:
a gate would read B's layout before its reduce-scatter); (2) the tiny rows stay out: vit ilp-time
1.190 -> 1.118 (1.062 with no rule), meshgraphnet policy 1.138 (its count, 6 / 7, was never the
problem): at tiny size XLA's scheduler issues the broadcasts late (meshgraphnet policy, compiled
with --xla_dump_to: the 7 at positions 215-284 of 625, read at 390-544; all 7 live at XLA's
backward peak, 1223 KB), while the rule holds them from the source's step through the model's
forward peak (step 146 of 651, 6 x 32 KB). Gated and started at the first reader's step, the three
rows come in (1.059, 0.969, 0.978) but gpt tiny ilp-time / ilp-memory / -1.05 go out (0.864-0.888)
and real size falls 39 -> 26 of 40 (meshgraphnet large back to ~0.75, gpt 125m to ~0.89): no single
start fits all. A gate on a third node also needs copy-group members with two nodes (ILP rows,
lagrange, bp_copies, local search). Earlier keys (session 11,
commit 42927fb, reverted in ae535e3: B + R) over-charged meshgraphnet tiny megatron (XLA 2, the rule
6). Not modelled: the third buffer XLA holds per LayerNorm at real size (the LayerNorm input x = dot +
bias, written out for its two YNN statistics reductions beside the dot's own result, from which the
fusions reading x recompute it): meshgraphnet large stays about 9% under XLA. Re-priced figures: README, session 20.
"""
from __future__ import annotations

import numpy as np

from costmodel.cost import Mesh, local_bytes, local_shape
from costmodel.fused_reductions import YNN_MIN_ELEMENTS
from costmodel.graph import OpGraph
from costmodel.memory import materialising, non_fusible

#: reductions XLA CPU emits as YNNPACK fusions (``__ynn_fusion`` with a ``reduce`` root)
YNN_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min"})


def shared_broadcast_lists(graph: OpGraph, strats, mesh: Mesh, kept, intervals) -> list:
    """The broadcasts XLA CPU writes out for its YNNPACK reductions (module docstring), as copy
    groups (F, bytes, members, start step, early: every F strategy)."""
    nodes = graph.nodes
    cmap = graph.consumers()
    groups: dict = {}
    for r in nodes:
        if r.primitive not in YNN_REDUCTIONS or r.is_input or not r.operands or len(strats[r.id]) == 0:
            continue
        b, o = r.operands[0]
        if b < 0 or nodes[b].is_input or o in kept[b]:
            continue
        ten = r.operand_types[0]
        axes = {int(a) for a in r.params.get("axes", ())}
        size = int(np.prod(ten.shape))
        itemsize = np.dtype(ten.dtype).itemsize
        dst = [s.operand_specs[0] for s in strats[r.id]]
        nh = int(nodes[b].params.get("num_head_operands", 0)) if materialising(nodes[b]) else 0
        for (w, j), t in list(zip(nodes[b].operands, nodes[b].operand_types))[nh:]:
            varies = {d for d in range(len(t.shape)) if int(t.shape[d]) > 1}
            product = w >= 0 and tuple(t.shape) == tuple(ten.shape) and shared_product(nodes[w], j, kept[w], cmap)
            if product:
                f, fo = w, j   # the product itself, written out for R's fusion (shared_product)
            elif w < 0 or len(t.shape) != len(ten.shape) or int(np.prod(t.shape)) >= size or not varies \
                    or not varies <= axes:
                continue
            else:
                fwd = sorted((nodes[c].order, c, next(k for k, x in enumerate(nodes[c].outputs) if x.shape == ten.shape))
                             for c, _ in cmap.get((w, j), ()) if c != b and nodes[c].order < nodes[b].order
                             and not non_fusible(nodes[c]) and any(x.shape == ten.shape for x in nodes[c].outputs))
                if not fwd:
                    continue
                _, f, fo = fwd[0]
            src = [s.out_specs[fo] for s in strats[f]]
            for L in dict.fromkeys(dst):
                local = local_shape(ten.shape, L, mesh)
                if int(np.prod(local)) < YNN_MIN_ELEMENTS or (product and int(np.prod(
                        [n for d, n in enumerate(local) if d not in axes])) < YNN_MIN_ELEMENTS):
                    continue   # a loop fusion: the broadcast stays fused
                free = np.array([s != L for s in src])
                if free.all():
                    continue
                key = (f, w, j, L)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = (f, local_bytes(ten.shape, itemsize, L, mesh), {}, int(intervals[w, 0]),
                                       np.ones(len(src), dtype=bool))
                g[2][r.id, 0] = (r.id, r.order, np.array([d == L for d in dst]), free)
    return [(f, nb, list(ms.values()), t, e) for f, nb, ms, t, e in groups.values()]


def shared_product(nd, j: int, kept_w, cmap) -> bool:
    """Is output ``j`` of ``nd`` a product of broadcasts that XLA CPU writes out in the forward pass
    for a YNNPACK reduction's fusion in the backward: an output ``nd`` keeps no buffer for, of a
    chain with no buffer-writing head (``materialising``), that another output of ``nd``, read by
    some consumer, is computed through (its operands, ``params["out_operands"]``, a strict superset
    of j's)? LayerNorm's ``mul = rsqrt[:, None] * scale`` beside its normalised output. Probed
    (tests/test_partly_kept_interval.py, flax's LayerNorm in a residual block, fwd + bwd,
    replicated): with at least ``YNN_MIN_ELEMENTS`` rows (the per-row reduction's output: 4096 x 8
    to x 64 and 4097 x 32 yes; 4095 x 64, 3072 x 128, 1024 x 256 no, whatever the element count)
    XLA fuses the rsqrt gradient's reduction, the product ``g * mul`` and the input gradient's
    epilogue into one ``ynn_fusion``, which takes no broadcast in: ``broadcast_multiply_fusion``
    (``rsqrt * scale``) is computed from the forward's rsqrt and written out there (the forward's own
    fusion recomputes it), held to that reduction. meshgraphnet large fsdp:
    ``broadcast_multiply_fusion.58`` (``sg_node_854/mul``, f32[49152,128]) read only by
    ``ynn_fusion.176``, one per edge and node LayerNorm at XLA's peak."""
    if nd.is_input or materialising(nd) or j in kept_w:
        return False
    deps = nd.params.get("out_operands")
    if deps is None or len(deps) != len(nd.outputs):
        return False
    return any(o != j and cmap.get((nd.id, o)) and set(deps[j]) < set(deps[o]) for o in range(len(nd.outputs)))
