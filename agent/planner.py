"""Planning with a trained policy: decode, keep the cheapest feasible of K plans, polish.

``Planner.load("pretrained" | "fgnn" | path)`` reads a checkpoint (agent/checkpoints.py; an fgnn
checkpoint gives an ``agent.fgnn_planner.FGPlanner``); ``plan(problem, mode, samples,
memory_cap_bytes, polish, seed)`` decodes ``samples`` plans (greedy = argmax; sample = draws from π),
repairs memory if needed, optionally improves each by the local-search library
(``solvers.local.improve``: repair, polish, refine), and returns the cheapest feasible one under
``costmodel.problem.evaluate``. ``memory_cap_bytes`` tightens the problem's own limit (the effective
cap is min(problem.usage_limit, cap), validated by ``costmodel.limits.Limits``); it never relaxes it.

Fast decoding. Stepping the GNN once per node would cost N forwards; instead the GNN embeds the
whole graph once every ``refresh`` decisions (refresh = max(1, ⌈N / max_passes⌉), so at most
``max_passes`` forwards), and between passes each decision uses the last node embeddings with the
*current* action features from the env's incremental state (resharding to decided neighbours,
peak rise, ...), scored by the policy head in numpy. With ``refresh=1`` this is exactly the
policy the env trains (small problems use that); with larger ``refresh`` the embeddings lag by
at most refresh−1 decisions, an approximation. The embedding itself runs in numpy too
(``agent.gnn.np_encode``, the Flax network's equations): nothing is jit-compiled, so the first
plan of a new graph size costs what later ones do.

Under a memory cap the polish alone is not enough: the cap couples every node live at the peak,
and the optimum often shards a parameter, its optimizer state and its whole update chain together,
which pays only when all of them move (forest moves break such groups up; the polish stalled at
1.2-1.7x the ILP on capped held-out problems). There ``plan`` adds a second start (the policy's
decode of the uncapped problem, repaired to fit) and, when the cap binds, ``solvers.local.refine``:
large-neighbourhood search with the exact MILP on 90-node BFS neighbourhoods
(``REFINE_TIME_LIMIT_S``).

Resharded copies (``Problem.edge_memory``) are priced by every step: the env's profile, the
repair (``solvers.local.repair_memory``, moves priced with their copies), the polish and refine,
and the fallback when no decode fits (``solvers.local.fitting_least_usage_plan``).
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from agent.checkpoints import load_checkpoint
from agent.fgnn_planner import FGPlanner
from agent.gnn import node_inputs, np_encode, np_mlp
from agent.ppo import PPOConfig, PPOTrainer, make_model, problem_env_fn
from costmodel.limits import Limits
from costmodel.problem import Problem, evaluate
from env.sharding_env import ShardingEnv
from solvers.local import (
    REFINE_TIME_LIMIT_S,
    LocalCosts,
    fitting_least_usage_plan,
    greedy_by_cost,
    heuristic_plan,
    improve,
    least_usage_plan,
    refine,
    repair_memory,
)
from solvers.local import polish as polish_plan  # ``Planner.plan`` has a flag named ``polish``

# ``heuristic_plan`` and ``greedy_by_cost`` live in solvers.local; they stay importable from here for
# agent/ppo.py, agent/train.py and tests/test_ablate.py (other owners) until those import them from there.
__all__ = ["DEFAULT_POLICY", "PRETRAINED", "PRETRAINED_FGNN", "Planner", "capped", "cl_copy", "greedy_by_cost", "heuristic_plan"]

PRETRAINED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained", "policy.msgpack")
PRETRAINED_FGNN = os.path.join(os.path.dirname(PRETRAINED), "fgnn.msgpack")   # the factor-graph network
#: what ``shardgym.solve(method="policy")`` plans with: the factor-graph network (README, "The
#: factor-graph network": its raw decode is a median 1.0x the ILP on the fg held-out split, the GNN
#: policy's 5.0x on its own split)
DEFAULT_POLICY = "fgnn"


def capped(problem: Problem, memory_cap_bytes) -> Problem:
    """``problem`` with its limit tightened to min(problem.usage_limit, memory_cap_bytes)
    (``costmodel.limits.Limits``: a cap that is not None must be a finite number > 0)."""
    return Limits.of(memory_cap_bytes=memory_cap_bytes).apply(problem)


_LOADED: dict = {}


class Planner:
    """A trained policy that plans any Problem; see the module docstring."""

    def __init__(self, params, config, source: str = "", update: int = 0, extra: dict | None = None):
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
        path = {"pretrained": PRETRAINED, "fgnn": PRETRAINED_FGNN}.get(which) or os.fspath(which)
        if not os.path.exists(path):
            hint = (" (the shipped policy is missing: train one with `shardgym train --minutes M` and copy its policy.msgpack there)"
                    if which == "pretrained" else "")
            raise FileNotFoundError(f"policy checkpoint {path!r} does not exist{hint}")
        stamp = (os.path.abspath(path), os.path.getmtime(path), os.path.getsize(path))
        if stamp in _LOADED:   # a fresh planner on the same (immutable) parameters: finetune replaces, never mutates
            src = _LOADED[stamp]
            if isinstance(src, FGPlanner):
                return FGPlanner(src.params, src.config.to_dict(), source=src.source, update=src.update, extra=src.extra)
            return cls(src.params, src.config, source=src.source, update=src.update, extra=src.extra)
        state = load_checkpoint(path)
        if isinstance(state["config"], dict) and state["config"].get("kind") == "fgnn":
            # cached too: from_state builds a template network (flax init), ~0.1 s a call on 2 cores
            _LOADED[stamp] = FGPlanner.from_state(state, path)
            return cls.load(which)
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
        n_params = sum(int(np.size(x)) for x in jax.tree.leaves(self.params))
        return {"source": self.source, "updates": self.update, "parameters": n_params,
                "hidden": self.config.hidden, "rounds": self.config.rounds, **{k: v for k, v in self.extra.items()
                                                                            if k in ("wall_s", "command", "git_rev")}}

    # ---- decoding ----
    def _head_params(self):
        if self._head is None:
            p = jax.device_get(self.params)["params"]
            self._head = {k: {kk: np.asarray(vv, np.float64) for kk, vv in v.items()} for k, v in p["policy_head"].items()}
        return self._head

    def _env(self, problem: Problem):
        return ShardingEnv(workloads=problem, copy_obs=False)

    def _embed_obs(self, obs):
        n = int(obs["node_mask"].sum())
        e = int(obs["edge_mask"].sum())
        if self._np_params is None:
            self._np_params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(self.params))
        h, g = np_encode(self._np_params, node_inputs(obs["node_features"][:n], obs["action_features"][:n]),
                         obs["edge_index"][:e], obs["edge_features"][:e], self.config.rounds)
        return np.asarray(h, np.float64), np.asarray(g, np.float64)

    def decode(self, env, greedy: bool = True, rng: np.random.Generator | None = None,
               max_passes: int = 16, seed: int = 0) -> tuple[list[int], object]:
        """One episode of ``env`` driven by the policy; returns (plan, Cost). The GNN runs once
        every ``refresh`` decisions (see the module docstring)."""
        head = self._head_params()
        obs, _ = env.reset(seed=seed)
        n_dec = env.unwrapped.episode.num_decisions
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
             polish: bool = True, seed: int = 0, max_passes: int = 16, polish_time_limit_s: float = 0.5,
             refine_time_limit_s: float | None = None, return_info: bool = False, time_limit_s: float | None = None):
        """The cheapest feasible of ``samples`` decoded plans (mode "greedy": the first is the
        argmax decode, the rest sampled; "sample": all sampled), each memory-repaired if needed
        and (``polish``) improved by local search. Under a memory cap with ``polish``, one more
        candidate is the greedy decode of the same problem without its cap, memory-repaired and
        polished (a second basin: the policy's uncapped plan, shrunk to fit). If that plan,
        polished without the cap, is over the cap (the cap *binds*), the best plan is then refined
        by ``solvers.local.refine`` for ``refine_time_limit_s`` (default ``REFINE_TIME_LIMIT_S``; 0 when the
        cap does not bind, e.g. a builder's device-memory limit far above the plan).
        ``time_limit_s`` (``shardgym.solve``'s; None: none) caps the refine at what the decodes left of it.
        ``return_info`` adds ``{"plan_time_s", "candidates", "cap_binds"}``. Raises ValueError if
        no plan fits the cap; ``memory_cap_bytes`` tightens the problem's limit (module docstring)."""
        if mode not in ("greedy", "sample"):
            raise ValueError(f"unknown mode {mode!r}; use 'greedy' or 'sample'")
        if int(samples) < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        problem = capped(problem, memory_cap_bytes)
        t0 = time.perf_counter()
        is_capped = problem.usage_limit is not None
        env = self._env(problem)
        rng = np.random.default_rng(seed)
        lc = LocalCosts(problem) if polish or is_capped else None
        best, best_cost, tried = None, np.inf, []
        starts = [(j, mode == "greedy" and j == 0, problem) for j in range(int(samples))]
        if is_capped and polish:
            starts.append((0, True, problem.with_usage_limit(None)))
        binds = False
        for j, greedy, start_problem in starts:
            free = start_problem is not problem
            strategies, _ = self.decode(self._env(start_problem) if free else env, greedy=greedy, rng=rng,
                                        max_passes=max_passes, seed=seed + j)
            if free:  # the uncapped start: its own optimum first, then shrunk to fit if it must be
                strategies = polish_plan(start_problem, strategies, time_limit_s=polish_time_limit_s, lc=lc)
                binds = evaluate(start_problem, strategies).peak_memory_bytes > problem.usage_limit
            raw = evaluate(problem, strategies)
            if free and raw.feasible:   # already polished, and it fits
                cand = strategies
            elif polish:
                cand = improve(problem, strategies, polish_time_limit_s=polish_time_limit_s, lc=lc)
            else:
                cand = strategies if raw.feasible else repair_memory(problem, strategies, lc=lc)
            cost = evaluate(problem, cand) if cand is not None else None
            tried.append({"raw_total": raw.total, "raw_feasible": raw.feasible, "uncapped_start": free,
                          "total": None if cost is None else cost.total,
                          "feasible": bool(cost is not None and cost.feasible)})
            if cost is not None and cost.feasible and cost.total < best_cost:
                best, best_cost = cand, cost.total
        if best is None:
            mm = fitting_least_usage_plan(problem, time_limit_s=max(polish_time_limit_s, 2.0))
            if mm is None:
                least = evaluate(problem, least_usage_plan(problem)).peak_memory_bytes
                copies = "" if problem.edge_memory is None else " (with its resharded copies; a repair found none)"
                raise ValueError(f"no plan of {problem.name!r} fits the memory cap {problem.usage_limit:.4g} bytes: "
                                 f"the least-usage plan peaks at {least:.4g} bytes{copies}")
            best = polish_plan(problem, mm, time_limit_s=polish_time_limit_s, lc=lc) if polish else mm
            binds = is_capped
        if refine_time_limit_s is None:
            refine_time_limit_s = REFINE_TIME_LIMIT_S if binds else 0.0
        if time_limit_s is not None:
            refine_time_limit_s = min(refine_time_limit_s, max(float(time_limit_s) - (time.perf_counter() - t0), 0.0))
        if polish and refine_time_limit_s > 0:
            best = refine(problem, best, refine_time_limit_s, seed=seed)
        best = [int(x) for x in best]
        if return_info:
            return best, {"plan_time_s": time.perf_counter() - t0, "candidates": tried, "cap_binds": binds}
        return best

    def finetune(self, problem: Problem, time_limit_s: float, memory_cap_bytes=None, seed: int = 0,
                 num_envs: int = 4, num_steps: int = 64, progress: bool = False) -> list[dict]:
        """Continue PPO on ``problem`` alone for ``time_limit_s`` of wall time (this Planner's params
        are updated; the shipped checkpoint is not touched). Returns the per-update stats."""
        if time_limit_s <= 0:
            return []
        problem = capped(problem, memory_cap_bytes)
        cfg = dataclasses.replace(self.config, seed=seed, num_envs=num_envs, num_steps=num_steps, wandb=False)
        tr = PPOTrainer(cfg, env_fn=problem_env_fn(problem), params=self.params)
        stats = tr.train(time_limit_s=time_limit_s, progress=progress, log_wandb=False)
        self.params = tr.params
        self._head = None
        self._np_params = None
        return stats


def cl_copy(pl: Planner) -> Planner:
    """A Planner sharing ``pl``'s parameters (fine-tuning one never changes the cached original)."""
    return Planner(pl.params, pl.config, source=pl.source, update=pl.update, extra=pl.extra)
