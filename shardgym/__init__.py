"""shardgym: learn to plan how a model is sharded over a device mesh.

Public surface (see README and ../shared/DESIGN.md):
``trace, Cluster, build_problem, Problem, solve, evaluate, execute, verify, Plan`` (and ``Cost``,
``Limits``, ``LimitError``), from ``shardgym.api``. They load on first use, so ``import shardgym``
(and the ``shardgym iopddl`` command) does not import jax. Importing shardgym registers the
gymnasium environment ``shardgym/Sharding-v0``.
"""
import importlib

try:  # registering the env must never break the planner API
    import env  # noqa: F401
except ImportError:  # pragma: no cover - env package still being built
    pass

__all__ = ["Cluster", "Cost", "LimitError", "Limits", "OpGraph", "Plan", "Problem", "build_problem", "evaluate",
           "execute", "solve", "trace", "verify"]


def __getattr__(name):  # lazy: shardgym.api imports jax and flax; `shardgym iopddl` needs neither
    if name == "recompute":   # shardgym.recompute.choose: the planner's choice of recomputation
        return importlib.import_module("shardgym.recompute")
    if name in __all__ or name == "api":
        # not `from shardgym import api`: its hasattr check would call this function again
        api = importlib.import_module("shardgym.api")
        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module 'shardgym' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
