"""PPOConfig: everything that determines a PPO training run (recorded in checkpoints and wandb).

A frozen dataclass with a docstring per field and a strict ``from_dict`` (unknown fields are an
error), as CleanRL's configs; agent/ppo.py (the trainer) and agent/ppo_loss.py read it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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
    num_nodes − num_steps/2) is played by ``solvers.local.heuristic_plan`` (falling back to the
    env's best_incremental action where the mask forbids it), so long episodes (hundreds of
    nodes) train on their late decisions too, from sensible states."""
    scale_rewards: bool = True
    """Multiply each episode's rewards by R / C_h (R: the env's reference cost, C_h: the cost of
    ``solvers.local.heuristic_plan`` on the episode's problem), so a return of −1 means "as good
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
