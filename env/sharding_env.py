"""ShardingEnv: choose a sharding strategy for one Problem node per step (gymnasium.Env).

Episode. At reset a Problem is drawn from the workload source (seeded by ``reset(seed=...)``).
Nodes are decided one per step in a fixed **topological order**: Kahn's algorithm over the edges
(producer before consumer) taking the smallest ready node id first, so a traced Problem (whose node
order is already topological) is walked in node order 0..n-1. Cycles (IOPDDL's B and G have some)
are broken by taking the smallest remaining id; rewards stay exact since an edge is charged when
its second end is decided, whichever that is. The action is the strategy index of ``obs["current_node"]``.
With ``skip_trivial=True`` (default) nodes with a single strategy are applied automatically,
their cost being added to the reward of the step that reaches them (those before the first
decision go into the first step's reward), so the rewards still sum exactly.

Reward of a step that decides node i with strategy s (units of the per-problem reference cost R):

    r = -( w_time * (c_i[s] + Σ_{e to decided j} E_e[s, s_j])
         + w_balance * imbalance_i[s]
         + w_redundancy * (R / ref_redundant_bytes) * redundant_i[s]
         + w_memory * (R / ref_peak_bytes) * (rise of the running peak) ) / R

where the running peak is the maximum over time of the live per-device usage of the decided
nodes (maintained on the problem's grid of interval endpoints). The episode's rewards therefore sum
to ``-objective / R`` with ``objective = w_time * cost.total + w_memory * (R/ref_peak) *
cost.peak_memory_bytes + w_redundancy * (R/ref_redundant) * cost.redundant_memory_bytes +
w_balance * cost.imbalance_s`` (so memory weights are dimensionless: weight 1 values the
reference plan's peak like its step time; ref_peak / ref_redundant fall back to the mean positive
usage / redundant bytes over all strategies when the reference plan has none). With default
weights this is ``-cost.total / R``.
Extra penalties (not part of the objective): ``invalid_penalty`` (default 1.0) for a masked-out
action, which is then NOT applied (the state is unchanged); ``infeasible_penalty`` (default 1.0)
added once on the last step when the final peak exceeds the memory cap.

Reference cost R (> 0): the data-parallel plan's cost when the problem is traced (has meta) and
``solvers.baselines`` can build it, else the cost of the greedy plan (``greedy_plan``: each node
in the decision order takes the strategy with the least node + resharding cost to decided
neighbours, avoiding "impossible" costs as the action mask does). If that is not > 0, the mean
positive node cost times num_nodes, else 1. Preprocessing (order, reference plan, static
features) is cached per problem and shared by copies that differ only in their usage_limit.

Action mask: strategies s < k_i of the current node, minus (``mask_forbidden``) those whose
incremental time cost is >= 1e15 (IOPDDL's "impossible" marker) or that leave some undecided
neighbour only such strategies (forward checking, one edge at a time, skipped for an edge where it
would mask everything; only on problems that have such costs), and minus (``mask_memory``, when
a cap exists) those that would make the cap impossible: s is masked when, somewhere in node i's
interval, the decided usage + the smallest usage of every undecided node + u_i[s] exceeds the cap.
With the memory mask on, every valid action sequence ends feasible whenever the cap is attainable
at all. If the masks leave nothing, the memory mask alone is used (it always keeps the
least-usage strategy).

Observation (all Boxes, padded to max_nodes N, max_edges E, max_strategies K; see env/features.py
for each feature): node_features (N, F_node), action_features (N, K, F_act), edge_index (E, 2)
int32 (producer, consumer), edge_features (E, F_edge), edge_mask (E,), node_mask (N,),
current_node (1,) int64, action_mask (K,) int8. At the terminal step current_node is 0 and
action_mask is [1, 0, ...] (a dummy; the episode is over). Obs arrays are copies
(``copy_obs=True``, default, required by check_env's "data not reused" check) or, with
``copy_obs=False``, the env's persistent arrays, updated in place in O(degree x K) per step: copy
them if you keep them. gymnasium's vector envs copy into their own (or shared-memory) buffers, so
``copy_obs=False`` is safe and ~4x faster there. Episode context (memory cap / mem_unit, objective
weights) is broadcast into every node row (see NODE_FEATURES).

Step cost: O(degree x K + interval length in grid points); the plan is evaluated once per episode
(``costmodel.problem.evaluate``) for the final info: plan, cost, reference_cost, objective.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from costmodel.edge_memory import CopyTracker
from costmodel.problem import Problem, evaluate
from env.features import (
    ACTION_FEATURES,
    ACTION_INDEX,
    EDGE_FEATURES,
    EDGE_INDEX,
    NODE_FEATURES,
    NODE_INDEX,
    static_features,
    unit_of,
)

FORBIDDEN_COST = 1e15
_N_DECIDED, _N_CURRENT = NODE_INDEX["decided"], NODE_INDEX["current"]
_N_CAP, _N_HASCAP = NODE_INDEX["cap_ratio"], NODE_INDEX["has_cap"]
_N_WT, _N_WM, _N_WR, _N_WB = (NODE_INDEX[f"weight_{k}"] for k in ("time", "memory", "redundancy", "balance"))
_N_DCOST, _N_DMEM, _N_DRESH = NODE_INDEX["decided_cost"], NODE_INDEX["decided_memory"], NODE_INDEX["decided_reshard"]
_A_CHOSEN, _A_PEAK, _A_BEST = ACTION_INDEX["chosen"], ACTION_INDEX["peak_rise"], ACTION_INDEX["best_incremental"]
_A_RESH, _A_INCR = ACTION_INDEX["reshard_decided"], ACTION_INDEX["incremental"]
assert _A_INCR == _A_RESH + 1  # _flush writes both columns at once
_E_SRC, _E_DST, _E_REAL = EDGE_INDEX["src_decided"], EDGE_INDEX["dst_decided"], EDGE_INDEX["realised_cost"]
FEATURE_MAX = 1e4  # features are log1p of clipped-at-0 quantities, fractions, flags; peak_rise may be < 0
DEFAULT_WEIGHTS = {"time": 1.0, "memory": 0.0, "redundancy": 0.0, "balance": 0.0}
DEFAULT_WORKLOADS = [("gpt", "tiny")]
DEFAULT_CLUSTERS = ["cpu-2x4"]


# ---- per-problem preprocessing ------------------------------------------------------------------
def decision_order(problem: Problem) -> np.ndarray:
    """Topological order (Kahn, smallest ready id first; cycles broken by the smallest remaining id)."""
    n = problem.num_nodes
    edges = problem.edges[problem.edges[:, 0] != problem.edges[:, 1]] if problem.num_edges else np.zeros((0, 2), np.int64)
    indeg = np.bincount(edges[:, 1], minlength=n).astype(np.int64) if len(edges) else np.zeros(n, np.int64)
    if len(edges) == 0 or np.all(edges[:, 0] < edges[:, 1]):
        return np.arange(n, dtype=np.int64)
    srt = np.argsort(edges[:, 0], kind="stable")
    dst = edges[srt, 1]
    ptr = np.searchsorted(edges[srt, 0], np.arange(n + 1))
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    done = np.zeros(n, bool)
    order = []
    nxt = 0
    while len(order) < n:
        if not heap:  # cycle: take the smallest remaining node
            while done[nxt]:
                nxt += 1
            indeg[nxt] = 0
            heap = [nxt]
        i = heapq.heappop(heap)
        if done[i]:
            continue
        done[i] = True
        order.append(i)
        for j in dst[ptr[i]:ptr[i + 1]]:
            indeg[j] -= 1
            if indeg[j] == 0 and not done[j]:
                heapq.heappush(heap, int(j))
    return np.asarray(order, dtype=np.int64)


def _padded(problem: Problem, values: np.ndarray, K: int, fill: float = 0.0) -> np.ndarray:
    n, k = problem.num_nodes, problem.num_strategies
    out = np.full((n, K), fill, dtype=np.float64)
    rows = np.repeat(np.arange(n), k)
    cols = np.arange(len(values)) - np.repeat(problem.strategy_offsets[:-1], k)
    out[rows, cols] = values
    return out


def _adjacency(problem: Problem):
    """CSR incidence: for node i, entries ptr[i]:ptr[i+1] give (edge, neighbour, i_is_producer).
    A self-loop appears once (as producer)."""
    n, m = problem.num_nodes, problem.num_edges
    if m == 0:
        z = np.zeros(0, np.int64)
        return np.zeros(n + 1, np.int64), z, z, np.zeros(0, bool)
    e = np.arange(m)
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    loop = u == v
    node = np.concatenate([u, v[~loop]])
    nbr = np.concatenate([v, u[~loop]])
    eid = np.concatenate([e, e[~loop]])
    is_src = np.concatenate([np.ones(m, bool), np.zeros(int((~loop).sum()), bool)])
    srt = np.argsort(node, kind="stable")
    ptr = np.searchsorted(node[srt], np.arange(n + 1))
    return ptr, eid[srt], nbr[srt], is_src[srt]


def greedy_plan(problem: Problem, order: np.ndarray | None = None) -> list[int]:
    """Each node in ``order`` (default: the decision order) takes the strategy with the least
    node cost + resharding cost to already-decided neighbours (ties: lowest index). On problems
    with "impossible" costs (>= 1e15, IOPDDL) it avoids them as the env's action mask does: it
    skips a strategy that costs that much now or leaves an undecided neighbour no cheaper choice."""
    order = decision_order(problem) if order is None else order
    k, offs, eoffs = problem.num_strategies, problem.strategy_offsets, problem.edge_offsets
    ptr, eid, nbr, is_src = _adjacency(problem)
    costs = [problem.node_costs[offs[i]:offs[i + 1]].copy() for i in range(problem.num_nodes)]
    resh = [np.zeros(int(x)) for x in k]
    strat = np.full(problem.num_nodes, -1, np.int64)
    forbidden = bool((problem.node_costs >= FORBIDDEN_COST).any() or (problem.edge_costs >= FORBIDDEN_COST).any())
    for i in order:
        i = int(i)
        incr = costs[i] + resh[i]
        if forbidden:
            ok = incr < FORBIDDEN_COST
            for p in range(ptr[i], ptr[i + 1]):
                j = int(nbr[p])
                if strat[j] >= 0 or j == i:
                    continue
                mat = problem.edge_matrix(int(eid[p]))
                mat = mat if is_src[p] else mat.T
                ok_j = ((mat + (costs[j] + resh[j])[None, :]) < FORBIDDEN_COST).any(axis=1)
                if (ok & ok_j).any():
                    ok &= ok_j
            if ok.any():
                incr = np.where(ok, incr, np.inf)
        s = int(np.argmin(incr))
        strat[i] = s
        for p in range(ptr[i], ptr[i + 1]):
            j = int(nbr[p])
            if strat[j] >= 0:
                continue
            e = int(eid[p])
            if is_src[p]:
                kv = int(k[j])
                resh[j] += problem.edge_costs[eoffs[e] + s * kv: eoffs[e] + (s + 1) * kv]
            else:
                resh[j] += problem.edge_costs[eoffs[e] + s: eoffs[e + 1]: int(k[i])]
    return [int(x) for x in strat]


def reference_plan(problem: Problem, order: np.ndarray | None = None) -> tuple[list[int], str]:
    """(plan, name): the data-parallel plan for a traced problem when available, else greedy."""
    if problem.meta is not None:
        try:
            from solvers.baselines import baseline_plan
            return [int(x) for x in baseline_plan(problem, "dp")], "dp"
        except Exception:  # baselines not available or not applicable: fall back to greedy
            pass
    return greedy_plan(problem, order), "greedy"


class _Compiled:
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
        self.ptr, self.eid, self.nbr, self.is_src = _adjacency(problem)
        self.esrc_k = self.k[problem.edges[:, 1]] if m else np.zeros(0, np.int64)  # k of the consumer (row length)
        valid = np.arange(K)[None, :] < self.k[:, None]
        self.valid = valid
        self.cost = _padded(problem, problem.node_costs, K)
        self.usage = _padded(problem, problem.node_usages, K)
        self.redundant = _padded(problem, problem.node_redundant, K)
        self.comm = _padded(problem, problem.node_comm_bytes, K)
        self.imbalance = _padded(problem, problem.node_imbalance_s, K)
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
        min_live = np.zeros(self.G + 1)
        np.add.at(min_live, self.lo[keep], self.umin[keep])
        np.add.at(min_live, self.hi[keep], -self.umin[keep])
        self.min_live = np.cumsum(min_live)[:self.G]

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
        self.usage_n = self.usage / self.mem_unit
        self.cost_rows = [self.cost[i, :kk] for i, kk in enumerate(self.k_list)]
        self.usage_n_rows = [self.usage_n[i, :kk] for i, kk in enumerate(self.k_list)]
        self.udelta_max = (np.where(valid, self.usage, -np.inf).max(axis=1) - self.umin).tolist() if n else []
        self.kmask = np.zeros((K + 1, K), np.int8)
        for kk in range(K + 1):
            self.kmask[kk, :kk] = 1
        self.ecosts_n = self.ecosts / self.cost_unit
        self.cost_n = self.cost / self.cost_unit
        self.negative_costs = bool((problem.node_costs < 0).any() or (problem.edge_costs < 0).any())
        self.step_static_list = self.step_static.tolist()
        self.cost_list = self.cost.tolist()
        self.usage_list = self.usage.tolist()
        big = FORBIDDEN_COST
        self.has_forbidden = bool((problem.node_costs >= big).any() or (problem.edge_costs >= big).any())
        if self.has_forbidden:
            # for forward checking: node i's view of each incident edge as a (k_i, k_j) matrix / cost_unit
            self.incident_mats = [[(j, self.ecosts_n[eo[e]:eo[e + 1]].reshape(k_l[i], kj) if src
                                    else self.ecosts_n[eo[e]:eo[e + 1]].reshape(kj, k_l[i]).T)
                                   for e, j, src, _, kj in self.incident[i] if j != i] for i in range(n)]


# ---- workload sources -----------------------------------------------------------------------------
def _as_source(workloads, clusters, memory_cap_bytes) -> tuple[list | None, Callable | None]:
    """Normalise the workload kwarg to (fixed list of problems or zero-arg builders, or a sampler)."""
    from env import workloads as wl

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


def _problem_of(item) -> Problem:
    return item if isinstance(item, Problem) else item.build()


class ShardingEnv(gym.Env):
    """See the module docstring. Keyword arguments:

    workloads: a Problem, a list of Problems/Workloads/IOPDDL paths, an IOPDDL path, a list of
        (model, size) zoo pairs (each built on every cluster in ``clusters``), or a sampler
        ``rng -> Problem | Workload`` (give max_nodes/max_edges/max_strategies or a sampler with
        a ``max_sizes`` dict; otherwise 8 probe draws, padded x1.5). Default: gpt tiny.
    clusters: preset names or Cluster objects for (model, size) pairs (default ["cpu-2x4"]).
    weights: dict(time=1, memory=0, redundancy=0, balance=0) (missing keys take these defaults).
    memory_cap_bytes: overrides every problem's usage_limit (None keeps the problem's own;
        float("inf") removes it).
    """

    metadata = {"render_modes": []}

    def __init__(self, workloads=None, clusters=None, weights: dict | None = None,
                 memory_cap_bytes: float | None = None, max_nodes: int | None = None,
                 max_edges: int | None = None, max_strategies: int | None = None,
                 skip_trivial: bool = True, mask_memory: bool = True, mask_forbidden: bool = True,
                 invalid_penalty: float = 1.0, infeasible_penalty: float = 1.0, copy_obs: bool = True,
                 render_mode=None):
        w = dict(DEFAULT_WEIGHTS)
        for key, val in (weights or {}).items():
            if key not in DEFAULT_WEIGHTS:
                raise ValueError(f"unknown weight {key!r}; weights are {', '.join(DEFAULT_WEIGHTS)}")
            if not (val >= 0 and math.isfinite(val)):
                raise ValueError(f"weight {key!r} must be a finite number >= 0, got {val!r}")
            w[key] = float(val)
        if sum(w.values()) <= 0:
            raise ValueError("at least one weight must be positive")
        self.weights = w
        self.memory_cap_bytes = memory_cap_bytes
        self.skip_trivial, self.mask_memory, self.mask_forbidden = skip_trivial, mask_memory, mask_forbidden
        self.invalid_penalty, self.infeasible_penalty = float(invalid_penalty), float(infeasible_penalty)
        self.copy_obs = copy_obs
        self.render_mode = render_mode
        self._items, self._sampler = _as_source(workloads, clusters, memory_cap_bytes)
        self._compiled: dict[int, _Compiled] = {}   # id(problem.node_costs) -> _Compiled (LRU, 64)
        self._problems: dict[int, Problem] = {}

        if None in (max_nodes, max_edges, max_strategies):
            if self._items is not None:
                probe = [self._problem_at(i) for i in range(len(self._items))]
                slack = 1.0
            elif hasattr(self._sampler, "max_sizes"):
                probe, slack = [], 1.0
                ms = self._sampler.max_sizes
                max_nodes = max_nodes or ms["nodes"]
                max_edges = max_edges or ms["edges"]
                max_strategies = max_strategies or ms["strategies"]
            else:
                rng = np.random.default_rng(0)
                probe = [_problem_of(self._sampler(rng)) for _ in range(8)]
                slack = 1.5
            if probe:
                def up(x, to):
                    return int(math.ceil(max(x, 1) * slack / to) * to)
                max_nodes = max_nodes or up(max(p.num_nodes for p in probe), 64)
                max_edges = max_edges or up(max(p.num_edges for p in probe), 64)
                max_strategies = max_strategies or up(max(int(p.num_strategies.max()) for p in probe), 1)
        self.N, self.E, self.K = int(max_nodes), int(max_edges), int(max_strategies)
        if min(self.N, self.E, self.K) < 1:
            raise ValueError("max_nodes, max_edges and max_strategies must be >= 1")
        self._check_fits_all()

        Fn, Fa, Fe = len(NODE_FEATURES), len(ACTION_FEATURES), len(EDGE_FEATURES)
        f32 = np.float32
        self.observation_space = spaces.Dict({
            "node_features": spaces.Box(-FEATURE_MAX, FEATURE_MAX, (self.N, Fn), f32),
            "action_features": spaces.Box(-FEATURE_MAX, FEATURE_MAX, (self.N, self.K, Fa), f32),
            "edge_index": spaces.Box(0, self.N - 1, (self.E, 2), np.int32),
            "edge_features": spaces.Box(-FEATURE_MAX, FEATURE_MAX, (self.E, Fe), f32),
            "edge_mask": spaces.Box(0, 1, (self.E,), np.int8),
            "node_mask": spaces.Box(0, 1, (self.N,), np.int8),
            "current_node": spaces.Box(0, self.N - 1, (1,), np.int64),
            "action_mask": spaces.Box(0, 1, (self.K,), np.int8),
        })
        self.action_space = spaces.Discrete(self.K)
        self._obs = {
            "node_features": np.zeros((self.N, Fn), f32),
            "action_features": np.zeros((self.N, self.K, Fa), f32),
            "edge_index": np.zeros((self.E, 2), np.int32),
            "edge_features": np.zeros((self.E, Fe), f32),
            "edge_mask": np.zeros(self.E, np.int8),
            "node_mask": np.zeros(self.N, np.int8),
            "current_node": np.zeros(1, np.int64),
            "action_mask": np.zeros(self.K, np.int8),
        }
        self._c: _Compiled | None = None
        self._problem: Problem | None = None
        self._done = True

    # ---- problems ------------------------------------------------------------------------------
    def _apply_cap(self, p: Problem) -> Problem:
        return p if self.memory_cap_bytes is None else p.with_usage_limit(
            None if math.isinf(self.memory_cap_bytes) else float(self.memory_cap_bytes))

    def _problem_at(self, idx: int) -> Problem:
        if idx not in self._problems:
            self._problems[idx] = self._apply_cap(_problem_of(self._items[idx]))
        return self._problems[idx]

    def _check_fits(self, p: Problem) -> None:
        for what, have, lim, kw in (("nodes", p.num_nodes, self.N, "max_nodes"), ("edges", p.num_edges, self.E, "max_edges"),
                                    ("strategies per node", int(p.num_strategies.max()), self.K, "max_strategies")):
            if have > lim:
                raise ValueError(f"problem {p.name!r} has {have} {what}, more than the env's padding {kw}={lim}; "
                                 f"construct the env with a larger {kw}")

    def _check_fits_all(self) -> None:
        if self._items is not None:
            for i in range(len(self._items)):
                self._check_fits(self._problem_at(i))

    def _compile(self, problem: Problem) -> _Compiled:
        """Per-problem preprocessing, cached by the identity of the problem's arrays (shared by
        ``with_usage_limit`` copies), so a sampler re-drawing a built problem costs nothing."""
        key = id(problem.node_costs)
        c = self._compiled.pop(key, None)
        if c is None or c.problem.node_costs is not problem.node_costs:
            self._check_fits(problem)
            c = _Compiled(problem, self.weights, self.K)
            while len(self._compiled) >= 64:
                self._compiled.pop(next(iter(self._compiled)))
        self._compiled[key] = c   # most recently used last
        return c

    @property
    def problem(self) -> Problem | None:
        """The Problem of the current episode (with the env's memory cap applied)."""
        return self._problem

    # ---- gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "problem" in options:
            p = self._apply_cap(_problem_of(options["problem"]))
        elif self._items is not None:
            idx = int(self.np_random.integers(len(self._items))) if len(self._items) > 1 else 0
            p = self._problem_at(idx)
        else:
            p = self._apply_cap(_problem_of(self._sampler(self.np_random)))
        c = self._compile(p)
        self._c, self._problem = c, p
        cap = p.usage_limit
        self._cap = None if cap is None or not math.isfinite(cap) else float(cap)
        n, m, K = c.n, c.m, self.K
        o = self._obs
        o["node_features"][:n] = c.node_static
        o["node_features"][n:] = 0
        o["action_features"][:n] = c.act_static
        o["action_features"][n:] = 0
        o["edge_features"][:m] = c.edge_static
        o["edge_features"][m:] = 0
        o["edge_index"][:m] = c.problem.edges
        o["edge_index"][m:] = 0
        o["edge_mask"][:m] = 1
        o["edge_mask"][m:] = 0
        o["node_mask"][:n] = 1
        o["node_mask"][n:] = 0
        ctx = o["node_features"][:n]
        w = self.weights
        ctx[:, _N_CAP] = 0.0 if self._cap is None else min(self._cap / c.ref_peak, 10.0)
        ctx[:, _N_HASCAP] = float(self._cap is not None)
        ctx[:, _N_WT], ctx[:, _N_WM] = w["time"], w["memory"]
        ctx[:, _N_WR], ctx[:, _N_WB] = w["redundancy"], w["balance"]
        self._strat = [-1] * n
        # _dyn[j, s] = [resharding cost to decided neighbours, node cost + that] / cost_unit (float64)
        self._dyn = np.zeros((n, K, 2))
        self._dyn[:, :, 1] = c.cost_n
        self._dyn_rows = [self._dyn[j, :kj] for j, kj in enumerate(c.k_list)]
        self._dirty: set[int] = set()
        self._use_lb = self._cap is not None and self.mask_memory
        self._live = np.zeros(c.G)
        self._copies = None if c.copies is None else c.copies.fresh()
        self._lb = c.min_live.copy()
        self._peak = 0.0
        self._ptr = 0          # position in c.order of the next node to apply
        self._cur = -1
        self._pending = 0.0    # reward of auto-applied nodes not yet handed out
        self._steps = 0
        self._done = False
        # last node that the agent decides (when every node is trivial, the last node in order)
        if self.skip_trivial and not c.trivial.all():
            self._last_decision = int(c.order[np.nonzero(~c.trivial[c.order])[0][-1]])
        else:
            self._last_decision = int(c.order[-1])
        self._advance()
        info = {"problem": p.name, "memory_cap_bytes": self._cap, "reference_cost": c.reference_cost, "reference": c.reference_name,
                "num_nodes": n}
        return self._observation(), info

    def step(self, action):
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        c = self._c
        a = int(action)
        i = self._cur
        if not (0 <= a < self.K) or not self._obs["action_mask"][a]:
            self._steps += 1
            return self._observation(), -self.invalid_penalty, False, False, {
                "invalid_action": True, "node": i}
        reward = self._pending + self._apply(i, a)
        self._pending = 0.0
        self._steps += 1
        self._advance()
        info: dict[str, Any] = {"invalid_action": False, "node": i}
        terminated = self._cur < 0
        if terminated:
            reward += self._pending
            self._pending = 0.0
            self._done = True
            plan = list(self._strat)
            cost = evaluate(self._problem, plan)
            w = self.weights
            objective = (w["time"] * cost.total + w["memory"] * c.mem_scale * cost.peak_memory_bytes
                         + w["redundancy"] * c.red_scale * cost.redundant_memory_bytes + w["balance"] * cost.imbalance_s)
            if not cost.feasible:
                reward -= self.infeasible_penalty
            info.update(plan=plan, cost=cost, reference_cost=c.reference_cost, objective=objective,
                        normalized_objective=objective / c.reference_cost, feasible=cost.feasible,
                        reference=c.reference_name, problem=self._problem.name, weights=dict(w),
                        memory_scale=c.mem_scale, redundancy_scale=c.red_scale)
        return self._observation(), float(reward), terminated, False, info

    def action_masks(self) -> np.ndarray:
        """The current action mask as bools (the method sb3-contrib's MaskablePPO looks for)."""
        return self._obs["action_mask"].astype(bool)

    # ---- internals -----------------------------------------------------------------------------
    def _observation(self) -> dict:
        if self.copy_obs:
            return {k: v.copy() for k, v in self._obs.items()}
        return dict(self._obs)

    def _apply(self, i: int, s: int) -> float:
        """Fix node i to strategy s; update state and features; return the step's reward.
        O(degree x K + interval length); the neighbours' dynamic action features are refreshed
        in one batch by ``_flush``."""
        c, o = self._c, self._obs
        strat, ecosts, ecosts_n, dyn_rows, dirty = self._strat, c.ecosts, c.ecosts_n, self._dyn_rows, self._dirty
        strat[i] = s
        ki = c.k_list[i]
        ef = o["edge_features"]
        iSRC, iDST, iREAL = _E_SRC, _E_DST, _E_REAL
        cu = c.cost_unit
        edge_time = 0.0
        for e, j, src, eoff, kj in c.incident[i]:
            ef[e, iSRC if src else iDST] = 1.0
            sj = strat[j]
            if sj >= 0:  # j decided (or j == i: a self-loop)
                v = float(ecosts[eoff + s * kj + sj] if src else ecosts[eoff + sj * ki + s])
                edge_time += v
                ef[e, iREAL] = math.log1p(v / cu) if v > 0 else 0.0
                if j == i:
                    ef[e, iDST] = 1.0
            else:
                row = dyn_rows[j]
                if src:
                    row += ecosts_n[eoff + s * kj: eoff + (s + 1) * kj, None]
                else:
                    row += ecosts_n[eoff + s: eoff + kj * ki: ki, None]
                dirty.add(j)
        reward = c.step_static_list[i][s] + c.w_time * edge_time
        # memory: running live profile, its peak, and the lower-bound profile for the mask
        lo, hi = c.lo_list[i], c.hi_list[i]
        u = c.usage_list[i][s]
        if hi > lo:
            live = self._live[lo:hi]
            live += u
            # the current node's interval max was taken in _advance and nothing changed since:
            # max(live + u) == max(live) + u exactly (rounding is monotonic)
            top = self._top_cur + u if i == self._cur else float(live.max())
            if top > self._peak:
                reward += c.w_mem * c.mem_scale * (top - self._peak)
                self._peak = top
            if self._use_lb:
                self._lb[lo:hi] += u - c.umin_list[i]
        if self._copies is not None:   # copies that node i's choice makes live, in the same profile
            for a, b, nbytes in self._copies.decide(i, s, strat):
                seg = self._live[a:b]
                seg += nbytes
                top = float(seg.max())
                if top > self._peak:
                    reward += c.w_mem * c.mem_scale * (top - self._peak)
                    self._peak = top
        # features of node i
        nf, af = o["node_features"], o["action_features"]
        nf[i, _N_DECIDED] = 1.0
        nf[i, _N_CURRENT] = 0.0
        ci = c.cost_list[i][s]
        nf[i, _N_DCOST] = math.log1p(ci / cu) if ci > 0 else 0.0
        nf[i, _N_DMEM] = min(max(u / c.mem_unit, 0.0), 10.0)
        nf[i, _N_DRESH] = math.log1p(edge_time / cu) if edge_time > 0 else 0.0
        af[i, s, _A_CHOSEN] = 1.0
        return -reward / c.reference_cost

    def _flush(self) -> None:
        """Refresh reshard_decided / incremental features of the nodes whose resharding changed."""
        if not self._dirty:
            return
        c, af = self._c, self._obs["action_features"]
        rows = np.fromiter(self._dirty, np.int64, len(self._dirty))
        self._dirty.clear()
        t = self._dyn[rows]
        if c.negative_costs:
            np.maximum(t, 0.0, out=t)
        af[rows, :, _A_RESH:_A_RESH + 2] = np.log1p(t, out=t)

    def _advance(self) -> None:
        """Move to the next node the agent decides, auto-applying trivial nodes on the way."""
        c, o = self._c, self._obs
        order, trivial = c.order_list, c.trivial_list
        n = c.n
        while self._ptr < n:
            i = order[self._ptr]
            if self.skip_trivial and trivial[i] and i != self._last_decision:
                self._cur = -1
                self._pending += self._apply(i, 0)
                self._ptr += 1
                continue
            break
        self._flush()
        am = o["action_mask"]
        if self._ptr >= n:
            self._cur = -1
            o["current_node"][0] = 0
            am[:] = c.kmask[1]
            return
        i = order[self._ptr]
        self._ptr += 1
        self._cur = i
        o["current_node"][0] = i
        o["node_features"][i, _N_CURRENT] = 1.0
        k = c.k_list[i]
        incr = self._dyn_rows[i][:, 1]
        mask = None
        if self.mask_forbidden and c.has_forbidden:
            big = FORBIDDEN_COST / c.cost_unit
            ok = incr < big
            strat = self._strat
            for j, mat in c.incident_mats[i]:   # forward check: leave each undecided neighbour an allowed strategy
                if strat[j] < 0:
                    ok_j = ((mat + self._dyn_rows[j][:, 1]) < big).any(axis=1)
                    if (ok & ok_j).any():
                        ok &= ok_j
            if not ok.all() and ok.any():
                mask = ok
        lo, hi = c.lo_list[i], c.hi_list[i]
        af = o["action_features"]
        if hi > lo:
            if self._use_lb:
                m = float(self._lb[lo:hi].max())
                if m + c.udelta_max[i] > self._cap:  # some strategy may not fit: check each
                    delta = c.usage[i, :k] - c.umin_list[i]
                    fits = (delta <= self._cap - m) | (delta <= 0)
                    both = fits if mask is None else (mask & fits)
                    mask = both if both.any() else fits
            top = self._top_cur = float(self._live[lo:hi].max())
            af[i, :k, _A_PEAK] = c.usage_n_rows[i] + (top - self._peak) / c.mem_unit
        if mask is None:
            am[:] = c.kmask[k]
            best = int(incr.argmin())
        else:
            am[:k] = mask
            am[k:] = 0
            best = int(np.where(mask, incr, np.inf).argmin())
        af[i, best, _A_BEST] = 1.0
