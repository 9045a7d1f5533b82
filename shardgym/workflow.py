"""The steps behind the CLI and the demo: model -> Problem, solve and price, tables, run, plots.

Kept apart from cli.py so the demo, the experiments and the CLI share one implementation.
"""
from __future__ import annotations

import functools
import time

from costmodel.problem import Cost, Plan, Problem, evaluate

GiB = 1024 ** 3


def fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(b) >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} µs"


@functools.lru_cache(maxsize=16)
def _traced(model: str, size: str, abstract: bool):
    import shardgym as sg
    import zoo
    fn, args = zoo.build(model, size, abstract=abstract)
    return fn, args, sg.trace(fn, *args, name=f"{model}-{size}")


def model_problem(model: str, size: str, cluster, memory_cap_bytes=None):
    """(fn, abstract args, OpGraph, Problem) for a zoo model on a cluster."""
    import shardgym as sg
    fn, args, graph = _traced(model, size, True)
    problem = sg.build_problem(graph, cluster, memory_cap_bytes=memory_cap_bytes)
    return fn, args, graph, problem


def parse_method(spec: str) -> tuple[str, str]:
    """'ilp:memory' -> ('ilp', 'memory'); 'dp' -> ('dp', 'time')."""
    method, _, objective = spec.strip().partition(":")
    return method, objective or "time"


def solve_and_price(problem: Problem, method: str, objective: str = "time", memory_cap_bytes=None,
                    max_step_time_s=None, time_limit_s: float = 60) -> tuple[Plan, Cost]:
    import shardgym as sg
    plan = sg.solve(problem, method=method, objective=objective, memory_cap_bytes=memory_cap_bytes,
                    max_step_time_s=max_step_time_s, time_limit_s=time_limit_s)
    return plan, evaluate(problem, plan)


def compare(problem: Problem, methods, memory_cap_bytes=None, max_step_time_s=None, time_limit_s=60,
            console=None) -> list[tuple[str, str, Plan, Cost]]:
    """Solve with every method; a method that fails is reported as a row with its error."""
    rows = []
    for spec in methods:
        method, objective = parse_method(spec)
        t0 = time.perf_counter()
        if console is not None:
            status = console.status(f"{method} ({objective}) ...")
            status.start()
        try:
            plan, cost = solve_and_price(problem, method, objective, memory_cap_bytes, max_step_time_s, time_limit_s)
        except Exception as exc:  # one failing baseline must not hide the others
            plan, cost = None, None
            if console is not None:
                console.print(f"[red]{method} ({objective}) failed: {type(exc).__name__}: {exc}[/red]")
        finally:
            if console is not None:
                status.stop()
        if plan is not None:
            plan.solve_time_s = time.perf_counter() - t0
        rows.append((method, objective, plan, cost))
    return rows


def cost_table(rows, title=""):
    from rich.table import Table
    t = Table(title=title)
    for col in ("method", "objective", "step time", "peak mem/device", "redundant mem", "comm/device",
                "imbalance", "feasible", "solve time"):
        t.add_column(col, justify="right" if col not in ("method", "objective") else "left")
    for method, objective, plan, cost in rows:
        if cost is None:
            t.add_row(method, objective, *(["failed"] + [""] * 7))
            continue
        t.add_row(method, objective if method in ("ilp", "policy") else "-", fmt_time(cost.step_time_s),
                  fmt_bytes(cost.peak_memory_bytes), fmt_bytes(cost.redundant_memory_bytes),
                  fmt_bytes(cost.comm_bytes), fmt_time(cost.imbalance_s), "yes" if cost.feasible else "NO",
                  f"{plan.solve_time_s:.2f} s")
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
    """(Flax module path/param name, PartitionSpec string) for every parameter of the plan."""
    rows = []
    for keys, spec in plan.param_entries():
        if keys and keys[0] == "params":
            keys = keys[1:]
        rows.append(("/".join(keys), _spec_str(spec)))
    return rows


def module_sharding_table(plan: Plan, max_rows: int = 60):
    from rich.table import Table
    t = Table(title=f"parameter sharding (mesh {dict(zip(plan.axis_names, plan.mesh_shape))})")
    t.add_column("Flax module / parameter")
    t.add_column("PartitionSpec")
    rows = param_rows(plan)
    for name, spec in rows[:max_rows]:
        t.add_row(name, spec)
    if len(rows) > max_rows:
        t.add_row(f"... {len(rows) - max_rows} more", "")
    return t


def run_plan(plan: Plan, **kw):
    """Execute a plan file's model on the local devices (concrete arrays)."""
    import shardgym as sg
    fn, args, graph = _traced(plan.meta["model"], plan.meta["size"], False)
    return sg.execute(fn, args, graph, plan, **kw)


def report_table(report, title=""):
    from rich.table import Table
    t = Table(title=title)
    t.add_column("check")
    t.add_column("value", justify="right")
    t.add_row("loss |sharded - reference|", f"{getattr(report, 'loss_abs_err', float('nan')):.3g}")
    t.add_row("max abs err (all outputs)", f"{report.max_abs_err:.3g}")
    t.add_row("max rel err (per-leaf L2)", f"{report.max_rel_err:.3g}")
    t.add_row("memory/device: cost model", fmt_bytes(report.predicted_memory_bytes))
    t.add_row("memory/device: XLA compiled", fmt_bytes(report.xla_memory_bytes))
    if report.xla_memory_bytes:
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
