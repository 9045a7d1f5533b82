"""Problem: the strategy graph every solver sees, and its evaluation (Cost, ``evaluate``).

``Plan`` (costmodel/plan.py) and the IOPDDL reader/writer (costmodel/iopddl.py) are re-exported here.

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

import hashlib
from dataclasses import asdict, dataclass, field, replace
from itertools import chain
from typing import Any

import numpy as np

from costmodel.edge_memory import CopyGroups
from costmodel.iopddl import read_iopddl, write_iopddl
from costmodel.plan import Plan, PlanError, as_strategy_array
from costmodel.profile import step_sum

__all__ = ["FORBIDDEN_COST", "Cost", "Plan", "PlanError", "Problem", "ProblemMeta", "as_strategy_array",
           "evaluate", "usage_profile"]

# A cost at or above this marks a strategy or an edge pair as impossible (IOPDDL writes 1e18).
# The one threshold every solver, the env and the reductions use.
FORBIDDEN_COST = 1e15


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
        """Read a contest instance (.json or .json.gz). Errors name the file and the bad field
        (``costmodel.iopddl``)."""
        return read_iopddl(cls, path)

    def to_iopddl(self, path: str) -> None:
        """Write the contest format (``costmodel.iopddl.write_iopddl``)."""
        write_iopddl(self, path)



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


def usage_profile(problem: Problem, usages: np.ndarray, extra=None, times_too=None) -> tuple[np.ndarray, np.ndarray]:
    """Live usage at each time point where it changes: (times, usage) (``costmodel.profile``). Half-open intervals:
    node i counts at time t iff start_i <= t < end_i. ``extra``: more (start, end, bytes) intervals
    (live copies); ``times_too``: more time points to report (the profile is flat across them)."""
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    u = np.asarray(usages, dtype=np.float64)
    if extra is not None:
        st, en, u = np.concatenate([st, extra[0]]), np.concatenate([en, extra[1]]), np.concatenate([u, extra[2]])
    keep = en > st
    times = np.concatenate([st[keep], en[keep]] + ([] if times_too is None or not len(times_too)
                                                   else [np.asarray(times_too, dtype=st.dtype)]))
    if len(times) == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(1)
    ut = np.unique(times)
    return ut, step_sum(np.searchsorted(ut, st[keep]), np.searchsorted(ut, en[keep]), u[keep], len(ut))


#: CopyGroups fields no plan's cost or fit reads (``Cost.comm_bytes`` only): left out of the fingerprint
UNPRICED = frozenset({"group_a2a"})


def problem_fingerprint(p: Problem, salt: str = "", digits: int = 20) -> str:
    """sha256 (its first ``digits`` hex digits) of everything a plan's cost and fit depend on: the
    strategy / edge layout, node and edge costs, usages, intervals, the usage limit and the copy groups
    (``Problem.edge_memory``, but for ``UNPRICED`` fields, which only the reported collective bytes read),
    each array tagged with its name, dtype and shape, then ``salt`` (a cache's
    version). Any cost-model change that moves one of them changes it: the key of the caches of ILP
    results (``agent.fgnn_data``'s labels, ``experiments.heldout_reference``)."""
    h = hashlib.sha256()
    for name in ("strategy_offsets", "node_costs", "node_usages", "intervals", "edges", "edge_offsets", "edge_costs"):
        a = np.ascontiguousarray(getattr(p, name))
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    h.update(repr(None if p.usage_limit is None else float(p.usage_limit)).encode())
    em = p.edge_memory
    if em is not None:
        for k, v in sorted(vars(em).items()):
            if isinstance(v, np.ndarray) and k not in UNPRICED:
                a = np.ascontiguousarray(v)
                h.update(f"em.{k}:{a.dtype.str}:{a.shape}".encode())
                h.update(a.tobytes())
    if salt:
        h.update(salt.encode())
    return h.hexdigest()[:digits]


FIT_RTOL = 1e-9
"""Relative slack of every "does it fit" test. A plan whose peak equals the cap fits; summing the same usages in
another order (a reduced problem, the ILP's rows, the env's running sums) can put it an ulp or two over, so the
test allows ``FIT_RTOL * cap`` (one byte per GB)."""


def fits(peak: float, cap: float | None) -> bool:
    """True when a peak of ``peak`` bytes fits under ``cap`` (None: no cap), within ``FIT_RTOL``."""
    return cap is None or float(peak) <= float(cap) + FIT_RTOL * abs(float(cap))


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
    feasible = fits(peak, problem.usage_limit)
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

