"""The steps behind the CLI and the demo: model -> Problem, limits, solve and price, run, plots.

Kept apart from cli.py so the demo, the experiments and the CLI share one implementation (the
tables live in ``shardgym.tables``, the figures in ``shardgym.plots``). The limits are applied
once (``costmodel.limits.Limits``): every method ``compare`` runs and every figure it prices sees
the same Problem, whose usage_limit is the effective cap.
"""
from __future__ import annotations

import functools
import os
import time

from costmodel.limits import Limits
from costmodel.problem import Cost, Plan, Problem, evaluate
from shardgym import api, plots
from shardgym.options import DEFAULT_RTOL  # noqa: F401  (re-exported)
from shardgym.tables import (  # noqa: F401  (the face's table helpers, re-exported for the CLI and the demo)
    COST_LEGEND,
    GiB,
    cost_table,
    fmt_bytes,
    fmt_time,
    module_sharding_table,
    natural_key,
    param_rows,
    param_specs_sorted,
    report_table,
    solver_status,
)
from shardgym.userfn import ModelSource

__all__ = ["ModelSource", "model_problem", "source_problem", "solve_and_price", "compare", "cost_table",
           "module_sharding_table", "run_plan", "report_table", "plot_plan", "plot_comparison", "traced"]


@functools.lru_cache(maxsize=16)
def traced(source: ModelSource, abstract: bool):
    """(fn, args, OpGraph) of a model source (memoised); ``abstract``: args as ShapeDtypeStructs."""
    fn, args = source.build(abstract=abstract)
    return fn, args, api.trace(fn, *args, name=source.name, recompute=source.recompute)


def source_problem(source: ModelSource, cluster, limits: Limits | None = None):
    """(fn, abstract args, OpGraph, Problem) for a zoo model or a user's make_step on a cluster;
    the Problem's usage_limit is device memory, or with ``limits`` the effective cap
    (``Limits.apply``)."""
    fn, args, graph = traced(source, True)
    problem = api.build_problem(graph, cluster)
    return fn, args, graph, (problem if limits is None else limits.apply(problem))


def model_problem(model: str, size: str, cluster, limits: Limits | None = None):
    """(fn, abstract args, OpGraph, Problem) for a zoo model on a cluster."""
    return source_problem(ModelSource(model, size), cluster, limits)


def parse_method(spec: str) -> tuple[str, str]:
    """'ilp:memory' -> ('ilp', 'memory'); 'dp' -> ('dp', 'time')."""
    method, _, objective = spec.strip().partition(":")
    return method, objective or "time"


def parse_methods(text: str) -> list[str]:
    """Validate a comma-separated --methods list: every entry a method (and objective) solve takes."""
    specs = [s.strip() for s in text.split(",")]
    for s in specs:
        method, objective = parse_method(s)
        if method not in api.METHODS:
            raise ValueError(f"--methods: unknown method {s!r}; choose from {', '.join(api.METHODS)} "
                             "(method:objective allowed, e.g. ilp:memory)")
        if objective not in api.OBJECTIVES:
            raise ValueError(f"--methods: unknown objective in {s!r}; objectives: {', '.join(api.OBJECTIVES)}")
        if method != "ilp" and objective != "time":
            raise ValueError(f"--methods: {s!r}: only ilp takes an objective other than time")
    if len(set(specs)) != len(specs):
        raise ValueError(f"--methods: {text!r} names a method twice")
    return specs


def solve_and_price(problem: Problem, method: str, objective: str = "time", memory_cap_bytes=None,
                    max_step_time_s=None, time_limit_s: float = 60) -> tuple[Plan, Cost]:
    """Solve and price under ``Limits.of(memory_cap_bytes, max_step_time_s)`` applied to
    ``problem`` (the solver and the pricing see the same effective cap); a plan that breaks the
    cap (any method) is a ValueError naming the cap."""
    limits = Limits.of(memory_cap_bytes, max_step_time_s)
    problem = limits.apply(problem)
    plan = api.solve(problem, method=method, objective=objective, max_step_time_s=limits.max_step_time_s,
                     time_limit_s=time_limit_s)
    cost = evaluate(problem, plan)
    if not cost.feasible:
        raise ValueError(f"{method}: no plan within the memory cap ({fmt_bytes(problem.usage_limit)}/device; "
                         f"its plan needs {fmt_bytes(cost.peak_memory_bytes)}): raise --memory-cap")
    return plan, cost


def compare(problem: Problem, methods, memory_cap_bytes=None, max_step_time_s=None, time_limit_s=60,
            console=None) -> list[tuple[str, str, Plan, Cost]]:
    """Solve with every method. A method whose plan breaks the cap or the step-time bound is a row
    with that plan (``plan.meta['unmet']`` says which); one that fails is a row of Nones. The limits
    are applied once, so every method sees the same effective cap."""
    limits = Limits.of(memory_cap_bytes, max_step_time_s)
    problem = limits.apply(problem)
    rows = []
    for spec in methods:
        method, objective = parse_method(spec)
        t0 = time.perf_counter()
        status = console.status(f"{method} ({objective}) ...") if console is not None else None
        if status is not None:
            status.start()
        try:
            plan, cost = solve_and_price(problem, method, objective, None, limits.max_step_time_s, time_limit_s)
        except api.UnmetBoundError as exc:
            plan, cost = exc.plan, exc.cost
            plan.meta["unmet"] = str(exc)
        except (ValueError, RuntimeError) as exc:  # one failing method must not hide the others
            plan, cost = None, None
            if console is not None:
                console.print(f"[red]{method} ({objective}) failed: {exc}[/red]")
        finally:
            if status is not None:
                status.stop()
        if plan is not None:
            plan.solve_time_s = time.perf_counter() - t0
        rows.append((method, objective, plan, cost))
    return rows


def run_plan(plan: Plan, problem: Problem | None = None, source: ModelSource | None = None, **kw):
    """Execute a plan file's model (zoo model or the user's make_step, from ``plan.meta``) on the
    local devices with concrete arrays. ``problem``: the Problem the plan was made for (else the
    runtime rebuilds it from the plan's cluster and cap)."""
    source = source or ModelSource.from_meta(plan.meta)
    fn, args, graph = traced(source, False)
    return api.execute(fn, args, graph, plan, problem=problem, **kw)


def plot_plan(problem: Problem, plan: Plan, stem: str, other: Plan | None = None) -> list[str]:
    """The memory timeline (and, for a traced problem, the sharding map) of ``plan``."""
    paths = [plots.memory_timeline(problem, [plan] + ([other] if other else []), f"{stem}_memory.png")]
    if problem.meta is not None:
        paths.append(plots.sharding_map([plan], f"{stem}_sharding.png"))
    return paths


def plot_comparison(problem: Problem, rows, out_dir: str, pareto: bool = True) -> list[str]:
    """The memory timeline of two plans, the sharding map of all and the Pareto front."""
    ok = [(m, o, p, c) for m, o, p, c in rows if p is not None]
    paths = []
    by = {(m, o): p for m, o, p, _ in ok}
    pair = [p for p in (by.get(("megatron", "time")), by.get(("ilp", "memory"))) if p is not None]
    if len(pair) < 2:
        pair = [p for _, _, p, _ in ok[:2]]
    if pair:
        paths.append(plots.memory_timeline(problem, pair, os.path.join(out_dir, "memory_timeline.png")))
    if problem.meta is not None and ok:
        paths.append(plots.sharding_map([p for _, _, p, _ in ok], os.path.join(out_dir, "sharding_map.png")))
    if pareto:
        paths.append(plots.pareto_front(problem, ok, os.path.join(out_dir, "pareto.png")))
    return paths
