"""Planning with a trained policy: decode, keep the cheapest feasible of K plans, polish.

``Planner.load("pretrained" | path)`` reads a checkpoint (agent/checkpoints.py);
``plan(problem, mode, samples, memory_cap_bytes, polish, seed)`` decodes ``samples`` plans
(greedy = argmax; sample = draws from π), repairs memory if needed, optionally polishes each by
local search, and returns the cheapest feasible one under ``costmodel.problem.evaluate``.

Fast decoding. Stepping the GNN once per node would cost N forwards; instead the GNN embeds the
whole graph once every ``refresh`` decisions (refresh = max(1, ⌈N / max_passes⌉), so at most
``max_passes`` forwards), and between passes each decision uses the last node embeddings with the
*current* action features from the env's incremental state (resharding to decided neighbours,
peak rise, ...), scored by the policy head in numpy. With ``refresh=1`` this is exactly the
policy the env trains (small problems use that); with larger ``refresh`` the embeddings lag by
at most refresh−1 decisions, an approximation. The embedding itself runs in numpy too
(``agent.gnn.np_encode``, the Flax network's equations): nothing is jit-compiled, so the first
plan of a new graph size costs what later ones do.

Local search (``polish``): iterated best response. Each node's local cost for strategy s is
c_i(s) + Σ_(i,v) E[s, s_v] + Σ_(u,i) E[s_u, s]; every round computes all of them vectorised, and
moves a set of improving nodes no two of which share an edge (each moves iff its gain beats all
its neighbours'), so the total falls by exactly the sum of their gains. Moves that would break the
memory cap are dropped (only usage-non-increasing moves are kept when the batch is infeasible).
Then exact forest moves (``solvers.search.forest_dp``): a random induced forest of the graph is
re-optimised by tree DP with every other node held, which lets whole chains switch together.

Under a memory cap that is not enough: the cap couples every node live at the peak, and the
optimum often shards a parameter, its optimizer state and its whole update chain together, which
pays only when all of them move (forest moves break such groups up; the polish stalled at 1.2-1.7x
the ILP on capped held-out problems). There ``plan`` adds a second start (the policy's decode of
the uncapped problem, repaired to fit) and, when the cap binds, ``solvers.search.refine``:
large-neighbourhood search with the exact MILP on 90-node BFS neighbourhoods (1.5 s).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from costmodel.problem import Problem, evaluate

REFINE_TIME_S = 1.5  # Planner.plan: refinement when the memory cap binds (solvers.search.refine)
PRETRAINED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained", "policy.msgpack")
PRETRAINED_FGNN = os.path.join(os.path.dirname(PRETRAINED), "fgnn.msgpack")   # the factor-graph network


# ---- vectorised local costs ----------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class LocalCosts:
    """Index arrays to compute every strategy's local cost for a plan in O(S + Σ_e (k_u + k_v))."""

    problem: Problem
    node_of: np.ndarray      # flat strategy -> node
    static: np.ndarray       # node cost + self-loop diagonal, per flat strategy
    r_tgt: np.ndarray        # row entries: target flat strategy of the producer
    r_base: np.ndarray       # edge_costs index without the consumer's strategy
    r_other: np.ndarray      # the consumer node
    c_tgt: np.ndarray
    c_base: np.ndarray
    c_other: np.ndarray      # the producer node
    c_mult: np.ndarray       # k_v: stride of the producer's strategy
    usage: np.ndarray        # per flat strategy; 0 for nodes with an empty interval
    nbr_u: np.ndarray        # edges without self-loops
    nbr_v: np.ndarray

    @classmethod
    def of(cls, p: Problem) -> LocalCosts:
        k = p.num_strategies
        off = p.strategy_offsets
        node_of = np.repeat(np.arange(p.num_nodes), k)
        static = p.node_costs.astype(np.float64).copy()
        u, v = (p.edges[:, 0], p.edges[:, 1]) if p.num_edges else (np.zeros(0, int), np.zeros(0, int))
        loop = u == v
        for e in np.nonzero(loop)[0]:
            static[p.node_slice(int(u[e]))] += np.diagonal(p.edge_matrix(int(e)))
        es = np.nonzero(~loop)[0]
        ku, kv = k[u[es]], k[v[es]]
        # rows: for each edge e and producer strategy s
        r_e = np.repeat(es, ku)
        r_s = np.arange(len(r_e)) - np.repeat(np.cumsum(ku) - ku, ku)
        r_tgt = off[u[r_e]] + r_s
        r_base = p.edge_offsets[r_e] + r_s * k[v[r_e]]
        c_e = np.repeat(es, kv)
        c_t = np.arange(len(c_e)) - np.repeat(np.cumsum(kv) - kv, kv)
        c_tgt = off[v[c_e]] + c_t
        c_base = p.edge_offsets[c_e] + c_t
        live = (p.intervals[:, 1] > p.intervals[:, 0])[node_of]
        return cls(p, node_of, static, r_tgt, r_base, v[r_e], c_tgt, c_base, u[c_e], k[v[c_e]],
                   np.where(live, p.node_usages, 0.0), u[es], v[es])

    def local(self, plan: np.ndarray) -> np.ndarray:
        """Per flat strategy: node cost + resharding to the neighbours' strategies in ``plan``."""
        p = self.problem
        S = len(self.static)
        tot = self.static.copy()
        if len(self.r_tgt):
            tot += np.bincount(self.r_tgt, p.edge_costs[self.r_base + plan[self.r_other]], minlength=S)
            tot += np.bincount(self.c_tgt, p.edge_costs[self.c_base + plan[self.c_other] * self.c_mult], minlength=S)
        return tot

    def best(self, tot: np.ndarray) -> np.ndarray:
        """First argmin strategy of each node's segment of ``tot``."""
        off = self.problem.strategy_offsets
        mins = np.minimum.reduceat(tot, off[:-1])
        idx = np.where(tot <= mins[self.node_of], np.arange(len(tot)), len(tot))
        return np.minimum.reduceat(idx, off[:-1]) - off[:-1]


def polish(problem: Problem, plan, time_budget_s: float = 1.0, lc: LocalCosts | None = None,
           tree_moves: int = 64, seed: int = 0, max_fails: int = 10) -> list[int]:
    """Local search: best response and edge pair moves (``pair_moves``) to a local optimum, then
    up to ``tree_moves`` forest moves (``solvers.search.forest_dp``: a random induced forest
    re-optimised exactly by tree DP, every other node held), each memory-repaired if needed,
    followed by the same local optimisation and kept only if it lowers the true cost within the
    memory cap; stops after ``max_fails`` failed forest moves in a row or when ``time_budget_s``
    is spent. Never makes a plan worse or infeasible."""
    from solvers.search import Graph, forest_dp
    t0 = time.perf_counter()
    lc = lc or LocalCosts.of(problem)
    graph = Graph(problem) if tree_moves and problem.num_edges else None

    def local_opt(x):
        left = lambda: max(0.0, time_budget_s - (time.perf_counter() - t0))
        x = best_response(problem, x, time_budget_s=left(), lc=lc)
        for _ in range(5):
            y = pair_moves(problem, x, lc, time_budget_s=left())
            y = best_response(problem, y, time_budget_s=left(), lc=lc)
            if np.array_equal(np.asarray(y), np.asarray(x)):
                break
            x = y
        return x

    cur = local_opt(plan)
    cost = evaluate(problem, cur).total
    rng = np.random.default_rng(seed)
    fails = 0
    for _ in range(tree_moves):
        if fails >= max_fails or time.perf_counter() - t0 > time_budget_s or problem.num_edges == 0:
            break
        cand = forest_dp(graph, np.asarray(cur, dtype=np.int64), graph.cost, rng, np.inf)
        c = evaluate(problem, cand)
        if not c.feasible:
            rep = repair_memory(problem, cand, lc=lc)
            if rep is None:
                fails += 1
                continue
            cand = rep
        cand = local_opt(cand)
        c = evaluate(problem, cand)
        if c.feasible and c.total < cost * (1 - 1e-12):
            cur, cost, fails = cand, c.total, 0
        else:
            fails += 1
    return [int(x) for x in cur]


def improve(problem: Problem, plan, polish_time_s: float = 0.5, refine_time_s: float = 0.0,
            lc: LocalCosts | None = None, seed: int = 0) -> list[int] | None:
    """What ``Planner.plan`` does to a decoded plan, for any start plan: memory repair if it is over
    the cap (None if that fails), ``polish``, then ``solvers.search.refine`` for
    ``refine_time_s``. Used to give the comparison rows of experiments/eval_policy.py the same
    post-processing as the policy (with the refinement time the planner chose)."""
    from solvers.search import refine
    lc = lc or LocalCosts.of(problem)
    if not evaluate(problem, plan).feasible:
        plan = repair_memory(problem, plan, lc=lc)
        if plan is None:
            return None
    plan = polish(problem, plan, time_budget_s=polish_time_s, lc=lc, seed=seed)
    if refine_time_s > 0:
        plan = refine(problem, plan, refine_time_s, seed=seed)
    return [int(x) for x in plan]


def best_response(problem: Problem, plan, time_budget_s: float = 1.0, max_rounds: int = 10_000,
                  lc: LocalCosts | None = None) -> list[int]:
    """Iterated best response (see module docstring); never makes a plan worse or infeasible."""
    lc = lc or LocalCosts.of(problem)
    plan = np.asarray(plan, dtype=np.int64).copy()
    off = problem.strategy_offsets
    n = problem.num_nodes
    limit = problem.usage_limit
    t0 = time.perf_counter()
    prio_base = np.arange(n)
    for _ in range(max_rounds):
        if time.perf_counter() - t0 > time_budget_s:
            break
        tot = lc.local(plan)
        cur_flat = off[:-1] + plan
        cur = tot[cur_flat]
        best = lc.best(tot)
        gain = cur - tot[off[:-1] + best]
        scale = max(float(np.abs(cur).max()), 1e-30)
        cand = gain > 1e-12 * scale
        if not cand.any():
            break
        # priority by gain (ties: lower index first); a node moves iff it beats all its neighbours
        order = np.lexsort((-prio_base, gain))
        prio = np.empty(n, np.int64)
        prio[order] = np.arange(n)
        prio = np.where(cand, prio, -1)
        nb = np.full(n, -1, np.int64)
        np.maximum.at(nb, lc.nbr_u, prio[lc.nbr_v])
        np.maximum.at(nb, lc.nbr_v, prio[lc.nbr_u])
        move = cand & (prio > nb)
        new = plan.copy()
        new[move] = best[move]
        if limit is not None and not evaluate(problem, new).feasible:
            safe = move & (lc.usage[off[:-1] + best] <= lc.usage[cur_flat])
            if not safe.any():
                # best moves all raise memory: retry restricted to non-increasing usage strategies
                tot2 = np.where(lc.usage <= lc.usage[cur_flat][lc.node_of], tot, np.inf)
                best2 = lc.best(tot2)
                gain2 = cur - tot2[off[:-1] + best2]
                cand2 = gain2 > 1e-12 * scale
                if not cand2.any():
                    break
                prio2 = np.where(cand2, prio, -1)
                nb2 = np.full(n, -1, np.int64)
                np.maximum.at(nb2, lc.nbr_u, prio2[lc.nbr_v])
                np.maximum.at(nb2, lc.nbr_v, prio2[lc.nbr_u])
                safe = cand2 & (prio2 > nb2)
                if not safe.any():
                    break
                best = best2
            new = plan.copy()
            new[safe] = best[safe]
        plan = new
    return [int(x) for x in plan]


def pair_moves(problem: Problem, plan, lc: LocalCosts, time_budget_s: float = 0.5) -> np.ndarray:
    """Edge moves: for every edge (u, v) the joint best (s, t) given all other nodes,
    J[s, t] = L_u(s) − E[s, t_now] + L_v(t) − E[s_now, t] + E[s, t] (L: local costs), computed
    for all edges at once over the flat edge-cost array; moves with positive gain are applied
    greedily, best first, skipping any whose nodes touch a node already moved this round (so
    every applied gain is exact). Repeats until no edge improves or the time is spent."""
    p = problem
    plan = np.asarray(plan, dtype=np.int64).copy()
    if p.num_edges == 0:
        return plan
    t0 = time.perf_counter()
    k = p.num_strategies
    off, eoff = p.strategy_offsets, p.edge_offsets
    sizes = np.diff(eoff)
    ent_e = np.repeat(np.arange(p.num_edges), sizes)
    pos = np.arange(len(ent_e)) - eoff[ent_e]
    kv = k[p.edges[ent_e, 1]]
    ent_s, ent_t = pos // kv, pos % kv
    u_of, v_of = p.edges[ent_e, 0], p.edges[ent_e, 1]
    loop = p.edges[:, 0] == p.edges[:, 1]
    nbrs = [[] for _ in range(p.num_nodes)]
    for a, b in zip(lc.nbr_u.tolist(), lc.nbr_v.tolist()):
        nbrs[a].append(b)
        nbrs[b].append(a)
    limit = p.usage_limit
    while time.perf_counter() - t0 < time_budget_s:
        tot = lc.local(plan)
        su, sv = plan[u_of], plan[v_of]
        J = (tot[off[u_of] + ent_s] - p.edge_costs[eoff[ent_e] + ent_s * kv + sv]
             + tot[off[v_of] + ent_t] - p.edge_costs[eoff[ent_e] + su * kv + ent_t]
             + p.edge_costs)
        nz = sizes > 0
        mins = np.full(p.num_edges, np.inf)
        mins[nz] = np.minimum.reduceat(J, eoff[:-1][nz])
        cur = J[eoff[:-1] + plan[p.edges[:, 0]] * k[p.edges[:, 1]] + plan[p.edges[:, 1]]]
        gain = np.where(loop, 0.0, cur - mins)
        scale = max(float(np.abs(tot).max()), 1e-30)
        cand = np.nonzero(gain > 1e-12 * scale)[0]
        if not len(cand):
            break
        first = np.where(J <= mins[ent_e], np.arange(len(J)), len(J))
        arg = np.full(p.num_edges, 0)
        arg[nz] = np.minimum.reduceat(first, eoff[:-1][nz]) - eoff[:-1][nz]
        locked = np.zeros(p.num_nodes, bool)
        new = plan.copy()
        moved = 0
        for e in cand[np.argsort(-gain[cand])]:
            a, b = int(p.edges[e, 0]), int(p.edges[e, 1])
            if locked[a] or locked[b]:
                continue
            new[a], new[b] = divmod(int(arg[e]), int(k[b]))
            for x in (a, b):
                locked[x] = True
                for y in nbrs[x]:
                    locked[y] = True
            moved += 1
        if limit is not None and not evaluate(p, new).feasible:
            break
        if evaluate(p, new).total >= evaluate(p, plan).total:
            break
        plan = new
    return plan


def repair_memory(problem: Problem, plan, lc: LocalCosts | None = None, max_moves: int | None = None) -> list[int] | None:
    """Make a plan feasible under the usage limit by repeatedly switching, among the nodes live
    at the peak, the strategy with the least cost increase per byte saved. None if it fails."""
    plan = np.asarray(plan, dtype=np.int64).copy()
    limit = problem.usage_limit
    if limit is None or evaluate(problem, plan).feasible:
        return [int(x) for x in plan]
    lc = lc or LocalCosts.of(problem)
    off = problem.strategy_offsets
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    for _ in range(max_moves or 4 * problem.num_nodes):
        usage = lc.usage[off[:-1] + plan]
        from costmodel.problem import usage_profile
        times, live = usage_profile(problem, usage)
        j = int(np.argmax(live))
        if live[j] <= limit:
            return [int(x) for x in plan]
        t = times[j]
        alive = (st <= t) & (t < en)
        tot = lc.local(plan)
        cur_flat = off[:-1] + plan
        saved = lc.usage[cur_flat][lc.node_of] - lc.usage
        dcost = tot - tot[cur_flat][lc.node_of]
        ok = alive[lc.node_of] & (saved > 0)
        if not ok.any():
            return None
        score = np.where(ok, np.maximum(dcost, 0) / np.where(ok, saved, 1) - 1e-30 * saved, np.inf)
        f = int(np.argmin(score))
        i = int(lc.node_of[f])
        plan[i] = f - off[i]
    return [int(x) for x in plan] if evaluate(problem, plan).feasible else None


def min_memory_plan(problem: Problem) -> list[int]:
    """Each node's least-usage strategy (ties: least node cost): the plan of least peak memory."""
    lc = LocalCosts.of(problem)
    u = lc.usage
    scale = max(float(np.abs(problem.node_costs).max()), 1e-30)
    key = u + 1e-9 * max(float(u.max()), 1.0) * (problem.node_costs / scale)
    return [int(x) for x in lc.best(key)]


def decision_order(problem: Problem) -> np.ndarray:
    """Topological order of the nodes (Kahn, ties by index); nodes on cycles last, by index."""
    n = problem.num_nodes
    if not problem.num_edges:
        return np.arange(n)
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    keep = u != v
    indeg = np.bincount(v[keep], minlength=n)
    order_e = np.argsort(u[keep], kind="stable")
    uu, vv = u[keep][order_e], v[keep][order_e]
    start = np.searchsorted(uu, np.arange(n + 1))
    import heapq
    heap = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(i)
        for w in vv[start[i]:start[i + 1]]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, int(w))
    if len(out) < n:
        seen = np.zeros(n, bool)
        seen[out] = True
        out.extend(np.nonzero(~seen)[0].tolist())
    return np.asarray(out)


def greedy_by_cost(problem: Problem, order=None) -> list[int]:
    """Baseline: in decision order, each node takes the strategy minimising its node cost plus
    resharding to the neighbours already decided (no look-ahead, memory ignored)."""
    order = decision_order(problem) if order is None else order
    n = problem.num_nodes
    k = problem.num_strategies
    adj: list[list[tuple[int, int, bool]]] = [[] for _ in range(n)]
    for e, (u, v) in enumerate(problem.edges.tolist()):
        adj[u].append((e, v, True))
        if u != v:
            adj[v].append((e, u, False))
    plan = np.full(n, -1, np.int64)
    for i in order:
        i = int(i)
        c = problem.node_costs[problem.node_slice(i)].astype(np.float64).copy()
        for e, w, i_is_src in adj[i]:
            if w == i:
                c += np.diagonal(problem.edge_matrix(e))
            elif plan[w] >= 0:
                m = problem.edge_matrix(e)
                c += m[:, plan[w]] if i_is_src else m[plan[w], :]
        plan[i] = int(np.argmin(c))
    del k
    return [int(x) for x in plan]


def heuristic_plan(problem: Problem) -> tuple[list[int] | None, str]:
    """(plan, start name): the cheapest feasible of {greedy-by-cost, and for traced problems the
    replicated/dp/megatron/fsdp baselines}, each memory-repaired and polished. A teacher for
    imitation and the per-problem reward scale for PPO; not used by ``Planner.plan``."""
    lc = LocalCosts.of(problem)
    starts = {"greedy": greedy_by_cost(problem)}
    if problem.meta is not None:
        try:
            from solvers.baselines import baseline_plan
            for m in ("replicated", "dp", "megatron", "fsdp"):
                starts[m] = baseline_plan(problem, m)
        except Exception:  # baselines not applicable to this problem
            pass
    best, best_cost, best_name = None, np.inf, ""
    for name, s in starts.items():
        s = repair_memory(problem, s, lc=lc)
        if s is None:
            continue
        s = polish(problem, s, lc=lc, time_budget_s=0.5)
        c = evaluate(problem, s)
        if c.feasible and c.total < best_cost:
            best, best_cost, best_name = s, c.total, name
    return best, best_name


# ---- the policy planner -------------------------------------------------------------------------
_LOADED: dict = {}


class Planner:
    """A trained policy that plans any Problem; see the module docstring."""

    def __init__(self, params, config, source: str = "", update: int = 0, extra: dict | None = None):
        from agent.ppo import PPOConfig, make_model
        self.config = config if isinstance(config, PPOConfig) else PPOConfig.from_dict(dict(config))
        self.params = params
        self.source = source
        self.update = int(update)
        self.extra = dict(extra or {})
        self.model = make_model(self.config)
        self._head = None
        self._np_params = None

    # ---- loading ----
    @classmethod
    def load(cls, which: str = "pretrained") -> Planner:
        """``"pretrained"`` (agent/pretrained/policy.msgpack), ``"fgnn"`` (agent/pretrained/fgnn.msgpack,
        the factor-graph network: an ``agent.fgnn_planner.FGPlanner``) or a checkpoint path."""
        from agent.checkpoints import load_checkpoint
        path = {"pretrained": PRETRAINED, "fgnn": PRETRAINED_FGNN}.get(which) or os.fspath(which)
        if not os.path.exists(path):
            hint = (" (the shipped policy is missing: train one with `shardgym train --minutes M` and copy its policy.msgpack there)"
                    if which == "pretrained" else "")
            raise FileNotFoundError(f"policy checkpoint {path!r} does not exist{hint}")
        stamp = (os.path.abspath(path), os.path.getmtime(path), os.path.getsize(path))
        if stamp in _LOADED:
            src = _LOADED[stamp]
            return cls(src.params, src.config, source=src.source, update=src.update, extra=src.extra)
        state = load_checkpoint(path)
        if isinstance(state["config"], dict) and state["config"].get("kind") == "fgnn":
            from agent.fgnn_planner import FGPlanner  # the factor-graph network's checkpoint
            return FGPlanner.from_state(state, path)
        params = state["params"]
        if not isinstance(params, dict) or "params" not in params or "policy_head" not in params["params"]:
            raise ValueError(f"checkpoint {path!r} does not hold ShardingGNN parameters")
        try:
            pl = cls(params, state["config"], source=path, update=state["update"], extra=state.get("extra"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint {path!r} has an unusable config ({exc})") from exc
        _LOADED[stamp] = pl
        return cl_copy(pl)

    def describe(self) -> dict:
        import jax
        n_params = sum(int(np.size(x)) for x in jax.tree.leaves(self.params))
        return {"source": self.source, "updates": self.update, "parameters": n_params,
                "hidden": self.config.hidden, "rounds": self.config.rounds, **{k: v for k, v in self.extra.items()
                                                                            if k in ("wall_s", "command", "git_rev")}}

    # ---- decoding ----
    def _head_params(self):
        if self._head is None:
            import jax
            p = jax.device_get(self.params)["params"]
            self._head = {k: {kk: np.asarray(vv, np.float64) for kk, vv in v.items()} for k, v in p["policy_head"].items()}
        return self._head

    def _env(self, problem: Problem):
        from env.sharding_env import ShardingEnv
        return ShardingEnv(workloads=problem, copy_obs=False)

    def _embed_obs(self, obs):
        from agent.gnn import node_inputs, np_encode
        n = int(obs["node_mask"].sum())
        e = int(obs["edge_mask"].sum())
        if self._np_params is None:
            import jax
            self._np_params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(self.params))
        h, g = np_encode(self._np_params, node_inputs(obs["node_features"][:n], obs["action_features"][:n]),
                         obs["edge_index"][:e], obs["edge_features"][:e], self.config.rounds)
        return np.asarray(h, np.float64), np.asarray(g, np.float64)

    def decode(self, env, greedy: bool = True, rng: np.random.Generator | None = None,
               max_passes: int = 16, seed: int = 0) -> tuple[list[int], object]:
        """One episode of ``env`` driven by the policy; returns (plan, Cost). The GNN runs once
        every ``refresh`` decisions (see the module docstring)."""
        from agent.gnn import np_mlp
        head = self._head_params()
        obs, _ = env.reset(seed=seed)
        c = env.unwrapped._c
        n_dec = int((~c.trivial).sum()) if env.unwrapped.skip_trivial else c.n
        refresh = max(1, -(-max(n_dec, 1) // max(1, int(max_passes))))
        step = 0
        h = g = None
        while True:
            if step % refresh == 0:
                h, g = self._embed_obs(obs)
            cur = int(obs["current_node"][0])
            mask = obs["action_mask"] > 0
            af = obs["action_features"][cur].astype(np.float64)
            K = af.shape[0]
            x = np.concatenate([np.broadcast_to(h[cur], (K, h.shape[1])), np.broadcast_to(g, (K, g.shape[0])), af], 1)
            logits = np.where(mask, np_mlp(head, x)[:, 0], -np.inf)
            if greedy:
                a = int(np.argmax(logits))
            else:
                gumbel = -np.log(-np.log(rng.random(K)))
                a = int(np.argmax(logits + gumbel))
            obs, _, term, trunc, info = env.step(a)
            step += 1
            if term or trunc:
                return info["plan"], info["cost"]

    def plan(self, problem: Problem, mode: str = "greedy", samples: int = 1, memory_cap_bytes=None,
             polish: bool = True, seed: int = 0, max_passes: int = 16, polish_time_s: float = 0.5,
             refine_time_s: float | None = None, return_info: bool = False):
        """The cheapest feasible of ``samples`` decoded plans (mode "greedy": the first is the
        argmax decode, the rest sampled; "sample": all sampled), each memory-repaired if needed
        and (``polish``) improved by local search. Under a memory cap with ``polish``, one more
        candidate is the greedy decode of the same problem without its cap, memory-repaired and
        polished (a second basin: the policy's uncapped plan, shrunk to fit). If that plan,
        polished without the cap, is over the cap (the cap *binds*), the best plan is then refined
        by ``solvers.search.refine`` for ``refine_time_s`` (default ``REFINE_TIME_S``; 0 when the
        cap does not bind, e.g. a builder's device-memory limit far above the plan).
        ``return_info`` adds ``{"plan_time_s", "candidates", "cap_binds"}``. Raises ValueError if
        no plan fits the cap."""
        if mode not in ("greedy", "sample"):
            raise ValueError(f"unknown mode {mode!r}; use 'greedy' or 'sample'")
        if int(samples) < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if memory_cap_bytes is not None:
            problem = problem.with_usage_limit(float(memory_cap_bytes))
        t0 = time.perf_counter()
        capped = problem.usage_limit is not None
        env = self._env(problem)
        rng = np.random.default_rng(seed)
        lc = LocalCosts.of(problem) if polish or capped else None
        best, best_cost, tried = None, np.inf, []
        starts = [(j, mode == "greedy" and j == 0, problem) for j in range(int(samples))]
        if capped and polish:
            starts.append((0, True, problem.with_usage_limit(None)))
        binds = False
        for j, greedy, start_problem in starts:
            free = start_problem is not problem
            strategies, _ = self.decode(self._env(start_problem) if free else env, greedy=greedy, rng=rng,
                                        max_passes=max_passes, seed=seed + j)
            if free:  # the uncapped start: its own optimum first, then shrunk to fit if it must be
                strategies = polish_fn(start_problem, strategies, time_budget_s=polish_time_s, lc=lc)
                binds = evaluate(start_problem, strategies).peak_memory_bytes > problem.usage_limit
            raw = evaluate(problem, strategies)
            if free and raw.feasible:   # already polished, and it fits
                cand = strategies
            elif polish:
                cand = improve(problem, strategies, polish_time_s=polish_time_s, lc=lc)
            else:
                cand = strategies if raw.feasible else repair_memory(problem, strategies, lc=lc)
            cost = evaluate(problem, cand) if cand is not None else None
            tried.append({"raw_total": raw.total, "raw_feasible": raw.feasible, "uncapped_start": free,
                          "total": None if cost is None else cost.total,
                          "feasible": bool(cost is not None and cost.feasible)})
            if cost is not None and cost.feasible and cost.total < best_cost:
                best, best_cost = cand, cost.total
        if best is None:
            mm = min_memory_plan(problem)
            c = evaluate(problem, mm)
            if not c.feasible:
                raise ValueError(f"no plan of {problem.name!r} fits the memory cap {problem.usage_limit:.4g} bytes: "
                                 f"the least possible peak is {c.peak_memory_bytes:.4g} bytes")
            best = polish_fn(problem, mm, time_budget_s=polish_time_s, lc=lc) if polish else mm
            binds = capped
        if refine_time_s is None:
            refine_time_s = REFINE_TIME_S if binds else 0.0
        if polish and refine_time_s > 0:
            from solvers.search import refine
            best = refine(problem, best, refine_time_s, seed=seed)
        best = [int(x) for x in best]
        if return_info:
            return best, {"plan_time_s": time.perf_counter() - t0, "candidates": tried, "cap_binds": binds}
        return best

    def finetune(self, problem: Problem, seconds: float, memory_cap_bytes=None, seed: int = 0,
                 num_envs: int = 4, num_steps: int = 64, progress: bool = False) -> list[dict]:
        """Continue PPO on ``problem`` alone for ``seconds`` of wall time (this Planner's params are
        updated; the shipped checkpoint is not touched). Returns the per-update stats."""
        import dataclasses

        from agent.ppo import PPOTrainer, problem_env_fn
        if seconds <= 0:
            return []
        if memory_cap_bytes is not None:
            problem = problem.with_usage_limit(float(memory_cap_bytes))
        cfg = dataclasses.replace(self.config, seed=seed, num_envs=num_envs, num_steps=num_steps, wandb=False)
        tr = PPOTrainer(cfg, env_fn=problem_env_fn(problem), params=self.params)
        stats = tr.train(seconds=seconds, progress=progress, log_wandb=False)
        self.params = tr.params
        self._head = None
        self._np_params = None
        return stats


polish_fn = polish


def cl_copy(pl: Planner) -> Planner:
    """A Planner sharing ``pl``'s parameters (fine-tuning one never changes the cached original)."""
    return Planner(pl.params, pl.config, source=pl.source, update=pl.update, extra=pl.extra)
