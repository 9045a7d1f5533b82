"""The step order of XLA's own schedule: ``follow_schedule(graph, hlo_text)`` gives the OpGraph whose
node ``order`` (the time grid every liveness interval is on, ``costmodel.builder``) follows the
order in which XLA's compiled program runs the nodes, instead of the trace's program order.

Why: the model's peak is where buffers coincide, and which coincide is decided by *when* things
run. XLA's scheduler (on CPU a memory-minimising list / DFS scheduler) does not run the step in
program order. Measured (the scheduled module, ``compiled.as_text()``, whose entry computation
lists the instructions in the order they run):
  * a batch-1 two-conv stack (tests/test_halo.py, dilation-2 plan): JAX traces the loss's
    ``reduce_sum`` right after the forward pass; XLA runs it after the loss gradient's first
    fusions (the unsharded step) or after the first weight-gradient conv (the plan's own program),
    so the residual's all-gather and its relayout copy (256 KiB each) live beside the backward's
    buffers: predicted / XLA 0.849 in trace order, 0.922 in this order (0.998 in the order of the
    plan's own program); the stride-2 plan 1.000 -> 1.034;
  * the 2-D fftn slab FNO plan (tests/test_dist_fft.py): the spectral-weight slices, two gathered
    spectra and two weight-gradient pads are live together at XLA's peak but never in trace order:
    0.896 -> 1.000.

Re-priced (``experiments/fidelity.py --reprice --schedule xla``: the stored plans, the stored XLA
figures; with ``memory.early_buffers``, which this order needs), memory within 10% of XLA:
results/fidelity_s11b.json without fno 36 -> 39 of 40 (gpt ilp-memory 0.897 -> 0.957,
ilp-memory-1.05 0.885 -> 0.935, unet ilp-time 1.104 -> 1.031; left: gpt policy 1.146 -> 1.161),
fidelity_s11_final.json 19 -> 23 of 24 (also mlp ilp-memory 0.807 -> 1.015, unet policy 1.053 ->
1.004; left: fno ilp-time 1.204, unchanged: the donated spectral weights' copies), fno's eight
rows of fidelity_s11.json unchanged (7 of 8), the outside-zoo steps (fidelity_outside_s11.json)
16 -> 19 of 24 (rnn ilp-time 0.874 -> 0.939, rnn policy 0.888 -> 0.953, convae fsdp 0.810 -> 0.921,
moe ilp-memory-1.05 0.852 -> 0.917; convae megatron 0.997 -> 1.100 and replicated 0.990 -> 1.091
over-count: not diagnosed).

Mapping. The runtime traces every equation of node i under ``jax.named_scope(NODE_SCOPE + i)``
(``runtime.program``), so each HLO instruction's ``op_name`` names its node (the last such scope
in it: a combined all-reduce of several nodes counts for the last). A node's position is that of
the last instruction computing its head primitive (the node's own ``primitive`` at the end of the
op_name; a fusion carries its root's metadata), else of its last other instruction; sharding
constraints (the operand and result resharding), constants, parameters, tuples, bitcasts and
``partition-id`` do not count (XLA hoists constants and masks to the start). A node with no
instruction of its own (fused into every consumer, or removed by CSE) runs just before its first
consumer. A node is never put before one of its operands (a mapping miss cannot break the
dependency order). Op nodes keep the same set of ``order`` values (a permutation), so the grid's
length is unchanged; input nodes keep 0.

Approximate: the schedule is that of one compiled program (``runtime.schedule`` compiles the
unsharded step on one device, before any plan exists); a plan's own program may run the nodes in
another order (conv stack: 11 of 15 nodes at the same step). Within one node, the model's step
stands for all of the node's instructions.
"""
from __future__ import annotations

import dataclasses
import re

from costmodel.graph import OpGraph

#: every equation of graph node i is traced under jax.named_scope(f"{NODE_SCOPE}{i}") by the runtime
#: (runtime.program), so an HLO instruction's op_name says which node it came from.
NODE_SCOPE = "sg_node_"
#: opcodes that are no node's work (hoisted, or views)
NOT_WORK = frozenset({"constant", "parameter", "partition-id", "replica-id", "get-tuple-element", "tuple",
                      "bitcast"})
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(")
_SCOPE = re.compile(re.escape(NODE_SCOPE) + r"(\d+)/([^\":)(]+)")


def entry_instructions(hlo_text: str) -> list[str]:
    """The entry computation's instruction lines, in the order the scheduled module runs them."""
    out, on = [], False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY"):
            on = True
        elif on and line.startswith("}"):
            break
        elif on:
            out.append(line)
    return out


def node_positions(graph: OpGraph, hlo_text: str) -> dict[int, int]:
    """Graph node id -> its position in the entry schedule (see the module docstring)."""
    head, other = {}, {}
    for k, line in enumerate(entry_instructions(hlo_text)):
        op = _INSTR.match(line)
        meta = re.search(r'op_name="([^"]*)"', line)
        if not op or op.group(1) in NOT_WORK or not meta:
            continue
        hits = _SCOPE.findall(meta.group(1))
        if not hits:
            continue
        nid, prim = int(hits[-1][0]), hits[-1][1].split("/")[-1]
        if prim == "sharding_constraint" or not 0 <= nid < len(graph.nodes):
            continue
        (head if prim == graph.nodes[nid].primitive else other)[nid] = k
    return {**other, **head}


def follow_schedule(graph: OpGraph, hlo_text: str) -> OpGraph:
    """``graph`` with its op nodes' ``order`` permuted to follow XLA's schedule in ``hlo_text`` (the
    scheduled module of the program ``runtime.program`` builds for this graph)."""
    pos = node_positions(graph, hlo_text)
    nodes = graph.nodes
    consumers = graph.consumer_nodes()
    ops = [nd for nd in nodes if not nd.is_input]
    key: dict[int, float] = {}
    for nd in sorted(ops, key=lambda n: -n.order):   # consumers first: a fused node runs before its first one
        if nd.id in pos:
            key[nd.id] = float(pos[nd.id])
        else:
            after = [key[c] for c in consumers.get(nd.id, ()) if c in key]
            key[nd.id] = min(after) - 0.5 if after else float("inf")
    for nd in sorted(ops, key=lambda n: n.order):    # never before an operand
        before = [key[u] for u, _ in nd.operands if u in key]
        if before and key[nd.id] <= max(before):
            key[nd.id] = max(before) + 0.25
    steps = sorted(int(nd.order) for nd in ops)
    new = {nd.id: step for step, nd in zip(steps, sorted(ops, key=lambda n: (key[n.id], n.order)))}
    return dataclasses.replace(graph, schedule="xla", nodes=tuple(dataclasses.replace(nd, order=new.get(nd.id, nd.order))
                                                                  for nd in nodes))
