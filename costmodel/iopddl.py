"""The IOPDDL contest format: reading (with validation that names the file and the bad field) and
writing ``costmodel.problem.Problem`` instances (``Problem.from_iopddl`` / ``Problem.to_iopddl``).

A contest file is ``{"problem": {"name", "nodes": {"intervals", "costs", "usages"}, "edges":
{"nodes", "costs"}, "usage_limit"}}``; shardgym adds ``shardgym_edge_memory`` (the resharded
copies, ``costmodel.edge_memory.CopyGroups``), which contest readers ignore.
"""
from __future__ import annotations

import gzip
import json
import math
import os

import numpy as np

from costmodel.edge_memory import CopyGroups


def read_iopddl(cls, path: str):
    """``cls.from_lists`` of the contest instance at ``path`` (.json or .json.gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise
    except (OSError, json.JSONDecodeError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable IOPDDL JSON file ({exc})") from exc
    try:
        p = doc["problem"]
        nodes, edges = p["nodes"], p["edges"]
        _check_iopddl(path, nodes, edges, p.get("usage_limit"))
        problem = cls.from_lists(
            name=p.get("name", os.path.basename(str(path))),
            node_costs=nodes["costs"],
            node_usages=nodes["usages"],
            intervals=nodes["intervals"] if nodes["intervals"] else np.zeros((0, 2)),
            edges=edges["nodes"] if edges["nodes"] else np.zeros((0, 2)),
            edge_costs=edges["costs"],
            usage_limit=p.get("usage_limit"),
            edge_memory=CopyGroups.from_dict(p["shardgym_edge_memory"]) if "shardgym_edge_memory" in p else None,
        )
    except KeyError as exc:
        raise ValueError(f"{path}: IOPDDL field {exc} is missing") from exc
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(str(path)) else f"{path}: malformed IOPDDL instance: {msg}") from exc
    _check_values(path, problem)
    return problem


def write_iopddl(problem, path: str) -> None:
    """Write ``problem`` in the contest format. Costs and usages are written as numbers as stored
    (seconds and bytes for a traced Problem; the contest itself uses integers)."""
    self = problem

    def num(x):
        return int(x) if float(x).is_integer() else float(x)

    costs = [[num(c) for c in self.node_costs[self.node_slice(i)]] for i in range(self.num_nodes)]
    usages = [[num(c) for c in self.node_usages[self.node_slice(i)]] for i in range(self.num_nodes)]
    ecosts = [[num(c) for c in self.edge_costs[self.edge_offsets[e]:self.edge_offsets[e + 1]]]
              for e in range(self.num_edges)]
    doc = {"problem": {
        "name": self.name,
        "nodes": {"intervals": self.intervals.tolist(), "costs": costs, "usages": usages},
        "edges": {"nodes": self.edges.tolist(), "costs": ecosts},
    }}
    if self.usage_limit is not None:
        doc["problem"]["usage_limit"] = num(self.usage_limit)
    if self.edge_memory is not None:   # not a contest field: contest readers ignore it
        doc["problem"]["shardgym_edge_memory"] = self.edge_memory.to_dict()
    opener = gzip.open if str(path).endswith(".gz") else open
    tmp = f"{path}.tmp"
    with opener(tmp, "wt") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def _check_iopddl(path, nodes: dict, edges: dict, usage_limit) -> None:
    """Structure (per node / edge, O(n + m) Python): lists of one length, one usage per cost, a
    strategy at least, [start, end] intervals not reversed, edges naming existing nodes, a finite
    limit >= 0. Values are checked vectorised by ``_check_values`` after loading."""
    costs, usages, intervals = nodes["costs"], nodes["usages"], nodes["intervals"]
    if not (len(costs) == len(usages) == len(intervals)):
        raise ValueError(f"{path}: nodes.costs has {len(costs)} entries, nodes.usages {len(usages)}, "
                         f"nodes.intervals {len(intervals)}: one per node each")
    for i, (c, u, iv) in enumerate(zip(costs, usages, intervals)):
        if not isinstance(c, list) or not isinstance(u, list) or len(c) != len(u):
            raise ValueError(f"{path}: node {i} has {len(c) if isinstance(c, list) else c!r} costs but "
                             f"{len(u) if isinstance(u, list) else u!r} usages (one of each per strategy)")
        if not c:
            raise ValueError(f"{path}: node {i} has no strategy (nodes.costs[{i}] is empty)")
        if not (isinstance(iv, list) and len(iv) == 2 and all(isinstance(x, (int, float)) for x in iv)):
            raise ValueError(f"{path}: node {i}: nodes.intervals[{i}] must be [start, end], got {iv!r}")
        if iv[0] > iv[1]:
            raise ValueError(f"{path}: node {i}: interval {iv} is reversed (start > end)")
    n = len(costs)
    pairs, ecosts = edges["nodes"], edges["costs"]
    if len(pairs) != len(ecosts):
        raise ValueError(f"{path}: edges.nodes has {len(pairs)} entries but edges.costs {len(ecosts)}")
    for e, (uv, c) in enumerate(zip(pairs, ecosts)):
        if not (isinstance(uv, list) and len(uv) == 2 and all(isinstance(x, int) and 0 <= x < n for x in uv)):
            raise ValueError(f"{path}: edge {e}: edges.nodes[{e}] = {uv!r} must name two of the {n} nodes")
        if not isinstance(c, list) or len(c) != len(costs[uv[0]]) * len(costs[uv[1]]):
            raise ValueError(f"{path}: edge {e} {tuple(uv)} has {len(c) if isinstance(c, list) else c!r} costs, "
                             f"expected {len(costs[uv[0]])} x {len(costs[uv[1]])}")
    if usage_limit is not None and (isinstance(usage_limit, bool) or not isinstance(usage_limit, (int, float))
                                    or not math.isfinite(usage_limit) or usage_limit < 0):
        raise ValueError(f"{path}: usage_limit {usage_limit!r} must be a finite number >= 0")


def _check_values(path, problem) -> None:
    """Finite costs and finite, non-negative usages (vectorised), naming the first bad node/edge."""
    def first(bad: np.ndarray, offsets: np.ndarray) -> int:
        return int(np.searchsorted(offsets, int(np.argmax(bad)), side="right") - 1)

    bad = ~np.isfinite(problem.node_costs)
    if bad.any():
        i = first(bad, problem.strategy_offsets)
        raise ValueError(f"{path}: node {i} has a cost that is not a finite number "
                         f"({float(problem.node_costs[int(np.argmax(bad))])}) in nodes.costs[{i}]")
    bad = ~np.isfinite(problem.node_usages) | (problem.node_usages < 0)
    if bad.any():
        i = first(bad, problem.strategy_offsets)
        raise ValueError(f"{path}: node {i} has usage {float(problem.node_usages[int(np.argmax(bad))]):g} in "
                         f"nodes.usages[{i}]: usages are finite and >= 0")
    bad = ~np.isfinite(problem.edge_costs)
    if bad.any():
        e = first(bad, problem.edge_offsets)
        raise ValueError(f"{path}: edge {e} {tuple(int(x) for x in problem.edges[e])} has a cost that is not a "
                         f"finite number ({float(problem.edge_costs[int(np.argmax(bad))])})")

