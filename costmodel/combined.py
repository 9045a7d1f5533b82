"""XLA CPU's combined all-reduce of independent partial results, as copy-group lists
(``costmodel.edge_memory.CopyGroups.from_lists``): which nodes' all-reduces the combiner merges
(``combined_candidates``: the gradients; ``independent_all_reduce_lists``: the combinations before
them, session 22) and the operands it holds together (``combined_all_reduce_lists``), and the
copies of a combined result made only after the combination (``with_combined_all_reduces``, what
the builder calls). Split out of costmodel/copy_lists.py (which re-exports the first two) to keep
each module under 400 lines.
"""
from __future__ import annotations

import numpy as np

from costmodel.cost import Mesh, lowered_kind, node_collective
from costmodel.graph import OpGraph


def combined_all_reduce_lists(graph: OpGraph, strats, mesh: Mesh, exclude=frozenset()) -> list:
    """The operands of XLA CPU's combined all-reduces as copy groups: the combinations before the
    gradients' (``independent_all_reduce_lists``) and the gradients' (``gradient_all_reduce_lists``)."""
    return _lists_of(graph, strats, mesh, *_plan_combinations(graph, strats, mesh, exclude))


def _plan_combinations(graph: OpGraph, strats, mesh: Mesh, exclude) -> tuple[list, list]:
    """(the gradients ``combined_candidates`` merges, the combinations before them: ``_combinations``
    outside ``exclude`` and those gradients), computed once per build."""
    grads = combined_candidates(graph, strats, mesh, exclude)
    return grads, _combinations(graph, strats, mesh, set(exclude) | set(grads))


def _lists_of(graph: OpGraph, strats, mesh: Mesh, grads, runs) -> list:
    used = graph.consumer_nodes()
    groups = [g for ax, run in runs for g in _combination_groups(graph, strats, mesh, ax, run, used)]
    return groups + gradient_all_reduce_lists(graph, strats, mesh, cand=grads)


def gradient_all_reduce_lists(graph: OpGraph, strats, mesh: Mesh, exclude=frozenset(), cand=None) -> list:
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
    stops at a byte threshold (30 MiB by default), which is not modelled: no charge there.
    ``cand``: ``combined_candidates(graph, strats, mesh, exclude)`` when the caller has it."""
    cand = combined_candidates(graph, strats, mesh, exclude) if cand is None else cand
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


def independent_all_reduce_lists(graph: OpGraph, strats, mesh: Mesh, exclude=frozenset()) -> list:
    """XLA CPU's combined all-reduces before the gradients', as copy groups (the form of
    ``combined_all_reduce_lists``'s): forward (or backward) partial results that do not depend on
    each other. XLA's combiner (``CombineInstructionsByKey``) walks the all-reduces of one key (the
    same replica groups: here the same mesh axes) in post order and adds each to the combination
    unless it depends on a member; one that does waits for a later pass, the next combination
    (XLA in jax 0.10.2, tests/test_combined_forward.py: d1, d2 reading d1, d3 independent run as
    (d1, d3) and d2; older XLA closed the combination at d2, which would give (d2, d3): the test
    fails on that reading). A combination runs once its last operand exists. Simulated here in the
    graph's order over the nodes that may
    all-reduce over the axes (``lowered_kind``: on CPU a reduce-scatter too), outside ``exclude``
    (the gradients ``combined_candidates`` merges, the fused-sum contributions). A member of a
    combination of two or more is charged, under its strategies that all-reduce over those axes, its
    operand (B per device) at the combination's step, and, unless it is the last member (its own
    step holds it), the rest of its reduced result there too (a reduce-scatter's B - B/n,
    ``node_collective``'s extra bytes: the model holds them at the node's own step only).
    XLA's buffer assignment, moe ilp-memory (results/s22a_moe_after_diag_moe_ilp-memory.json): the
    gate and both expert dots (nodes 14, 21, 23, reduce-scatter over x) run as one all-reduce
    (all-reduce.8) at XLA's peak, holding both expert partials (16 KiB each) and both sums.
    Approximate: the combinations are those of a plan in which every such node all-reduces over the
    axes (a charge depends on the member's own strategy alone, as a copy group's producer): where
    the plan leaves a member out, XLA may combine the others with different nodes or earlier; the
    post order is taken to be the graph's. A node's all-reduce reads its head's result, so it
    depends on the head's operands only (``num_head_operands``), not on its folded chain's (the
    same test: d3's chain multiplies by tanh(d1), and XLA combines them). Re-priced (fidelity
    --reprice; with the copies' shift of ``with_combined_all_reduces``): moe ilp-memory 0.872 ->
    1.029 (its gate dot, node 14, joins the expert dots as in XLA's all-reduce.8); no zoo row moves
    (tiny 46 / 48, real 38 / 40). CPU clusters only, like ``combined_all_reduce_lists``."""
    return _lists_of(graph, strats, mesh, [], _combinations(graph, strats, mesh, exclude))


def _combinations(graph: OpGraph, strats, mesh: Mesh, exclude) -> list:
    """``independent_all_reduce_lists``' combinations of two or more nodes: [(axes, [node, ...])]."""
    if mesh.backend != "cpu":
        return []
    nodes = graph.nodes
    used = graph.consumer_nodes()
    anc, head = [0] * len(nodes), [0] * len(nodes)   # ancestor bit sets (producers have lower ids)
    for i, nd in enumerate(nodes):
        nh = int(nd.params.get("num_head_operands", len(nd.operands)))
        for k, (u, _) in enumerate(nd.operands):
            if u >= 0:
                anc[i] |= anc[u] | (1 << u)
                if k < nh:   # the all-reduce reads the head's partial result, before the folded chain
                    head[i] |= anc[u] | (1 << u)
    by_axes: dict = {}
    for i in range(len(nodes)):
        if i in exclude or not used.get(i):
            continue
        for st in strats[i]:
            for k, ax, B in st.collectives:
                if lowered_kind(k, mesh) == "all-reduce" and B > 0:
                    by_axes.setdefault(tuple(ax), set()).add(i)
    runs = []
    for ax, members in by_axes.items():
        left = sorted(members, key=lambda j: (int(nodes[j].order), j))
        while left:   # one combination per pass: every node left that depends on none taken in it
            run, rest, mask = [], [], 0
            for i in left:
                if head[i] & mask:
                    rest.append(i)
                else:
                    run.append(i)
                    mask |= 1 << i
            if len(run) > 1:
                runs.append((ax, run))
            left = rest
    return runs


def with_combined_all_reduces(lists: list, graph: OpGraph, strats, mesh: Mesh, exclude=frozenset()) -> list:
    """``lists`` (copy groups) with XLA CPU's combined all-reduces: ``combined_all_reduce_lists``'
    groups appended, and the collective-made copies (``early``) of a forward combination's member's
    reduced result started after the combination (its step + 1) under the member's strategies that
    join it (the group split in two by producer strategy): the copy reads the sum, which exists only
    once the combined all-reduce has run (moe ilp-memory: both expert dots' results resharded for
    their transposes, 8 KiB each, made after all-reduce.8 in XLA, held from each dot's own step in
    the model). The gradients' combination is left as it was (its members' copies from their step).
    A reader that comes before the combination in the graph's order (XLA schedules it after) starts
    the copy at its own step instead, so that no copy is dropped."""
    grads, runs = _plan_combinations(graph, strats, mesh, exclude)
    late = {}   # node -> per strategy: the step after the combination it joins (-1: none)
    for ax, run in runs:
        t = max(int(graph.nodes[i].order) for i in run)
        for i in run:
            joins = np.array([any(lowered_kind(k, mesh) == "all-reduce" and B > 0 and tuple(a) == ax
                                  for k, a, B in st.collectives) for st in strats[i]])
            late.setdefault(i, np.full(len(strats[i]), -1))[joins] = t + 1
    out = []
    for g in lists:
        u, b, members, *early = g
        e = np.asarray(early[1], dtype=bool) if len(early) > 1 else None
        if u not in late or e is None or not np.any(e & (late[u] >= 0)):
            out.append(g)
            continue
        # a reader before the combination (the graph's order, not XLA's) starts the copy at its step
        first = min((int(tc) for _, tc, _, _ in members), default=int(early[0]))
        start = np.where(late[u] >= 0, np.minimum(late[u], max(first, int(early[0]))), int(early[0]))
        for time in sorted(set(start.tolist())):
            keep = start == time
            ms = [(c, tc, want, np.asarray(free, dtype=bool) | ~keep) for c, tc, want, free in members]
            out.append((u, b, ms, time, e & keep, *early[2:]))
    return out + _lists_of(graph, strats, mesh, grads, runs)


def _combination_groups(graph: OpGraph, strats, mesh: Mesh, ax, run, used) -> list:
    """``independent_all_reduce_lists``' copy groups of one combination ``run`` over axes ``ax``."""
    t = max(int(graph.nodes[i].order) for i in run)
    last = max(run, key=lambda j: (int(graph.nodes[j].order), j))
    groups = []
    for i in run:
        held = np.array([sum(B + (0.0 if i == last else node_collective(k, a, B, mesh)[2]) for k, a, B in st.collectives
                             if lowered_kind(k, mesh) == "all-reduce" and tuple(a) == ax) for st in strats[i]])
        k, c = len(strats[i]), used[i][0]
        for b in sorted(set(held[held > 0].tolist())):
            groups.append((i, b, [(c, t, np.ones(len(strats[c]), dtype=bool), held != b)], int(graph.nodes[i].order),
                           np.zeros(k, dtype=bool), np.zeros(k)))
    return groups
