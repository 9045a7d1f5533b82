"""The env's per-problem preprocessing and its workload sources (env/sharding_env.py uses both).

* ``Compiled(problem, weights, K)``: everything ``ShardingEnv`` needs about one Problem for one
  (weights, padding) setting, independent of the usage limit (so copies that differ only in their
  cap share it): the decision order (``solvers.local.decision_order``), incidence
  (``solvers.local.incidence``), padded per-strategy tables, the reference plan and units, static
  features (env/features.py), the time grid and the least-usage profile (``costmodel.profile``),
  and Python-level copies for the per-step hot path.
* ``reference_plan(problem, order)``: the data-parallel baseline for a traced problem, else the
  greedy construction that avoids forbidden costs as the action mask does.

Reference cost R (> 0): the data-parallel plan's cost when the problem is traced (has meta) and
``solvers.baselines`` can build it, else the cost of ``solvers.local.greedy_by_cost`` avoiding
"impossible" costs as the action mask does. If that is not > 0, the mean positive node cost times
num_nodes, else 1. Preprocessing (env/compiled.py: order, reference plan, static features) is
cached per problem and shared by copies that differ only in their usage_limit.

* ``as_source(workloads, clusters, memory_cap_bytes)``: the ``workloads`` keyword normalised to a
  fixed list of problems / builders or a sampler; ``problem_of(item)`` builds one.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from gymnasium import spaces

from costmodel.edge_memory import CopyTracker
from costmodel.problem import FORBIDDEN_COST, Problem, evaluate
from costmodel.profile import step_sum
from env import workloads as wl
from env.features import ACTION_FEATURES, EDGE_FEATURES, NODE_FEATURES, NODE_INDEX, static_features, unit_of
from solvers.baselines import baseline_plan
from solvers.local import decision_order, greedy_by_cost, incidence

FEATURE_MAX = 1e4  # features are log1p of clipped-at-0 quantities, fractions, flags; peak_rise may be < 0
DEFAULT_WEIGHTS = {"time": 1.0, "memory": 0.0, "redundancy": 0.0, "balance": 0.0}
DEFAULT_WORKLOADS = [("gpt", "tiny")]
DEFAULT_CLUSTERS = ["cpu-2x4"]


def padded(problem: Problem, values: np.ndarray, K: int, fill: float = 0.0) -> np.ndarray:
    n, k = problem.num_nodes, problem.num_strategies
    out = np.full((n, K), fill, dtype=np.float64)
    rows = np.repeat(np.arange(n), k)
    cols = np.arange(len(values)) - np.repeat(problem.strategy_offsets[:-1], k)
    out[rows, cols] = values
    return out



def reference_plan(problem: Problem, order: np.ndarray | None = None) -> tuple[list[int], str]:
    """(plan, name): the data-parallel plan for a traced problem when available, else the greedy
    construction avoiding forbidden costs (``solvers.local.greedy_by_cost``)."""
    if problem.meta is not None:
        try:
            return [int(x) for x in baseline_plan(problem, "dp")], "dp"
        except Exception:  # baselines not available or not applicable: fall back to greedy
            pass
    return greedy_by_cost(problem, order, avoid_forbidden=True), "greedy"



class Compiled:
    """Everything the env needs about one Problem for one (weights, padding) setting. Independent of
    the problem's usage_limit, so problems that differ only in their cap share it."""

    def __init__(self, problem: Problem, weights: dict, K: int):
        self.problem = problem
        n, m = problem.num_nodes, problem.num_edges
        self.n, self.m = n, m
        self.k = problem.num_strategies.astype(np.int64)
        self.offs = problem.strategy_offsets
        self.eoffs = problem.edge_offsets
        self.ecosts = problem.edge_costs
        self.order = decision_order(problem)
        self.rank = np.empty(n, np.int64)
        self.rank[self.order] = np.arange(n)
        self.ptr, self.eid, self.nbr, self.is_src = incidence(problem)
        self.esrc_k = self.k[problem.edges[:, 1]] if m else np.zeros(0, np.int64)  # k of the consumer (row length)
        valid = np.arange(K)[None, :] < self.k[:, None]
        self.valid = valid
        self.cost = padded(problem, problem.node_costs, K)
        self.usage = padded(problem, problem.node_usages, K)
        self.redundant = padded(problem, problem.node_redundant, K)
        self.comm = padded(problem, problem.node_comm_bytes, K)
        self.imbalance = padded(problem, problem.node_imbalance_s, K)
        self.umin = np.where(valid, self.usage, np.inf).min(axis=1) if n else np.zeros(0)

        # reference plan and units
        ref_strats, self.reference_name = reference_plan(problem, self.order)
        ref = evaluate(problem.with_usage_limit(None), ref_strats)
        R = ref.total
        if not (R > 0 and math.isfinite(R)):
            pos = problem.node_costs[(problem.node_costs > 0) & np.isfinite(problem.node_costs)]
            R = float(pos.mean() * n) if len(pos) else 1.0
        self.reference_cost = float(R)
        self.reference_plan = ref_strats
        self.ref_peak = ref.peak_memory_bytes if ref.peak_memory_bytes > 0 else unit_of(problem.node_usages)
        self.ref_redundant = ref.redundant_memory_bytes if ref.redundant_memory_bytes > 0 else unit_of(problem.node_redundant)
        self.mem_scale = self.reference_cost / self.ref_peak
        self.red_scale = self.reference_cost / self.ref_redundant
        self.units = {
            "cost_unit": self.reference_cost / max(n, 1),
            "mem_unit": self.ref_peak,
            "red_unit": unit_of(problem.node_redundant),
            "comm_unit": unit_of(problem.node_comm_bytes),
        }
        # weighted per-strategy step cost apart from edges and peak (float64, exact units)
        w = weights
        self.w_time, self.w_mem = float(w["time"]), float(w["memory"])
        self.step_static = (w["time"] * self.cost + w["balance"] * self.imbalance
                            + w["redundancy"] * self.red_scale * self.redundant)
        self.trivial = self.k == 1
        # with skip_trivial, the last node the agent decides (the last in order when all are trivial)
        nontrivial = np.nonzero(~self.trivial[self.order])[0]
        self.last_decision = int(self.order[nontrivial[-1] if len(nontrivial) else -1])

        # time grid for the live-usage profile (the points where evaluate's profile changes)
        st, en = problem.intervals[:, 0], problem.intervals[:, 1]
        keep = en > st
        grid = np.unique(np.concatenate([st[keep], en[keep]])) if keep.any() else np.zeros(1, np.int64)
        if problem.edge_memory is not None:   # the shared resharded copies' steps (costmodel.edge_memory)
            grid = np.unique(np.concatenate([grid, problem.edge_memory.time_points()]))
        self.copies = None if problem.edge_memory is None else CopyTracker(problem.edge_memory, grid, n)
        self.G = len(grid)
        self.lo = np.where(keep, np.searchsorted(grid, st), 0).astype(np.int64)
        self.hi = np.where(keep, np.searchsorted(grid, en), 0).astype(np.int64)
        self.min_live = step_sum(self.lo[keep], self.hi[keep], self.umin[keep], self.G)

        feats = static_features(problem, {"K": K}, self.units, self.rank, {
            "cost": self.cost, "usage": self.usage, "redundant": self.redundant, "comm": self.comm,
            "imbalance": self.imbalance, "valid": valid})
        self.node_static, self.act_static, self.edge_static = feats["node"], feats["action"], feats["edge"]
        self.cost_unit = self.units["cost_unit"]
        self.mem_unit = self.units["mem_unit"]

        # Python-level copies for the per-step hot path (numpy calls cost ~1-2 us each)
        self.k_list = self.k.tolist()
        self.lo_list, self.hi_list = self.lo.tolist(), self.hi.tolist()
        self.umin_list = self.umin.tolist()
        self.order_list = self.order.tolist()
        self.trivial_list = self.trivial.tolist()
        k_l, eo = self.k_list, self.eoffs.tolist()
        self.incident = [[(int(self.eid[p]), int(self.nbr[p]), bool(self.is_src[p]), eo[int(self.eid[p])],
                           k_l[int(self.nbr[p])]) for p in range(self.ptr[i], self.ptr[i + 1])] for i in range(n)]
        self.incident_edges = [tuple(t[0] for t in inc) for inc in self.incident]
        self.usage_n = self.usage / self.mem_unit
        self.cost_rows = [self.cost[i, :kk] for i, kk in enumerate(self.k_list)]
        self.usage_n_rows = [self.usage_n[i, :kk] for i, kk in enumerate(self.k_list)]
        self.udelta_max = (np.where(valid, self.usage, -np.inf).max(axis=1) - self.umin).tolist() if n else []
        self.kmask = np.zeros((K + 1, K), np.int8)
        for kk in range(K + 1):
            self.kmask[kk, :kk] = 1
        self.memoryviews()
        self.ecosts_n = self.ecosts / self.cost_unit
        self.cost_n = self.cost / self.cost_unit
        self.negative_costs = bool((problem.node_costs < 0).any() or (problem.edge_costs < 0).any())
        self.step_static_list = self.step_static.tolist()
        self.cost_list = self.cost.tolist()
        self.usage_list = self.usage.tolist()
        # a decided node's decided_cost / decided_memory feature per strategy (env/features.py)
        cu, mu = self.cost_unit, self.mem_unit
        self.dcost_list = [[math.log1p(x / cu) if x > 0 else 0.0 for x in row] for row in self.cost_list]
        self.dmem_list = [[min(max(u / mu, 0.0), 10.0) for u in row] for row in self.usage_list]
        big = FORBIDDEN_COST
        self.has_forbidden = bool((problem.node_costs >= big).any() or (problem.edge_costs >= big).any())
        if self.has_forbidden:
            # for forward checking: node i's view of each incident edge as a (k_i, k_j) matrix / cost_unit
            self.incident_mats = [[(j, self.ecosts_n[eo[e]:eo[e + 1]].reshape(k_l[i], kj) if src
                                    else self.ecosts_n[eo[e]:eo[e + 1]].reshape(kj, k_l[i]).T)
                                   for e, j, src, _, kj in self.incident[i] if j != i] for i in range(n)]

    def memoryviews(self) -> None:
        """The hot path's memoryviews (not picklable: ``__getstate__`` drops them, ``__setstate__``
        makes them again): action-mask rows, and the edge costs (indexing one gives a float)."""
        self.kmask_mv = [memoryview(row) for row in self.kmask]
        self.ecosts_mv = memoryview(np.ascontiguousarray(self.ecosts, np.float64))

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("kmask_mv", "ecosts_mv")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.memoryviews()

    def forward_check(self, i: int, incr: np.ndarray, strat: list, dyn_rows: list) -> np.ndarray | None:
        """The forbidden-cost mask of node i (None: nothing masked): strategies whose incremental
        cost ``incr`` (/ cost_unit) is below FORBIDDEN_COST and that leave each undecided neighbour
        (``strat[j] < 0``; ``dyn_rows[j][:, 1]``: its incremental costs) an allowed strategy,
        skipping a neighbour's check where it would mask everything."""
        big = FORBIDDEN_COST / self.cost_unit
        ok = incr < big
        for j, mat in self.incident_mats[i]:
            if strat[j] < 0:
                ok_j = ((mat + dyn_rows[j][:, 1]) < big).any(axis=1)
                if (ok & ok_j).any():
                    ok &= ok_j
        return ok if not ok.all() and ok.any() else None

    def write_episode(self, o: dict, cap: float | None, weights: dict) -> None:
        """Write every observation array of a new episode (static features, padding, episode
        context; the dynamic columns start at their static values) into the padded arrays ``o``."""
        n, m = self.n, self.m
        for key, rows, val in (("node_features", n, self.node_static), ("action_features", n, self.act_static),
                               ("edge_features", m, self.edge_static), ("edge_index", m, self.problem.edges),
                               ("edge_mask", m, 1), ("node_mask", n, 1)):
            o[key][:rows] = val
            o[key][rows:] = 0
        ctx, N = o["node_features"][:n], NODE_INDEX
        ctx[:, N["cap_ratio"]] = 0.0 if cap is None else min(cap / self.ref_peak, 10.0)
        ctx[:, N["has_cap"]] = float(cap is not None)
        for k in ("time", "memory", "redundancy", "balance"):
            ctx[:, N["weight_" + k]] = weights[k]


def as_source(workloads, clusters, memory_cap_bytes) -> tuple[list | None, Callable | None]:
    """Normalise the workload kwarg to (fixed list of problems or zero-arg builders, or a sampler)."""
    if workloads is None:
        workloads = DEFAULT_WORKLOADS
    if isinstance(workloads, Problem):
        return [workloads], None
    if isinstance(workloads, str):
        return [Problem.from_iopddl(workloads)], None
    if isinstance(workloads, wl.Workload):
        return [workloads], None
    if callable(workloads):
        return None, workloads
    items = list(workloads)
    if not items:
        raise ValueError("workloads is empty: give a Problem, a list of Problems, an IOPDDL path, "
                         "a list of (model, size) pairs, Workloads, or a sampler rng -> Problem")
    out = []
    for it in items:
        if isinstance(it, (Problem, wl.Workload)):
            out.append(it)
        elif isinstance(it, str):
            out.append(Problem.from_iopddl(it))
        elif isinstance(it, (tuple, list)) and len(it) == 2 and all(isinstance(x, str) for x in it):
            for c in (clusters or DEFAULT_CLUSTERS):
                out.append(wl.Workload(it[0], it[1], c, memory_cap_bytes))
        else:
            raise ValueError(f"cannot use {it!r} as a workload: give a Problem, an IOPDDL path, "
                             "a (model, size) pair or a Workload")
    return out, None


def problem_of(item) -> Problem:
    return item if isinstance(item, Problem) else item.build()



class CompiledCache:
    """``Compiled`` per problem, keyed by the identity of its cost arrays (shared by
    ``with_usage_limit`` copies, so a sampler re-drawing a built problem costs nothing); LRU of 64."""

    def __init__(self, size: int = 64):
        self.size, self.items = size, {}

    def get(self, problem: Problem, build: Callable[[], Compiled]) -> Compiled:
        key = id(problem.node_costs)
        c = self.items.pop(key, None)
        if c is None or c.problem.node_costs is not problem.node_costs:
            c = build()
            while len(self.items) >= self.size:
                self.items.pop(next(iter(self.items)))
        self.items[key] = c   # most recently used last
        return c

    def __len__(self) -> int:
        return len(self.items)


def check_weights(weights: dict | None) -> dict:
    """The objective weights with defaults filled in; ValueError naming a bad one."""
    w = dict(DEFAULT_WEIGHTS)
    for key, val in (weights or {}).items():
        if key not in DEFAULT_WEIGHTS:
            raise ValueError(f"unknown weight {key!r}; weights are {', '.join(DEFAULT_WEIGHTS)}")
        if not (val >= 0 and math.isfinite(val)):
            raise ValueError(f"weight {key!r} must be a finite number >= 0, got {val!r}")
        w[key] = float(val)
    if sum(w.values()) <= 0:
        raise ValueError("at least one weight must be positive")
    return w


def padding(probe, sampler, max_nodes, max_edges, max_strategies) -> tuple[int, int, int]:
    """(N, E, K): the given sizes, else the largest over ``probe`` (the fixed problems), a sampler's
    ``max_sizes``, or 8 probe draws of the sampler padded x1.5 (rounded up to 64 / 1)."""
    if None in (max_nodes, max_edges, max_strategies):
        slack = 1.0
        if probe is None and hasattr(sampler, "max_sizes"):
            probe, ms = [], sampler.max_sizes
            max_nodes = max_nodes or ms["nodes"]
            max_edges = max_edges or ms["edges"]
            max_strategies = max_strategies or ms["strategies"]
        elif probe is None:
            rng = np.random.default_rng(0)
            probe = [problem_of(sampler(rng)) for _ in range(8)]
            slack = 1.5
        if probe:
            def up(x, to):
                return int(math.ceil(max(x, 1) * slack / to) * to)
            max_nodes = max_nodes or up(max(p.num_nodes for p in probe), 64)
            max_edges = max_edges or up(max(p.num_edges for p in probe), 64)
            max_strategies = max_strategies or up(max(int(p.num_strategies.max()) for p in probe), 1)
    N, E, K = int(max_nodes), int(max_edges), int(max_strategies)
    if min(N, E, K) < 1:
        raise ValueError("max_nodes, max_edges and max_strategies must be >= 1")
    return N, E, K


def check_fits(p: Problem, N: int, E: int, K: int) -> None:
    """ValueError naming the padding keyword to raise when ``p`` does not fit (N, E, K)."""
    for what, have, lim, kw in (("nodes", p.num_nodes, N, "max_nodes"), ("edges", p.num_edges, E, "max_edges"),
                                ("strategies per node", int(p.num_strategies.max()), K, "max_strategies")):
        if have > lim:
            raise ValueError(f"problem {p.name!r} has {have} {what}, more than the env's padding {kw}={lim}; "
                             f"construct the env with a larger {kw}")


def spaces_and_buffers(N: int, E: int, K: int):
    """(observation_space, action_space, the zeroed observation arrays) for padding (N, E, K)."""
    Fn, Fa, Fe = len(NODE_FEATURES), len(ACTION_FEATURES), len(EDGE_FEATURES)
    f32 = np.float32
    shapes = {"node_features": ((N, Fn), f32), "action_features": ((N, K, Fa), f32), "edge_index": ((E, 2), np.int32),
              "edge_features": ((E, Fe), f32), "edge_mask": ((E,), np.int8), "node_mask": ((N,), np.int8),
              "current_node": ((1,), np.int64), "action_mask": ((K,), np.int8)}
    bounds = {"edge_index": (0, N - 1), "current_node": (0, N - 1), "edge_mask": (0, 1), "node_mask": (0, 1),
              "action_mask": (0, 1)}
    obs_space = spaces.Dict({k: spaces.Box(*bounds.get(k, (-FEATURE_MAX, FEATURE_MAX)), shape, dt)
                             for k, (shape, dt) in shapes.items()})
    return obs_space, spaces.Discrete(K), {k: np.zeros(shape, dt) for k, (shape, dt) in shapes.items()}
