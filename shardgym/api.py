"""The functions users call: trace, build_problem, solve, evaluate, execute, verify.

This module only dispatches; the work lives in costmodel/, agent/ and runtime/core.py.
"""
from __future__ import annotations

import time

from costmodel.cluster import Cluster
from costmodel.graph import OpGraph
from costmodel.problem import Cost, Plan, Problem, evaluate
from solvers.capped import milp_ok

__all__ = ["Cluster", "Cost", "OpGraph", "Plan", "Problem", "build_problem", "evaluate", "execute", "solve", "trace",
           "verify"]

METHODS = ("ilp", "policy", "dp", "megatron", "fsdp", "replicated")
OBJECTIVES = ("time", "memory", "redundancy")


class UnmetBoundError(ValueError):
    """A method that cannot take a memory cap or a step-time bound into account (a baseline rule, the
    policy for the bound) gave a plan that breaks it; ``plan`` and ``cost`` are that plan."""

    def __init__(self, message: str, plan, cost):
        super().__init__(message)
        self.plan, self.cost = plan, cost


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
    if method != "ilp" and objective != "time":
        raise ValueError(f"objective {objective!r}: method {method!r} plans for step time only "
                         f"(use method 'ilp' for the {objective} objective)")
    t0 = time.perf_counter()
    info: dict = {}
    cap = _binding_cap(problem, memory_cap_bytes) if method == "ilp" else None
    if (cap is not None and objective == "time" and max_step_time_s is None and milp_ok(problem)
            and set(kw) <= {"initial_plan", "initial_plans", "threads"}):
        if problem.edge_memory is None:
            strategies, info = _solve_capped_time(problem, cap, float(time_limit_s), t0, **kw)
        else:   # the capped core prices node memory only: fit the copies by lowering its cap
            strategies, info = _fit_copies(
                problem, cap, float(time_limit_s),
                lambda sur, c, left: _solve_capped_time(sur, c, left, time.perf_counter(), **kw))
            if strategies is None:
                raise RuntimeError(f"no plan of {problem.name!r} with its resharded copies fits the memory cap "
                                   f"{cap:.4g} bytes within time_limit_s={time_limit_s:g}; raise time_limit_s")
    elif method == "ilp":
        from solvers.ilp import solve_ilp
        # with copy groups (edge_memory) the memory objective's phase 1 is a MIP too: seed it
        if objective != "time" and ((max_step_time_s is not None and "initial_plans" not in kw)
                                    or problem.edge_memory is not None):
            kw["initial_plans"] = list(kw.get("initial_plans") or []) + _baseline_seeds(problem)
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
        if not kw.pop("search", True):   # the raw decode: one forward pass + the masked decode, no polish/refine
            kw["polish"] = False
        pcap = _binding_cap(problem, memory_cap_bytes)
        strategies, error = None, None
        try:
            strategies = planner.plan(problem, memory_cap_bytes=memory_cap_bytes, **kw)
        except ValueError as exc:   # the planner's least-usage fallback does not see copies
            error = exc
        if (pcap is not None and problem.edge_memory is not None
                and (strategies is None or not evaluate(problem.with_usage_limit(pcap), strategies).feasible)):
            fitted, _ = _fit_copies(problem, pcap, float(time_limit_s),
                                    lambda sur, c, left: (planner.plan(sur, memory_cap_bytes=c, **kw), {}))
            strategies = fitted if fitted is not None else strategies
        if strategies is None:
            raise error
        info = {"planner": planner.describe()} if hasattr(planner, "describe") else {}
    else:
        from solvers.baselines import baseline_plan
        strategies = baseline_plan(problem, method)
    if method != "ilp":
        info.setdefault("status", "heuristic" if method == "policy" else "rule")
        info.setdefault("gap", None)
    plan = Plan.for_problem(problem, strategies, method=method, objective=objective, info=info)
    plan.solve_time_s = time.perf_counter() - t0
    if method != "ilp":
        _check_bounds(problem, plan, method, memory_cap_bytes, max_step_time_s)
    return plan


def _check_bounds(problem: Problem, plan: Plan, method: str, memory_cap_bytes, max_step_time_s) -> None:
    """UnmetBoundError when a non-ILP plan breaks the cap (``memory_cap_bytes`` or the problem's
    usage limit) or ``max_step_time_s``: these methods cannot aim at them, so they are checked."""
    cost = evaluate(problem, plan)
    caps = [x for x in (memory_cap_bytes, problem.usage_limit) if x is not None]
    if caps and cost.peak_memory_bytes > min(caps):
        raise UnmetBoundError(f"method {method!r}: its plan needs {cost.peak_memory_bytes:.4g} bytes/device, over the "
                              f"memory cap {min(caps):.4g}; raise the cap or use method 'ilp'", plan, cost)
    if max_step_time_s is not None and cost.step_time_s > max_step_time_s:
        raise UnmetBoundError(f"method {method!r}: its plan takes {cost.step_time_s:.4g} s a step, over the bound "
                              f"max_step_time_s={max_step_time_s:g}; raise the bound or use method 'ilp'", plan, cost)


def _binding_cap(problem: Problem, memory_cap_bytes):
    """min(usage limit, memory_cap_bytes) when some plan can exceed it (every node at its largest
    usage breaks it), else None."""
    caps = [x for x in (problem.usage_limit, memory_cap_bytes) if x is not None]
    if not caps:
        return None
    cap = float(min(caps))
    if cap < 0:
        raise ValueError(f"memory_cap_bytes must be >= 0, got {memory_cap_bytes}")
    import numpy as np
    offs = problem.strategy_offsets[:-1]
    local = np.arange(len(problem.node_usages)) - np.repeat(offs, problem.num_strategies)
    order = np.lexsort((local, -problem.node_usages, np.repeat(np.arange(problem.num_nodes), problem.num_strategies)))
    worst = local[order[offs]]
    return cap if evaluate(problem.with_usage_limit(None), worst).peak_memory_bytes > cap else None


def _solve_capped_time(problem: Problem, cap: float, time_limit_s: float, t0: float, initial_plan=None,
                       initial_plans=None, threads=None):
    """Time objective under a memory cap that can bind: ``solvers.capped.solve_capped`` seeded
    with the given plans, replicated (traced problems) and the baselines when replication does not
    fit; never worse than any of them (nor than BP or the search inside). The policy's plan is
    not a default seed: Planner.plan took 75-95 s on gpt tiny under this machine's load (pass it
    as ``initial_plans`` to have it count). Only on graphs the MILP
    holds (``solvers.capped.milp_ok``); bigger ones keep ``solve_ilp``'s uncapped-LP-first path. The seeds' time counts
    against the limit. Falls back to ``solve_ilp`` (for its infeasibility report) when no plan
    fits."""
    from solvers.capped import solve_guarded
    from solvers.ilp import solve_ilp
    capped = problem.with_usage_limit(cap)
    seeds = ([] if initial_plan is None else [initial_plan]) + list(initial_plans or [])
    seeds = [list(getattr(s, "strategies", s)) for s in seeds]
    if problem.meta is not None:
        replicated = [0] * problem.num_nodes
        seeds.append(replicated)
        if evaluate(capped, replicated).peak_memory_bytes > cap:
            seeds += _baseline_seeds(problem, use_ilp=False)   # the rules' plans without their own ILP
    left = max(3.0, time_limit_s - (time.perf_counter() - t0))
    r = solve_guarded(capped, left, seeds=seeds, threads=threads, relax_cap=True)
    if r.plan is None:
        return solve_ilp(problem, objective="time", memory_cap_bytes=cap, time_limit_s=left)[0], {}
    info = dict(r.milp_info.to_dict()) if r.milp_info is not None else {}
    info.update({"status": r.status, "objective": r.cost, "bound": r.bound if r.gap is not None else None,
                 "gap": r.gap, "wall_s": time.perf_counter() - t0, "source": r.source,
                 "objective_name": "time"})
    return r.plan, info


def _fit_copies(problem: Problem, cap: float, time_limit_s: float, solve_under, rounds: int = 6):
    """Solvers that price node memory only (the capped core, the policy planner) on a problem with
    copy groups (``Problem.edge_memory``): each round plans the copy-free surrogate under a cap
    lowered by the excess that the last plan's copies put over ``cap`` by ``evaluate`` (which
    prices them), until a plan fits; the first that fits is returned. ``solve_under(surrogate,
    cap, seconds_left)`` returns (strategies, info); a ValueError (nothing fits the lowered cap)
    ends the rounds. Returns (None, {}) when no round fits. A heuristic: the copies a plan carries
    change with the plan, so no round count is proven to reach a fit."""
    from dataclasses import replace
    t0 = time.perf_counter()
    surrogate = replace(problem, edge_memory=None)
    target = problem.with_usage_limit(cap)
    c, tried = cap, []
    for r in range(rounds):
        left = time_limit_s - (time.perf_counter() - t0)
        if left < 1.0 or c <= 0:
            break
        try:
            s, info = solve_under(surrogate, c, left / max(1, min(2, rounds - r)))
        except (ValueError, RuntimeError):
            break
        if s is None:
            break
        cost = evaluate(target, s)
        tried.append({"surrogate_cap_bytes": c, "peak_bytes": cost.peak_memory_bytes, "total": cost.total})
        if cost.feasible:
            info = dict(info, copy_rounds=tried, gap=None, bound=None)   # no proof for the copies
            if info.get("status") == "optimal":   # optimal for the surrogate only
                info["status"] = "feasible"
            return [int(x) for x in s], info
        c -= 1.05 * (cost.peak_memory_bytes - cap)
    return None, {}


def _baseline_seeds(problem: Problem, use_ilp: bool = True) -> list:
    """The baseline plans of a traced problem, as seeds for the memory / redundancy objectives under
    a step-time bound (the ILP then never answers worse than the best baseline within the bound).
    Empty for problems without roles (IOPDDL). Costs about a second or two per baseline."""
    if problem.meta is None or not getattr(problem.meta, "roles", None):
        return []
    from solvers.baselines import METHODS as BASELINES
    from solvers.baselines import baseline_plan
    seeds = []
    for m in BASELINES:
        try:
            seeds.append(baseline_plan(problem, m, use_ilp=use_ilp, ilp_time_limit_s=10.0))
        except (ValueError, RuntimeError):   # a rule that does not apply: skip that seed
            continue
    return seeds


def execute(fn, args, graph: OpGraph, plan: Plan, **kw):
    """Run ``fn(*args)`` sharded as ``plan`` says on the local devices; see runtime/core.py."""
    from runtime.core import execute as _execute
    return _execute(fn, args, graph, plan, **kw)


def verify(fn, args, graph: OpGraph, problem: Problem, plan: Plan | None = None, **kw):
    """Compile the plan (abstractly), compare XLA's memory with the model's, charge what the model
    missed from XLA's buffer assignment and re-solve, for a bounded number of rounds; returns a
    ``shardgym.verify.Verified`` (plan, charged problem, every round, XLA's fits verdict)."""
    from shardgym.verify import verify as _verify
    return _verify(fn, args, graph, problem, plan, solve=solve, **kw)

