"""Where buffers read through fusions live: the builder's extension of each value's interval to the
readers of the nodes fused into their consumers (``read_extents``), the held-only-when-read-as-is
part of it (``fused_read_groups``), and slices XLA makes in their readers' layouts
(``reader_layout_slices``), as copy groups (``costmodel.edge_memory.CopyGroups.from_lists``).
"""
from __future__ import annotations

import numpy as np

from costmodel.combined import combined_candidates
from costmodel.cost import Mesh, lowered_kind
from costmodel.graph import OpGraph
from costmodel.memory import (
    MATERIALISING,
    NON_FUSIBLE,
    SLICES,
    buffer_bytes,
    materialising,
    non_fusible,
    recomputed_reads,
)

__all__ = ["buffer_reads", "copied_together", "copy_source_reads", "fused_read_groups", "held_read_steps", "partly_kept_reads",
           "read_extents",
           "reader_layout_slices", "recomputed_reads", "splits_before_gather"]


def splits_before_gather(nd, k: int) -> bool:
    """Does XLA cut ``nd``'s operand ``k`` into pieces in the producer's layout and reshard each piece
    as the node's own output, so that no copy of the whole operand exists whatever layout ``nd``
    reads it in? True for a ``split``'s operand (sharding propagation gives the split its operand's
    sharding; the consumer's layout applies to the pieces). Probed (tests/test_split_gather.py):
    x[8,32,32,16] split in two along the channels, each half replicated: batch-sharded over 8, two
    all-gathers of f32[8,32,32,8]; channel-sharded over 8, collective-permutes of the local
    f32[8,32,32,2] into each half's devices, then the same two all-gathers; never f32[8,32,32,16].
    unet tiny ilp-time: the skip concatenate's gradient, S01RRR, read RRRR by its split, was charged a
    512 KiB gathered copy at the model's peak (re-priced 1.104 -> 1.031). Approximate: the pieces
    are priced as the split's outputs (its own buffers, in its layout); the local halo exchange of a
    split along a sharded dim (producer-sized, short-lived) is not charged. Not for ``slice``
    (not probed)."""
    return nd.primitive == "split" and k == 0


def read_extents(graph: OpGraph, intervals, kept, transparent, recomputed, edge_memory=True) -> tuple[set, list]:
    """(fused nodes, held reads): extends ``intervals`` (the nodes' (start, end) steps, in place) so
    a value is live where it is read. A bitcast (``transparent``) keeps its producer's buffer alive;
    a node fused into its consumers (no buffer; not a concatenate, whose pieces each reader slices
    apart, nor the trace's scan-unrolling records) or recomputed by fusions (``recomputed``:
    ``memory.recomputed_reads``) has its operands read where those run. A buffer (u, output oi) so
    read by a fused or recomputed node i is not extended when ``edge_memory``: the read is returned
    as (u, oi, i, operand k, step t) for ``fused_read_groups``.

    A fused group's operand is read only where the outputs computed from it are
    (``params["out_operands"]``): a reader of another output does not hold it. GPT's causal mask
    ``select(broadcast(mask), scores, -inf)`` is one group whose outputs are the broadcast mask
    (read by the backward's ``select``) and the masked scores (read by the softmax): XLA rebuilds
    the mask from its iota in the backward fusion, and the scores dot's result dies in the forward
    pass (tests/test_attention_memory.py); extended over the whole group, the model held it to the
    backward, one scores-sized buffer per attention block (gpt 125m ilp-time, +576 MiB)."""
    nodes = graph.nodes
    fused = {i for i, nd in enumerate(nodes) if not nd.is_input and i not in transparent and not kept[i]
             and nd.primitive != "concatenate" and not nd.params.get("synthetic")}
    through: list = []
    partly = partly_kept_reads(graph, kept, transparent) if edge_memory else {}
    cons = graph.consumers()
    for i in range(len(nodes) - 1, -1, -1):  # consumers have higher ids: their ends are final here
        nd = nodes[i]
        if nd.is_input or not (i in transparent or i in fused or i in recomputed or i in partly):
            continue
        t = max(int(intervals[c, 1]) if c in fused else int(nodes[c].order) + 1
                for c in (recomputed[i] if i in recomputed else partly[i])) \
            if i in recomputed or i in partly else int(intervals[i, 1])
        t_of = _operand_ends(nd, t, cons, intervals, fused | transparent) \
            if i in fused and i not in recomputed and i not in partly else {}
        if i in partly and i not in recomputed:   # only the operands the unkept outputs are computed from
            t_of = _unkept_operand_ends(nd, kept[i], cons, intervals, fused) or t_of
        for k, (u, oi) in enumerate(nd.operands[:1] if i in transparent else nd.operands):
            tk = t_of.get(k, t)
            if tk is None:
                continue
            if u >= 0 and not nodes[u].is_input and i not in recomputed.get(u, ()):
                if edge_memory and i not in transparent and oi in kept[u] and u not in transparent:
                    through.append((u, oi, i, k, tk))
                else:
                    intervals[u, 1] = max(intervals[u, 1], tk)
    return fused, through


def _operand_ends(nd, t: int, cons, intervals, spans) -> dict[int, int]:
    """Operand k of fused group ``nd`` -> the step after its last read: the latest end of the
    readers of the outputs computed from k (a reader in ``spans``, itself fused or a bitcast, at
    its interval's end), capped at ``t``; {} when the trace did not record the dependencies or an
    output has no reader (a program output)."""
    deps = nd.params.get("out_operands")
    if deps is None or len(deps) != len(nd.outputs):
        return {}
    ends = []
    for o in range(len(nd.outputs)):
        rs = cons.get((nd.id, o), ())
        if not rs:
            return {}
        ends.append(max(int(intervals[c, 1]) if c in spans else int(intervals[c, 0]) + 1 for c, _ in rs))
    out: dict[int, int] = {}
    for o, ks in enumerate(deps):
        for k in ks:
            out[k] = min(t, max(out.get(k, 0), ends[o]))
    return out


def _unkept_operand_ends(nd, kept_i, cons, intervals, fused) -> dict:
    """Operand k of a partly kept chain ``nd`` -> the step after the last reader of the outputs it
    does not keep that are computed from k (``params["out_operands"]``), None for an operand none of
    them is computed from (read at the chain's own step only); {} when the trace did not record the
    dependencies. meshgraphnet's edge LayerNorm chain (``buffer_reads``): its unkept ``rsqrt * scale``
    is computed from the rsqrt and the scale, not from the residual ``e`` the kept block output adds."""
    deps = nd.params.get("out_operands")
    if deps is None or len(deps) != len(nd.outputs):
        return {}
    out: dict = {k: None for k in range(len(nd.operands))}
    for o, ks in enumerate(deps):
        if o in kept_i:
            continue
        end = max((int(intervals[c, 1]) if c in fused else int(intervals[c, 0]) + 1 for c, _ in cons.get((nd.id, o), ())),
                  default=None)
        for k in ks if end is not None else ():
            out[k] = max(out[k] or 0, end)
    return out


def partly_kept_reads(graph: OpGraph, kept, transparent) -> dict[int, list[int]]:
    """node i -> the readers of i's outputs XLA does not keep (``materialised_outputs``), for i a
    fused chain (folded ops) behind a head that writes no buffer of its own (not ``materialising``:
    a transpose, an element-wise op) that keeps some outputs but not all. Such a reader's fusion
    recomputes the unkept value from i's operands, so they live to it (``read_extents``), as they
    do for a chain that keeps nothing. XLA's buffer assignment, moe tiny (tests/data/outside_steps.py)
    under all four solver plans: the SiLU-GLU chain ``transpose(x @ w_gate) -> logistic, 1 - s,
    s * (1 - s), g = x * s, h = a * g`` keeps h (a dot operand) and s, and the backward fusion of
    dgate (``copy_bitcast_fusion.1``) reads the gate dot's result (``ynn_fusion.4``) to rebuild
    s * (1 - s), so that 16 KiB lives from the forward dot to the backward pass (XLA's peak)."""
    nodes = graph.nodes
    out: dict[int, list[int]] = {}
    for (i, o), cs in graph.consumers().items():
        nd = nodes[i]
        if (nd.is_input or not nd.folded or not kept[i] or o in kept[i] or i in transparent
                or materialising(nd)):
            continue
        out.setdefault(i, []).extend(c for c, _ in cs)
    return out


def buffer_reads(graph: OpGraph, last_use, kept, skip, recomputed, partly) -> None:
    """``last_use[u]`` (in place): the last step that reads a buffer of node u, the builder's end of
    u's interval. Every read (v, k) counts but those in ``skip`` (served by a layout copy), those
    of a fusion that recomputes u (``recomputed``), and the reads of an output a partly kept chain
    does not keep (``partly``: ``partly_kept_reads``): that reader's fusion recomputes the value
    from the chain's operands (``read_extents`` holds them to it), not from the chain's kept
    outputs, which are separate buffers that die at their own last reader. XLA's buffer assignment,
    meshgraphnet large dp (tests/test_partly_kept_interval.py probes the same on a LayerNorm and a
    residual add): the edge block's LayerNorm chain keeps only the block's output ``e + norm(x) *
    scale + bias`` (read by the scatter-add and the next block), while its other output, the
    broadcast ``rsqrt * scale``, is read by the backward chain; XLA frees the block output in the
    forward pass and rebuilds the broadcast from the rsqrt in the backward fusion
    (``multiply_multiply_fusion``), where the model held the 24 MiB output from its block to the
    backward, 15 edge and 15 node blocks at its peak (+420 MiB, 1.124 of XLA's memory)."""
    for nd in graph.nodes:
        for k, (src, oi) in enumerate(nd.operands):
            if src >= 0 and (nd.id, k) not in skip and nd.id not in recomputed.get(src, ()) \
                    and not (src in partly and oi not in kept[src]):
                last_use[src] = max(last_use[src], int(nd.order))


def held_read_steps(graph: OpGraph, intervals, kept, transparent, fused, from_state) -> dict:
    """Consumer v (or its operand k, key (v, k)) -> the step where its operands' resharded copies are read (``copy_group_lists``'
    ``held_reads``; any other consumer reads at its ``order``), for v computed from more than the
    state (``from_state``: ``value_origin.state_only``) and no reduction or sort head: a bitcast or a
    node fused into its consumers (``fused``) at its interval's last step, where its buffer's or its
    readers' fusions read the copy; a partly kept chain (``partly_kept_reads``) at the last step of
    the readers of its unkept outputs, which recompute them from the copy, as ``read_extents`` holds
    the operands it reads as they are. XLA's buffer assignment, moe tiny's min-memory plan
    (results/s21a_fidelity_outside_remat.json; tests/test_partly_kept_copy.py): the gate dot's result,
    read by the SiLU-GLU chain through an all-to-all, lives as that all-to-all's ``concatenate.3``
    (8 KiB) from the forward pass to the backward fusions that rebuild s * (1 - s) from it
    (``bitcast_slice_fusion.13``-``.16``); held at the chain's own step only, the model lacked it at
    XLA's peak (0.846 of XLA's memory). Held for every operand of such a chain to its interval's end
    instead (tried): gpt tiny ilp-memory-1.05 1.087 -> 1.185, vit tiny ilp-time 1.190 -> 1.239 and
    meshgraphnet large ilp-memory 1.095 -> 1.115 of XLA's (their chains' kept outputs' readers).

    The same for a chain behind a non-fusible head that keeps the head's own result for its readers
    (``materialised_outputs``' -1: a gather or dot whose folded chain, e.g. ``+ bias + residual``, every
    reader recomputes): the chain's own operands (after the head's) are read where the readers of its
    unkept outputs run. XLA's buffer assignment, gpt tiny's min-memory plans under the blocks recompute
    policy (results/s23b_polish_blocks*.json): the input embedding ``wte[tokens] + wpe`` is never written
    out; ``copy_gather_fusion`` (the gather's result) and ``all-gather.2`` (wpe, hidden-sharded, gathered:
    f32[1,32,64], 8 KiB) both live from the forward pass to block_0's recomputation in the backward pass
    (positions 158-876 of ~1100), where the model held the gathered wpe for the gather's own step only
    (tests/test_chain_operand_copy.py). The head's operands are read by the head alone (its step).
    Re-priced (``fidelity --reprice``, results/s24a_reprice_*): zoo tiny 46 / 48 either way (gpt ilp-memory
    0.925 -> 0.960, mlp ilp-memory 1.029 -> 1.039, eight more rows by at most +0.009), real size 40 / 40 (gpt fsdp
    +0.001), outside 22 / 24 (no row moves); gpt tiny's blocks frontier plans +8 KiB (results/s24a_frontier*).
    Not extended (not probed): such an operand's own buffer when it is read as it is (``read_extents``)."""
    nodes = graph.nodes
    ok = [not from_state[i] and nodes[i].primitive not in MATERIALISING - NON_FUSIBLE for i in range(len(nodes))]
    out = {i: int(intervals[i, 1]) - 1 for i in transparent | fused if ok[i]}
    cons = graph.consumers()
    behind_head = [i for i, nd in enumerate(nodes) if not nd.is_input and nd.folded and -1 in kept[i]
                   and materialising(nd) and non_fusible(nd)]
    for i in list(partly_kept_reads(graph, kept, transparent)) + behind_head:
        deps = nodes[i].params.get("out_operands")
        nh = int(nodes[i].params.get("num_head_operands", len(nodes[i].operands))) if i in behind_head else 0
        for o in range(len(nodes[i].outputs)) if ok[i] and deps and len(deps) == len(nodes[i].outputs) else ():
            if o in kept[i]:
                continue
            for k in (k for k in deps[o] if k >= nh):
                t = max((int(intervals[c, 1]) if c in fused else int(nodes[c].order) + 1 for c, _ in cons.get((i, o), ())),
                        default=0) - 1
                out[i, k] = max(out.get((i, k), int(nodes[i].order)), t)
    return out


def copy_source_reads(graph: OpGraph, copied) -> np.ndarray:
    """Per node, the step of the last dot (-1: none) whose operand layout copy (``copied``:
    ``copy_lists.layout_copied_reads``) XLA CPU recomputes from that node: the copied value is a
    fused element-wise group (not ``materialising``, not an input) whose buffer is also written out
    for another reader, every reader a dot, so XLA's fusion duplicates the group into the
    ``copy_bitcast_fusion`` made just before the dot, and the group's operands stay live to that
    step (the builder starts ``last_use`` from this array), not to the group's own step.
    XLA's buffer assignment, gpt 125m ilp-memory-1.05 (results/s20_fidelity_real_gpt.json's plan,
    cpu-2x4): the logits gradient dlogits = exp * (g / sum) + one-hot is written row-major for dX
    (``add_bitcast_fusion.1`` f32[4096,12576]) and, fused again from the scatter-add one-hot
    (``wrapped_scatter``) and the exp (``subtract_exponential_fusion``), transposed for dW
    (``copy_bitcast_fusion`` f32[12576,4096]): 4 x 196.5 MiB at XLA's peak, where the model
    held 2 (dlogits and its copy; predicted / XLA 0.889, re-priced 1.005; tests/test_copy_sources.py
    at a small size 0.515 -> 0.993). Not extended: a group read by a non-dot too (fno tiny
    replicated: the GELU gradient, also read by the bias gradient's reduction, is written out once
    and ``transpose(param_0.134)`` copies that buffer; extending it put fno's real-size rows at
    1.11-1.44 of XLA), a group every read of which is a copy (no canonical buffer: fno's spectral
    slices), a conv's copy (made at its producer's step). Approximate: every operand of the group
    is held, whatever the plan; where the dot reads the group resharded XLA copies the gathered
    buffer instead and the operands die at the group (a probe, the same lm_head with batch 4 under
    dp on cpu-2x4: 1.10 -> 1.67 of XLA)."""
    nodes = graph.nodes
    out = np.full(len(nodes), -1, dtype=np.int64)
    via = {r for rs in copied.values() for r in rs}
    cons = graph.consumers()
    for (u, oi, _), rs in copied.items():
        pu = nodes[u]
        rd = cons.get((u, oi), [])
        if (pu.is_input or materialising(pu) or all(r in via for r in rd)   # no canonical buffer (fno's slices)
                or any(nodes[c].primitive != "dot_general" for c, _ in rd)):  # a bias reduction: copied from it
            continue
        for v, _ in rs:
            if nodes[v].primitive == "dot_general":
                for src, _ in pu.operands:
                    if src >= 0:
                        out[src] = max(out[src], int(nodes[v].order))
    return out


def copied_together(graph: OpGraph, copied, plain_out=frozenset()) -> dict:
    """(u, oi) -> the step of its first reader, for the unfolded result of a dot, conv or reduction
    (``materialising``; a slice, say, is recomputed into each copy instead) read at two or more
    steps, every read a dot operand XLA CPU serves from a layout copy (``copied``:
    ``copy_lists.layout_copied_reads``).
    XLA's scheduler makes all those copies at the first reader's step, and the value's buffer dies
    there (``layout_copy_lists`` holds each copy from that step to its dot; the builder ends the
    value at it). XLA's buffer assignment, moe tiny (tests/data/outside_steps.py): the expert
    outputs y[e, b, d] are read by the gate-weighted sum and its gate gradient, each in its own
    batch-major order: under ilp-time both transposed copies of y's all-gather
    (``transpose_copy_fusion``, ``.1``, 32 KiB each) are made right after it, the second held to
    the gate gradient's dot; under dp both sliced copies of the replicated y, and y (32 KiB) dies."""
    reads = {r: order for (_, _, order), rs in copied.items() for r in rs}
    out = {}
    for (u, oi), cs in graph.consumers().items():
        if ((u, oi) in plain_out or not materialising(graph.nodes[u]) or graph.nodes[u].folded
                or len({graph.nodes[c].order for c, _ in cs}) < 2
                or any(graph.nodes[c].primitive != "dot_general" or (c, k) not in reads for c, k in cs)):
            continue
        out[(u, oi)] = min(int(graph.nodes[c].order) for c, _ in cs)
    return out


def _chain(graph: OpGraph, u: int, transparent, cons) -> list[int] | None:
    """[u, t1, ..., tm]: u and the bitcasts (``transparent``) that each read the one before as
    their only reader, up to the first node read by something else or by several readers."""
    out = [u]
    while len(cs := cons.get((out[-1], 0), [])) == 1 and cs[0][0] in transparent:
        out.append(cs[0][0])
    return out


def _strategy_map(strats, chain) -> np.ndarray | None:
    """For each strategy of the slice chain[0], the strategy of the chain's end that reads the
    value as it is at every bitcast (operand spec = the previous out spec), or None if one has none."""
    idx = np.arange(len(strats[chain[0]]))
    for prev, t in zip(chain, chain[1:]):
        spec = [strats[prev][a].out_specs[0] for a in idx]
        ops = [s.operand_specs[0] for s in strats[t]]
        if any(sp not in ops for sp in spec):
            return None
        idx = np.array([ops.index(sp) for sp in spec])
    return idx


def reader_layout_slices(graph: OpGraph, strats, mesh: Mesh, reads, intervals, kept, transparent, usages, offs,
                         skip=frozenset(), recomputed=None) -> list:
    """Copy groups: an unfolded slice (``SLICES``) keeping one buffer (no program output: ``skip``),
    with the bitcasts (squeezes, reshapes) that are its only readers, is made by XLA in each reader's
    layout: a reader taking a local piece of it (the resharding sends nothing) gets that piece from
    the slice's fusion (a ``dynamic-slice_bitcast_fusion``), so the slice's own layout is a buffer
    only for readers that take it as it is or through a collective. The slice's own bytes leave
    ``usages`` (flat, offsets ``offs``, changed in place) and come back as one group per distinct out
    spec: made at its first reader's step (not before the slice's) under the strategies of that
    spec, wanted by each reader (v, k) of the chain's end under v's strategies that read that spec
    as it is or through a collective, live to its last such reader. The copies in the readers'
    layouts stay ``copy_group_lists``' (made at each reader's step). Readers that recompute the
    slice (``memory.recomputed_reads``) read none of its buffers. Seen in XLA's buffer assignment,
    fno's 2-D fftn batch-sharded plan at batch 1 (tests/test_dist_fft.py): the four spectral-weight
    slices, replicated c64[1,8,8,16,16] in the plan (128 KiB) and squeezed for the spectral dots,
    are ``dynamic-slice_bitcast_fusion``s of c64[8,8,4,16] (32 KiB) in the backward dots' layout;
    the model charged the 128 KiB from the forward pass to the backward dots. Approximate: XLA made
    those pieces at the forward pass (live to the backward dots); made so here (at the slice's
    first reader) the FNO cases stay within 10% but the zoo's fno ilp-memory-1.05 row (weight
    slices read as they are forward and locally sliced backward) re-prices 1.063 -> 1.106, so they
    are short-lived copies at each reader; a reader taking the slice resharded with a collective is
    charged the own-layout buffer to its step (XLA may gather from the slice's operand instead)."""
    recomputed = recomputed or {}
    cons = graph.consumers()
    by_end: dict = {}
    for v, k, u, oi, comm in reads:
        if oi == 0:
            by_end.setdefault(u, []).append((v, k, comm))
    groups = []
    for nd in graph.nodes:
        u = nd.id
        if nd.primitive not in SLICES or nd.folded or kept[u] != [0] or u in transparent or (u, 0) in skip:
            continue
        chain = _chain(graph, u, transparent, cons)
        amap = _strategy_map(strats, chain)
        e = chain[-1]
        readers = [(v, k, comm) for v, k, comm in by_end.get(e, ()) if v not in recomputed.get(u, ())
                   and v not in chain]
        if amap is None or not readers:
            continue
        st_u = strats[u]
        own = np.array([buffer_bytes(nd, 0, st, mesh) for st in st_u])
        usages[offs[u]:offs[u + 1]] -= own
        made = max(int(intervals[u, 0]), min(int(graph.nodes[v].order) for v, _, _ in readers))
        specs = [st.out_specs[0] for st in st_u]
        for a in [specs.index(sp) for sp in dict.fromkeys(specs)]:
            on = np.array([sp == specs[a] for sp in specs])
            spec_e = strats[e][amap[a]].out_specs[0]
            members = [(v, int(graph.nodes[v].order), np.array([comm[amap[a], j] > 0 or sj.operand_specs[k] == spec_e
                                                                for j, sj in enumerate(strats[v])]), ~on)
                       for v, k, comm in readers]
            if own[a] > 0:
                groups.append((u, float(own[a]), members, made, on, np.zeros(len(st_u))))
    return groups


def fused_read_groups(graph: OpGraph, strats, mesh: Mesh, reads, intervals, through, usages, offs) -> list:
    """A buffer read by a fused (or slice-recomputing) node i, which reads it where i's own readers
    run (``through``: (u, output oi, i, operand k, step t) with t past u's interval), is held to t
    only under the strategies where i reads it as it is or a local piece of it (no bytes sent):
    a read through a collective reads the gathered copy (``copy_group_lists`` keeps that to i's
    readers), and u's buffer dies at the collective. One group per (u, oi, out spec), made at
    u's interval end. Seen in XLA's buffer assignment, fno's 3-D fftn batch-sharded plan at batch 1
    (tests/test_dist_fft.py): the spectra's sharded fft outputs (64 KiB) die at their all-gathers
    (``all-gather``, c64[1,8,16,16,16], 110-279), which the weight gradients' pad fusions read
    (``memory.recomputed_reads``); held to those fusions the model was 1.120 of XLA's memory. Held
    as before under a strategy whose all-reduce XLA CPU combines (``combined_candidates``: the copy
    is made at the reader's step, not early). A group holds the node's whole usage (its
    collectives' buffers too), as the interval extension did: holding only the output's bytes
    re-priced rnn tiny dp / fsdp 0.988 / 0.983 -> 0.598 / 0.570 (the unrolled scan's
    weight-gradient dots, held to the fused sum). Not under a reader strategy that all-reduces the
    reader's own result (a partial sum): XLA writes that result out for the collective, so the
    reader is no fusion's part and the buffer dies at it (rnn megatron's per-step bias reductions,
    ``costmodel.fused_reductions``: all eight ``wrapped_reduce`` apart, 1.088 -> 1.030 of XLA's)."""
    comm_of = {(v, k): comm for v, k, _, _, comm in reads}
    merged = set(combined_candidates(graph, strats, mesh))
    groups: dict = {}
    # a reader whose result is all-reduced (a partial sum) writes it out for the collective: not fused
    reduced = {i: [any(lowered_kind(c, mesh) in ("all-reduce", "reduce-scatter") for c, _, _ in st.collectives)
                   for st in strats[i]] for i in {r[2] for r in through}}
    for u, oi, i, k, t in through:
        comm = comm_of.get((i, k))
        if t <= intervals[u, 1] or comm is None:
            continue
        # under a combined all-reduce the read is a copy at the reader's step (copy_group_lists' ``whole``): held
        whole = [u in merged and any(lowered_kind(c, mesh) != c for c, _, _ in st.collectives) for st in strats[u]]
        # the node's whole usage (its collectives' buffers too), as the interval it no longer extends held it
        kinds = [(st.out_specs[oi], w, float(b)) for st, w, b in zip(strats[u], whole, usages[offs[u]:offs[u + 1]])]
        for a in [kinds.index(kd) for kd in dict.fromkeys(kinds)]:
            on = np.array([kd == kinds[a] for kd in kinds])
            g = groups.setdefault((u, oi, kinds[a]), (u, kinds[a][2], [], int(intervals[u, 1]), on, np.zeros(len(kinds))))
            g[2].append((i, t - 1, np.array([(whole[a] or comm[a, j] == 0) and not reduced[i][j]
                                             for j in range(len(strats[i]))]), ~on))
    return [g for g in groups.values() if g[1] > 0]
