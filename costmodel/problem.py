"""Problem: the strategy graph every solver sees, its evaluation (Cost), and Plan.

A Problem is stored as flat numpy arrays (CSR style) so that 60,000-node contest instances load
and evaluate in seconds:

* node i has ``k_i = strategy_offsets[i+1] - strategy_offsets[i]`` strategies; strategy s of node i
  lives at flat index ``strategy_offsets[i] + s`` of ``node_costs`` (seconds, or contest units),
  ``node_usages`` (per-device bytes held while the node's tensor is live), ``node_redundant``
  (bytes replicated across devices), ``node_comm_bytes`` (bytes the node's own collectives move
  per device) and ``node_imbalance_s`` (seconds the slowest device adds over a balanced split).
* ``intervals[i] = [start, end)`` is the half-open lifetime of node i's usage.
* edge e = (u, v) has a ``k_u x k_v`` row-major cost matrix (producer's strategy first) at
  ``edge_costs[edge_offsets[e]:edge_offsets[e+1]]``, and the same layout in ``edge_comm_bytes``.
* ``usage_limit``: the per-device memory cap (None = unbounded).
* ``edge_memory``: optional resharded copies shared per (value, layout), live from their first to
  their last consumer (``costmodel.edge_memory.CopyGroups``); None for IOPDDL instances, which
  then price exactly as the contest does.

Cost of a plan = Σ node costs + Σ edge costs: for an IOPDDL instance exactly the contest cost.
A plan is feasible iff the live usage (node usages + live copies) never exceeds the limit at any
time point.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from costmodel.edge_memory import CopyGroups

# A cost at or above this marks a strategy or an edge pair as impossible (IOPDDL writes 1e18).
# The one threshold every solver, the env and the reductions use.
FORBIDDEN_COST = 1e15


class PlanError(ValueError):
    """A plan that does not fit its problem (wrong length, strategy index out of range)."""


@dataclass(frozen=True, eq=False)
class ProblemMeta:
    """What a traced Problem knows beyond the contest format (None for IOPDDL instances).

    ``graph_node[i]`` is the OpGraph node behind problem node i; ``out_specs[i][s]`` is the
    PartitionSpec of node i's output 0 under strategy s, as a tuple with one entry per dim:
    None, an axis name, or a tuple of axis names. ``operand_specs[i][s]`` likewise per operand.
    ``reshard_stats``: how many distinct resharding pairs were priced from XLA's measured table
    (``measured_pairs``) and how many by the fallback rules (``fallback_pairs``). ``space``: the
    ``costmodel.strategies.SearchSpace`` the strategies were enumerated in (None: unknown).
    """

    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    cluster_name: str
    graph_node: np.ndarray
    names: list[str]
    primitives: list[str]
    roles: list[str]
    strategy_names: list[list[str]]
    out_specs: list[list[tuple]]
    operand_specs: list[list[tuple]] = field(default_factory=list)
    input_index: list[int | None] = field(default_factory=list)
    input_path: list[str | None] = field(default_factory=list)
    graph: Any = None
    reshard_stats: dict = field(default_factory=dict)
    space: Any = None


@dataclass(frozen=True, eq=False)
class Problem:
    name: str
    strategy_offsets: np.ndarray
    node_costs: np.ndarray
    node_usages: np.ndarray
    intervals: np.ndarray
    edges: np.ndarray
    edge_offsets: np.ndarray
    edge_costs: np.ndarray
    usage_limit: float | None = None
    node_redundant: np.ndarray | None = None
    node_comm_bytes: np.ndarray | None = None
    edge_comm_bytes: np.ndarray | None = None
    node_imbalance_s: np.ndarray | None = None
    meta: ProblemMeta | None = None
    edge_memory: CopyGroups | None = None

    def __post_init__(self):
        S = len(self.node_costs)
        for name in ("node_redundant", "node_comm_bytes", "node_imbalance_s"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(S))
        if self.edge_comm_bytes is None:
            object.__setattr__(self, "edge_comm_bytes", np.zeros(len(self.edge_costs)))
        n = self.num_nodes
        if self.intervals.shape != (n, 2):
            raise ValueError(f"intervals must have shape ({n}, 2), got {self.intervals.shape}")
        if self.edges.size and (self.edges.min() < 0 or self.edges.max() >= n):
            raise ValueError("an edge names a node that does not exist")
        k = self.num_strategies
        if np.any(k <= 0):
            raise ValueError(f"node {int(np.argmin(k))} has no strategy")
        if len(self.edges):
            sizes = np.diff(self.edge_offsets)
            want = k[self.edges[:, 0]] * k[self.edges[:, 1]]
            bad = np.nonzero(sizes != want)[0]
            if len(bad):
                e = int(bad[0])
                raise ValueError(f"edge {e} {tuple(self.edges[e])} has {sizes[e]} costs, expected {want[e]}")
        if self.edge_memory is not None:
            self.edge_memory.check(k)

    # ---- shape -------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.strategy_offsets) - 1

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    @property
    def num_strategies(self) -> np.ndarray:
        return np.diff(self.strategy_offsets)

    def node_slice(self, i: int) -> slice:
        return slice(int(self.strategy_offsets[i]), int(self.strategy_offsets[i + 1]))

    def edge_matrix(self, e: int, arr: np.ndarray | None = None) -> np.ndarray:
        """Edge e's cost matrix (k_u x k_v view), or the same view into ``arr``."""
        u, v = self.edges[e]
        a = self.edge_costs if arr is None else arr
        k = self.num_strategies
        return a[self.edge_offsets[e]:self.edge_offsets[e + 1]].reshape(int(k[u]), int(k[v]))

    def __repr__(self) -> str:
        return (f"Problem({self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"strategies={len(self.node_costs)}, usage_limit={self.usage_limit})")

    def with_usage_limit(self, usage_limit: float | None) -> Problem:
        from dataclasses import replace
        return replace(self, usage_limit=usage_limit)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_lists(cls, name, node_costs, node_usages, intervals, edges, edge_costs,
                   usage_limit=None, **extra) -> Problem:
        """Build from per-node lists (costs[i][s]) and per-edge flat row-major lists."""
        k = np.array([len(c) for c in node_costs], dtype=np.int64)
        offs = np.zeros(len(k) + 1, dtype=np.int64)
        np.cumsum(k, out=offs[1:])
        ek = np.array([len(c) for c in edge_costs], dtype=np.int64)
        eoffs = np.zeros(len(ek) + 1, dtype=np.int64)
        np.cumsum(ek, out=eoffs[1:])

        def flat(lists):
            return np.fromiter(chain.from_iterable(lists), dtype=np.float64)

        for key in ("node_redundant", "node_comm_bytes", "node_imbalance_s"):
            if key in extra and extra[key] is not None and not isinstance(extra[key], np.ndarray):
                extra[key] = flat(extra[key])
        if "edge_comm_bytes" in extra and extra["edge_comm_bytes"] is not None and not isinstance(extra["edge_comm_bytes"], np.ndarray):
            extra["edge_comm_bytes"] = flat(extra["edge_comm_bytes"])
        return cls(
            name=name,
            strategy_offsets=offs,
            node_costs=flat(node_costs),
            node_usages=flat(node_usages),
            intervals=np.asarray(intervals, dtype=np.int64).reshape(len(k), 2),
            edges=np.asarray(edges, dtype=np.int64).reshape(-1, 2),
            edge_offsets=eoffs,
            edge_costs=flat(edge_costs),
            usage_limit=None if usage_limit is None else float(usage_limit),
            **extra,
        )

    # ---- IOPDDL contest format -----------------------------------------------------------
    @classmethod
    def from_iopddl(cls, path: str) -> Problem:
        """Read a contest instance (.json or .json.gz). Errors name the file and the bad field."""
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

    def to_iopddl(self, path: str) -> None:
        """Write the contest format. Costs and usages are written as numbers as stored
        (seconds and bytes for a traced Problem; the contest itself uses integers)."""
        k = self.num_strategies

        def num(x):
            return int(x) if float(x).is_integer() else float(x)

        costs = [[num(c) for c in self.node_costs[self.node_slice(i)]] for i in range(self.num_nodes)]
        usages = [[num(c) for c in self.node_usages[self.node_slice(i)]] for i in range(self.num_nodes)]
        ecosts = [[num(c) for c in self.edge_costs[self.edge_offsets[e]:self.edge_offsets[e + 1]]]
                  for e in range(self.num_edges)]
        del k
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
    import math
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


def _check_values(path, problem: Problem) -> None:
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


@dataclass(frozen=True)
class Cost:
    """What a plan costs under the cost model.

    total = node_cost + edge_cost (seconds; for IOPDDL the contest cost). step_time_s = total.
    peak_memory_bytes = max over time of the live per-device usage; feasible iff it is within
    the problem's usage_limit. redundant_memory_bytes = Σ over nodes of the bytes the chosen
    strategy replicates across devices. comm_bytes = per-device bytes moved by collectives
    (node collectives + resharding; a collective copy that several readers share, per
    ``Problem.edge_memory``, counted once as XLA runs it, where the edges each pay for it in
    ``total``). imbalance_s = Σ seconds lost to the slowest device.
    """

    total: float
    feasible: bool
    step_time_s: float
    peak_memory_bytes: float
    redundant_memory_bytes: float
    comm_bytes: float
    imbalance_s: float
    node_cost: float
    edge_cost: float

    @property
    def imbalance(self) -> float:
        return self.imbalance_s

    def to_dict(self) -> dict:
        return asdict(self)


def as_strategy_array(problem: Problem, plan) -> np.ndarray:
    """Validate a Plan or a sequence of strategy indices against ``problem``."""
    s = plan.strategies if isinstance(plan, Plan) else plan
    s = np.asarray(s, dtype=np.int64).reshape(-1)
    if len(s) != problem.num_nodes:
        raise PlanError(f"plan has {len(s)} strategies but problem {problem.name!r} has {problem.num_nodes} nodes")
    k = problem.num_strategies
    bad = np.nonzero((s < 0) | (s >= k))[0]
    if len(bad):
        i = int(bad[0])
        raise PlanError(f"plan picks strategy {int(s[i])} for node {i}, which has {int(k[i])} strategies")
    return s


def usage_profile(problem: Problem, usages: np.ndarray, extra=None, times_too=None) -> tuple[np.ndarray, np.ndarray]:
    """Live usage at each time point where it changes: (times, usage). Half-open intervals:
    node i counts at time t iff start_i <= t < end_i. ``extra``: more (start, end, bytes) intervals
    (live copies); ``times_too``: more time points to report (the profile is flat across them)."""
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    u = np.asarray(usages, dtype=np.float64)
    if extra is not None:
        st, en, u = np.concatenate([st, extra[0]]), np.concatenate([en, extra[1]]), np.concatenate([u, extra[2]])
    keep = en > st
    times = np.concatenate([st[keep], en[keep]])
    deltas = np.concatenate([u[keep], -u[keep]])
    if times_too is not None and len(times_too):
        times = np.concatenate([times, np.asarray(times_too, dtype=times.dtype)])
        deltas = np.concatenate([deltas, np.zeros(len(times_too))])
    if len(times) == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(1)
    ut, inv = np.unique(times, return_inverse=True)
    acc = np.zeros(len(ut))
    np.add.at(acc, inv, deltas)
    return ut, np.cumsum(acc)


def evaluate(problem: Problem, plan) -> Cost:
    """Price a plan: vectorised over nodes and edges, O(n + m + n log n)."""
    s = as_strategy_array(problem, plan)
    flat = problem.strategy_offsets[:-1] + s
    node_cost = float(problem.node_costs[flat].sum())
    if problem.num_edges:
        u, v = problem.edges[:, 0], problem.edges[:, 1]
        eidx = problem.edge_offsets[:-1] + s[u] * problem.num_strategies[v] + s[v]
        edge_cost = float(problem.edge_costs[eidx].sum())
        edge_comm = float(problem.edge_comm_bytes[eidx].sum())
    else:
        edge_cost = edge_comm = 0.0
    copies = None if problem.edge_memory is None else problem.edge_memory.intervals(s)
    _, live = usage_profile(problem, problem.node_usages[flat], extra=copies)
    peak = float(max(live.max(), 0.0))
    feasible = problem.usage_limit is None or peak <= problem.usage_limit
    total = node_cost + edge_cost
    return Cost(
        total=total,
        feasible=bool(feasible),
        step_time_s=total,
        peak_memory_bytes=peak,
        redundant_memory_bytes=float(problem.node_redundant[flat].sum()),
        comm_bytes=float(problem.node_comm_bytes[flat].sum()) + edge_comm
        - (0.0 if problem.edge_memory is None else problem.edge_memory.shared_comm_bytes(s)),
        imbalance_s=float(problem.node_imbalance_s[flat].sum()),
        node_cost=node_cost,
        edge_cost=edge_cost,
    )


def _spec_to_json(spec):
    return None if spec is None else [list(a) if isinstance(a, (tuple, list)) else a for a in spec]


def _spec_from_json(spec):
    return None if spec is None else tuple(tuple(a) if isinstance(a, list) else a for a in spec)


@dataclass
class Plan:
    """A solver's answer: one strategy index per Problem node, plus what it takes to run it.

    ``info``: the solver's report (status, objective, bound, gap, wall_s, ...).
    ``mesh_shape``/``axis_names``: the mesh the plan was made for (empty for IOPDDL).
    ``input_specs``: [(flat input index, keypath, spec)] for every program input leaf.
    ``node_specs``: [(graph node id, spec of output 0)] for every planned operator.
    ``meta``: free-form provenance (model, size, cluster, ...) used by ``shardgym run``.
    """

    strategies: list[int]
    method: str = ""
    objective: str = ""
    problem_name: str = ""
    solve_time_s: float = 0.0
    info: dict = field(default_factory=dict)
    mesh_shape: tuple[int, ...] = ()
    axis_names: tuple[str, ...] = ()
    input_specs: list = field(default_factory=list)
    node_specs: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @classmethod
    def for_problem(cls, problem: Problem, strategies, **kw) -> Plan:
        """Make a plan and, for a traced problem, fill in its PartitionSpecs from the meta."""
        s = as_strategy_array(problem, strategies)
        plan = cls(strategies=[int(x) for x in s], problem_name=problem.name, **kw)
        m = problem.meta
        if m is not None:
            plan.mesh_shape = tuple(m.mesh_shape)
            plan.axis_names = tuple(m.axis_names)
            plan.meta.setdefault("cluster", m.cluster_name)
            for i, si in enumerate(s):
                spec = m.out_specs[i][int(si)]
                idx = m.input_index[i] if m.input_index else None
                if idx is not None:
                    plan.input_specs.append((int(idx), m.input_path[i], spec))
                else:
                    plan.node_specs.append((int(m.graph_node[i]), spec))
        return plan

    # ---- PartitionSpecs ----------------------------------------------------------------
    def input_partition_specs(self) -> dict[int, Any]:
        from jax.sharding import PartitionSpec as P
        return {i: P(*spec) if spec is not None else P() for i, _, spec in self.input_specs}

    def arg_specs(self, args) -> Any:
        """PartitionSpec pytree matching ``args`` (params, opt_state, batch) of the traced fn."""
        import jax
        from jax.sharding import PartitionSpec as P
        leaves, treedef = jax.tree.flatten(args)
        by_index = self.input_partition_specs()
        return jax.tree.unflatten(treedef, [by_index.get(i, P()) for i in range(len(leaves))])

    def make_mesh(self, devices=None):
        """The plan's ``jax.sharding.Mesh`` over the first prod(mesh_shape) devices, with **Auto**
        axes: the plan's specs are hints XLA propagates. (``jax.make_mesh`` defaults to Explicit
        axes, where a sharded contraction without ``out_sharding`` is a ShardingTypeError.)"""
        import math

        import jax
        n = math.prod(self.mesh_shape) if self.mesh_shape else 0
        devs = list(jax.devices() if devices is None else devices)
        if not n or len(devs) < n:
            raise ValueError(f"plan needs {n} devices for mesh {dict(zip(self.axis_names, self.mesh_shape))}, "
                             f"{len(devs)} available")
        return jax.make_mesh(tuple(self.mesh_shape), tuple(self.axis_names),
                             axis_types=(jax.sharding.AxisType.Auto,) * len(self.mesh_shape), devices=devs[:n])

    def shardings(self, args, mesh=None):
        """NamedSharding pytree matching ``args`` for ``jax.jit(fn, in_shardings=...)`` or
        ``jax.device_put``. ``mesh``: default ``make_mesh()``; a mesh with Explicit axes (a default
        ``jax.make_mesh``) is used over the same devices with Auto axes."""
        import jax
        from jax.sharding import Mesh, NamedSharding
        if mesh is None:
            mesh = self.make_mesh()
        elif any(t != jax.sharding.AxisType.Auto for t in getattr(mesh, "axis_types", ())):
            mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names))
        if tuple(mesh.axis_names) != tuple(self.axis_names) or tuple(mesh.devices.shape) != tuple(self.mesh_shape):
            raise ValueError(f"mesh {dict(zip(mesh.axis_names, mesh.devices.shape))} is not the plan's mesh "
                             f"{dict(zip(self.axis_names, self.mesh_shape))}")
        return jax.tree.map(lambda s: NamedSharding(mesh, s), self.arg_specs(args))

    def param_entries(self) -> list[tuple[list[str], tuple | None]]:
        """(dict keys below args[0], spec) for every parameter input (path starting with ``[0]``),
        in input order; ``"[0]['Dense_0']['kernel']"`` gives ``['Dense_0', 'kernel']``."""
        import re
        out = []
        for _, path, spec in self.input_specs:
            if path and path.startswith("[0]"):
                keys = [a or b for a, b in re.findall(r"\[['\"]?([^'\"\]]+)['\"]?\]|\.(\w+)", path[3:])]
                out.append((keys, spec))
        return out

    def param_specs(self) -> dict:
        """PartitionSpec pytree for the parameters (the inputs whose path starts with ``[0]``),
        as nested dicts keyed like the Flax params."""
        from jax.sharding import PartitionSpec as P
        tree: dict = {}
        for keys, spec in self.param_entries():
            if not keys:
                continue
            d = tree
            for k in keys[:-1]:
                d = d.setdefault(k, {})
            d[keys[-1]] = P(*spec) if spec is not None else P()
        return tree

    # ---- JSON ---------------------------------------------------------------------------
    def to_json(self, path: str) -> None:
        doc = {
            "format": "shardgym.Plan/1",
            "strategies": [int(x) for x in self.strategies],
            "method": self.method,
            "objective": self.objective,
            "problem_name": self.problem_name,
            "solve_time_s": self.solve_time_s,
            "info": self.info,
            "mesh_shape": list(self.mesh_shape),
            "axis_names": list(self.axis_names),
            "input_specs": [[i, p, _spec_to_json(s)] for i, p, s in self.input_specs],
            "node_specs": [[i, _spec_to_json(s)] for i, s in self.node_specs],
            "meta": self.meta,
        }
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1, default=float)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):   # a failed write (path is a directory, disk full) leaves nothing
                os.remove(tmp)

    @classmethod
    def from_json(cls, path: str) -> Plan:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: malformed plan file, not JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != "shardgym.Plan/1":
            raise ValueError(f"{path}: not a shardgym plan file (missing format 'shardgym.Plan/1')")
        try:
            strategies = [int(x) for x in doc["strategies"]]
            return cls(
                strategies=strategies,
                method=doc.get("method", ""),
                objective=doc.get("objective", ""),
                problem_name=doc.get("problem_name", ""),
                solve_time_s=float(doc.get("solve_time_s", 0.0)),
                info=doc.get("info", {}),
                mesh_shape=tuple(doc.get("mesh_shape", ())),
                axis_names=tuple(doc.get("axis_names", ())),
                input_specs=[(int(i), p, _spec_from_json(s)) for i, p, s in doc.get("input_specs", [])],
                node_specs=[(int(i), _spec_from_json(s)) for i, s in doc.get("node_specs", [])],
                meta=doc.get("meta", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: malformed plan file ({type(exc).__name__}: {exc})") from exc
