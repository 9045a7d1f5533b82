"""Iteration spaces of OpGraph nodes and the search space the strategy enumerator offers.

Every node is described by an *iteration space* (``Space``): a list of iteration dims, each with a
size and a kind, and for each operand and output a map from its dims to iteration dims (None =
the tensor dim does not follow any iteration dim: the operand must be replicated along it, or the
output cannot be sharded along it). A strategy assigns each mesh axis to at most one shardable
iteration dim (several axes on one dim are ordered major-first in mesh order); the specs of the
output(s) and operands follow from the maps. Kinds:

- ``par``   appears in the output: sharding it is free (an operand that lacks the dim is read
            replicated and sliced locally, e.g. the new dims of broadcast_in_dim);
- ``sum``   reduced away (dot_general contracting dims, reduced dims of reduce_*, the in-feature of
            conv, the indexed dim of a gather, the scatter (update) dims of scatter-add): sharding
            it leaves partial sums -> an all-reduce of the result over those axes, or (a second
            strategy) a reduce-scatter whose result is sharded along a ``par`` output dim on them;
- ``whole`` must be unsharded while computing (the transformed dims of fft): sharding it costs an
            all-to-all of the operand to make it whole and one of the result to shard it back;
- ``fixed`` never sharded (conv spatial dims in Alpa's space, cumsum/sort dims, replicate-only nodes).

Each primitive's rule (which dims are which kind) is costmodel.space_rules; input nodes: every
storage layout of the tensor; unsupported / replicate-only nodes: None (one replicated strategy).

costmodel.strategies enumerates the strategies of a Space on a mesh (mesh axes -> iteration dims).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.graph import Node
from costmodel.space_rules import align, rule_of


@dataclass(frozen=True)
class SearchSpace:
    """Which strategy families beyond Alpa's the enumerator offers (``build_problem(space=...)``).

    ``spatial_conv``: conv spatial dims are shardable (halo exchange, costmodel.halo); off = Alpa's
    space (batch / feature sharding only, spatial dims ``fixed``).
    ``distributed_fft``: fft nodes get batch-sharded and transposing (slab / pencil) strategies
    (costmodel.fft_plan; the runtime runs them with shard_map); off = replicated, as XLA runs it.
    ``message_passing``: row gathers / scatter-adds also get node-and-edge-sharded strategies with a
    halo exchange (costmodel.graph_part; the runtime runs them with shard_map), priced from
    ``connectivity`` (real index arrays, ``graph_part.space_for``) or, without it, an assumed halo.
    ``xla_fft_replicated`` (used where ``distributed_fft`` is off): XLA's SPMD partitioner (Shardy and
    GSPMD, jax 0.10) all-gathers an FFT's operand whenever it is sharded — even on batch dims only —
    and runs the FFT replicated (then slices its result): so fft nodes get the replicated strategy
    only, and the gather is priced on the edge from the producer. False gives the issue's strategies
    (batch dims ``par``, transformed dims ``whole``: all-to-alls around a local FFT)."""

    spatial_conv: bool = True
    distributed_fft: bool = True
    message_passing: bool = True
    xla_fft_replicated: bool = True
    connectivity: object = field(default=None, compare=False, repr=False)  # graph_part.Connectivity | None


FULL = SearchSpace()
ALPA = SearchSpace(spatial_conv=False, distributed_fft=False, message_passing=False)
SPACES = {"full": FULL, "alpa": ALPA}


def search_space(space) -> SearchSpace:
    """A SearchSpace from itself or a name in ``SPACES``."""
    if isinstance(space, SearchSpace):
        return space
    if isinstance(space, str) and space in SPACES:
        return SPACES[space]
    raise ValueError(f"space must be a SearchSpace or one of {sorted(SPACES)}, got {space!r}")


@dataclass(frozen=True)
class Space:
    """Iteration space of a node: dims (size, kind) and, per operand/output, dim -> iteration dim."""

    sizes: tuple[int, ...]
    kinds: tuple[str, ...]
    operand_maps: tuple[tuple, ...]   # per operand: tuple (per operand dim: iter dim or None)
    out_maps: tuple[tuple, ...]       # per output, likewise


def space_of(node: Node, search: SearchSpace = FULL) -> Space | None:
    """The iteration space of ``node`` (see the module docstring); None = replicate only."""
    prim = node.primitive
    outs = [t.shape for t in node.outputs]
    if not outs:
        return None
    if node.is_input:
        s = tuple(outs[0])
        idx = tuple(range(len(s)))
        return Space(s, ("par",) * len(s), (), (idx,) * len(outs))
    if not node.supported or node.params.get("replicate_only"):
        return None
    ops = [t.shape for t in node.operand_types]
    p = node.params
    nh = int(p.get("num_head_operands", len(ops)))
    out0 = tuple(outs[0])
    sizes: list[int] = []
    kinds: list[str] = []

    def new(size, kind="par"):
        sizes.append(int(size))
        kinds.append(kind)
        return len(sizes) - 1

    head_maps, out_map, nh = rule_of(prim)(prim, p, ops, out0, nh, search, new)
    head_maps = list(head_maps[:nh]) + [()] * max(0, nh - len(head_maps))
    for k in range(len(head_maps)):
        if len(head_maps[k]) != len(ops[k]):
            head_maps[k] = align(ops[k], out0, out_map)
    extra = [align(s, out0, out_map) for s in ops[nh:]]
    out_maps = tuple(out_map if tuple(o) == out0 else align(o, out0, out_map) for o in outs)
    return Space(tuple(sizes), tuple(kinds), tuple(head_maps) + tuple(extra), out_maps)

