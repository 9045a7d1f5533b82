"""shardgym's agent: a Flax GNN policy (gnn.py) trained with PPO (ppo.py), optionally warm-started
by imitating ILP plans (imitation.py); checkpoints (checkpoints.py); and the Planner (planner.py)
that turns a checkpoint into plans for any Problem. The shipped policy is agent/pretrained/."""

__all__ = ["Planner"]


def __getattr__(name):  # lazy: importing agent must not import jax
    if name == "Planner":
        from agent.planner import Planner
        return Planner
    raise AttributeError(name)
