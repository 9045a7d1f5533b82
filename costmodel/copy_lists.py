"""The copies XLA makes of values, as copy-group lists (``costmodel.edge_memory.CopyGroups.from_lists``):
resharded copies per (value, layout) (``copy_group_lists``), XLA CPU's layout copies of conv
and dot operands (``layout_copy_lists``), copies of donated parameters read after their update could
run (``donated_copy_lists``), and the operands of XLA's combined all-reduce of independent partial
results (``combined_all_reduce_lists``, in costmodel/combined.py, re-exported here). The builder concatenates them into ``Problem.edge_memory``.
"""
from __future__ import annotations

import numpy as np

from costmodel.all_to_all import all_to_all_only
from costmodel.combined import combined_all_reduce_lists, combined_candidates
from costmodel.cost import Mesh, axis_changes, gather_relaid, local_bytes, lowered_kind, reshard_measured
from costmodel.graph import OpGraph
from costmodel.memory import TRANSPARENT, materialising, non_fusible, outer_product
from costmodel.slice_layout import splits_before_gather
from costmodel.value_origin import same_value_source


def copy_group_lists(graph: OpGraph, strats, mesh: Mesh, reads, intervals, held_reads=None) -> list:
    """The resharded copies of a traced program (``costmodel.edge_memory.CopyGroups.from_lists``).

    ``reads``: (consumer v, operand k, producer u, output oi, comm matrix) for every operand read;
    ``intervals``: the nodes' (start, end) steps (the builder's liveness);
    the comm matrix being the bytes each device sends for (producer strategy, consumer strategy).
    Per (u, oi, destination layout L) one group: the copy of u's output in layout L, of L's
    per-device bytes; its members are the reads (v, k) that some strategy of v takes in layout L,
    wanting it under exactly those strategies. A member needs no copy when u's strategy already
    stores L, and — for an element-wise (fusible) consumer, which fuses a slice of its operand
    into its own loop — when the transition sends no bytes; a non-fusible consumer (dot, conv,
    fft, gather, ...) reads a buffer, so any change of layout writes one (a sliced or permuted
    copy). The member's step is the consumer's ``order``, except for a consumer v (or read (v, k)) in
    ``held_reads`` (``slice_layout.held_read_steps``: bitcasts, fused and partly kept chains, a chain behind a
    non-fusible head that keeps only the head's result): the step it maps to, as XLA keeps the copy as the
    reshape's buffer (vit tiny min-memory plan: q and k gathered into a reshape, written out transposed for the
    score dot and kept to the backward dots) or for every reader that recomputes the fused node (gpt tiny,
    min-memory plan under 1.05 x Megatron: LayerNorm's ``x - mean`` read from the hidden-sharded residual, its
    gathered input kept to the LayerNorm gradient, 3 x 32 KiB at XLA's peak; re-priced on
    results/fidelity_s10.json, fno left out: 33 -> 38 of 40 within 10%, gpt / vit / unet /
    meshgraphnet ilp-memory-1.05 0.87 / 0.88 / 0.88 / 0.85 -> 0.95 / 0.93 / 0.96 / 0.93, unet
    ilp-time 1.02 -> 1.10). Re-priced
    (experiments.fidelity --reprice): zoo within 10% 40 -> 43 of 48 (vit megatron 0.90 -> 0.93,
    ilp-memory 0.80 -> 0.92, ilp-memory-1.05 0.81 -> 0.90, gpt ilp-memory 0.94 -> 1.04, policy
    0.91 -> 0.99). Not a state-only reshape (fno's spectral weight slices, gathered before the
    forward pass and sliced per reader at once: fno megatron 1.07 -> 1.23 if held). A gradient
    whose all-reduce XLA CPU's combiner merges (``combined_candidates``) under a reduce-scatter
    strategy holds the whole reduced tensor (``lowered_kind``): XLA serves every reader from it, so
    the read is a copy at the reader's step, not a gather from the producer's (gpt tiny dp, XLA's
    buffer assignment: the lm_head and attention kernels' gradients, one buffer each, read by the
    optimizer's transposes without an all-gather). Re-priced: gpt dp 1.117 -> 1.040, vit dp 1.093
    -> 1.071, fsdp 1.053 -> 1.045; zoo 43 -> 44 of 48. Taking every reduce-scatter so (vit megatron's
    forward dots too, whose slices XLA does gather after the LayerNorm) took vit megatron to 0.8997
    (out). Transitions into an output that
    aliases an input (the updated parameter) are not copies: the output buffer is the copy.
    A copy that needs a collective (bytes sent for u's strategy) is *early*: XLA issues it right
    after its producer (``intervals[u, 0]``, the producer's interval start; 0 for a program input),
    or after the earlier node whose output holds the same elements (``value_origin.same_value_source``:
    a scan's stacked residual read back in the backward pass as squeeze(slice(concatenate)), which
    XLA folds to the forward value: rnn ilp-memory 0.53 -> 0.99, ilp-memory-1.05 0.72 -> 0.98;
    no zoo row moves),
    and for a value computed from the donated state alone (``value_origin.state_only``: no batch
    input among its ancestors; Adam's ``m * b1`` folded into a weight-gradient conv) at the
    program's start, which ``intervals`` already says: the builder starts those nodes at 0, and the
    source of such a node is state-only or an input too:
    XLA computes it and issues the collective before the forward pass (unet tiny FSDP, XLA's live
    ranges: the moments of UNet/mid/conv_1 all-gathered at positions 319-320 of 800, the forward
    from about 360, live to the backward conv at 739). Re-priced (experiments.fidelity
    --reprice): unet fsdp and ilp-memory 0.75 -> 1.02, gpt fsdp 0.94 -> 1.02, vit ilp-memory
    0.76 -> 0.80; no row outside the zoo moves. (Taking every non-batch input as state instead
    moved rnn ilp-memory 0.53 -> 1.16: the rnn step's sequence input is no batch by role.)
    Approximate: XLA may schedule such a gather later when memory is short; the producer's own
    buffer, if it keeps one, is still charged from its trace step.
    On a CPU mesh an activation's gather with a non-major gathered dim (``cost.gather_relaid``) read
    by a dot / conv / fft has a relayout copy: a short-lived group the step before its first such
    reader. Not for an input or state-only value (``group_time`` 0): XLA gathers it just before the
    reader, the raw gather dying at the copy (convae megatron's kernels: counted, 1.00 -> 1.17).
    A copy made by a full rematerialisation (``rematerialises``: XLA all-gathers the whole tensor on
    every device, then slices it) also holds the whole tensor, from the copy's start to the step
    before its first reader ("remat" group; XLA's live ranges, mlp tiny min-memory plan: the Dense_0
    kernel read S01R -> RS1, ``all-gather.1 = f32[32,64]`` 34-45, its slice 45-53, the dot at 53).
    Re-priced: vit / mlp ilp-memory 0.878 / 0.807 -> 1.036 / 1.089, moe ilp-memory 0.742 -> 0.933.
    A later reader of that layout gets the whole tensor the step before it (XLA, gpt tiny ilp-memory, a plan
    whose first such reader reads another layout: all-gather.51 f32[8,32,256] at 602-606, its slice 606-612,
    the dot after; tests/test_remat_reader.py; 0.881 -> 1.082). Approximate: a later reader after an
    active first one is charged again, one step; XLA may put
    the whole tensor in a donated parameter's free buffer (mlp: the gathered batch, 2 KiB): over-count.
    """
    nodes, held_reads = graph.nodes, held_reads or {}
    groups, relayout, remat = {}, {}, {}
    merged = set(combined_candidates(graph, strats, mesh))
    for v, k, u, oi, comm in reads:
        nd = nodes[v]
        if splits_before_gather(nd, k):   # no copy of the operand: its pieces are resharded as the outputs
            continue
        nh = int(nd.params.get("num_head_operands", len(nd.operands)))
        buffer_read = k < nh and non_fusible(nd)
        src = [s.out_specs[oi] for s in strats[u]]
        whole = np.array([u in merged and any(lowered_kind(c, mesh) != c for c, _, _ in s.collectives)
                          for s in strats[u]], dtype=bool)
        dst = [s.operand_specs[k] for s in strats[v]]
        ten = nd.operand_types[k]
        itemsize = np.dtype(ten.dtype).itemsize
        seen: dict = {}
        for j, d in enumerate(dst):
            seen.setdefault(d, j)
        for L, j in seen.items():
            want = np.array([d == L for d in dst])
            free = np.array([s == L or (not buffer_read and comm[a, j] == 0) for a, s in enumerate(src)])
            if free.all():
                continue
            key = (u, oi, L)
            g = groups.get(key)
            if g is None:
                sent = np.array([comm[a, j] for a in range(len(src))], dtype=np.float64)
                g = groups[key] = (u, local_bytes(ten.shape, itemsize, L, mesh), [],
                                   int(intervals[same_value_source(graph, u), 0]), (sent > 0) & ~whole, sent,
                                   not any(L), np.array([all_to_all_only(s, L, mesh) for s in src], dtype=bool))
            g[2].append((v, int(held_reads.get((v, k), held_reads.get(v, nd.order))), want, free))
            gathered = g[4] & np.array([rematerialises(s, L, mesh) for s in src])
            if gathered.any():
                remat.setdefault(key, (u, float(itemsize * np.prod(ten.shape)), gathered, []))[3].append(
                    (v, g[2][-1][1], want, free | ~gathered))
            if buffer_read and mesh.backend == "cpu" and g[3] > 0:
                relaid = g[4] & np.array([gather_relaid(ten.shape, s, L, mesh) for s in src])
                if relaid.any():
                    relayout.setdefault(key, (u, g[1], []))[2].append((v, g[2][-1][1], want, free | ~relaid))
    for key, (u, b, ms) in relayout.items():   # the relayout copy just before its first buffer reader
        first = min(m[1] for m in ms)
        groups[key + ("relayout",)] = (u, b, [(v, max(first - 1, groups[key][3]), w, f) for v, t, w, f in ms if t == first])
    for key, (u, b, gathered, ms) in remat.items():   # the whole tensor, gathered, to its first reader
        first = min(m[1] for m in ms)
        t = max(first - 1, groups[key][3])
        groups[key + ("remat",)] = (u, b, [(v, t, w, f) for v, tv, w, f in ms if tv == first], groups[key][3],
                                    gathered, np.zeros(len(gathered)))
        for v, tv, w, f in ms:   # a later reader: the whole tensor, gathered the step before it
            if tv != first:
                ts = max(tv - 1, groups[key][3])
                groups[key + ("remat", v, tv)] = (u, b, [(v, ts, w, f)], ts, gathered, np.zeros(len(gathered)))
    return list(groups.values())


def rematerialises(src, dst, mesh: Mesh) -> bool:
    """Does XLA turn ``src`` into ``dst`` by all-gathering the whole tensor on every device and
    slicing it (its "involuntary full rematerialization")? The measured table's ``remat`` where
    it holds the pair (``cost.reshard_measured``), else the hand rules' (``cost.axis_changes``)."""
    src, dst = tuple(src), tuple(dst)
    if src == dst:
        return False
    tr = reshard_measured(src, dst, mesh)
    return tr.remat if tr is not None else axis_changes(src, dst)[2]


def conv_operand_order(nd, k: int) -> tuple | None:
    """The dimension order XLA CPU's canonical convolution wants for conv operand ``k`` (0: lhs,
    1: rhs), as a permutation of the operand's dims; None when it is already canonical. Canonical
    (xla/service/cpu ConvCanonicalization, Eigen's layout): lhs (batch, spatial..., feature), rhs
    (spatial..., in feature, out feature) — what a Flax NHWC / HWIO forward conv traces to. JAX's
    gradient convs permute the dimension numbers instead of the data (the weight gradient reads
    the activation as (feature, spatial..., batch)), and XLA writes the permuted operand out."""
    if nd.primitive != "conv_general_dilated" or k > 1 or "dimension_numbers" not in nd.params:
        return None
    spec = list(nd.params["dimension_numbers"]["lhs_spec" if k == 0 else "rhs_spec"])
    order = (spec[0], *spec[2:], spec[1]) if k == 0 else (*spec[2:], spec[1], spec[0])
    return None if order == tuple(range(len(spec))) else tuple(int(x) for x in order)


def dot_operand_order(nd, k: int) -> tuple | None:
    """The dimension order XLA CPU's DotDecomposer wants for dot_general operand ``k`` (0: lhs
    (batch, free, contracting), 1: rhs (batch, contracting, free)), as a permutation of its dims;
    None when already in order, or when the operand has at most one contracting and one free dim
    behind its batch dims, which lead in order (then the order differs at most by a swap of the
    last two dims, which TransposeFolding folds into the dot's dimension numbers: no copy). Probed
    (jax 0.8 CPU, f32): ``dot_general(x[8,32,32,16], g[8,32,32,128])`` contracting (0,1,2) copies
    x as [16,8192] (``copy_bitcast_fusion``), the same in 2-D ([8192,16] x [8192,128]) copies
    nothing; the weight gradient of a dense layer on a rank-4 input copies its lhs."""
    if nd.primitive != "dot_general" or k > 1 or "dimension_numbers" not in nd.params or outer_product(nd):
        return None
    (lc, rc), (lb, rb) = nd.params["dimension_numbers"]
    rank = len(nd.operand_types[k].shape)
    con, bat = tuple(int(d) for d in (lc if k == 0 else rc)), tuple(int(d) for d in (lb if k == 0 else rb))
    free = tuple(d for d in range(rank) if d not in con and d not in bat)
    if len(con) <= 1 and len(free) <= 1 and bat == tuple(range(len(bat))):
        return None
    order = bat + (free + con if k == 0 else con + free)
    return None if order == tuple(range(rank)) else order


def layout_copied_reads(graph: OpGraph) -> dict:
    """(producer u, output oi, order) -> the conv reads (v, k) that XLA CPU serves from one extra
    layout copy of u's output in that order (see ``layout_copy_lists``). The builder drops these
    reads from the producer's own liveness: the canonical buffer lives to its other readers."""
    nodes = graph.nodes
    readers: dict = {}
    for nd in nodes:
        nh = int(nd.params.get("num_head_operands", len(nd.operands)))
        for k, (u, oi) in enumerate(nd.operands[:nh]):
            if u >= 0 and non_fusible(nd):
                order = conv_operand_order(nd, k) if nd.primitive != "dot_general" else dot_operand_order(nd, k)
                readers.setdefault((u, oi), []).append((nd.id, k, order))
    out: dict = {}
    for (u, oi), rs in readers.items():
        pu = nodes[u]
        for order in {o for _, _, o in rs if o is not None}:
            if pu.is_input or (materialising(pu) and not pu.folded) or any(o != order for _, _, o in rs):
                out[(u, oi, order)] = [(v, k) for v, k, o in rs if o == order]
    return out


def layout_copy_lists(graph: OpGraph, strats, mesh: Mesh, start_of, copied=None, together=None) -> list:
    """XLA CPU's layout copies of convolution and dot operands, as copy groups (``CopyGroups.from_lists``;
    the builder adds them on ``backend="cpu"`` clusters only: GPU / TPU convolutions take any
    dimension order through their layout assignment, which is not modelled).

    A conv operand not in the canonical order (``conv_operand_order``) is copied in that order
    (a ``transpose_copy_fusion``). When the operand's buffer exists anyway — a program input, the
    unfolded result of a dot / conv / reduction, or a value some other non-fusible op reads as it
    is (``layout_copied_reads``) — the copy is an extra buffer: an early group from the
    producer's step to the last conv reading that (value, order), shared by them (one group per
    (value, order, per-device layout)), while the canonical buffer lives to its other readers
    only. XLA's live ranges, convae tiny replicated: the input's copy for the first conv's weight
    gradient lives 5-25 of 28 steps, a forward conv result's 9-22 beside its canonical buffer;
    unet tiny replicated: a norm output's canonical buffer lives into the backward pass and its
    copy from there to the weight-gradient conv, one of the two at any time. Otherwise the
    fused chain feeding the conv writes its result out in that order and the copy is that
    buffer (no extra bytes). Approximate: the copy is made at its producer's step here, later in
    XLA's schedule (unet: at the backward pass's start) while the canonical buffer lives on (the
    same bytes either way, once the forward readers have run); a copy made from a resharded
    operand counts the resharded copy and the layout copy both.
    Dot operands out of DotDecomposer's order (``dot_operand_order``) are copied the same way, but
    at the dot's step (not early: XLA schedules the ``copy_bitcast_fusion`` just before the dot),
    and the read keeps the canonical buffer alive to the dot (builder), unless every read of the value
    is such a copy (``together``: ``slice_layout.copied_together``). Re-priced
    (experiments.fidelity --reprice): fno dp / fsdp 0.82 / 0.76 -> 1.02 / 0.98 (the all-gathered
    activation's transposed copy for the weight gradient), moe 0.74-0.98 -> 0.85-1.02 (outside
    table), gpt dp 1.10 -> 1.12 and vit dp 1.12 -> 1.13 (already over-counted: the copy lands on
    their peak). Not modelled: the dot's result transposed by a folded ``transpose``, which
    decides which operand XLA copies; the dims' sizes (a copy of a size-1 dim is a bitcast)."""
    nodes = graph.nodes
    groups: dict = {}
    for (u, oi, order), rs in (layout_copied_reads(graph) if copied is None else copied).items():
        for v, k in rs:
            ten = nodes[v].operand_types[k]
            itemsize = np.dtype(ten.dtype).itemsize
            dst = [local_bytes(ten.shape, itemsize, s.operand_specs[k], mesh) for s in strats[v]]
            for b in set(dst):
                key = (u, oi, order, b)
                g = groups.get(key)
                if g is None:
                    ku = len(strats[u])
                    early = nodes[v].primitive != "dot_general"  # a dot's copy is made at its step
                    at = (together or {}).get((u, oi))  # ... or with the value's other copies (copied_together)
                    g = groups[key] = (u, b, [], int(start_of[u] if at is None else at), np.full(ku, early or at is not None),
                                       np.zeros(ku))
                g[2].append((v, int(nodes[v].order), np.array([d == b for d in dst]),
                             np.zeros(len(strats[u]), dtype=bool)))
    return list(groups.values())


def donated_copy_lists(graph: OpGraph, strats, mesh: Mesh, alias_edges, kept, transparent, copied=None) -> list:
    """XLA's copies of donated parameters read again after their update could run, as copy
    groups (``CopyGroups.from_lists``), one per (parameter, storage layout).

    The update of a donated input w writes w's buffer in place, so every reader of the old value
    must run first. XLA's copy insertion copies w (``copy.N = copy(param.K)``, read by the forward
    and backward users and by the update) unless every reader of w's buffer is an ancestor of
    the update in the data flow. Forward reads are (the update needs the loss); a backward read of
    the weight itself (dX = dY @ W^T, LayerNorm's scale in its backward) is not, while the weight
    gradient dW is computed alone. When dW comes out of an all-reduce (data-parallel, FSDP,
    Megatron's data axis), XLA's all-reduce combiner merges it with other layers' gradients,
    which depend on dX, and the copy is mostly not needed: gpt tiny, XLA's buffer assignment,
    copies 20 weights under the replicated plan (450 KiB of 6.4 MiB) and 12 under dp (the
    attention kernels and LayerNorm parameters, combined apart from their backward reads). So
    the copy is charged while the gradient dot that feeds w's update runs without an all-reduce
    (its members are those dots, at the update's step; the group lives from the program's start),
    and never under one (an under-count of up to 12 x 16 KiB on gpt tiny dp). Readers look
    through nodes that keep no buffer (fused into their consumers) and through bitcasts.
    A weight read through a kept plain slice (FNO's spectral weights, ``complex(w_real,
    w_imag)`` sliced to the kept modes, then squeezed) is copied when some reader, forward or
    backward, takes the sliced value more sharded than the slice under w's layout: XLA's
    partitioner cuts that reader's piece by a dynamic-slice fused with the slice, straight from
    the weight. Those readers are members of their own (at the update's step, whatever the
    all-reduces). XLA's buffer assignment, the four f32[2,8,8,16,16] weights (131,072 B each):
    copied under fno tiny's ilp-time and policy plans and under the distributed-FFT plan at
    batch 1 (tests/test_dist_fft.py 2-D: 3,215,704 -> 3,739,992 B vs XLA's 3,810,804 B, the
    four copies exactly), not under the replicated plan at batch 8 or batch 1 (no reader
    sharded: none charged). Why XLA copies for a forward reader too (not ordered after the
    update by a data dependence) is not understood; the rule is what the five plans show.
    Once copied, w's own buffer is free until the update writes it, and XLA's buffer assignment
    puts other values there. When the update has one gradient dot whose result is w's bytes, that
    result goes there (mlp tiny replicated: Dense_1's f32[64,64] dW in the kernel's parameter
    allocation; gpt tiny replicated: each copied attention kernel's dW in its own), so the copy's
    bytes are counted only up to the step before that dot, and the dot's result stands for them
    from there (the same bytes to the update). Not when a layout copy of one of the dot's
    operands (``layout_copied_reads``) would fit the buffer: XLA places that copy, made just
    before the dot, in the free buffer first and the result goes elsewhere (moe tiny replicated:
    w_out's f32[4,64,32] operand copy ``transpose_copy_fusion.1``; gpt's 64 KiB operand copies do
    not fit its 16 KiB kernels). ``copied``: the builder's ``layout_copied_reads`` (CPU only).
    Re-priced: mlp replicated / ilp-time / policy 1.19 -> 1.06, vit dp 1.14 -> 1.09, gpt
    replicated 0.92 -> 0.91; outside the zoo moe ilp-memory 0.88 -> 0.86. Approximate: which
    other value XLA puts in the free buffer before the dot is not modelled (mlp: two f32[16,64]
    activations; gpt: other weights' copies): the copy stays charged there."""
    nodes = graph.nodes
    cmap = graph.consumers()
    anc: list = []
    layout_copied: dict = {}
    for rs in (copied or {}).values():
        for v, k in rs:
            layout_copied.setdefault(v, []).append(k)

    def ancestors() -> list:
        """Per node, its ancestors as a bitset; built once, only when some update has gradient dots
        (O(n^2) bits: not paid on graphs without donated parameters)."""
        if not anc:
            anc.extend([0] * len(nodes))
            for nd in nodes:  # operands have lower ids
                a = 0
                for u, _ in nd.operands:
                    if u >= 0:
                        a |= anc[u] | (1 << u)
                anc[nd.id] = a
        return anc

    def passes(c):
        nd = nodes[c]
        return c in transparent or (not kept[c] and not non_fusible(nd) and nd.primitive != "concatenate"
                                    and not nd.params.get("synthetic"))

    def cons_of(c):
        return [r for o in range(len(nodes[c].outputs)) for r in cmap.get((c, o), ())]

    def readers(w):
        """(reader, operand index, reached through a kept plain slice) of w's value."""
        out, todo, seen = set(), [(c, k, False) for c, k in cons_of(w)], set()
        while todo:
            c, k, sl = todo.pop()
            if (c, k, sl) in seen:
                continue
            seen.add((c, k, sl))
            if passes(c) or not nodes[c].folded and (nodes[c].primitive == "slice"
                                                     or sl and nodes[c].primitive in TRANSPARENT):
                todo.extend((d, j, sl or not passes(c)) for d, j in cons_of(c))
            else:
                out.add((c, k, sl))
        return out

    def gradient_dots(u):
        out, todo, seen = set(), [s for s, _ in nodes[u].operands if s >= 0], set()
        while todo:
            c = todo.pop()
            if c in seen or nodes[c].is_input:
                continue
            seen.add(c)
            if nodes[c].role == "gradient" and non_fusible(nodes[c]):
                out.add(c)
            else:
                todo.extend(s for s, _ in nodes[c].operands if s >= 0)
        return out

    groups = []
    for w, u, _ in alias_edges:
        if not nodes[w].is_input or nodes[w].role != "param":
            continue
        rd = readers(w)
        dots = sorted(gradient_dots(u))
        late = dots and not all((ancestors()[u] >> r) & 1 or r == u for r, _, sl in rd if not sl)
        sliced = [(r, k) for r, k, sl in rd if sl]
        if not late and not sliced:
            continue
        t = nodes[w].outputs[0]
        itemsize = np.dtype(t.dtype).itemsize
        specs = [s.out_specs[0] for s in strats[w]]
        tm = int(nodes[u].order)
        members = [(v, np.array([not any(k == "all-reduce" or k == "reduce-scatter" for k, _, _ in s.collectives)
                                 for s in strats[v]])) for v in (dots if late else ())]
        for L in dict.fromkeys(specs):
            on = np.array([sp == L for sp in specs])
            b = local_bytes(t.shape, itemsize, L, mesh)
            mine = []
            for v, want in members:
                if len(members) == 1:   # dW goes into w's free buffer, unless its operand's layout copy does
                    out, ops = nodes[v].outputs[0], nodes[v].operand_types
                    fits = np.array([local_bytes(out.shape, np.dtype(out.dtype).itemsize, s.out_specs[0], mesh) == b
                                     and not any(local_bytes(ops[k].shape, np.dtype(ops[k].dtype).itemsize,
                                                             s.operand_specs[k], mesh) <= b
                                                 for k in layout_copied.get(v, ())) for s in strats[v]])
                    mine.append((v, int(nodes[v].order) - 1, want & fits))
                    want = want & ~fits
                mine.append((v, tm, want))
            for r, k in sliced:  # read more sharded than the slice under L: a dynamic-slice of w itself
                ten = nodes[r].operand_types[k]
                lim = b / t.nbytes * ten.nbytes * (1 - 1e-9)
                mine.append((r, tm, np.array([k < len(s.operand_specs) and local_bytes(
                    ten.shape, np.dtype(ten.dtype).itemsize, s.operand_specs[k], mesh) < lim for s in strats[r]])))
            groups.append((w, b, [(v, tv, want, ~on) for v, tv, want in mine if want.any()], 0, on,
                           np.zeros(len(specs))))
    return groups


__all__ = ["combined_all_reduce_lists", "combined_candidates", "conv_operand_order", "copy_group_lists",
           "donated_copy_lists", "dot_operand_order", "layout_copied_reads", "layout_copy_lists"]
