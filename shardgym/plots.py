"""PNG plots of plans: memory over the program timeline, the time/memory Pareto front from ILP
sweeps, and a per-layer sharding map. Matplotlib with the Agg backend; every function returns the
path it wrote."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from costmodel.problem import Plan, Problem, as_strategy_array, evaluate, usage_profile  # noqa: E402
from shardgym.tables import param_specs_sorted, spec_axes, spec_str  # noqa: E402
from solvers.ilp import solve_ilp  # noqa: E402

GiB = 1024 ** 3
MiB = 1024 ** 2


def _mem_unit(x: float) -> tuple[float, str]:
    for scale, unit in ((GiB, "GiB"), (MiB, "MiB"), (1024, "KiB")):
        if x >= scale:
            return scale, unit
    return 1.0, "B"


def _label(plan: Plan) -> str:
    if plan.meta.get("label"):
        return plan.meta["label"]
    return plan.method + (f" ({plan.objective})" if plan.method in ("ilp", "policy") else "")


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def memory_timeline(problem: Problem, plans: list[Plan], path: str) -> str:
    """Live per-device bytes at every point of the program (the cost model's liveness), one line per plan."""
    profiles = []
    for plan in plans:
        s = as_strategy_array(problem, plan)
        t, live = usage_profile(problem, problem.node_usages[problem.strategy_offsets[:-1] + s])
        profiles.append((plan, t, live))
    peak = max(float(live.max()) for _, _, live in profiles) if profiles else 1.0
    scale, unit = _mem_unit(peak)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for plan, t, live in profiles:
        line, = ax.step(t, live / scale, where="post", label=f"{_label(plan)}: peak {live.max() / scale:.2f} {unit}")
        k = int(np.argmax(live))
        ax.plot([t[k]], [live[k] / scale], "o", color=line.get_color())
    if problem.usage_limit is not None and problem.usage_limit < 4 * peak:
        ax.axhline(problem.usage_limit / scale, color="red", ls="--", lw=1, label="memory cap")
    for name, (a, b), shade in zip(("forward", "backward", "update"), phases(problem), (0.0, 0.07, 0.14)):
        if b > a:
            ax.axvspan(a, b, color="black", alpha=shade, lw=0)
            ax.text((a + b) / 2, 0.98, name, transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=8,
                    color="dimgray")
    ax.set_xlabel("program position (operator order: forward, backward, optimizer update)")
    ax.set_ylabel(f"live memory per device ({unit})")
    ax.set_title(f"Per-device memory over the step: {problem.name}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def phases(problem: Problem) -> list[tuple[float, float]]:
    """[(start, end)] program positions of the forward pass, the backward pass and the optimizer
    update: backward = from the first to the last node whose role is "gradient" (the tracer marks
    values made under a ``transpose`` transform), update = what follows. [] without roles (IOPDDL)."""
    m = problem.meta
    if m is None or not getattr(m, "roles", None) or "gradient" not in m.roles:
        return []
    start = problem.intervals[:, 0]
    grad = np.array([r == "gradient" for r in m.roles])
    work = np.array([r not in ("param", "opt_state", "batch", "input") for r in m.roles]) & ~np.array(
        [p == "input" for p in m.primitives])
    t0 = float(start[work].min()) if work.any() else 0.0
    b0, b1 = float(start[grad].min()), float(start[grad].max()) + 1
    end = float(problem.intervals[:, 1].max())
    return [(t0, b0), (b0, b1), (b1, end)]


def pareto_front(problem: Problem, rows, path: str, points: int = 5, time_limit_s: float = 10) -> str:
    """Step time against peak memory: the ILP's min-memory plan for a sweep of step-time bounds
    between the time-optimal and the memory-optimal plans, with the other methods as points.
    The ILP rows already in ``rows`` are reused; each sweep point is a time-limited solve
    (``time_limit_s``), so a point may sit slightly above the true front."""
    known = {(m, o): c for m, o, _, c in rows if c is not None and m == "ilp"}
    c_fast = known.get(("ilp", "time")) or evaluate(problem, solve_ilp(problem, objective="time", time_limit_s=time_limit_s)[0])
    c_small = known.get(("ilp", "memory")) or evaluate(problem, solve_ilp(problem, objective="memory", time_limit_s=time_limit_s)[0])
    front = [(c_fast.step_time_s, c_fast.peak_memory_bytes), (c_small.step_time_s, c_small.peak_memory_bytes)]
    if c_small.step_time_s > c_fast.step_time_s * (1 + 1e-9):
        for bound in np.linspace(c_fast.step_time_s, c_small.step_time_s, points + 2)[1:-1]:
            try:
                s, _ = solve_ilp(problem, objective="memory", max_step_time_s=float(bound), time_limit_s=time_limit_s)
            except ValueError:
                continue
            c = evaluate(problem, s)
            front.append((c.step_time_s, c.peak_memory_bytes))
    front.sort()
    pts, best = [], float("inf")
    for t, m in front:  # keep the non-dominated points
        if m < best - 1e-9:
            pts.append((t, m))
            best = m
    allmem = [m for _, m in pts] + [c.peak_memory_bytes for _, _, _, c in rows if c is not None]
    scale, unit = _mem_unit(max(allmem))
    tscale, tunit = (1e-3, "ms") if max(t for t, _ in pts) < 1 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.step([t / tscale for t, _ in pts], [m / scale for _, m in pts], where="post", color="black", lw=1.2,
            marker="o", label="ILP Pareto front (min memory s.t. step time)")
    for method, objective, plan, cost in rows:
        if cost is None:
            continue
        name = method + (f" ({objective})" if method in ("ilp", "policy") else "")
        ax.scatter([cost.step_time_s / tscale], [cost.peak_memory_bytes / scale], s=60, zorder=3, label=name)
    ax.set_xlabel(f"modelled step time ({tunit})")
    ax.set_ylabel(f"peak memory per device ({unit})")
    ax.set_title(f"Step time vs peak memory: {problem.name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _layout_code(spec) -> str:
    axes = [a for entry in (spec or ()) for a in spec_axes(entry)]
    return "+".join(axes) if axes else "R"


def sharding_map(plans: list[Plan], path: str, max_rows: int | None = None) -> str:
    """One row per parameter (module path, natural order), one column per plan; the colour says
    which mesh axes shard the parameter, the text gives its PartitionSpec. Every parameter is drawn
    (the figure grows 0.26 in a row); ``max_rows`` caps it and says so in the title."""
    entries = param_specs_sorted(plans[0])
    total = len(entries)
    names = [n for n, _ in entries][:max_rows]
    cols = []
    for plan in plans:
        by = dict(param_specs_sorted(plan))
        cols.append([by.get(n) for n in names])
    codes = sorted({_layout_code(s) for col in cols for s in col})
    cmap = plt.get_cmap("tab10")
    color_of = {c: ((0.93, 0.93, 0.93, 1.0) if c == "R" else cmap(i % 10)) for i, c in enumerate(codes)}
    fig, ax = plt.subplots(figsize=(2.4 + 2.2 * len(plans), 0.8 + 0.26 * len(names)))
    for j, col in enumerate(cols):
        for i, spec in enumerate(col):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=color_of[_layout_code(spec)], ec="white"))
            ax.text(j + 0.5, i + 0.5, spec_str(spec)[2:-1] or "replicated", ha="center", va="center", fontsize=6)
    ax.set_xlim(0, len(plans))
    ax.set_ylim(len(names), 0)
    ax.set_xticks(np.arange(len(plans)) + 0.5, [_label(p) for p in plans], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(np.arange(len(names)) + 0.5, names, fontsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color_of[c]) for c in codes]
    ax.legend(handles, ["replicated" if c == "R" else f"sharded over {c}" for c in codes], fontsize=7,
              loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=min(4, len(codes)))
    ax.set_title("Parameter sharding per plan" + (f" (first {len(names)} of {total})" if len(names) < total else ""),
                 pad=24)
    return _save(fig, path)
