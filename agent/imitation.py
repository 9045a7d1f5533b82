"""Warm start by behaviour cloning: imitate ILP-optimal plans on small problems.

For each (problem, plan) pair the environment is walked with the plan's action at every step
(teacher forcing), recording the observation, the action and the return-to-go. Training then
minimises, over minibatches of those steps,
    L = −mean(log π(a_ILP | o)) + c_v · mean((V(o) − G)²)
where G is the ILP plan's return-to-go, so the value head also starts sensible for PPO.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agent.gnn import model_input, pad_inputs
from agent.ppo import PPOTrainer
from agent.ppo_loss import batched_apply, jitted_step
from agent.rewards import reward_scale


def demonstrations(env, plan, seed: int = 0, keep: int | None = None, scale_rewards: bool = True) -> list[dict]:
    """Walk ``env`` (already bound to the plan's problem) taking ``plan[current_node]`` each step.
    Returns one record per step (obs as a model input, action, return-to-go); with ``keep``, only
    that many steps, chosen uniformly at random (seeded), are kept (long episodes are hundreds of
    steps of strongly correlated observations). Rewards are scaled as PPO scales them
    (``agent.rewards.reward_scale``) when ``scale_rewards``."""
    obs, info = env.reset(seed=seed)
    scale = reward_scale(env.unwrapped.problem, info["reference_cost"]) if scale_rewards else 1.0
    n = int(info.get("num_nodes", 0)) or 1
    rng = np.random.default_rng(seed)
    p_keep = 1.0 if keep is None else min(1.0, keep / n)
    steps, rewards = [], []
    while True:
        i = int(np.asarray(obs["current_node"]).reshape(-1)[0])
        a = int(plan[i])
        if not obs["action_mask"][a]:
            raise ValueError(f"demonstration plan picks masked strategy {a} for node {i}")
        if rng.random() < p_keep:
            steps.append({"obs": model_input(obs), "action": a, "t": len(rewards)})
        obs, r, term, trunc, _ = env.step(a)
        rewards.append(float(r) * scale)
        if term or trunc:
            break
    rtg = np.cumsum(np.asarray(rewards)[::-1])[::-1]
    for s in steps:
        s["return"] = float(rtg[s.pop("t")])
    return steps


def make_bc_update(model, optimizer, vf_coef: float = 0.5):
    def loss_fn(params, mb):
        logits, value = batched_apply(model, params, mb["obs"])
        logp = jax.nn.log_softmax(logits)
        nll = -jnp.mean(jnp.take_along_axis(logp, mb["actions"][:, None], 1)[:, 0])
        vloss = jnp.mean((value - mb["returns"]) ** 2)
        acc = jnp.mean(jnp.argmax(logits, -1) == mb["actions"])
        return nll + vf_coef * vloss, {"bc/nll": nll, "bc/value": vloss, "bc/accuracy": acc}

    return jitted_step(loss_fn, optimizer)


def behaviour_cloning(trainer: PPOTrainer, demos: Iterable[dict], epochs: int = 10, batch_size: int = 128,
                      time_limit_s: float | None = None, seed: int = 0, log: Callable[[dict], None] | None = None,
                      learning_rate: float = 1e-3) -> list[dict]:
    """Fit ``trainer.params`` to the demonstration steps for ``epochs`` epochs or until
    ``time_limit_s`` of wall time (checked after each minibatch), whichever ends first; the
    trainer's optimizer state is re-initialised afterwards so PPO starts with fresh Adam moments."""
    demos = list(demos)
    if not demos:
        raise ValueError("behaviour_cloning needs at least one demonstration step")
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate, weight_decay=1e-4))
    opt_state = opt.init(trainer.params)
    update = make_bc_update(trainer.model, opt)
    # Group by padded size so each minibatch pads only to its own bucket.
    order = sorted(range(len(demos)), key=lambda j: demos[j]["obs"]["nodes"].shape[0])
    chunks = [order[j:j + batch_size] for j in range(0, len(order), batch_size)]
    batches = []
    for c in chunks:
        if len(c) < batch_size:  # keep one shape per bucket: top up with repeats
            c = (c * (batch_size // max(len(c), 1) + 1))[:batch_size]
        batches.append({"obs": pad_inputs([demos[j]["obs"] for j in c]),
                        "actions": np.array([demos[j]["action"] for j in c], np.int32),
                        "returns": np.array([demos[j]["return"] for j in c], np.float32)})
    rng = np.random.default_rng(seed)
    params = trainer.params
    hist = []
    t0 = time.perf_counter()
    out_of_time = False
    for ep in range(epochs):
        acc = []
        for bi in rng.permutation(len(batches)):
            try:
                params, opt_state, st = update(params, opt_state, batches[bi])
            except KeyboardInterrupt:   # keep what was learnt: the caller saves trainer.params
                trainer.params = params
                trainer.opt_state = trainer.optimizer.init(params)
                raise
            acc.append({k: float(v) for k, v in st.items()})
            if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                out_of_time = True
                break
        rec = {k: float(np.mean([a[k] for a in acc])) for k in acc[0]} | {"bc/epoch": ep, "bc/batches": len(acc),
                                                                          "bc/elapsed_s": time.perf_counter() - t0}
        hist.append(rec)
        if log:
            log(rec)
        if out_of_time:
            break
    trainer.params = params
    trainer.opt_state = trainer.optimizer.init(params)
    return hist
