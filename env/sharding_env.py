"""ShardingEnv: choose a sharding strategy for one Problem node per step (gymnasium.Env).

Episode. At reset a Problem is drawn from the workload source (seeded by ``reset(seed=...)``);
``env.episode`` (an ``env.types.Episode``) is its public spec. Nodes are decided one per step in
``solvers.local.decision_order`` (topological, smallest ready id first; cycles broken by the
smallest remaining id); rewards stay exact since an edge is charged when its second end is decided.
The action is the strategy index of ``obs["current_node"]``.
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

Reference cost R (> 0): see env/compiled.py (the dp baseline's cost, else greedy's).

Action mask: strategies s < k_i of the current node, minus (``mask_forbidden``) those whose
incremental time cost is >= ``FORBIDDEN_COST`` (IOPDDL's "impossible" marker) or that leave some undecided
neighbour only such strategies (forward checking, one edge at a time, skipped for an edge where it
would mask everything; only on problems that have such costs), and minus (``mask_memory``, when
a cap exists) those that would make the cap impossible: s is masked when, somewhere in node i's
interval, the decided usage + the smallest usage of every undecided node + u_i[s] exceeds the cap.
With the memory mask on, every valid action sequence ends feasible whenever the cap is attainable
at all. If the masks leave nothing, the memory mask alone is used (it always keeps the
least-usage strategy).

Observation: the padded arrays ``env.types`` describes (each feature: env/features.py).

Step cost: O(degree x K + interval length in grid points); the plan is evaluated once per episode
(``costmodel.problem.evaluate``) for the final info: plan, cost, reference_cost, objective.
"""
from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from costmodel.limits import Limits
from costmodel.problem import Problem, evaluate
from env.compiled import (
    DEFAULT_WEIGHTS,
    FEATURE_MAX,
    Compiled,
    CompiledCache,
    as_source,
    check_fits,
    check_weights,
    padding,
    problem_of,
    spaces_and_buffers,
)
from env.features import ACTION_INDEX, EDGE_INDEX, NODE_INDEX
from env.obs_pool import ObservationPool
from env.types import Episode

_N_DECIDED, _N_CURRENT = NODE_INDEX["decided"], NODE_INDEX["current"]
_N_DCOST, _N_DMEM, _N_DRESH = NODE_INDEX["decided_cost"], NODE_INDEX["decided_memory"], NODE_INDEX["decided_reshard"]
_A_CHOSEN, _A_PEAK, _A_BEST = ACTION_INDEX["chosen"], ACTION_INDEX["peak_rise"], ACTION_INDEX["best_incremental"]
_A_RESH, _A_INCR = ACTION_INDEX["reshard_decided"], ACTION_INDEX["incremental"]
assert _A_INCR == _A_RESH + 1  # _flush writes both columns at once
_E_SRC, _E_DST, _E_REAL = EDGE_INDEX["src_decided"], EDGE_INDEX["dst_decided"], EDGE_INDEX["realised_cost"]
__all__ = ["DEFAULT_WEIGHTS", "FEATURE_MAX", "ShardingEnv"]


class ShardingEnv(gym.Env):
    """See the module docstring. Keyword arguments:

    workloads: a Problem, a list of Problems/Workloads/IOPDDL paths, an IOPDDL path, a list of
        (model, size) zoo pairs (each built on every cluster in ``clusters``), or a sampler
        ``rng -> Problem | Workload`` (give max_nodes/max_edges/max_strategies or a sampler with
        a ``max_sizes`` dict; otherwise 8 probe draws, padded x1.5). Default: gpt tiny.
    clusters: preset names or Cluster objects for (model, size) pairs (default ["cpu-2x4"]).
    weights: dict(time=1, memory=0, redundancy=0, balance=0) (missing keys take these defaults).
    memory_cap_bytes: tightens every problem's usage_limit to min(usage_limit, memory_cap_bytes)
        (``costmodel.limits.Limits``: None keeps the problem's own; otherwise a finite number > 0).
    copy_obs: True (default): a fresh read-only observation per call (env/obs_pool.py); False: the
        env's in-place arrays (env/types.py).
    """

    metadata = {"render_modes": []}

    def __init__(self, workloads=None, clusters=None, weights: dict | None = None,
                 memory_cap_bytes: float | None = None, max_nodes: int | None = None,
                 max_edges: int | None = None, max_strategies: int | None = None,
                 skip_trivial: bool = True, mask_memory: bool = True, mask_forbidden: bool = True,
                 invalid_penalty: float = 1.0, infeasible_penalty: float = 1.0, copy_obs: bool = True,
                 render_mode=None):
        w = check_weights(weights)
        self.weights = w
        self.limits = Limits.of(memory_cap_bytes=memory_cap_bytes)   # the one validation (LimitError)
        self.memory_cap_bytes = self.limits.memory_cap_bytes
        self.skip_trivial, self.mask_memory, self.mask_forbidden = skip_trivial, mask_memory, mask_forbidden
        self.invalid_penalty, self.infeasible_penalty = float(invalid_penalty), float(infeasible_penalty)
        self.copy_obs = copy_obs
        self.render_mode = render_mode
        self._items, self._sampler = as_source(workloads, clusters, memory_cap_bytes)
        self._compiled = CompiledCache()
        self._problems: dict[int, Problem] = {}

        probe = None if self._items is None else [self._problem_at(i) for i in range(len(self._items))]
        self.N, self.E, self.K = padding(probe, self._sampler, max_nodes, max_edges, max_strategies)
        for p in probe or ():
            check_fits(p, self.N, self.E, self.K)

        self.observation_space, self.action_space, self._obs = spaces_and_buffers(self.N, self.E, self.K)
        self._pool = ObservationPool(self._obs) if copy_obs else None   # fresh read-only obs per call
        self._mv = {k: memoryview(v) for k, v in self._obs.items()}   # scalar writes: ~0.05 us vs numpy's ~0.1
        self._chg: tuple[set, set, set] = (set(), set(), set())   # node / action / edge rows written since the last obs
        self._c: Compiled | None = None
        self._episode: Episode | None = None
        self._problem: Problem | None = None
        self._done = True

    # ---- problems ------------------------------------------------------------------------------
    def _apply_cap(self, p: Problem) -> Problem:
        return self.limits.apply(p)   # min(problem.usage_limit, memory_cap_bytes): tightens, never relaxes

    def _problem_at(self, idx: int) -> Problem:
        if idx not in self._problems:
            self._problems[idx] = self._apply_cap(problem_of(self._items[idx]))
        return self._problems[idx]

    def _compile(self, problem: Problem) -> Compiled:
        """Per-problem preprocessing, cached (``env.compiled.CompiledCache``)."""
        def build():
            check_fits(problem, self.N, self.E, self.K)
            return Compiled(problem, self.weights, self.K)
        return self._compiled.get(problem, build)

    @property
    def problem(self) -> Problem | None:
        """The Problem of the current episode (with the env's memory cap applied)."""
        return self._problem

    @property
    def episode(self) -> Episode | None:
        """The current episode's public spec (``env.types.Episode``); None before the first reset."""
        c, p = self._c, self._problem
        if c is None or p is None:
            return None
        if self._episode is None or self._episode.problem is not p:
            n_dec = int((~c.trivial).sum()) if self.skip_trivial else c.n
            self._episode = Episode(problem=p, order=c.order, reference_cost=c.reference_cost,
                                    reference_name=c.reference_name, reference_plan=c.reference_plan,
                                    num_decisions=max(n_dec, 1), memory_cap_bytes=self._cap,
                                    weights=tuple(sorted(self.weights.items())))
        return self._episode

    # ---- gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "problem" in options:
            p = self._apply_cap(problem_of(options["problem"]))
        elif self._items is not None:
            idx = int(self.np_random.integers(len(self._items))) if len(self._items) > 1 else 0
            p = self._problem_at(idx)
        else:
            p = self._apply_cap(problem_of(self._sampler(self.np_random)))
        c = self._compile(p)
        self._c, self._problem = c, p
        cap = p.usage_limit
        self._cap = None if cap is None or not math.isfinite(cap) else float(cap)
        n, K = c.n, self.K
        if self._pool is not None:
            self._obs, self._mv = self._pool.begin_episode()
        c.write_episode(self._obs, self._cap, self.weights)
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
        self._last_decision = c.last_decision if self.skip_trivial else int(c.order[-1])   # the agent decides it
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
        valid = 0 <= a < self.K and self._mv["action_mask"][a]
        if self._pool is not None:
            self._obs, self._mv = self._pool.begin(whole=not valid)   # a valid step rewrites current_node, action_mask
        if not valid:
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

    def __getstate__(self):   # memoryviews do not pickle; the copy makes its own
        return {k: v for k, v in self.__dict__.items() if k != "_mv"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self._pool is not None:
            self._obs, self._mv = self._pool.adopt(self._obs)
        else:
            self._mv = {k: memoryview(v) for k, v in self._obs.items()}

    def action_masks(self) -> np.ndarray:
        """The current action mask as bools (the method sb3-contrib's MaskablePPO looks for)."""
        return self._obs["action_mask"].astype(bool)

    # ---- internals -----------------------------------------------------------------------------
    def _observation(self) -> dict:
        chg = self._chg
        self._chg = (set(), set(), set())
        if self._pool is None:
            return dict(self._obs)
        return self._pool.publish(chg)

    def _apply(self, i: int, s: int) -> float:
        """Fix node i to strategy s; update state and features; return the step's reward.
        O(degree x K + interval length); the neighbours' dynamic action features are refreshed
        in one batch by ``_flush``."""
        c = self._c
        strat, ecosts, ecosts_n, dyn_rows, dirty = self._strat, c.ecosts_mv, c.ecosts_n, self._dyn_rows, self._dirty
        strat[i] = s
        ki = c.k_list[i]
        ef = self._mv["edge_features"]
        chg = self._chg
        chg[0].add(i)
        chg[1].add(i)
        chg[2].update(c.incident_edges[i])
        iSRC, iDST, iREAL = _E_SRC, _E_DST, _E_REAL
        cu = c.cost_unit
        edge_time = 0.0
        for e, j, src, eoff, kj in c.incident[i]:
            ef[e, iSRC if src else iDST] = 1.0
            sj = strat[j]
            if sj >= 0:  # j decided (or j == i: a self-loop)
                v = ecosts[eoff + s * kj + sj] if src else ecosts[eoff + sj * ki + s]
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
        nf = self._mv["node_features"]
        nf[i, _N_DECIDED] = 1.0
        nf[i, _N_CURRENT] = 0.0
        nf[i, _N_DCOST] = c.dcost_list[i][s]
        nf[i, _N_DMEM] = c.dmem_list[i][s]
        nf[i, _N_DRESH] = math.log1p(edge_time / cu) if edge_time > 0 else 0.0
        self._mv["action_features"][i, s, _A_CHOSEN] = 1.0
        return -reward / c.reference_cost

    def _flush(self) -> None:
        """Refresh reshard_decided / incremental features of the nodes whose resharding changed."""
        if not self._dirty:
            return
        c, af, dirty = self._c, self._obs["action_features"], self._dirty
        self._chg[1].update(dirty)
        if len(dirty) <= 8 and not c.negative_costs:   # ~1 us a row; fancy indexing costs ~4 us for 3 rows
            rows, k_list = self._dyn_rows, c.k_list
            for j in dirty:
                af[j, :k_list[j], _A_RESH:_A_RESH + 2] = np.log1p(rows[j])   # (log1p(out=) casts slower)
        else:
            rows = np.fromiter(dirty, np.int64, len(dirty))
            t = self._dyn[rows]
            if c.negative_costs:
                np.maximum(t, 0.0, out=t)
            af[rows, :, _A_RESH:_A_RESH + 2] = np.log1p(t, out=t)
        dirty.clear()

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
        self._chg[0].add(i)
        self._chg[1].add(i)
        mv = self._mv
        mv["current_node"][0] = i
        mv["node_features"][i, _N_CURRENT] = 1.0
        k = c.k_list[i]
        incr = self._dyn_rows[i][:, 1]
        mask = c.forward_check(i, incr, self._strat, self._dyn_rows) if self.mask_forbidden and c.has_forbidden else None
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
            mv["action_mask"][:] = c.kmask_mv[k]
            best = int(incr.argmin())
        else:
            am[:k] = mask
            am[k:] = 0
            best = int(np.where(mask, incr, np.inf).argmin())
        mv["action_features"][i, best, _A_BEST] = 1.0
