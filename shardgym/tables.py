"""The tables and figures' text of the face: byte and time formats, PartitionSpec strings, the
cost table, the per-parameter sharding table and the run report. Tables are sized for 80 columns
(short headers, a legend in the caption); parameter paths sort naturally (``block_2`` before
``block_10``).
"""
from __future__ import annotations

import re

from rich import box
from rich.table import Table

from costmodel.problem import Plan

GiB = 1024 ** 3


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


def spec_axes(entry) -> tuple:
    """The mesh axes of one PartitionSpec entry: None -> (), "x" -> ("x",), ("x", "y") -> itself."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def spec_str(spec) -> str:
    """'P()', "P('x', None, ('y', 'z'))": a PartitionSpec as Python writes it, trailing Nones dropped."""
    parts = ["None" if a is None else "(" + ", ".join(map(repr, a)) + ")" if isinstance(a, (tuple, list))
             else repr(a) for a in (spec or ())]
    while parts and parts[-1] == "None":
        parts.pop()
    return "P(" + ", ".join(parts) + ")"


def param_rows(plan: Plan) -> list[tuple[str, str]]:
    """(Flax module path/param name, PartitionSpec string) for every parameter of the plan, in
    natural order of the paths."""
    return [(name, spec_str(spec)) for name, spec in param_specs_sorted(plan)]


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


def report_table(report, title=""):
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("check")
    t.add_column("value", justify="right")
    t.add_row("loss |sharded - reference|", f"{getattr(report, 'loss_abs_err', float('nan')):.3g}")
    t.add_row("max abs err (all outputs)", f"{report.max_abs_err:.3g}")
    t.add_row("max rel err (per-leaf L2)", f"{report.max_rel_err:.3g}")
    if getattr(report, "predicted_cluster", ""):
        t.add_row("cost model: cluster", report.predicted_cluster)
    if getattr(report, "predicted_cap_bytes", None) is not None:
        t.add_row("cost model: memory cap/device", fmt_bytes(report.predicted_cap_bytes))
    if report.predicted_memory_bytes is not None:
        t.add_row("memory/device: cost model", fmt_bytes(report.predicted_memory_bytes))
    t.add_row("memory/device: XLA compiled", fmt_bytes(report.xla_memory_bytes))
    if report.xla_memory_bytes and report.predicted_memory_bytes is not None:
        t.add_row("predicted / XLA", f"{report.predicted_memory_bytes / report.xla_memory_bytes:.3f}")
    for c in report.collectives:
        t.add_row(f"XLA {c['kind']} x{c['count']}", fmt_bytes(c.get("bytes", 0)))
    t.add_row("compile time", fmt_time(getattr(report, "compile_time_s", 0.0)))
    if getattr(report, "predicted_step_time_s", None) is not None:
        t.add_row("step time: cost model", fmt_time(report.predicted_step_time_s))
    t.add_row("step time (local devices)", fmt_time(report.step_time_s))
    return t
