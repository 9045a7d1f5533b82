"""PPO (clipped surrogate, GAE, entropy bonus, value loss) for the sharding GNN, with optax AdamW.

Rollouts: ``num_envs`` environments are stepped together; each step pads their observations to a
common bucket size (powers of two, so jit compiles a handful of shapes) and runs one jitted,
vmapped GNN forward for all of them. Every update starts from freshly reset environments whose
reset seeds are a function of (seed, update, slot, episode), and actions are sampled from a JAX key
carried in the trainer state, so training is a deterministic function of the config: resuming
from a checkpoint (params, optimizer state, key, update counter) continues bit-identically.
An episode cut by the end of a rollout is bootstrapped with the value estimate.

Loss (per minibatch, advantages normalised):
    L = −mean(min(ρ A, clip(ρ, 1−ε, 1+ε) A)) + c_v · mean((V − R)²) − c_e · mean(H[π])
with ρ = π(a|o) / π_old(a|o), R = A + V_old (GAE(γ, λ) returns).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agent.checkpoints import load_checkpoint, save_checkpoint
from agent.gnn import ShardingGNN, model_input


@dataclass(frozen=True)
class PPOConfig:
    """Everything that determines a training run (recorded in checkpoints and wandb)."""

    seed: int = 0
    """Seeds parameter init, action sampling and the environments' reset seeds."""
    hidden: int = 64
    """Width of node embeddings and of every MLP layer in the GNN."""
    rounds: int = 4
    """Message-passing rounds (each with its own forward/backward message weights)."""
    num_envs: int = 8
    """Environments stepped together in one rollout (one batched GNN forward per step)."""
    num_steps: int = 64
    """Steps per environment per update; the batch is num_envs * num_steps transitions."""
    learning_rate: float = 3e-4
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW decoupled weight decay."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip applied before AdamW."""
    gamma: float = 1.0
    """Discount; 1.0 because an episode's return is exactly −(plan cost)/(reference cost)."""
    gae_lambda: float = 0.95
    """GAE λ (bias/variance trade-off of the advantage estimate)."""
    clip_eps: float = 0.2
    """PPO ratio clip ε."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    epochs: int = 4
    """Optimisation passes over each rollout."""
    minibatches: int = 4
    """Minibatches per epoch."""
    split: str = "train"
    """Workload split the default environments sample from (env/workloads.py)."""
    random_fraction: float = 0.0
    """Share of episodes on random problems (env.workloads.random_problem) for diversity."""
    random_start: float = 0.0
    """Probability that an episode starts mid-way: a uniform number of prefix steps (up to
    num_nodes − num_steps/2) is played by ``agent.planner.heuristic_plan`` (falling back to the
    env's best_incremental action where the mask forbids it), so long episodes (hundreds of
    nodes) train on their late decisions too, from sensible states."""
    scale_rewards: bool = True
    """Multiply each episode's rewards by R / C_h (R: the env's reference cost, C_h: the cost of
    ``agent.planner.heuristic_plan`` on the episode's problem), so a return of −1 means "as good
    as the heuristic" on every problem. Reference costs differ from good plans by 1e-4x to 1e4x
    across workloads; unscaled, the value loss of a few problems swamps everything. A positive
    per-episode constant does not change which plan is optimal."""
    wandb: bool = True
    """Log to wandb (mode from $WANDB_MODE, default offline; tests set disabled)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PPOConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown PPOConfig fields: {', '.join(sorted(unknown))}")
        return cls(**d)


# ---- observations -------------------------------------------------------------------------
def bucket(n: int, lo: int = 8) -> int:
    """Smallest power of two ≥ max(n, lo): the padded size jit compiles for."""
    return max(lo, 1 << max(int(n) - 1, 0).bit_length())


def pad_inputs(xs: list[dict], n_pad: int | None = None, e_pad: int | None = None,
               k_pad: int | None = None) -> dict:
    """Stack model inputs (``agent.gnn.model_input``) into a batch padded to (n_pad, e_pad, k_pad)
    (default: bucketed maxima). Padding has mask 0 and zero features; padded edges point at node 0."""
    n_pad = n_pad or bucket(max(x["nodes"].shape[0] for x in xs))
    e_pad = e_pad or bucket(max(x["edge_index"].shape[0] for x in xs))
    k_pad = k_pad or bucket(max(x["action_mask"].shape[0] for x in xs), lo=2)
    B = len(xs)
    x0 = xs[0]
    fn, fe, fa = x0["nodes"].shape[1], x0["edge_features"].shape[1], x0["cur_action"].shape[1]
    out = {
        "nodes": np.zeros((B, n_pad, fn), np.float32),
        "edge_index": np.zeros((B, e_pad, 2), np.int32),
        "edge_features": np.zeros((B, e_pad, fe), np.float32),
        "node_mask": np.zeros((B, n_pad), np.int8),
        "edge_mask": np.zeros((B, e_pad), np.int8),
        "current_node": np.zeros((B,), np.int32),
        "cur_action": np.zeros((B, k_pad, fa), np.float32),
        "action_mask": np.zeros((B, k_pad), np.int8),
    }
    for b, x in enumerate(xs):
        n, e, k = x["nodes"].shape[0], x["edge_index"].shape[0], x["action_mask"].shape[0]
        out["nodes"][b, :n] = x["nodes"]
        out["edge_index"][b, :e] = x["edge_index"]
        out["edge_features"][b, :e] = x["edge_features"]
        out["node_mask"][b, :n] = x["node_mask"]
        out["edge_mask"][b, :e] = x["edge_mask"]
        out["current_node"][b] = x["current_node"]
        out["cur_action"][b, :k] = x["cur_action"]
        out["action_mask"][b, :k] = x["action_mask"]
    return out


def make_model(config: PPOConfig) -> ShardingGNN:
    return ShardingGNN(hidden=config.hidden, rounds=config.rounds)


def _batched_apply(model, params, batch):
    return jax.vmap(lambda o: model.apply(params, o))(batch)


def make_act_fn(model):
    """jit: (params, batch, key, greedy) -> (actions, logp, value)."""

    @jax.jit
    def act(params, batch, key):
        logits, value = _batched_apply(model, params, batch)
        a = jax.random.categorical(key, logits)
        logp = jax.nn.log_softmax(logits)
        return a, jnp.take_along_axis(logp, a[:, None], 1)[:, 0], value, jnp.argmax(logits, -1)
    return act


def make_optimizer(config: PPOConfig):
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.adamw(config.learning_rate, weight_decay=config.weight_decay))


def masked_entropy(logits, mask):
    logp = jax.nn.log_softmax(logits)
    p = jnp.exp(logp)
    return -jnp.sum(jnp.where(mask > 0, p * logp, 0.0), -1)


def make_update_fn(model, optimizer, config: PPOConfig):
    def loss_fn(params, mb):
        logits, value = _batched_apply(model, params, mb["obs"])
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, mb["actions"][:, None], 1)[:, 0]
        ratio = jnp.exp(logp - mb["logp"])
        adv = mb["adv"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps) * adv))
        vloss = jnp.mean((value - mb["returns"]) ** 2)
        ent = jnp.mean(masked_entropy(logits, mb["obs"]["action_mask"]))
        approx_kl = jnp.mean((ratio - 1) - (logp - mb["logp"]))
        loss = pg + config.vf_coef * vloss - config.ent_coef * ent
        return loss, {"losses/policy": pg, "losses/value": vloss, "losses/entropy": ent,
                      "losses/approx_kl": approx_kl,
                      "losses/clipfrac": jnp.mean(jnp.abs(ratio - 1) > config.clip_eps)}

    return jitted_step(loss_fn, optimizer)


def jitted_step(loss_fn, optimizer):
    """One jitted optimiser step on ``loss_fn(params, mb) -> (loss, stats)``:
    (params, opt_state, mb) -> (new params, new opt_state, stats)."""
    @jax.jit
    def update(params, opt_state, mb):
        (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
        upd, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, stats
    return update


def gae(rewards, values, dones, last_value, gamma, lam):
    """GAE over a (T, B) rollout; dones[t] = the episode ended after step t."""
    T = rewards.shape[0]
    adv = np.zeros_like(rewards)
    last = np.zeros(rewards.shape[1], np.float32)
    for t in reversed(range(T)):
        nonterm = 1.0 - dones[t]
        nxt = values[t + 1] if t + 1 < T else last_value
        delta = rewards[t] + gamma * nxt * nonterm - values[t]
        last = delta + gamma * lam * nonterm * last
        adv[t] = last
    return adv, adv + values


_HEURISTIC: dict = {}


def _problem_key(problem):
    return (problem.name, problem.num_nodes, problem.num_edges, float(problem.node_costs.sum()),
            float(problem.edge_costs.sum()), problem.usage_limit)


def heuristic_for(problem):
    """(cached) ``agent.planner.heuristic_plan`` of ``problem`` as an array (None if none is feasible)."""
    key = _problem_key(problem)
    if key not in _HEURISTIC:
        from agent.planner import heuristic_plan
        plan, _ = heuristic_plan(problem)
        _HEURISTIC[key] = None if plan is None else np.asarray(plan, np.int64)
    return _HEURISTIC[key]


def reward_scale(problem, reference_cost: float) -> float:
    """R / C_h (see PPOConfig.scale_rewards), cached by the problem's identity and contents."""
    from costmodel.problem import evaluate
    plan = heuristic_for(problem)
    c = evaluate(problem, plan).total if plan is not None else reference_cost
    return float(reference_cost / c) if c > 0 and np.isfinite(c) else 1.0


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
        from env.workloads import RandomProblemSampler, WorkloadSampler
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
        from env.sharding_env import ShardingEnv
        return ShardingEnv(workloads=MixedSampler(config.split, config.random_fraction), copy_obs=False)
    return make


def problem_env_fn(problem) -> Callable[[], object]:
    """Environments that always plan ``problem`` (tests, fine-tuning). Observations are the env's
    in-place arrays (copy_obs=False); ``model_input`` copies what it keeps."""
    def make():
        from env.sharding_env import ShardingEnv
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

    def _scale(self, env) -> float:
        """R / C_h for the env's current problem (cached per problem)."""
        if not self.config.scale_rewards:
            return 1.0
        return reward_scale(env.unwrapped.problem, env.unwrapped._c.reference_cost)

    def _reset(self, slot: int, episode: int) -> dict:
        """Reset env ``slot`` (seeded) and, with probability random_start, play a greedy prefix."""
        env = self.envs[slot]
        seed = self._reset_seed(slot, episode)
        obs, info = env.reset(seed=seed)
        rng = np.random.default_rng([seed, 1])
        self._full[slot] = True
        self._scales[slot] = self._scale(env)
        n = int(info.get("num_nodes", 0))
        if self.config.random_start > 0 and rng.random() < self.config.random_start:
            from env.features import ACTION_INDEX
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
    def train(self, num_updates: int | None = None, seconds: float | None = None,
              checkpoint_path=None, checkpoint_every: int = 10, progress: bool = True,
              log_wandb: bool | None = None) -> list[dict]:
        """Run updates until ``num_updates`` more are done or ``seconds`` pass (whichever first).
        Ctrl-C saves a checkpoint (if a path is given) and returns cleanly, with
        ``self.interrupted`` set."""
        self.interrupted, self.interrupt = False, None
        if num_updates is None and seconds is None:
            raise ValueError("give num_updates or seconds")
        if (self.config.wandb if log_wandb is None else log_wandb) and self._wandb is None:
            self._wandb = _init_wandb(self.config)
        t0 = time.perf_counter()
        done = 0
        out = []
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        with Progress(TextColumn("PPO"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[msg]}"), TimeElapsedColumn(), disable=not progress) as bar:
            task = bar.add_task("ppo", total=num_updates, msg="")
            try:
                while (num_updates is None or done < num_updates) and \
                        (seconds is None or time.perf_counter() - t0 < seconds):
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
        from flax import serialization
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


def git_rev() -> str:
    """HEAD commit of the repository holding this file ("unknown" without git)."""
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def init_params(model, obs: dict, key):
    """Initialise parameters from one env observation."""
    return model.init(key, {k: jnp.asarray(v[0]) for k, v in pad_inputs([model_input(obs)]).items()})
