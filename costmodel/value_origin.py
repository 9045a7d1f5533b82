"""Where a node's value comes from, as XLA's schedule sees it: computed from the donated state
alone (``state_only``: XLA computes it before the forward pass), or the same elements as an
earlier node's output (``same_value_source``: XLA's simplifier folds the ops between them away,
so a collective copy is issued right after that earlier node). ``costmodel.copy_lists`` starts
copies and the builder starts buffers from these.
"""
from __future__ import annotations

from costmodel.graph import OpGraph
from costmodel.memory import TRANSPARENT


def same_value_source(graph: OpGraph, u: int) -> int:
    """The earliest node whose output holds the same elements as ``u``'s output 0: walked back
    through reshapes and broadcasts that only add or drop unit dimensions (bitcasts in any layout;
    a reshape that merges dimensions of a transpose is a copy in XLA, and stops the walk: vit dp
    1.09 -> 1.10 when it did not) and a slice that takes exactly one operand of a
    concatenate, which XLA's algebraic simplifier folds away (``slice(concatenate(a, b, ...))`` ->
    ``a``). A collective copy of ``u`` then reads that source and XLA issues it right after the
    source (rnn, a scan's stacked residuals: the backward ``squeeze(slice(concatenate(...)))`` of
    a forward ``tanh`` is all-gathered right after the forward step, XLA's live ranges hold seven
    f32[1,16,64] gathers at the peak in the backward pass)."""
    nodes = graph.nodes
    while True:
        nd = nodes[u]
        ops = [(s, o) for s, o in nd.operands if s >= 0]
        if nd.folded or len(ops) != 1 or len(nd.outputs) != 1:
            return u
        s, o = ops[0]
        src = nodes[s]
        unit_only = [n for n in nd.outputs[0].shape if n != 1] == [n for n in nd.operand_types[0].shape if n != 1]
        if unit_only and (nd.primitive in TRANSPARENT or nd.primitive == "broadcast_in_dim"):
            u = s
            continue
        if nd.primitive == "slice" and src.primitive == "concatenate" and not nd.params.get("strides"):
            d = int(src.params["dimension"])
            lo, hi = int(nd.params["start_indices"][d]), int(nd.params["limit_indices"][d])
            if any(int(a) != 0 or int(b) != n for i, (a, b, n) in enumerate(zip(
                    nd.params["start_indices"], nd.params["limit_indices"], nd.operand_types[0].shape)) if i != d):
                return u
            at, hit = 0, None
            for (cs, co), t in zip(src.operands, src.operand_types):
                if at == lo and at + int(t.shape[d]) == hi and cs >= 0:
                    hit = cs
                at += int(t.shape[d])
            if hit is None:
                return u
            u = hit
            continue
        return u


def state_only(graph: OpGraph, alias_edges) -> list[bool]:
    """Per node: is it an op computed from the donated state alone (the input nodes an output
    replaces, parameters and optimizer state: the first of each (input, producer, output) of
    ``alias_edges``), with no batch input among its ancestors (and not from literals alone: a
    broadcast zeros is built where it is used; not an update written over a donated input, which
    waits for that input's readers)? XLA's schedule computes such values before the forward pass
    (the builder starts them at 0; ``copy_group_lists`` starts their collective copies there)."""
    nodes = graph.nodes
    state, updates = {w for w, *_ in alias_edges}, {u for _, u, _ in alias_edges}
    out = [False] * len(nodes)   # operands have lower ids
    for nd in nodes:
        ops = [u for u, _ in nd.operands if u >= 0]
        out[nd.id] = not nd.is_input and bool(ops) and nd.id not in updates and all(u in state or out[u] for u in ops)
    return out
