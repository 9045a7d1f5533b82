"""Dead-code elimination, Alpa-style folding and the group graph for ``costmodel.trace``.

``group_program`` runs them in order over the walk's records: ``live_records`` keeps the records
whose results reach a program output (inputs always), ``group_records`` folds element-wise records
into a producer's group (``fold_target``: the rule and its acyclicity invariant), and the groups'
dependency graph is ordered by ``toposort`` (Kahn, ties by the head's program position). ``trace``
and ``flatten_program`` both read the same ``Grouping``, so the runtime's replay and the OpGraph
cannot disagree on a node.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from costmodel import primitives as P


@dataclass(frozen=True)
class Grouping:
    """The records kept, their groups and the group heads in node order.

    ``group[record]`` = its group's head record; ``members[head]`` = the group's records in program
    order; ``heads`` = group heads in node-id order (inputs first); ``node_outs[head]`` = the value
    ids the node exposes (an input's result; a group's values used outside it or by the program's
    outputs, in program order)."""

    kept: list
    group: dict
    members: dict
    heads: list
    node_outs: dict


def group_program(recs, val_src, out_refs, n_in: int, fold: bool) -> Grouping:
    """DCE, folding and the topological order of the groups (see the module docstring)."""
    kept = live_records(recs, out_refs, n_in)
    group, members = group_records(recs, val_src, kept, n_in, fold)
    exported: set[int] = set(r for r in out_refs if r is not None)
    preds: dict[int, set[int]] = {h: set() for h in members}
    for ri in kept:
        g = group[ri]
        for r in recs[ri].ins:
            if r is not None and group[val_src[r][0]] != g:
                exported.add(r)
                preds[g].add(group[val_src[r][0]])
    heads = toposort(preds)   # inputs first, then program order of heads where dependencies allow
    node_outs = {h: list(recs[h].outs) if h < n_in else
                 [o for ri in members[h] for o in recs[ri].outs if o in exported] for h in heads}
    return Grouping(kept, group, members, heads, node_outs)


def fold_target(rec, in_groups, source, pinned, n_in):
    """The group an element-wise record joins, or None (rule in the module docstring).

    Acyclicity invariant: every group edge H -> G has pos(H) < pos(G) (pos = head's program
    position), or H is a *pinned source*: a group with no op-group predecessors that must keep
    none. A record may join G if each other op-group operand H is earlier than G or a source (which
    gets pinned); a pinned G may only absorb records without other op-group operands.
    """
    out_shape = rec.out_types[0].shape
    cands = [k for k, g in enumerate(in_groups)
             if g is not None and g >= n_in and rec.in_types[k].shape == out_shape]
    cands.sort(key=lambda k: -P.size_of(rec.in_types[k]))  # stable: largest first, then first
    for k in cands:
        target = in_groups[k]
        others = {h for h in in_groups if h is not None and h >= n_in and h != target}
        if pinned[target] and others:
            continue
        if all(h < target or source[h] for h in others):
            for h in others:
                if h > target:
                    pinned[h] = True
            if others:
                source[target] = False
            return target
    return None


def live_records(recs, out_refs, n_in: int) -> list[int]:
    """Dead-code elimination: the record indices whose outputs reach a program output (inputs
    are always kept), in program order."""
    live = [ri < n_in for ri in range(len(recs))]
    used = set(r for r in out_refs if r is not None)
    for ri in range(len(recs) - 1, n_in - 1, -1):
        if any(o in used for o in recs[ri].outs):
            live[ri] = True
            used.update(r for r in recs[ri].ins if r is not None)
    return [ri for ri in range(len(recs)) if live[ri]]


def group_records(recs, val_src, kept: list[int], n_in: int, fold: bool):
    """Alpa-style folding: (group, members) where group[record] = its group's head record and
    members[head] = the group's records in program order (see fold_target for the rule)."""
    group = {ri: ri for ri in range(n_in)}   # record index -> head record index
    source: dict[int, bool] = {}             # op group without op-group predecessors
    pinned: dict[int, bool] = {}             # source group that must stay one (see fold_target)
    for ri in kept[n_in:]:
        rec = recs[ri]
        in_groups = [group[val_src[r][0]] if r is not None else None for r in rec.ins]
        if fold and rec.prim in P.FOLDABLE and len(rec.outs) == 1:
            target = fold_target(rec, in_groups, source, pinned, n_in)
            if target is not None:
                group[ri] = target
                continue
        group[ri] = ri
        source[ri] = all(g is None or g < n_in for g in in_groups)
        pinned[ri] = False
    members: dict[int, list[int]] = {}
    for ri in kept:
        members.setdefault(group[ri], []).append(ri)
    return group, members


def toposort(preds: dict[int, set[int]]) -> list[int]:
    """Kahn's algorithm over group heads; ties broken by program position of the head."""
    succs: dict[int, list[int]] = {h: [] for h in preds}
    indeg = {h: len(p) for h, p in preds.items()}
    for h, ps in preds.items():
        for p in ps:
            succs[p].append(h)
    ready = [h for h, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        h = heapq.heappop(ready)
        out.append(h)
        for s in succs[h]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if len(out) != len(preds):  # pragma: no cover - the folding rule guarantees a DAG
        raise RuntimeError("internal: folded operator graph has a cycle")
    return out
