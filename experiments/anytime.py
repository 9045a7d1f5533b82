"""Anytime curves on big graphs: best cost so far against wall time for the ILP, the default planner
and search from Lagrangian BP's start (issue 18, "Time to quality on big graphs").

Per problem, three curves of (wall seconds from that method's start, best feasible cost so far):

* ``ilp``: ``shardgym.solve(method="ilp", time_limit_s=--ilp-seconds)``. Its points are the plan
  costs the capped core prints in its ``progress`` phase log (``"<phase>: <cost> (<t>s)"``; lines
  about bounds, statuses and rounds carry no plan and are skipped), stamped when the line arrives,
  plus the returned plan's cost at the ILP's wall time. The phase log reports the cost each phase
  computed; the final point is priced by ``shardgym.evaluate``. Every ILP path takes ``progress``
  (session 12): the capped core (a binding cap on a graph ``solvers.capped.milp_ok`` admits) logs
  each phase's plan; the plain guarded ILP, which ``solve`` runs uncapped and on bigger graphs (gpt
  7b: 8,583 nodes > 5,000), logs the plans ``solve_ilp`` streams that fit (the memory objective's;
  its time objective's HiGHS streams none) and its answer, so its curve can be its final plan
  alone (``ilp_summary.phase_log``: how many points the log gave). Its final cost is the target:
  "the ILP's 60 s incumbent".
* ``policy``: the default planner's network (``agent.planner.DEFAULT_POLICY``, loaded before the
  clock starts): its raw decode (one forward pass + masked decode, a point if it fits: ``Planner.plan(polish=
  False)``, ``solve(search=False)``, routed as the planner routes it; before session 28 ``net.plan``, the
  jitted forward whatever the size), then
  ``solvers.local.improve`` (repair + polish), then ``solvers.local.refine`` chained in slices of
  1, 2, 4, ... s until ``--search-seconds`` after the polish. ``default`` is one more point,
  ``Planner.plan`` as ``solve(method="policy")`` runs it (decode + its own search), timed alone:
  the time it returns. ``default_curve`` (session 27): the same run's own phase log, as the ILP's
  curve is its phase log: under a cap ``capped_search`` records each phase's plan cost and when the
  phase ended (``info["search"]``: ``<phase>`` and ``t_<phase>``, seconds from the search's start, which
  is the decode's end: ``plan_time_s`` - the search's ``wall_s``), plus the returned plan at the
  wall time (``default_curve``'s last point is the ``default`` point). Session 28: both ``policy`` and
  ``default_curve`` also hold the raw decode's own log where it runs numpy BP (``decode_found``: each cheaper
  fitting plan BP decoded, stamped when it was decoded and priced), as the ILP's curve holds its phase log.
* ``bp``: ``solvers.bp.bp_plan(memory_prices=True)`` (a point if it fits), then the same
  improve + chained refine as ``policy``.

Each curve is a running minimum, so it never rises. Reported per problem: the ILP's final cost
and wall time, for each curve the first time it is at or below that cost (relative tolerance
1e-6), or else its best cost / the ILP's; and ``planner_within_25pct``: the policy curve (or the
default point) reaches the ILP's cost within 25 % of the ILP's wall time. Wall times include
everything, JIT compilation of the network included, on a shared 2-core machine: the load average
is recorded before each problem.

Problems (``--problems``, comma list): ``model:size:cluster:cap`` with cap ``cluster`` (the
cluster's own device memory) or a fraction f (``env.workloads.Workload``'s ``memory_cap_fraction``:
least peak + f (greatest - least)); ``random:nodes:strategies:f`` is
``env.workloads.random_problem(default_rng(--seed), nodes, strategies, memory_cap_fraction=f)``.
A cap binds when the uncapped optimum breaks it. gpt 7b's 80 GiB on h100-2x8 does not (session 25: its
uncapped ILP optimum, 0.34379 s/step, proven in 34 s, peaks at 61.8 GB); its least / greatest peaks (node
usages alone) are 33.5 / 536.2 GB, so its binding caps are fractions below 0.0562. No baseline fits
there (FSDP peaks at 65.7 GB, f 0.064; Megatron 71.3 GB; the least-usage plan, its copies priced,
152 GB), and the ILP (8,583 nodes: the plain guarded ILP) found no plan in 60 s at 0.04, 0.05 or
0.055 (61.2 GB, 1 % under the optimum's peak); ``gpt:7b:h100-2x8:0.05`` is 58.6 GB. At 0.3 the
uncapped optimum does not fit on meshgraphnet large (bound 0.011321 against 0.013397 capped) nor on
the random 2,000-node problem (3385.05 against 3386.18). ``--unseeded`` adds the ILP without the
planner's plan as a seed: under a binding cap on graphs ``milp_ok`` admits ``solve(method="ilp")``
seeds the capped core with ``solve(method="policy")``'s plan (``solvers.dispatch``), so its
incumbent can be the planner's own plan (random 2,000 nodes, session 25).

    nice -n 10 python experiments/anytime.py          # results/anytime.json and results/anytime.png
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np  # noqa: E402

DEFAULT_PROBLEMS = "gpt:7b:h100-2x8:0.05,meshgraphnet:large:h100-2x8:0.3,random:2000:8:0.3"
#: a phase-log line with a plan's cost: "<phase>: <cost>" then " (<t>s)" or the end of the line
_COST_LINE = re.compile(r"^(?P<phase>[^:]+): (?P<cost>[-+0-9.eE]+)(?: \(|$)")
_TOL = 1e-6


def build(spec: str, seed: int = 0):
    """The Problem of a ``--problems`` entry (module docstring)."""
    parts = spec.split(":")
    if parts[0] == "random":
        from env.workloads import random_problem
        n, k, f = int(parts[1]), int(parts[2]), float(parts[3])
        return random_problem(np.random.default_rng(seed), n, k, memory_cap_fraction=f)
    from env.workloads import Workload
    model, size, cluster, cap = parts
    return Workload(model, size, cluster, None, None if cap == "cluster" else float(cap)).build()


def monotone(points) -> list[list[float]]:
    """(time, cost) points, time-ordered, as a running minimum: only the points that lower it."""
    out = []
    for t, c in sorted(points):
        if c is not None and np.isfinite(c) and (not out or c < out[-1][1]):
            out.append([round(float(t), 3), float(c)])
    return out


def ilp_curve(problem, seconds: float, seeded: bool = True) -> tuple[list, dict]:
    """The ILP's points (module docstring) and its summary (cost, wall, status, gap). ``seeded=False``:
    the same dispatch (``solvers.dispatch.solve_exact``) without the planner's plan as a seed
    (``policy_seed=None``), so its incumbent is not the planner's own plan."""
    import shardgym as sg
    from solvers.dispatch import solve_exact
    pts, log = [], []
    t0 = time.perf_counter()

    def progress(msg: str):
        t = time.perf_counter() - t0
        log.append(f"{t:.1f}s {msg}")
        m = _COST_LINE.match(msg.strip())
        if m and not any(w in m["phase"] for w in ("bound", "round")):
            try:
                pts.append((t, float(m["cost"])))
            except ValueError:
                pass

    try:
        if seeded:
            plan = sg.solve(problem, method="ilp", time_limit_s=seconds, progress=progress)
            strategies, info = plan.strategies, plan.info
        else:
            strategies, info = solve_exact(problem, "time", None, seconds, policy_seed=None, progress=progress)
    except (RuntimeError, ValueError) as exc:   # no plan that fits within the limit (gpt 7b at binding caps)
        return monotone(pts), {"cost": None, "wall_s": round(time.perf_counter() - t0, 2), "status": "error",
                               "error": str(exc)[:300], "phase_log": len(pts), "log": log[:80]}
    wall, streamed = time.perf_counter() - t0, len(pts)
    c = sg.evaluate(problem, strategies)
    if c.feasible:
        pts.append((wall, c.total))
    return monotone(pts), {"cost": c.total if c.feasible else None, "wall_s": round(wall, 2),
                           "status": info.get("status"), "gap": info.get("gap"),
                           "source": info.get("source"), "phase_log": streamed, "log": log[:80]}


def search_curve(problem, start, t0: float, seconds: float, first_slice_s: float = 1.0) -> list:
    """Points of ``improve`` (repair + polish) from ``start`` and then ``refine`` chained in
    doubling slices for ``seconds``, stamped from ``t0``; [] if the repair finds no plan that fits."""
    import shardgym as sg
    from solvers.local import improve, refine
    pts = []
    if start is None:
        return pts
    c = sg.evaluate(problem, start)
    if c.feasible:
        pts.append((time.perf_counter() - t0, c.total))
    x = improve(problem, start, refine_time_limit_s=0.0)
    if x is None:
        return pts
    pts.append((time.perf_counter() - t0, sg.evaluate(problem, x).total))
    t_end, dt = time.perf_counter() + seconds, first_slice_s
    while (left := t_end - time.perf_counter()) > 0.05:
        x = refine(problem, x, min(dt, left))
        pts.append((time.perf_counter() - t0, sg.evaluate(problem, x).total))
        dt *= 2
    return pts


def run_problem(problem, ilp_seconds: float = 60.0, search_seconds: float = 30.0, unseeded: bool = False) -> dict:
    """The three curves, the default planner's point and the summary of one problem. With
    ``unseeded`` also ``ilp_free``: the ILP without the planner's plan as a seed (``ilp_curve``), and
    the same verdict against its final plan (``free_*`` keys)."""
    import shardgym as sg
    from agent.planner import DEFAULT_POLICY, Planner
    from solvers.bp import bp_plan
    out = {"nodes": problem.num_nodes, "cap_bytes": problem.usage_limit,
           "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
    planner = Planner.load(DEFAULT_POLICY)
    t0 = time.perf_counter()
    try:
        raw, raw_info = planner.plan(problem, polish=False, return_info=True)
    except ValueError:
        raw, raw_info = None, {}
    out["policy_raw_s"] = round(time.perf_counter() - t0, 2)
    out["policy"] = monotone(list(raw_info.get("decode_found", [])) + search_curve(problem, raw, t0, search_seconds))
    t0 = time.perf_counter()
    start = bp_plan(problem, memory_prices=True)
    out["bp_start_s"] = round(time.perf_counter() - t0, 2)
    out["bp"] = monotone(search_curve(problem, start, t0, search_seconds))
    t0 = time.perf_counter()
    x, info = planner.plan(problem, return_info=True)
    wall = time.perf_counter() - t0
    out["default"] = {"wall_s": round(wall, 2), "cost": sg.evaluate(problem, x).total, "cap_binds": info["cap_binds"]}
    out["default_curve"] = monotone(default_points(info, wall) + [(wall, out["default"]["cost"])])
    out["ilp"], out["ilp_summary"] = ilp_curve(problem, ilp_seconds)
    if unseeded:
        out["ilp_free"], out["ilp_free_summary"] = ilp_curve(problem, ilp_seconds, seeded=False)
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    for k in ("policy", "bp"):
        out[f"{k}_best"] = min((c for _, c in out[k]), default=None)
    out.update(verdict(out, "ilp"))
    if unseeded:
        out.update({f"free_{k}": v for k, v in verdict(out, "ilp_free").items()})
    return out


def default_points(info: dict, wall: float) -> list:
    """(seconds from the plan call, cost) of each search phase ``Planner.plan``'s ``info`` logs (module
    docstring, ``default_curve``), numpy BP's ``decode_found`` first; only those without a budgeted search."""
    search = info.get("search") or {}
    found = [tuple(p) for p in info.get("decode_found", [])]     # numpy BP's cheaper fitting decodes as they came
    if "wall_s" not in search:
        return found
    start = info.get("plan_time_s", wall) - search["wall_s"]     # the decode (and its bound) before the search
    pts = found + ([(start, search["start"])] if np.isfinite(search.get("start", np.inf)) else [])
    return pts + [(start + search[f"t_{k}"], search[k]) for k in search
                  if f"t_{k}" in search and isinstance(search[k], float)]


def verdict(out: dict, ilp: str) -> dict:
    """Against the final plan of ILP curve ``ilp`` ("ilp" or "ilp_free"): each curve's first time at or
    below it and best cost / it, and whether the planner reached it within 25 % of that ILP's wall.
    Empty when that ILP found no plan."""
    target, ilp_wall = out[f"{ilp}_summary"]["cost"], out[f"{ilp}_summary"]["wall_s"]
    if target is None:
        return {}
    res = {}
    curves = {k: out[k] for k in ("policy", "bp", ilp)}
    curves["default"] = [[out["default"]["wall_s"], out["default"]["cost"]]]
    curves["default_curve"] = out.get("default_curve") or curves["default"]
    for k, pts in curves.items():
        hit = next((t for t, c in pts if c <= target * (1 + _TOL)), None)
        best = min((c for _, c in pts), default=None)
        k = "ilp" if k == ilp else k
        res[f"{k}_reach_s"] = hit
        res[f"{k}_best_ratio"] = None if best is None else round(best / target, 4)
    hits = [res[f"{k}_reach_s"] for k in ("policy", "default") if res[f"{k}_reach_s"] is not None]
    res["planner_reach_s"] = min(hits, default=None)
    res["planner_within_25pct"] = bool(hits) and min(hits) <= 0.25 * ilp_wall
    # the shipped planner alone: when it returns (``default``) and when its own log found the plan
    res["default_within_25pct"] = res["default_reach_s"] is not None and res["default_reach_s"] <= 0.25 * ilp_wall
    res["default_found_within_25pct"] = (res["default_curve_reach_s"] is not None
                                         and res["default_curve_reach_s"] <= 0.25 * ilp_wall)
    return res


def plot(rows: list[dict], path) -> None:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4.2), squeeze=False)
    for ax, r in zip(axes[0], rows):
        target = r.get("ilp_summary", {}).get("cost") or 1.0
        for k, label, color in (("policy", "policy (raw decode + search)", "C0"), ("bp", "search from BP", "C1"),
                                ("ilp", "ILP (60 s)", "C2"), ("ilp_free", "ILP without the planner's seed", "C3")):
            pts = np.array(r[k]) if r.get(k) else np.zeros((0, 2))
            if len(pts):
                ax.step(pts[:, 0], pts[:, 1] / target, where="post", label=label, color=color, marker=".")
        d = r["default"]
        if r.get("default_curve"):
            pts = np.array(r["default_curve"])
            ax.step(pts[:, 0], pts[:, 1] / target, where="post", color="k", lw=0.8, label="solve(method='policy'), its phase log")
        ax.plot([d["wall_s"]], [d["cost"] / target], "k*", ms=10, label="solve(method='policy') returns")
        ax.axvline(0.25 * r["ilp_summary"]["wall_s"], color="grey", ls=":", label="25% of the ILP's wall")
        if r.get("ilp_summary", {}).get("cost"):
            ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if r.get("ilp_summary", {}).get("cost"):    # the first plans (anchors, seeds) are 2-14x: show the last 2 %
            lo = min([c / target for k in ("policy", "bp", "ilp", "ilp_free") for _, c in r.get(k) or []] + [d["cost"] / target])
            ax.set_ylim(lo - 0.002, 1.02)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("cost / ILP's final incumbent" if r.get("ilp_summary", {}).get("cost") else "cost (the ILP found no plan)")
        ax.set_title(f"{r['problem']} ({r['nodes']} nodes, load {r['load_avg_before'][0]:.1f})", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS)
    ap.add_argument("--ilp-seconds", type=float, default=60.0)
    ap.add_argument("--search-seconds", type=float, default=30.0, help="refine after the polish, per curve")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--unseeded", action="store_true",
                    help="also run the ILP without the planner's plan as a seed (ilp_free, free_* keys)")
    ap.add_argument("--out", default="anytime")
    ap.add_argument("--plot", action="store_true", help="redraw results/<out>.png from results/<out>.json; run nothing")
    a = ap.parse_args(argv)
    from experiments.common import RESULTS_DIR, print_table, write_results
    if a.plot:
        import json
        return plot(json.loads((RESULTS_DIR / f"{a.out}.json").read_text())["rows"], RESULTS_DIR / f"{a.out}.png")
    rows = []
    for spec in a.problems.split(","):
        p = build(spec, a.seed)
        row = {"problem": spec, **run_problem(p, a.ilp_seconds, a.search_seconds, a.unseeded)}
        rows.append(row)
        print({k: v for k, v in row.items() if k not in ("ilp_summary", "ilp_free_summary")}, flush=True)
        write_results(a.out, {"rows": rows}, config=vars(a), seed=a.seed)
    table = [{"problem": r["problem"], "nodes": r["nodes"], "ilp_cost": r["ilp_summary"]["cost"],
              "ilp_wall_s": r["ilp_summary"]["wall_s"], "ilp_status": r["ilp_summary"]["status"],
              **{f"{k}_reach_s": r.get(f"{k}_reach_s") for k in ("policy", "default", "bp", "ilp")},
              **{f"{k}_best_ratio": r.get(f"{k}_best_ratio") for k in ("policy", "default", "bp")},
              "within_25pct": r.get("planner_within_25pct"), "default_within": r.get("default_within_25pct"),
              "default_found_s": r.get("default_curve_reach_s"),
              "free_ilp_cost": r.get("ilp_free_summary", {}).get("cost"),
              "free_ilp_wall_s": r.get("ilp_free_summary", {}).get("wall_s"),
              "free_planner_reach_s": r.get("free_planner_reach_s"),
              "free_within_25pct": r.get("free_planner_within_25pct"),
              "free_default_within": r.get("free_default_within_25pct"), "load": r["load_avg_before"][0]} for r in rows]
    print_table(table, title="time to the ILP's incumbent (s; best cost / ILP's when never reached)")
    plot(rows, RESULTS_DIR / f"{a.out}.png")


if __name__ == "__main__":
    main()
