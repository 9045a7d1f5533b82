"""shardgym's gymnasium environment. ``import env`` registers ``shardgym/Sharding-v0``.

    env = gymnasium.make("shardgym/Sharding-v0")                  # gpt tiny on cpu-2x4
    env = gymnasium.make("shardgym/Sharding-v0", workloads=problem, weights={"memory": 1.0})
"""
import gymnasium as gym

from env.features import ACTION_FEATURES, EDGE_FEATURES, NODE_FEATURES  # noqa: F401

ENV_ID = "shardgym/Sharding-v0"

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="env.sharding_env:ShardingEnv", disable_env_checker=False)


def __getattr__(name):  # lazy: importing the env package stays cheap
    if name == "ShardingEnv":
        from env.sharding_env import ShardingEnv
        return ShardingEnv
    raise AttributeError(name)


__all__ = ["ACTION_FEATURES", "EDGE_FEATURES", "ENV_ID", "NODE_FEATURES", "ShardingEnv"]
