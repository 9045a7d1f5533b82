"""The functions users call: trace, build_problem, solve, evaluate, execute, verify.

A thin face: the work lives in costmodel/ (trace, build_problem, evaluate, Limits), solvers/
(``solvers.dispatch``: the ILP and the baselines), agent/ (the policy) and runtime/ (execute).
``solve`` owns one step itself: it validates the limits once (``costmodel.limits.Limits``) and
applies them, so every method sees the same effective cap min(device memory, memory_cap_bytes) as
the Problem's ``usage_limit`` (a cap above device memory does not bind: device memory does).
"""
from __future__ import annotations

import time
import warnings

from agent.planner import DEFAULT_POLICY, Planner
from costmodel.builder import build_problem
from costmodel.cluster import Cluster
from costmodel.graph import OpGraph
from costmodel.limits import LimitError, Limits
from costmodel.problem import Cost, Plan, Problem, evaluate
from costmodel.trace import trace as _trace_program
from runtime.core import execute
from runtime.schedule import xla_scheduled
from shardgym import verifier
from shardgym.options import METHODS, OBJECTIVES
from solvers.dispatch import solve_baseline, solve_exact

__all__ = ["Cluster", "Cost", "LimitError", "Limits", "OpGraph", "Plan", "Problem", "build_problem", "evaluate",
           "execute", "solve", "trace", "verify"]


class UnmetBoundError(ValueError):
    """A method that cannot take a memory cap or a step-time bound into account (a baseline rule, the
    policy for the bound) gave a plan that breaks it; ``plan`` and ``cost`` are that plan."""

    def __init__(self, message: str, plan, cost):
        super().__init__(message)
        self.plan, self.cost = plan, cost


#: ``trace(..., schedule=)``: "program" (the trace's order), "xla" (XLA's schedule or an error) or
#: "auto" (XLA's schedule where it can be had, else the program order, said in one warning line)
SCHEDULES = ("program", "xla", "auto")


def trace(fn, *args, fold: bool = True, name: str = "", schedule: str = "program",
          recompute: str | None = None) -> OpGraph:
    """The OpGraph of ``fn(*args)`` (``costmodel.trace``). Its node ``order`` is the time grid every
    liveness interval of the Problem is on, and ``graph.schedule`` says which order it follows:
      * ``"program"`` (default): the trace's program order (no compile);
      * ``"xla"``: the order XLA's compiled unsharded step runs the nodes in (``runtime.schedule``:
        one compile on one device, abstract, before any plan, memoised per process;
        ``costmodel.schedule`` says what it fixes);
      * ``"auto"``: ``"xla"``, falling back to ``"program"`` with one warning line that says why
        when the schedule cannot be had (``fold=False``; the compile fails).
    Session 13 made ``"auto"`` the default and session 14 took it back: on the solvers' fresh plans
    both orders are within 10% of XLA's memory on 59 of 72 executed rows (README "Step order"; on
    the same plans XLA's order prices closer), while the schedule compile costs 2-6x the trace
    (gpt tiny 2.1 s + 12.3 s at load 7-10) and doubled the test suite (773 s vs ~390 s, idle).
    ``recompute``: None (the program as written), ``"dots"``, ``"dots_no_batch"`` or ``"blocks"``: the forward values
    the policy does not save are recomputed in the backward pass (costmodel/trace/recompute.py); the
    graph records the policy (``graph.recompute``) and ``execute`` runs that same recomputing program.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if schedule == "xla" and not fold:
        raise ValueError("schedule='xla' needs fold=True (the runtime re-evaluates the folded program)")
    graph = _trace_program(fn, *args, fold=fold, name=name, recompute=recompute)
    if schedule == "program":
        return graph
    if not fold:
        warnings.warn("shardgym.trace: fold=False, so the steps follow the program order, not XLA's schedule "
                      "(which needs the folded program); pass schedule='program' to say so", stacklevel=2)
        return graph
    if schedule == "xla":
        return xla_scheduled(fn, args, graph)
    try:
        return xla_scheduled(fn, args, graph)
    except Exception as exc:  # noqa: BLE001 -- any compile failure: program order, said in one line
        why = (str(exc).strip().splitlines() or [""])[0][:200]
        warnings.warn(f"shardgym.trace: XLA's schedule could not be compiled ({type(exc).__name__}: {why}); "
                      f"the steps follow the program order", stacklevel=2)
        return graph


def solve(problem: Problem, method: str = "ilp", objective: str = "time", memory_cap_bytes=None,
          max_step_time_s=None, time_limit_s: float = 60, **kw) -> Plan:
    """Plan ``problem`` with one of METHODS; see README for what each objective means.

    ``memory_cap_bytes`` / ``max_step_time_s`` go through ``Limits.of`` (None, or a finite number
    > 0; bytes may be "12GiB"; anything else is a ``LimitError``, the same for every method); the
    problem every method then sees is ``Limits.apply(problem)``. ``plan.info["effective_cap_bytes"]``
    records the cap it saw. The ILP aims at both limits; the other methods' plans are checked
    against them (``UnmetBoundError``). ``time_limit_s`` bounds the ILP (a watchdog past it) and the
    policy's search (None: no limit for the policy; its phases stop at the limit, one phase may end
    past it: ``agent.fgnn_planner.FGPlanner.plan``); the baselines take no time to speak of."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if method != "ilp" and objective != "time":
        raise ValueError(f"objective {objective!r}: method {method!r} plans for step time only "
                         f"(use method 'ilp' for the {objective} objective)")
    limits = Limits.of(memory_cap_bytes, max_step_time_s)
    problem = limits.apply(problem)
    t0 = time.perf_counter()
    if method == "ilp":
        strategies, info = solve_exact(problem, objective, limits.max_step_time_s, time_limit_s,
                                       policy_seed=_policy_plan, **kw)
    elif method == "policy":
        strategies, info = _solve_policy(problem, time_limit_s, **kw)
    else:
        strategies, info = solve_baseline(problem, method)
    info["effective_cap_bytes"] = problem.usage_limit
    plan = Plan.for_problem(problem, strategies, method=method, objective=objective, info=info)
    plan.solve_time_s = time.perf_counter() - t0
    if method != "ilp":
        _check_bounds(problem, plan, method, limits.max_step_time_s)
    return plan


def _solve_policy(problem: Problem, time_limit_s: float | None = None, checkpoint: str = DEFAULT_POLICY,
                  search: bool = True, **kw) -> tuple[list[int], dict]:
    """The shipped planner (``agent.planner.DEFAULT_POLICY``: the factor-graph network,
    agent/pretrained/fgnn.msgpack; ``checkpoint="pretrained"``: the session-4 GNN policy) under
    ``problem.usage_limit``; ``search=False`` is the raw decode (one forward pass + the masked
    decode, no polish/refine). The planner prices the resharded copies itself (its repair and its
    fallback plan see them). ``time_limit_s`` (None: none) bounds the planner's call: its search stops
    at it (``FGPlanner.plan``); ``info["wall_s"]`` is the time it took. ``info["status"]`` is "optimal"
    (``bound`` = the cost, ``gap`` 0) when the planner proved its plan optimal, else "heuristic"."""
    planner = Planner.load(checkpoint)
    if not search:
        kw["polish"] = False
    strategies, got = planner.plan(problem, time_limit_s=time_limit_s, return_info=True, **kw)
    info = {"planner": planner.describe()} if hasattr(planner, "describe") else {}
    if got.get("proven"):       # BP's bound met, the whole MILP's proof, or the uncapped optimum fits the cap
        info.update(status="optimal", bound=evaluate(problem, strategies).total, gap=0.0)
    else:
        info.update(status="heuristic", gap=None)
    return strategies, dict(info, time_limit_s=time_limit_s, wall_s=round(got["plan_time_s"], 3))


def _policy_plan(problem: Problem) -> list[int]:
    """The pretrained planner's default plan (``_solve_policy``'s): the ILP's seed under a binding
    cap (``solvers.dispatch``)."""
    return _solve_policy(problem)[0]


#: the raw decode alone (``_solve_policy(search=False)``): the seed ``solvers.dispatch`` asks for on problems
#: with copy groups (``POLICY_SEED_SEARCH``), where the capped core runs the planner's search itself
_policy_plan.raw = lambda problem: _solve_policy(problem, search=False)[0]
#: the default plan within ``seconds`` (``solvers.dispatch`` beside the capped core on an idle core)
_policy_plan.limited = lambda problem, seconds: _solve_policy(problem, time_limit_s=max(seconds, 1.0))[0]

#: loads the planner (cached; JAX shapes) in the caller's process, before ``solvers.dispatch`` runs
#: ``_policy_plan`` in a forked child beside the capped core (the child then runs numpy and HiGHS only)
_policy_plan.prime = lambda: Planner.load(DEFAULT_POLICY)


def _check_bounds(problem: Problem, plan: Plan, method: str, max_step_time_s) -> None:
    """UnmetBoundError when a non-ILP plan breaks the cap (the applied problem's usage limit) or
    ``max_step_time_s``: these methods cannot aim at them, so they are checked."""
    cost = evaluate(problem, plan)
    if not cost.feasible:
        raise UnmetBoundError(f"method {method!r}: its plan needs {cost.peak_memory_bytes:.4g} bytes/device, over the "
                              f"memory cap {problem.usage_limit:.4g}; raise the cap or use method 'ilp'", plan, cost)
    if max_step_time_s is not None and cost.step_time_s > max_step_time_s:
        raise UnmetBoundError(f"method {method!r}: its plan takes {cost.step_time_s:.4g} s a step, over the bound "
                              f"max_step_time_s={max_step_time_s:g}; raise the bound or use method 'ilp'", plan, cost)


def verify(fn, args, graph: OpGraph, problem: Problem, plan: Plan | None = None, **kw):
    """Compile the plan (abstractly), compare XLA's memory with the model's, charge what the model
    missed from XLA's buffer assignment and re-solve with ``solve``, for a bounded number of rounds;
    returns a ``shardgym.verifier.Verified`` (plan, charged problem, every round, XLA's fits verdict)."""
    return verifier.verify(fn, args, graph, problem, plan, solve=solve, **kw)
