"""shardgym: learn to plan how a model is sharded over a device mesh.

Public surface (see README and ../shared/DESIGN.md):
``trace, Cluster, build_problem, Problem, solve, evaluate, execute, verify, Plan``.
Importing shardgym registers the gymnasium environment ``shardgym/Sharding-v0``.
"""
from shardgym.api import (  # noqa: F401
    Cluster,
    Cost,
    OpGraph,
    Plan,
    Problem,
    build_problem,
    evaluate,
    execute,
    solve,
    trace,
    verify,
)

try:  # registering the env must never break the planner API
    import env  # noqa: F401
except ImportError:  # pragma: no cover - env package still being built
    pass

__all__ = ["Cluster", "Cost", "OpGraph", "Plan", "Problem", "build_problem", "evaluate", "execute", "solve", "trace",
           "verify"]
