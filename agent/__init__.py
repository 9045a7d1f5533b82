"""shardgym's agent: a Flax GNN policy (gnn.py) trained with PPO (ppo.py: the trainer; ppo_loss.py:
the loss and GAE; ppo_config.py; rewards.py: reward scaling), optionally warm-started by imitating
teacher plans (imitation.py); checkpoints (checkpoints.py); run folders (runs.py); the training
entry point ``shardgym train`` calls (train.py; fgnn_train.py for the factor-graph network); and the
Planner (planner.py) that turns a checkpoint into plans for any Problem. The shipped policy is
agent/pretrained/."""

__all__ = ["Planner"]


def __getattr__(name):  # lazy: importing agent must not import jax
    if name == "Planner":
        from agent.planner import Planner
        return Planner
    raise AttributeError(name)
