"""PPO's loss, GAE and the jitted functions of the policy network (the trainer is agent/ppo.py).

Loss (per minibatch, advantages normalised):
    L = −mean(min(ρ A, clip(ρ, 1−ε, 1+ε) A)) + c_v · mean((V − R)²) − c_e · mean(H[π])
with ρ = π(a|o) / π_old(a|o), H the entropy over the valid strategies, R = A + V_old, and A from
GAE(γ, λ) over a (T, B) rollout (``gae``; an episode cut by the end of a rollout is bootstrapped
with the value estimate). ``jitted_step`` turns any such loss into one optimiser step; behaviour
cloning (agent/imitation.py) uses it too.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agent.gnn import ShardingGNN
from agent.ppo_config import PPOConfig


def make_model(config: PPOConfig) -> ShardingGNN:
    """The network of ``config`` (hidden width, message-passing rounds)."""
    return ShardingGNN(hidden=config.hidden, rounds=config.rounds)


def batched_apply(model, params, batch):
    """(logits, value) of a padded batch (``agent.gnn.pad_inputs``): the network vmapped over it."""
    return jax.vmap(lambda o: model.apply(params, o))(batch)


def make_act_fn(model):
    """jit: (params, batch, key) -> (sampled actions, their log-probabilities, values, greedy actions)."""

    @jax.jit
    def act(params, batch, key):
        logits, value = batched_apply(model, params, batch)
        a = jax.random.categorical(key, logits)
        logp = jax.nn.log_softmax(logits)
        return a, jnp.take_along_axis(logp, a[:, None], 1)[:, 0], value, jnp.argmax(logits, -1)
    return act


def make_optimizer(config: PPOConfig):
    """Global-norm clip, then AdamW (config's learning rate and weight decay)."""
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       optax.adamw(config.learning_rate, weight_decay=config.weight_decay))


def masked_entropy(logits, mask):
    """Entropy of the softmax over the valid (mask > 0) strategies."""
    logp = jax.nn.log_softmax(logits)
    p = jnp.exp(logp)
    return -jnp.sum(jnp.where(mask > 0, p * logp, 0.0), -1)


def make_update_fn(model, optimizer, config: PPOConfig):
    """The jitted PPO update on one minibatch (loss in the module docstring)."""
    def loss_fn(params, mb):
        logits, value = batched_apply(model, params, mb["obs"])
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
