"""XLA CPU's combined all-reduce of independent partial results, as copy-group lists
(``costmodel.edge_memory.CopyGroups.from_lists``): which nodes' all-reduces the combiner merges
(``combined_candidates``) and the operands it holds together (``combined_all_reduce_lists``).
Split out of costmodel/copy_lists.py (which re-exports both) to keep each module under 400 lines.
"""
from __future__ import annotations

import numpy as np

from costmodel.cost import Mesh, lowered_kind
from costmodel.graph import OpGraph


def combined_all_reduce_lists(graph: OpGraph, strats, mesh: Mesh, exclude=frozenset()) -> list:
    """The operands of XLA's combined all-reduce of independent partial results, as copy groups
    (``CopyGroups.from_lists``): one short-lived group per (node, bytes) at the combine step.

    XLA's all-reduce combiner merges all-reduces that do not depend on each other into one tuple
    all-reduce, which runs once its last operand exists; each operand (a node's partial result,
    B bytes per device) is live beside its reduced result there. Which all-reduces are
    independent is decided here statically: the nodes with a strategy that all-reduces
    (``lowered_kind``: on CPU a reduce-scatter too, whose operand is the whole tensor) none of
    whose descendants has such a strategy — in a train step the weight and bias gradients, which
    feed only the optimizer update, and the loss. The combine step is the largest ``order`` among
    them. Each such node is charged its all-reduce's operand bytes at that step under the
    strategies that all-reduce (the group's producer is the node, free under its other strategies;
    its member is the node's first reader, wanting it under every strategy: a member on an edge of
    the Problem, as the ILP's copy columns and the Lagrangian bound expect). XLA's buffer assignment,
    mlp tiny on cpu-2x4: dp, fsdp and Megatron each run one 7-operand all-reduce (every weight
    and bias gradient and the loss) and their temp allocation peaks there, holding every
    gradient twice (dp: 58,744 B of temp, 2 x 29,248 B of gradients); gpt tiny dp: one
    all-reduce of all 33 gradients. Approximate: the combine step is the last candidate's in the
    trace order whatever the plan (a plan whose last candidate does not all-reduce combines
    earlier in XLA); a gradient read by a reduction that may all-reduce
    (a global-norm clip) makes its node no candidate (under-count). ``exclude``: nodes charged
    their operand otherwise (the builder's fused-sum contributions, over their whole interval).
    CPU clusters only: XLA CPU's combiner has no byte threshold and takes up to 256 operands
    (cpu_compiler.cc: ``CpuAllReduceCombiner(kCombineBytes = int64 max, kCombineCount = 256)``;
    more than 256 candidates make several all-reduces, charged here as one); the GPU combiner
    stops at a byte threshold (30 MiB by default), which is not modelled: no charge there."""
    cand = combined_candidates(graph, strats, mesh, exclude)
    if len(cand) < 2:   # nothing to combine with
        return []
    nodes = graph.nodes
    used = graph.consumer_nodes()

    def operand_bytes(st):
        return sum(B for k, _, B in st.collectives if lowered_kind(k, mesh) == "all-reduce")

    t_ar = max(int(nodes[i].order) for i in cand)
    groups = []
    for i in cand:
        if not used.get(i):
            continue   # read by nothing (a program output only)
        ops = np.array([operand_bytes(st) for st in strats[i]], dtype=np.float64)
        k, c = len(strats[i]), used[i][0]   # the member: a reader of i (an edge of the Problem), whatever its strategy
        for b in sorted(set(ops[ops > 0].tolist())):
            groups.append((i, b, [(c, t_ar, np.ones(len(strats[c]), dtype=bool), ops != b)], int(nodes[i].order),
                           np.zeros(k, dtype=bool), np.zeros(k)))
    return groups


def combined_candidates(graph: OpGraph, strats, mesh: Mesh, exclude=frozenset()) -> list:
    """The nodes whose all-reduce XLA CPU's combiner merges (``combined_all_reduce_lists``): a
    strategy all-reduces (a reduce-scatter too, lowered so on CPU) and no descendant's does."""
    if mesh.backend != "cpu":
        return []
    used = graph.consumer_nodes()
    reducing = [any(lowered_kind(k, mesh) == "all-reduce" and B > 0 for st in ss for k, _, B in st.collectives)
                for ss in strats]
    reaches = [False] * len(graph.nodes)   # some descendant may all-reduce (consumers have higher ids)
    for i in range(len(graph.nodes) - 1, -1, -1):
        reaches[i] = any(reducing[c] or reaches[c] for c in used.get(i, ()))
    return [i for i in range(len(graph.nodes)) if reducing[i] and not reaches[i] and i not in exclude]
