"""The steps behind the CLI and the demo: model -> Problem, solve and price, tables, run, plots.

Kept apart from cli.py so the demo, the experiments and the CLI share one implementation. Tables are
sized for 80 columns (short headers, a legend in the caption); parameter paths sort naturally
(``block_2`` before ``block_10``).
"""
from __future__ import annotations

import functools
import re
import time

from costmodel.problem import Cost, Plan, Problem, evaluate
from shardgym.userfn import ModelSource

GiB = 1024 ** 3
# `shardgym run`'s numerics bound on max_rel_err (per-leaf L2 after one AdamW step, see runtime.py).
# Correct plans differ from the unsharded step only by the order of sharded sums: up to 2.1e-4
# measured for a plain MLP plan (1e-4 failed it); a plan XLA miscomputes is off by O(1) or inf
# (Megatron on a 3x2 mesh, gpt tiny: inf). 1e-3 sits between, 5x over the worst correct case.
DEFAULT_RTOL = 1e-3
__all__ = ["ModelSource", "model_problem", "source_problem", "solve_and_price", "compare", "cost_table",
           "module_sharding_table", "run_plan", "report_table", "plot_plan", "plot_comparison"]


def fmt_bytes(b: float, short: bool = False) -> str:
    """'1.50 MiB', or with ``short`` '1.5M' (3 significant digits, for 80-column tables)."""
    for unit, scale in (("GiB", GiB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(b) >= scale:
            return f"{b / scale:.3g}{unit[0]}" if short else f"{b / scale:.2f} {unit}"
    return f"{b:.0f}B" if short else f"{b:.0f} B"


def fmt_time(s: float, short: bool = False) -> str:
    """'13.621 ms' (µs with one decimal), or with ``short`` '13.6ms'."""
    scale, unit = (1.0, "s") if s >= 1 else (1e-3, "ms") if s >= 1e-3 else (1e-6, "us" if short else "µs")
    if short:
        return f"{s / scale:.3g}{unit}"
    return f"{s / scale:.1f} {unit}" if scale == 1e-6 else f"{s / scale:.3f} {unit}"


def natural_key(text: str):
    """Sort key that orders digit runs by value: block_2 < block_10."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text) if t]


@functools.lru_cache(maxsize=16)
def _traced(source: ModelSource, abstract: bool):
    import shardgym as sg
    fn, args = source.build(abstract=abstract)
    return fn, args, sg.trace(fn, *args, name=source.name)


def source_problem(source: ModelSource, cluster, memory_cap_bytes=None):
    """(fn, abstract args, OpGraph, Problem) for a zoo model or a user's make_step on a cluster."""
    import shardgym as sg
    fn, args, graph = _traced(source, True)
    problem = sg.build_problem(graph, cluster, memory_cap_bytes=memory_cap_bytes)
    return fn, args, graph, problem


def model_problem(model: str, size: str, cluster, memory_cap_bytes=None):
    """(fn, abstract args, OpGraph, Problem) for a zoo model on a cluster."""
    return source_problem(ModelSource(model, size), cluster, memory_cap_bytes)


def parse_method(spec: str) -> tuple[str, str]:
    """'ilp:memory' -> ('ilp', 'memory'); 'dp' -> ('dp', 'time')."""
    method, _, objective = spec.strip().partition(":")
    return method, objective or "time"


def parse_methods(text: str) -> list[str]:
    """Validate a comma-separated --methods list: every entry a method (and objective) solve takes."""
    from shardgym.api import METHODS, OBJECTIVES
    specs = [s.strip() for s in text.split(",")]
    for s in specs:
        method, objective = parse_method(s)
        if method not in METHODS:
            raise ValueError(f"--methods: unknown method {s!r}; choose from {', '.join(METHODS)} "
                             "(method:objective allowed, e.g. ilp:memory)")
        if objective not in OBJECTIVES:
            raise ValueError(f"--methods: unknown objective in {s!r}; objectives: {', '.join(OBJECTIVES)}")
        if method != "ilp" and objective != "time":
            raise ValueError(f"--methods: {s!r}: only ilp takes an objective other than time")
    if len(set(specs)) != len(specs):
        raise ValueError(f"--methods: {text!r} names a method twice")
    return specs


def solve_and_price(problem: Problem, method: str, objective: str = "time", memory_cap_bytes=None,
                    max_step_time_s=None, time_limit_s: float = 60) -> tuple[Plan, Cost]:
    """Solve and price; a plan that breaks the cap (any method) is a ValueError naming the cap."""
    import shardgym as sg
    plan = sg.solve(problem, method=method, objective=objective, memory_cap_bytes=memory_cap_bytes,
                    max_step_time_s=max_step_time_s, time_limit_s=time_limit_s)
    cost = evaluate(problem, plan)
    if not cost.feasible:
        raise ValueError(f"{method}: no plan within the memory cap ({fmt_bytes(problem.usage_limit)}/device; "
                         f"its plan needs {fmt_bytes(cost.peak_memory_bytes)}): raise --memory-cap")
    return plan, cost


def compare(problem: Problem, methods, memory_cap_bytes=None, max_step_time_s=None, time_limit_s=60,
            console=None) -> list[tuple[str, str, Plan, Cost]]:
    """Solve with every method. A method whose plan breaks the cap or the step-time bound is a row
    with that plan (``plan.meta['unmet']`` says which); one that fails is a row of Nones."""
    from shardgym.api import UnmetBoundError
    rows = []
    for spec in methods:
        method, objective = parse_method(spec)
        t0 = time.perf_counter()
        status = console.status(f"{method} ({objective}) ...") if console is not None else None
        if status is not None:
            status.start()
        try:
            plan, cost = solve_and_price(problem, method, objective, memory_cap_bytes, max_step_time_s, time_limit_s)
        except UnmetBoundError as exc:
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


def solver_status(plan: Plan | None) -> str:
    """'optimal', 'limit 19%' (stopped by the time limit, relative gap), 'rule', 'heuristic', ..."""
    if plan is None:
        return "failed"
    info = plan.info or {}
    st = str(info.get("status") or "?")
    gap = info.get("gap")
    st = {"time_limit": "limit"}.get(st, st)
    if gap is not None and st != "optimal":
        try:
            st += f" {100 * float(gap):.2g}%"
        except (TypeError, ValueError):
            pass
    return st


COST_LEGEND = ("step = modelled step time; peak = peak memory/device; redund = bytes replicated; comm = "
               "collective bytes/device; imbal = time lost to the slowest device; fits = within cap and bound; "
               "status: optimal (proven), limit g% (time limit, gap g%), rule (baseline), heuristic (policy)")


def cost_table(rows, title=""):
    from rich import box
    from rich.table import Table
    t = Table(title=title, caption=COST_LEGEND, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
              caption_justify="left")
    for col in ("method", "step", "peak", "redund", "comm", "imbal", "fits", "status", "solve"):
        t.add_column(col, justify="left" if col in ("method", "status") else "right", no_wrap=True)
    for method, objective, plan, cost in rows:
        name = f"{method}:{objective}" if method == "ilp" else method
        if cost is None:
            t.add_row(name, *([""] * 6), "failed", "")
            continue
        fits = cost.feasible and not (plan.meta or {}).get("unmet")
        t.add_row(name, fmt_time(cost.step_time_s, True), fmt_bytes(cost.peak_memory_bytes, True),
                  fmt_bytes(cost.redundant_memory_bytes, True), fmt_bytes(cost.comm_bytes, True),
                  fmt_time(cost.imbalance_s, True), "yes" if fits else "NO", solver_status(plan),
                  f"{plan.solve_time_s:.2f}s")
    return t


def _spec_str(spec) -> str:
    if spec is None:
        return "P()"
    parts = []
    for a in spec:
        if a is None:
            parts.append("None")
        elif isinstance(a, (tuple, list)):
            parts.append("(" + ", ".join(repr(x) for x in a) + ")")
        else:
            parts.append(repr(a))
    while parts and parts[-1] == "None":
        parts.pop()
    return "P(" + ", ".join(parts) + ")"


def param_rows(plan: Plan) -> list[tuple[str, str]]:
    """(Flax module path/param name, PartitionSpec string) for every parameter of the plan, in
    natural order of the paths."""
    return [(name, _spec_str(spec)) for name, spec in param_specs_sorted(plan)]


def param_specs_sorted(plan: Plan) -> list[tuple[str, tuple | None]]:
    """(path, spec) for every parameter, naturally sorted by path (block_2 before block_10)."""
    rows = []
    for keys, spec in plan.param_entries():
        if keys and keys[0] == "params":
            keys = keys[1:]
        rows.append(("/".join(keys), spec))
    return sorted(rows, key=lambda r: natural_key(r[0]))


def module_sharding_table(plan: Plan, max_rows: int | None = None):
    """Every parameter's PartitionSpec (``max_rows`` caps the table, the rest counted)."""
    from rich import box
    from rich.table import Table
    t = Table(title=f"parameter sharding (mesh {dict(zip(plan.axis_names, plan.mesh_shape))})",
              box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("Flax module / parameter", overflow="fold")
    t.add_column("PartitionSpec", overflow="fold")
    rows = param_rows(plan)
    shown = rows if max_rows is None else rows[:max_rows]
    for name, spec in shown:
        t.add_row(name, spec)
    if len(rows) > len(shown):
        t.add_row(f"... {len(rows) - len(shown)} more", "")
    return t


def run_plan(plan: Plan, problem: Problem | None = None, source: ModelSource | None = None, **kw):
    """Execute a plan file's model (zoo model or the user's make_step, from ``plan.meta``) on the
    local devices with concrete arrays. ``problem``: the Problem the plan was made for (else the
    runtime rebuilds it from the plan's cluster)."""
    import shardgym as sg
    source = source or ModelSource.from_meta(plan.meta)
    fn, args, graph = _traced(source, False)
    return sg.execute(fn, args, graph, plan, problem=problem, **kw)


def report_table(report, title=""):
    from rich import box
    from rich.table import Table
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("check")
    t.add_column("value", justify="right")
    t.add_row("loss |sharded - reference|", f"{getattr(report, 'loss_abs_err', float('nan')):.3g}")
    t.add_row("max abs err (all outputs)", f"{report.max_abs_err:.3g}")
    t.add_row("max rel err (per-leaf L2)", f"{report.max_rel_err:.3g}")
    if report.predicted_memory_bytes is not None:
        t.add_row("memory/device: cost model", fmt_bytes(report.predicted_memory_bytes))
    t.add_row("memory/device: XLA compiled", fmt_bytes(report.xla_memory_bytes))
    if report.xla_memory_bytes and report.predicted_memory_bytes is not None:
        t.add_row("predicted / XLA", f"{report.predicted_memory_bytes / report.xla_memory_bytes:.3f}")
    for c in report.collectives:
        t.add_row(f"XLA {c['kind']} x{c['count']}", fmt_bytes(c.get("bytes", 0)))
    t.add_row("compile time", fmt_time(getattr(report, "compile_time_s", 0.0)))
    t.add_row("step time (local devices)", fmt_time(report.step_time_s))
    return t


def plot_plan(problem: Problem, plan: Plan, stem: str, other: Plan | None = None) -> list[str]:
    from shardgym import plots
    paths = [plots.memory_timeline(problem, [plan] + ([other] if other else []), f"{stem}_memory.png")]
    if problem.meta is not None:
        paths.append(plots.sharding_map([plan], f"{stem}_sharding.png"))
    return paths


def plot_comparison(problem: Problem, rows, out_dir: str, pareto: bool = True) -> list[str]:
    import os

    from shardgym import plots
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
