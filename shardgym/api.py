"""The functions users call: trace, build_problem, solve, evaluate, execute, verify.

This module only dispatches; the work lives in costmodel/, agent/ and shardgym/runtime.py.
"""
from __future__ import annotations

import time

from costmodel.cluster import Cluster
from costmodel.graph import OpGraph
from costmodel.problem import Cost, Plan, Problem, evaluate

__all__ = ["Cluster", "Cost", "OpGraph", "Plan", "Problem", "build_problem", "evaluate", "execute", "solve", "trace",
           "verify"]

METHODS = ("ilp", "policy", "dp", "megatron", "fsdp", "replicated")
OBJECTIVES = ("time", "memory", "redundancy")


def trace(fn, *args, **kw) -> OpGraph:
    """Trace ``fn(*args)`` (args may be ShapeDtypeStructs) into an OpGraph."""
    from costmodel.trace import trace as _trace
    return _trace(fn, *args, **kw)


def build_problem(graph: OpGraph, cluster, **kw) -> Problem:
    """Compile an OpGraph on a Cluster into a Problem (strategies, costs, resharding, liveness)."""
    from costmodel.builder import build_problem as _build
    return _build(graph, cluster, **kw)


def solve(problem: Problem, method: str = "ilp", objective: str = "time", memory_cap_bytes=None,
          max_step_time_s=None, time_limit_s: float = 60, **kw) -> Plan:
    """Plan ``problem`` with one of METHODS; see README for what each objective means."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    info: dict = {}
    if method == "ilp":
        from costmodel.ilp import solve_ilp
        if objective != "time" and max_step_time_s is not None and "initial_plans" not in kw:
            kw["initial_plans"] = _baseline_seeds(problem)
            # the seeds' time counts against the limit (at least 1 s is left to the solver)
            time_limit_s = max(1.0, float(time_limit_s) - (time.perf_counter() - t0))
        if problem.meta is not None and "initial_plan" not in kw:
            # strategy 0 of every traced node is "replicated": a plan HiGHS can start from, so a
            # time-limited solve of a big graph returns a plan instead of "no feasible plan found"
            replicated = [0] * problem.num_nodes
            kw["initial_plans"] = list(kw.get("initial_plans") or []) + [replicated]
            cap = min(x for x in (problem.usage_limit, memory_cap_bytes, float("inf")) if x is not None)
            if objective == "time" and evaluate(problem, replicated).peak_memory_bytes > cap:
                # replication does not fit (GPT-7B on 80 GiB): the baselines are the seeds
                kw["initial_plans"] += _baseline_seeds(problem)
                time_limit_s = max(1.0, float(time_limit_s) - (time.perf_counter() - t0))
        strategies, solve_info = solve_ilp(problem, objective=objective, memory_cap_bytes=memory_cap_bytes,
                                           max_step_time_s=max_step_time_s, time_limit_s=time_limit_s, **kw)
        info = solve_info.to_dict() if hasattr(solve_info, "to_dict") else dict(solve_info)
    elif method == "policy":
        from agent.planner import Planner
        planner = Planner.load(kw.pop("checkpoint", "pretrained"))
        strategies = planner.plan(problem, memory_cap_bytes=memory_cap_bytes, **kw)
        info = {"planner": planner.describe()} if hasattr(planner, "describe") else {}
    else:
        from costmodel.baselines import baseline_plan
        strategies = baseline_plan(problem, method)
    plan = Plan.for_problem(problem, strategies, method=method, objective=objective, info=info)
    plan.solve_time_s = time.perf_counter() - t0
    return plan


def _baseline_seeds(problem: Problem) -> list:
    """The baseline plans of a traced problem, as seeds for the memory / redundancy objectives under
    a step-time bound (the ILP then never answers worse than the best baseline within the bound).
    Empty for problems without roles (IOPDDL). Costs about a second or two per baseline."""
    if problem.meta is None or not getattr(problem.meta, "roles", None):
        return []
    from costmodel.baselines import METHODS as BASELINES
    from costmodel.baselines import baseline_plan
    seeds = []
    for m in BASELINES:
        try:
            seeds.append(baseline_plan(problem, m, ilp_time_limit_s=10.0))
        except (ValueError, RuntimeError):   # a rule that does not apply: skip that seed
            continue
    return seeds


def execute(fn, args, graph: OpGraph, plan: Plan, **kw):
    """Run ``fn(*args)`` sharded as ``plan`` says on the local devices; see shardgym/runtime.py."""
    from shardgym.runtime import execute as _execute
    return _execute(fn, args, graph, plan, **kw)


def verify(fn, args, graph: OpGraph, problem: Problem, plan: Plan | None = None, **kw):
    """Compile the plan (abstractly), compare XLA's memory with the model's, charge what the model
    missed from XLA's buffer assignment and re-solve, for a bounded number of rounds; returns a
    ``shardgym.verify.Verified`` (plan, charged problem, every round, XLA's fits verdict)."""
    from shardgym.verify import verify as _verify
    return _verify(fn, args, graph, problem, plan, solve=solve, **kw)

