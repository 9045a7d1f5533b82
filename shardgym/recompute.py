"""The planner's choice of activation recomputation: ``choose(fn, args, cluster, ...)``.

For each recompute policy (``costmodel.trace.recompute.POLICIES``: None, the program as written;
``"dots"``; ``"dots_no_batch"``; ``"blocks"``) it traces the step with that policy, builds its Problem on
``cluster``, and solves the min-peak-memory objective within the step-time bound (the ILP,
``objective="memory"``, ``time_limit_s`` per policy; on a traced problem it is seeded with the
baselines, Megatron's plan and the all-replicated one among them: ``solvers.dispatch.solve_exact``). It returns the policy whose plan has the least predicted peak per device among those
within the bound, with that policy's graph, Problem and plan, and every policy's figures
(``Choice.candidates``; a policy whose step-time floor, ``solvers.ilp.bounds.step_time_floor``, is
above the bound is not solved: its row has ``peak_memory_bytes`` None and the floor as its step
time; so has a policy whose solve found no plan within the bound, its status "no plan: " and the
solver's error). ``sg.execute(fn, args, choice.graph, choice.plan)`` then runs the chosen
recomputing program (the graph carries its policy).

The bound is ``max_step_time_s`` (seconds, the model's step time) or ``bound_vs_megatron`` times the
plain program's Megatron step time (the issue's 1.05x). The choice is the model's: it is as good as
the model's memory and time predictions of each program (tests/test_recompute.py and README say by
how much they miss XLA's).
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodel.graph import OpGraph
from costmodel.problem import Cost, Plan, Problem
from costmodel.trace.recompute import POLICIES, check_policy
from shardgym.api import build_problem, evaluate, solve, trace
from solvers.baselines import baseline_plan
from solvers.ilp.bounds import step_time_floor


@dataclass(frozen=True)
class Choice:
    """The chosen policy with its graph, Problem, plan and the plan's Cost; ``candidates``: one dict
    per policy tried (policy, peak_memory_bytes, step_time_s, within_bound, status, solve_time_s,
    num_nodes), in the order tried; ``max_step_time_s``: the bound applied (None: none)."""

    policy: str | None
    graph: OpGraph
    problem: Problem
    plan: Plan
    cost: Cost
    candidates: tuple
    max_step_time_s: float | None


def megatron_step_time_s(problem: Problem) -> float:
    """The modelled step time of Megatron's plan (the rule, even where it breaks the problem's
    memory cap) on ``problem``: on the plain program's, what ``bound_vs_megatron`` multiplies."""
    return evaluate(problem, baseline_plan(problem, "megatron")).step_time_s


def choose(fn, args, cluster, max_step_time_s: float | None = None, bound_vs_megatron: float | None = None,
           time_limit_s: float = 60.0, policies=POLICIES, name: str = "") -> Choice:
    """Trace ``fn(*args)`` under each of ``policies``, solve the min-memory objective within the bound,
    and return the least predicted peak (the module docstring). One clear error when no policy's
    plan is within the bound."""
    policies = tuple(policies)
    if not policies:
        raise ValueError("choose: give at least one recompute policy")
    for p in policies:
        check_policy(p)
    if max_step_time_s is not None and bound_vs_megatron is not None:
        raise ValueError("choose: give max_step_time_s or bound_vs_megatron, not both")
    built = {}   # policy -> (graph, Problem): the plain program's is traced once, for the bound too

    def program(policy):
        if policy not in built:
            graph = trace(fn, *args, name=name, recompute=policy)
            built[policy] = (graph, build_problem(graph, cluster))
        return built[policy]

    if bound_vs_megatron is not None:
        if not bound_vs_megatron > 0:
            raise ValueError(f"choose: bound_vs_megatron must be > 0, got {bound_vs_megatron!r}")
        max_step_time_s = bound_vs_megatron * megatron_step_time_s(program(None)[1])
    best, rows = None, []
    for policy in policies:
        graph, problem = program(policy)
        floor = step_time_floor(problem)
        if max_step_time_s is not None and floor > max_step_time_s:   # no plan of this program is within
            rows.append({"policy": policy, "peak_memory_bytes": None, "step_time_s": floor, "within_bound": False,
                         "status": "step-time floor above the bound", "solve_time_s": 0.0,
                         "num_nodes": len(graph.nodes)})
            continue
        try:
            plan = solve(problem, method="ilp", objective="memory", max_step_time_s=max_step_time_s,
                         time_limit_s=time_limit_s)
        except RuntimeError as exc:   # the solver found no plan within the bound (nor did a seed): none
            rows.append({"policy": policy, "peak_memory_bytes": None, "step_time_s": floor, "within_bound": False,
                         "status": f"no plan: {exc}", "solve_time_s": None, "num_nodes": len(graph.nodes)})
            continue
        cost = evaluate(problem, plan)
        within = cost.feasible and (max_step_time_s is None or cost.step_time_s <= max_step_time_s)
        rows.append({"policy": policy, "peak_memory_bytes": cost.peak_memory_bytes, "step_time_s": cost.step_time_s,
                     "within_bound": within, "status": plan.info.get("status"), "solve_time_s": plan.solve_time_s,
                     "num_nodes": len(graph.nodes)})
        if within and (best is None or cost.peak_memory_bytes < best[4].peak_memory_bytes):
            best = (policy, graph, problem, plan, cost)
    if best is None:
        got = ", ".join(f"{r['policy']}: {r['step_time_s']:.4g} s" for r in rows)
        raise ValueError(f"choose: no policy's min-memory plan is within max_step_time_s={max_step_time_s:.4g} "
                         f"({got}); raise the bound")
    return Choice(*best, candidates=tuple(rows), max_step_time_s=max_step_time_s)
