"""OpGraph: the traced operator graph of a JAX program (owned data model, no tracing logic).

A node is one operator that matters for sharding (dot_general, conv, reduce, fft, gather, ...),
with the element-wise chain that follows it folded in (Alpa's "follow" nodes), or one program
input (a parameter, optimizer-state or batch leaf, primitive ``"input"``). Operands point at
(producer node id, output index); a producer id of -1 is a literal or constant.

Everything here is plain data: frozen dataclasses, tuples, JSON in and out. Tracing lives in
``costmodel/trace/`` (its package docstring).
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

ROLES = ("param", "opt_state", "batch", "activation", "gradient", "constant", "other")


@dataclass(frozen=True)
class Tensor:
    """An abstract array: shape and dtype name (numpy spelling, e.g. ``"float32"``)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Node:
    """One operator (or program input) of the graph.

    flops, bytes_read, bytes_written cover the head primitive and everything folded into it;
    ``flops_by_primitive`` splits ``flops`` by the primitive that does the work.
    ``role`` is the role of output 0: for inputs param/opt_state/batch; for ops activation or
    gradient (a tensor on the backward path that is, or feeds, a parameter gradient).
    ``input_index`` is the flat index of an input node in ``jax.tree.leaves(args)`` and
    ``input_path`` its ``jax.tree_util.keystr`` path (e.g. ``"[0]['params']['Dense_0']['kernel']"``).
    """

    id: int
    primitive: str
    operands: tuple[tuple[int, int], ...]
    operand_types: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    params: dict = field(default_factory=dict)
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    module_path: str = ""
    operand_roles: tuple[str, ...] = ()
    role: str = "activation"
    folded: tuple[str, ...] = ()
    flops_by_primitive: dict = field(default_factory=dict)
    input_index: int | None = None
    input_path: str | None = None
    order: int = 0
    supported: bool = True

    @property
    def out(self) -> Tensor:
        return self.outputs[0]

    @property
    def is_input(self) -> bool:
        return self.primitive == "input"


@dataclass(frozen=True)
class OpGraph:
    """The traced program.

    ``outputs`` are the program's flat outputs as (node id, output index), in
    ``jax.tree.leaves(fn(*args))`` order; ``output_aliases[i]`` is the flat input index that
    output i replaces (a new parameter or optimizer state for the old one), else None.
    ``num_eqns`` and ``num_nodes_unfolded`` report the size before folding. ``recompute`` is the
    recompute policy the program was traced with (costmodel/trace/recompute.py; None: as written);
    the runtime replays the program with the same policy.
    """

    nodes: tuple[Node, ...]
    outputs: tuple[tuple[int, int], ...] = ()
    output_aliases: tuple[int | None, ...] = ()
    num_eqns: int = 0
    num_nodes_unfolded: int = 0
    name: str = ""
    schedule: str = "program"   # what node ``order`` follows: "program" (the trace) or "xla" (costmodel.schedule)
    recompute: str | None = None   # the recompute policy traced with (costmodel.trace.recompute); None: as written

    def __len__(self) -> int:
        return len(self.nodes)

    def edges(self) -> list[tuple[int, int, int, int]]:
        """(src node, src output, dst node, dst operand index) for every non-literal operand."""
        out = []
        for n in self.nodes:
            for k, (src, si) in enumerate(n.operands):
                if src >= 0:
                    out.append((src, si, n.id, k))
        return out

    def consumers(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """(producer node, output index) -> [(consumer node, operand index), ...], one entry per
        non-literal operand read, in node order (the one consumer map of the memory terms)."""
        out: dict = {}
        for src, si, dst, k in self.edges():
            out.setdefault((src, si), []).append((dst, k))
        return out

    def consumer_nodes(self) -> dict[int, list[int]]:
        """producer node -> the nodes reading any of its outputs, one entry per operand read, in
        node order (``consumers`` merged over the producer's outputs)."""
        out: dict = {}
        for src, _, dst, _ in self.edges():
            out.setdefault(src, []).append(dst)
        return out

    def flops_by_primitive(self) -> dict[str, float]:
        """FLOPs of each primitive summed over the graph, whichever node it was folded into."""
        acc: dict[str, float] = defaultdict(float)
        for n in self.nodes:
            for p, f in n.flops_by_primitive.items():
                acc[p] += f
        return dict(acc)

    @property
    def total_flops(self) -> float:
        return float(sum(n.flops for n in self.nodes))

    @property
    def total_bytes(self) -> float:
        return float(sum(n.bytes_read + n.bytes_written for n in self.nodes))

    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.is_input]

    # ---- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": "shardgym.OpGraph/1",
            "name": self.name,
            "num_eqns": self.num_eqns,
            "num_nodes_unfolded": self.num_nodes_unfolded,
            "outputs": [list(o) for o in self.outputs],
            "output_aliases": list(self.output_aliases),
            "schedule": self.schedule,
            "recompute": self.recompute,
            "nodes": [asdict(n) for n in self.nodes],
        }

    def to_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def from_dict(cls, d: dict) -> OpGraph:
        if d.get("format") != "shardgym.OpGraph/1":
            raise ValueError(f"not a shardgym OpGraph file (format={d.get('format')!r})")
        nodes = []
        for nd in d["nodes"]:
            nd = dict(nd)
            nd["operands"] = tuple(tuple(o) for o in nd["operands"])
            nd["operand_types"] = tuple(Tensor(tuple(t["shape"]), t["dtype"]) for t in nd["operand_types"])
            nd["outputs"] = tuple(Tensor(tuple(t["shape"]), t["dtype"]) for t in nd["outputs"])
            nd["operand_roles"] = tuple(nd["operand_roles"])
            nd["folded"] = tuple(nd["folded"])
            if "out_operands" in nd["params"]:
                nd["params"] = nd["params"] | {"out_operands": tuple(tuple(ks) for ks in nd["params"]["out_operands"])}
            nodes.append(Node(**nd))
        return cls(
            nodes=tuple(nodes),
            outputs=tuple(tuple(o) for o in d["outputs"]),
            output_aliases=tuple(d["output_aliases"]),
            num_eqns=d["num_eqns"],
            num_nodes_unfolded=d["num_nodes_unfolded"],
            name=d.get("name", ""),
            schedule=d.get("schedule", "program"),
            recompute=d.get("recompute"),
        )

    @classmethod
    def from_json(cls, path: str) -> OpGraph:
        with open(path) as f:
            return cls.from_dict(json.load(f))
