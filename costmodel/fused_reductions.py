"""Reductions XLA CPU does not write out: ``trivial_reduction`` (one over size-1 dims only, a reshape
after XLA's algebraic simplifier) and ``fused_reductions`` (a small reduce fused into the loop fusion
that reads it). ``memory.materialised_outputs`` keeps no buffer for either, so the reduced operand is
read where that fusion runs (``slice_layout.read_extents``: held there by ``fused_read_groups``).

What XLA does (xla/service/cpu/cpu_instruction_fusion.cc, and the scheduled HLO of the step):
  * a reduce is loop-fusible on CPU (``CanBeLoopFused``). It is an expensive op, so it fuses only
    into a consumer that reads each of its elements once (not a broadcast of it, ``ReusesOperand
    Elements``), and only when that consumer is its one reader (XLA does not duplicate an
    expensive producer). A reduction large enough for YNNPACK (``YNN_MIN_ELEMENTS`` operand
    elements, tests/test_ynn_reduce.py) becomes a custom fusion instead, which nothing fuses into;
  * at most ``MAX_REDUCTIONS_IN_FUSION`` reduces go into one fusion (``kMaxReductionsInFusion`` = 5,
    checked before each fuse: the sixth is the last). Fusion runs from the root back, so the
    reduces nearest the root (the latest in an accumulation chain) are the ones fused; the others
    stay separate kernels (``wrapped_reduce``) that write their small result out.
Measured, rnn tiny (tests/data/outside_steps.py: an unrolled lax.scan whose bias gradient is
eight per-step ``reduce_sum(tanh' x dh)`` accumulated by one add chain into the momentum update):
XLA's ``add_add_fusion.2`` holds the last six reduces, so six per-step products (f32[16,64],
``multiply_add_fusion.1``-``.6``) live from their backward step to that fusion at the step's end,
and they are what the model lacked at XLA's peak (rnn ilp-time: XLA 134.7 KB, the model 117.8
KB). Re-priced, the stored plans of results/fidelity_s13c_outside_{program,xla}.json and the zoo's
fidelity_s13c_{program,xla}.json: figures in experiments/fidelity.py's docstring (session 17).
Charged only where two or more reductions fuse into one fusion (an accumulation): a lone one (a
bias gradient into its optimizer update) XLA's scheduler runs right after its reduction, where the
program order puts the update at the step's end (charged, meshgraphnet dp 1.099 -> 1.112). A read
through a collective stays a copy at the reduction's own step (the builder leaves reductions out of
``copy_group_lists``' held reads): held to the fusion, the replicated copy's first reader moved past
the reads XLA slices from it (rnn ilp-memory-1.05's collective bytes 1.000 -> 1.103).
A reduction whose strategy all-reduces its partial sum is written out for the collective, its
operand not held (``slice_layout.fused_read_groups``, per strategy; rnn megatron, dp, fsdp).
Approximate: the rule reads the global operand size, not the per-device one, against YNNPACK's
threshold (a reduce over >= 4096 elements that a plan shards below it is still counted as written
out); "nearest the root" is taken as the latest step.
"""
from __future__ import annotations

import math

from costmodel.graph import OpGraph

#: reductions that lower to one HLO reduce (argmax / cumulative ones do not)
LOOP_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                             "reduce_xor"})
#: kMaxReductionsInFusion (5) + 1: XLA CPU fuses a reduce while the fusion holds no more than five
MAX_REDUCTIONS_IN_FUSION = 6
#: the fewest operand elements of a reduction XLA CPU hands to YNNPACK (a custom fusion)
YNN_MIN_ELEMENTS = 4096


def trivial_reduction(nd) -> bool:
    """A reduction over size-1 dims only (``reduce_sum(x[1, n], axis=0)``): XLA's algebraic
    simplifier rewrites it as a reshape, a bitcast with no buffer of its own; any ops folded after
    it are element-wise. The rnn's transposed scan accumulates its bias gradient through one."""
    axes = nd.params.get("axes")
    if nd.primitive not in LOOP_REDUCTIONS or not axes or not nd.operand_types:
        return False
    shape = nd.operand_types[0].shape
    return all(int(shape[a]) == 1 for a in axes)


def fused_reductions(graph: OpGraph, kept, transparent, plain_out=frozenset()) -> set[int]:
    """Nodes whose reduction XLA CPU fuses into its one reader's loop fusion (module docstring): a
    loop reduction head (not ``trivial_reduction``) of fewer than ``YNN_MIN_ELEMENTS`` operand
    elements, kept only for being a reduction (its head result, output 0 or -1: no output feeds a
    buffer or is a program output), with one reader, a fused node (``kept`` empty, or a reduction
    this rule fuses; through bitcasts) whose outputs are no larger than the reduced value (no
    broadcast of it). At most ``MAX_REDUCTIONS_IN_FUSION`` per fusion root, the latest first (an
    accumulation chain, ``acc + x_t.sum(0)`` per step, folds each add into the next reduce's group:
    those groups are read by each other and fuse together). ``kept``: per node, the outputs kept as
    buffers (``materialised_outputs`` before this rule)."""
    nodes = graph.nodes
    used = graph.consumer_nodes()
    out: set[int] = set()

    def readers(c, depth=0):  # the non-bitcast nodes reading c
        if c in transparent and depth < 64:
            return [r for d in used.get(c, ()) for r in readers(d, depth + 1)]
        return [c]

    def next_readers(c):  # the non-bitcast nodes reading c's results
        return [r for d in used.get(c, ()) for r in readers(d)]

    def fused(c):
        return (not nodes[c].is_input and c not in transparent and nodes[c].primitive != "concatenate"
                and (not kept[c] or c in out))

    memo: dict = {}

    def root(c, depth=0):  # the fusion a fused node ends up in (its last fused reader); readers come later
        if c not in memo:
            nxt = next_readers(c)
            memo[c] = (max((root(r, depth + 1) for r in nxt), key=lambda x: nodes[x].order)
                       if nxt and all(fused(r) for r in nxt) and depth < 64 else c)
        return memo[c]

    def within(c, size, depth=0):  # no output on the way to the root larger than the reduced value
        nxt = next_readers(c)
        return depth < 64 and all(math.prod(int(d) for d in o.shape) <= size for o in nodes[c].outputs) and (
            not nxt or not all(fused(r) for r in nxt) or all(within(r, size, depth + 1) for r in nxt))

    per_root: dict = {}
    for nd in reversed(nodes):   # readers (higher ids) first: their status is final
        if (nd.is_input or nd.primitive not in LOOP_REDUCTIONS or trivial_reduction(nd) or not nd.operand_types
                or not set(kept[nd.id]) <= {-1, 0} or any((nd.id, o) in plain_out for o in range(len(nd.outputs)))):
            continue
        shape = [int(d) for d in nd.operand_types[0].shape]
        if math.prod(shape) >= YNN_MIN_ELEMENTS:
            continue
        size = math.prod(d for a, d in enumerate(shape) if a not in nd.params.get("axes", ()))
        rs = next_readers(nd.id)
        if len(rs) != 1 or not fused(rs[0]) or not within(rs[0], size) or any(
                math.prod(int(d) for d in o.shape) > size for o in nd.outputs):
            continue
        r = root(rs[0])
        if len(per_root.setdefault(r, [])) < MAX_REDUCTIONS_IN_FUSION:
            per_root[r].append(nd.id)
            out.add(nd.id)   # a candidate: its own group's readers see it fused (one root, so kept or not alike)
    return {i for ids in per_root.values() if len(ids) >= 2 for i in ids}
