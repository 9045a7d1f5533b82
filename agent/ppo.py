"""The PPO trainer of the sharding GNN: rollouts, minibatch updates, checkpoints, wandb.

Rollouts: ``num_envs`` environments are stepped together; each step pads their observations to a
common bucket size (``agent.gnn.pad_inputs``: powers of two, so jit compiles a handful of shapes)
and runs one jitted, vmapped GNN forward for all of them. Every update starts from freshly reset
environments whose reset seeds are a function of (seed, update, slot, episode), and actions are
sampled from a JAX key carried in the trainer state, so training is a deterministic function of the
config: resuming from a checkpoint (params, optimizer state, key, update counter) continues
bit-identically. The loss and GAE are agent/ppo_loss.py; the config is agent/ppo_config.py;
reward scaling is agent/rewards.py.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from agent.checkpoints import load_checkpoint, save_checkpoint
from agent.gnn import init_params, model_input, pad_inputs
from agent.ppo_config import PPOConfig
from agent.ppo_loss import gae, make_act_fn, make_model, make_optimizer, make_update_fn
from agent.rewards import heuristic_for, reward_scale
from agent.runs import git_rev
from env.features import ACTION_INDEX
from env.sharding_env import ShardingEnv
from env.workloads import RandomProblemSampler, WorkloadSampler

#: what callers import from here (the trainer's config, network and batching live next door)
__all__ = ["MixedSampler", "PPOConfig", "PPOTrainer", "default_env_fn", "heuristic_for", "make_model",
           "pad_inputs", "problem_env_fn"]


def _cost_total(x) -> float:
    return float(getattr(x, "total", x))


def _fn_key(config: PPOConfig) -> PPOConfig:
    """The config with the fields that do not change the jitted functions normalised away."""
    return dataclasses.replace(config, seed=0, num_envs=1, num_steps=1, epochs=1, minibatches=1,
                               split="train", random_fraction=0.0, wandb=False)


@functools.lru_cache(maxsize=16)
def _compiled_fns(key: PPOConfig):
    """(model, optimizer, act, update) shared by every trainer with the same network and loss, so
    a second trainer (resume, fine-tune) reuses jit's compilation cache."""
    model = make_model(key)
    opt = make_optimizer(key)
    return model, opt, make_act_fn(model), make_update_fn(model, opt, key)


# ---- environments -------------------------------------------------------------------------
class MixedSampler:
    """rng -> Problem: a train-split workload, or with probability ``random_fraction`` a random
    problem (env.workloads.RandomProblemSampler) for diversity."""

    def __init__(self, split: str = "train", random_fraction: float = 0.0, random_nodes=(20, 200)):
        self.split, self.random_fraction = split, float(random_fraction)
        self.work = WorkloadSampler(split)
        self.rand = RandomProblemSampler(nodes=random_nodes)

    def __call__(self, rng):
        if self.random_fraction > 0 and rng.random() < self.random_fraction:
            return self.rand(rng)
        return self.work(rng)

    @property
    def max_sizes(self) -> dict:
        a = self.work.max_sizes if self.random_fraction < 1 else {"nodes": 1, "edges": 1, "strategies": 1}
        b = self.rand.max_sizes if self.random_fraction > 0 else {"nodes": 1, "edges": 1, "strategies": 1}
        return {k: max(a[k], b[k]) for k in a}


def default_env_fn(config: PPOConfig) -> Callable[[], object]:
    """Environments that sample a workload of ``config.split`` at every reset."""
    def make():
        return ShardingEnv(workloads=MixedSampler(config.split, config.random_fraction), copy_obs=False)
    return make


def problem_env_fn(problem) -> Callable[[], object]:
    """Environments that always plan ``problem`` (tests, fine-tuning). Observations are the env's
    in-place arrays (copy_obs=False); ``model_input`` copies what it keeps."""
    def make():
        return ShardingEnv(workloads=problem, copy_obs=False)
    return make


# ---- trainer ------------------------------------------------------------------------------
class PPOTrainer:
    """Holds the training state (params, optimizer state, key, update counter) and the envs."""

    def __init__(self, config: PPOConfig, env_fn: Callable[[], object] | None = None, params=None):
        self.config = config
        self.env_fn = env_fn or default_env_fn(config)
        self.envs = [self.env_fn() for _ in range(config.num_envs)]
        self.model, self.optimizer, self._act, self._update = _compiled_fns(_fn_key(config))
        key = jax.random.PRNGKey(config.seed)
        key, init_key = jax.random.split(key)
        if params is None:
            obs, _ = self.envs[0].reset(seed=config.seed)
            params = init_params(self.model, obs, init_key)
        self.params = params
        self.opt_state = self.optimizer.init(params)
        self.key = key
        self.update_count = 0
        self._wandb = None
        self.history: list[dict] = []

    # ---- rollouts ----
    def _reset_seed(self, slot: int, episode: int) -> int:
        return int(np.random.default_rng([self.config.seed, self.update_count, slot, episode]).integers(2**31 - 1))

    def _scale(self, env, reset_info: dict) -> float:
        """R / C_h for the env's current problem (cached per problem; R from the reset's info)."""
        if not self.config.scale_rewards:
            return 1.0
        return reward_scale(env.unwrapped.problem, reset_info["reference_cost"])

    def _reset(self, slot: int, episode: int) -> dict:
        """Reset env ``slot`` (seeded) and, with probability random_start, play a greedy prefix."""
        env = self.envs[slot]
        seed = self._reset_seed(slot, episode)
        obs, info = env.reset(seed=seed)
        rng = np.random.default_rng([seed, 1])
        self._full[slot] = True
        self._scales[slot] = self._scale(env, info)
        n = int(info.get("num_nodes", 0))
        if self.config.random_start > 0 and rng.random() < self.config.random_start:
            col = ACTION_INDEX["best_incremental"]
            prefix = int(rng.integers(0, max(1, n - self.config.num_steps // 2)))
            self._full[slot] = prefix == 0
            guide = heuristic_for(env.unwrapped.problem) if prefix else None
            for _ in range(prefix):
                cur = int(obs["current_node"][0])
                if guide is not None and obs["action_mask"][guide[cur]]:
                    a = int(guide[cur])
                else:
                    a = int(np.argmax(np.where(obs["action_mask"] > 0, obs["action_features"][cur, :, col], -1)))
                obs, _, term, trunc, _ = env.step(a)
                if term or trunc:
                    obs, _ = env.reset(seed=seed)
                    break
        return obs

    def collect(self):
        """One rollout of num_steps x num_envs transitions (from freshly reset environments)."""
        cfg = self.config
        B, T = cfg.num_envs, cfg.num_steps
        episodes = [0] * B
        self._full = [False] * B
        self._scales = [1.0] * B
        obs = [model_input(self._reset(b, 0)) for b in range(B)]
        ep_ret = np.zeros(B)
        stored, actions = [], np.zeros((T, B), np.int32)
        logps, values = np.zeros((T, B), np.float32), np.zeros((T, B), np.float32)
        rewards, dones = np.zeros((T, B), np.float32), np.zeros((T, B), np.float32)
        finished = []
        for t in range(T):
            batch = pad_inputs(obs)
            self.key, k = jax.random.split(self.key)
            a, lp, v, _ = self._act(self.params, batch, k)
            a, lp, v = np.asarray(a), np.asarray(lp), np.asarray(v)
            stored.append(obs)
            actions[t], logps[t], values[t] = a, lp, v
            nxt = []
            for b, env in enumerate(self.envs):
                o, r, term, trunc, info = env.step(int(a[b]))
                rewards[t, b] = r * self._scales[b]
                ep_ret[b] += r * self._scales[b]
                if term or trunc:
                    dones[t, b] = 1.0
                    ref = info.get("reference_cost")
                    cost = info.get("cost")
                    finished.append({"return": float(ep_ret[b]), "full": self._full[b],
                                     "cost_ratio": (_cost_total(cost) / _cost_total(ref) * self._scales[b])
                                     if cost is not None and ref else float("nan")})
                    ep_ret[b] = 0.0
                    episodes[b] += 1
                    o = self._reset(b, episodes[b])
                nxt.append(model_input(o))
            obs = nxt
        self.key, k = jax.random.split(self.key)
        _, _, last_v, _ = self._act(self.params, pad_inputs(obs), k)
        last_v = np.asarray(last_v)
        adv, ret = gae(rewards, values, dones, last_v, cfg.gamma, cfg.gae_lambda)
        flat_obs = [o for row in stored for o in row]
        return {"obs": flat_obs, "actions": actions.reshape(-1), "logp": logps.reshape(-1),
                "adv": adv.reshape(-1), "returns": ret.reshape(-1)}, finished

    # ---- one update ----
    def update(self) -> dict:
        """One PPO update. Interrupted part-way (Ctrl-C), it leaves the state as before it started
        (the key is restored; params and optimizer state change only at the end), so the
        checkpoint saved at Ctrl-C resumes bit-identically."""
        key0 = self.key
        try:
            return self._update_once()
        except KeyboardInterrupt:
            self.key = key0
            raise

    def _update_once(self) -> dict:
        cfg = self.config
        t0 = time.perf_counter()
        roll, finished = self.collect()
        t_roll = time.perf_counter() - t0
        batch_obs = pad_inputs(roll["obs"])
        n = len(roll["actions"])
        mb_size = n // cfg.minibatches
        perm_rng = np.random.default_rng([cfg.seed, self.update_count, 7])
        params, opt_state = self.params, self.opt_state
        stats_acc: dict[str, list] = {}
        for _ in range(cfg.epochs):
            perm = perm_rng.permutation(n)
            for m in range(cfg.minibatches):
                idx = perm[m * mb_size:(m + 1) * mb_size]
                mb = {"obs": {k: v[idx] for k, v in batch_obs.items()}, "actions": roll["actions"][idx],
                      "logp": roll["logp"][idx], "adv": roll["adv"][idx], "returns": roll["returns"][idx]}
                params, opt_state, st = self._update(params, opt_state, mb)
                for k, v in st.items():
                    stats_acc.setdefault(k, []).append(float(v))
        self.params, self.opt_state, self.update_count = params, opt_state, self.update_count + 1
        stats = {k: float(np.mean(v)) for k, v in stats_acc.items()}
        if finished:
            full = [f["return"] for f in finished if f["full"]]
            if full:
                stats["charts/episodic_return"] = float(np.mean(full))
            stats["charts/cost_ratio"] = float(np.nanmean([f["cost_ratio"] for f in finished]))
        stats["charts/episodes"] = len(finished)
        stats["charts/rollout_s"] = t_roll
        stats["charts/update_s"] = time.perf_counter() - t0
        stats["update"] = self.update_count
        self.history.append(stats)
        if self._wandb is not None:
            self._wandb.log(stats, step=self.update_count)
        return stats

    # ---- loop ----
    def train(self, num_updates: int | None = None, time_limit_s: float | None = None,
              checkpoint_path=None, checkpoint_every: int = 10, progress: bool = True,
              log_wandb: bool | None = None) -> list[dict]:
        """Run updates until ``num_updates`` more are done or ``time_limit_s`` pass (whichever first).
        Ctrl-C saves a checkpoint (if a path is given) and returns cleanly, with
        ``self.interrupted`` set."""
        self.interrupted, self.interrupt = False, None
        if num_updates is None and time_limit_s is None:
            raise ValueError("give num_updates or time_limit_s")
        if (self.config.wandb if log_wandb is None else log_wandb) and self._wandb is None:
            self._wandb = _init_wandb(self.config)
        t0 = time.perf_counter()
        done = 0
        out = []
        with Progress(TextColumn("PPO"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[msg]}"), TimeElapsedColumn(), disable=not progress) as bar:
            task = bar.add_task("ppo", total=num_updates, msg="")
            try:
                while (num_updates is None or done < num_updates) and \
                        (time_limit_s is None or time.perf_counter() - t0 < time_limit_s):
                    st = self.update()
                    out.append(st)
                    done += 1
                    bar.update(task, advance=1, msg=f"return {st.get('charts/episodic_return', float('nan')):.3f} "
                                                    f"ratio {st.get('charts/cost_ratio', float('nan')):.3f}")
                    if checkpoint_path and checkpoint_every and self.update_count % checkpoint_every == 0:
                        self.save(checkpoint_path)
            except KeyboardInterrupt as exc:
                self.interrupted, self.interrupt = True, exc
                if checkpoint_path:
                    self.save(checkpoint_path)
                print(f"interrupted after update {self.update_count}; "
                      + (f"checkpoint saved to {checkpoint_path}" if checkpoint_path else "no checkpoint path"))
        if checkpoint_path:
            self.save(checkpoint_path)
        return out

    # ---- checkpoints ----
    def save(self, path, extra: dict | None = None) -> str:
        return save_checkpoint(path, self.params, self.config.to_dict(), opt_state=self.opt_state,
                               rng=self.key, update=self.update_count, extra=extra)

    @classmethod
    def load(cls, path, env_fn=None, config_overrides: dict | None = None) -> PPOTrainer:
        """Resume from a checkpoint: params, optimizer state, key and update counter restored."""
        state = load_checkpoint(path)
        cfg = PPOConfig.from_dict({**state["config"], **(config_overrides or {})})
        tr = cls(cfg, env_fn=env_fn, params=state["params"])
        try:
            tr.params = serialization.from_state_dict(tr.params, state["params"])
            if state.get("opt_state") is not None:
                tr.opt_state = serialization.from_state_dict(tr.opt_state, state["opt_state"])
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"checkpoint {path!r} does not match the model in its config ({exc})") from exc
        if state.get("rng") is not None:
            tr.key = jnp.asarray(state["rng"], dtype=jnp.uint32)
        tr.update_count = state["update"]
        return tr

    def close(self):
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _init_wandb(config: PPOConfig):
    try:
        import wandb
    except ImportError:  # pragma: no cover
        return None
    return wandb.init(project="shardgym", mode=os.environ.get("WANDB_MODE", "offline"),
                      config={**config.to_dict(), "git_rev": git_rev()}, reinit=True)
