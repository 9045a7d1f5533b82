"""Benchmark the exact ILP and the IOPDDL contest solver.

(a) random 1,000-node problems (8 strategies per node, sparse DAG of ~1.5 edges per node, random
    intervals, a memory limit that binds): wall time to the proven optimum with and without the
    reductions of solvers/reduce.py;
(b) every shared IOPDDL instance (../shared/iopddl): ``shardgym iopddl FILE TIMEOUT`` in a
    subprocess with the contest timeout times ``--timeout-scale``: cost, feasibility, score =
    best_known / cost, wall, and the machine's load average around each run;
(c) zoo models (gpt tiny, ... on cpu-2x4 and h100-2x8): time to the proven optimum, when
    ``costmodel.builder.build_problem`` is available;
(m) "memory objective" (``--sections m``): per zoo model (tiny, cpu-2x4) the memory objective
    without a bound (its peak is proven optimal at once; the wall time includes the time
    tie-break), the memory objective with max_step_time_s = 1.05 x Megatron's step time through
    ``shardgym.solve`` (seeded with the baseline plans: peak, gap, savings against Megatron and
    FSDP) and the redundancy objective. Stored under "memory_objective".

(s) "solvers" (``--sections s``): HiGHS against OR-Tools CP-SAT with 2 workers (``cpsat_solve``,
    the same model) on the random problems of (a) and gpt / unet tiny; needs the optional
    ``cpsat`` extra (``pip install -e ".[cpsat]"``), skipped without it.

Writes results/bench_ilp.json. Usage:
    python experiments/bench_ilp.py [--sections a,b,c] [--timeout-scale 1.0] [--instances A,B,G,M,S]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from costmodel.problem import Problem, evaluate  # noqa: E402
from experiments.common import print_table, write_results  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "iopddl")


@dataclass
class Config:
    sections: str = "a,b,c"
    seed: int = 0
    random_nodes: int = 1000
    random_strategies: int = 8
    random_instances: int = 1
    random_time_limit_s: float = 120.0
    timeout_scale: float = 1.0
    instances: str = "A,B,G,M,S"
    zoo: str = ("gpt:tiny,gpt:125m,gpt:350m,gpt:1.3b,gpt:7b,vit:tiny,vit:base,fno:tiny,fno:large,"
                "unet:tiny,unet:large,meshgraphnet:tiny,meshgraphnet:large,mlp:tiny,mlp:large")
    clusters: str = "cpu-2x4,h100-2x8"
    zoo_time_limit_s: float = 60.0
    memory_models: str = "gpt,vit,fno,unet,meshgraphnet,mlp"
    memory_cluster: str = "cpu-2x4"
    memory_time_limit_s: float = 30.0


def random_problem(n: int, k: int, seed: int) -> Problem:
    """Sparse random DAG: each node i > 0 gets 1 or 2 producers among the previous 20 nodes."""
    rng = np.random.default_rng(seed)
    costs = [rng.integers(1, 1000, k).astype(float) for _ in range(n)]
    usages = [rng.integers(1, 100, k).astype(float) for _ in range(n)]
    st = np.arange(n)
    en = st + rng.integers(1, 30, n)
    edges, ecosts = [], []
    for v in range(1, n):
        for u in rng.choice(np.arange(max(0, v - 20), v), size=min(v, 1 + int(rng.random() < 0.5)), replace=False):
            edges.append((int(u), v))
            m = rng.integers(0, 500, k * k).astype(float)
            m[np.arange(k) * (k + 1)] = 0.0       # same layout on both sides: no resharding
            ecosts.append(m)
    p = Problem.from_lists(f"random-{n}x{k}-s{seed}", costs, usages, np.stack([st, en], 1), edges, ecosts)
    # limit: between the lowest-usage plan's peak and the cheapest-node plan's peak
    lo = evaluate(p, [int(np.argmin(u)) for u in usages]).peak_memory_bytes
    hi = evaluate(p, [int(np.argmin(c)) for c in costs]).peak_memory_bytes
    return p.with_usage_limit(float(lo + 0.5 * (hi - lo)))


def section_a(cfg: Config) -> list[dict]:
    from solvers.ilp import solve_ilp
    rows = []
    for i in range(cfg.random_instances):
        p = random_problem(cfg.random_nodes, cfg.random_strategies, cfg.seed + i)
        for reduce in (True, False):
            t0 = time.perf_counter()
            plan, info = solve_ilp(p, time_limit_s=cfg.random_time_limit_s, reduce=reduce)
            rows.append({"instance": p.name, "reduce": reduce, "status": info.status,
                         "cost": evaluate(p, plan).total, "bound": info.bound,
                         "wall_s": round(time.perf_counter() - t0, 2), "vars": info.num_vars,
                         "rows": info.num_rows, "free_nodes": info.reduced_nodes})
            print(rows[-1], flush=True)
    print_table(rows, title="(a) random problems: time to proven optimum")
    return rows


def cpsat_solve(p: Problem, time_limit_s: float, workers: int = 2, scale_to: float = 1e6):
    """The same model in OR-Tools CP-SAT (``pip install -e ".[cpsat]"``): one-hot booleans per node,
    Alpa's linearised edge booleans, one row per time point for the memory limit. CP-SAT needs
    integer data: costs are scaled so the median nonzero one is ``scale_to`` and rounded, usages
    and the limit likewise (rounded up / down), so its optimum can differ from HiGHS's by the
    rounding (the plan is re-priced exactly). -> (plan or None, status, wall_s)."""
    from ortools.sat.python import cp_model
    t0 = time.perf_counter()
    m = cp_model.CpModel()
    k, offs = p.num_strategies, p.strategy_offsets
    allc = np.concatenate([p.node_costs, p.edge_costs])
    nz = np.abs(allc[allc != 0])
    cs = scale_to / float(np.median(nz)) if nz.size else 1.0
    x = [[m.NewBoolVar("") for _ in range(int(k[i]))] for i in range(p.num_nodes)]
    obj = []
    for i in range(p.num_nodes):
        m.AddExactlyOne(x[i])
        obj += [int(round(c * cs)) * x[i][s] for s, c in enumerate(p.node_costs[offs[i]:offs[i + 1]])]
    for e in range(p.num_edges):
        u, v = (int(a) for a in p.edges[e])
        M = p.edge_matrix(e)
        y = [[m.NewBoolVar("") for _ in range(M.shape[1])] for _ in range(M.shape[0])]
        for s in range(M.shape[0]):
            m.Add(sum(y[s]) == x[u][s])
        for t in range(M.shape[1]):
            m.Add(sum(y[s][t] for s in range(M.shape[0])) == x[v][t])
        obj += [int(round(M[s, t] * cs)) * y[s][t] for s in range(M.shape[0]) for t in range(M.shape[1])
                if M[s, t] != 0]
    if p.usage_limit is not None:
        us = 1e6 / max(float(np.abs(p.node_usages).max()), 1.0)
        st, en = p.intervals[:, 0], p.intervals[:, 1]
        for t in np.unique(st):
            live = np.nonzero((st <= t) & (t < en))[0]
            m.Add(sum(int(np.ceil(p.node_usages[offs[i] + s] * us)) * x[i][s]
                      for i in live for s in range(int(k[i]))) <= int(np.floor(p.usage_limit * us)))
    m.Minimize(sum(obj))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = int(workers)
    st = solver.Solve(m)
    name = solver.StatusName(st).lower()
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, time.perf_counter() - t0
    plan = [int(np.argmax([solver.Value(b) for b in x[i]])) for i in range(p.num_nodes)]
    return plan, name, time.perf_counter() - t0


def section_s(cfg: Config) -> list[dict]:
    """HiGHS against OR-Tools CP-SAT (2 workers) on the random problems of (a) and two zoo models."""
    try:
        import ortools  # noqa: F401
    except ImportError:
        print('(s) skipped: OR-Tools is not installed (pip install -e ".[cpsat]")')
        return [{"skipped": "ortools not installed"}]
    import shardgym as sg
    from shardgym import workflow
    from solvers.ilp import solve_ilp
    probs = [random_problem(cfg.random_nodes, cfg.random_strategies, cfg.seed + i)
             for i in range(cfg.random_instances)]
    for spec in ("gpt:tiny", "unet:tiny"):
        model, size = spec.split(":")
        probs.append(workflow.model_problem(model, size, sg.Cluster.preset("cpu-2x4"))[3])
    rows = []
    lim = cfg.random_time_limit_s
    for p in probs:
        t0 = time.perf_counter()
        try:
            hp, hi = solve_ilp(p, time_limit_s=lim)
            hc, hst = evaluate(p, hp).total, hi.status
        except RuntimeError:          # no plan within the limit
            hc, hst = None, "no plan"
        h_s = time.perf_counter() - t0
        cp, cst, c_s = cpsat_solve(p, lim)
        cc = evaluate(p, cp) if cp is not None else None
        rows.append({"problem": p.name, "nodes": p.num_nodes, "highs_status": hst, "highs_s": round(h_s, 2),
                     "highs_cost": hc, "cpsat_status": cst, "cpsat_s": round(c_s, 2),
                     "cpsat_cost": None if cc is None else cc.total,
                     "cpsat_feasible": None if cc is None else bool(cc.feasible),
                     "cpsat_over_highs": None if cc is None or not hc else cc.total / hc})
        print(rows[-1], flush=True)
    print_table(rows, title=f"(s) HiGHS vs CP-SAT (2 workers), {lim:g} s limit")
    return rows


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def section_b(cfg: Config) -> list[dict]:
    """Run ``shardgym iopddl FILE TIMEOUT`` exactly as a user would (the console script of the
    venv, one subprocess per instance), time it, parse the last line and price the plan."""
    with open(os.path.join(SHARED, "best_known.json")) as f:
        bk = json.load(f)
    exe = os.path.join(os.path.dirname(sys.executable), "shardgym")
    cmd0 = [exe, "iopddl"] if os.path.exists(exe) else [sys.executable, "-m", "shardgym.cli", "iopddl"]
    rows = []
    for name in cfg.instances.split(","):
        path = os.path.join(SHARED, f"asplos-2025-iopddl-{name}.json.gz")
        timeout = bk["timeout_s"][name] * cfg.timeout_scale
        load_before = _load_average()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd0 + [path, f"{timeout:g}"], capture_output=True, text=True,
                                  timeout=timeout + 5, cwd=REPO)
            out = proc.stdout.strip().splitlines()
            plan = json.loads(out[-1]) if out else []
            log = proc.stderr.strip().splitlines()[-4:]
        except subprocess.TimeoutExpired:
            plan, log = [], ["killed: ran past the timeout"]
        wall = time.perf_counter() - t0
        p = Problem.from_iopddl(path)
        if plan:
            c = evaluate(p, plan)
            cost, feas = c.total, c.feasible
        else:
            cost, feas = float("inf"), False
        best = bk["best_known_cost"][name]
        rows.append({"instance": name, "timeout_s": timeout, "wall_s": round(wall, 1), "cost": cost,
                     "feasible": feas, "forbidden_free": bool(cost < 1e17), "best_known": best,
                     "score": (best / cost) if feas and cost > 0 else 0.0,
                     "load_avg_before": load_before, "load_avg_after": _load_average(), "log_tail": log})
        print({k: v for k, v in rows[-1].items() if k != "log_tail"}, flush=True)
    print_table([{k: v for k, v in r.items() if k not in ("log_tail", "load_avg_before", "load_avg_after")}
                 for r in rows], title="(b) IOPDDL instances")
    return rows


def section_c(cfg: Config) -> list[dict]:
    try:
        import zoo
        from costmodel.builder import build_problem
        from costmodel.trace import trace
    except ImportError as exc:
        print(f"(c) skipped: build_problem is unavailable ({exc})")
        return [{"skipped": str(exc)}]
    from solvers.ilp import InfeasibleError, solve_ilp
    rows = []
    for spec in cfg.zoo.split(","):
        model, size = spec.split(":")
        try:
            fn, args = zoo.build(model, size, abstract=True)
            graph = trace(fn, *args)
        except Exception as exc:  # a zoo entry that is missing or broken: report and go on
            rows.append({"model": spec, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for cluster in cfg.clusters.split(","):
            try:
                tb = time.perf_counter()
                p = build_problem(graph, cluster)
                t0 = time.perf_counter()
                plan, info = solve_ilp(p, time_limit_s=cfg.zoo_time_limit_s)
                rows.append({"model": spec, "cluster": cluster, "nodes": p.num_nodes,
                             "strategies": int(p.num_strategies.sum()), "status": info.status,
                             "gap": info.gap, "step_time_s": info.step_time_s,
                             "peak_gib": round(info.peak_memory_bytes / 2**30, 2),
                             "build_s": round(t0 - tb, 2), "wall_s": round(time.perf_counter() - t0, 2),
                             "free_nodes": info.reduced_nodes, "lp_columns": info.num_vars,
                             "cap_relaxed": bool(info.reduction.get("memory_cap_relaxed", False))})
            except InfeasibleError as exc:   # the model does not fit the cluster's memory at all
                rows.append({"model": spec, "cluster": cluster, "status": "infeasible",
                             "peak_gib": round(exc.min_peak_bytes / 2**30, 2), "error": str(exc)})
            except Exception as exc:
                rows.append({"model": spec, "cluster": cluster, "error": f"{type(exc).__name__}: {exc}"})
            print(rows[-1], flush=True)
    print_table(rows, title="(c) zoo models: time to proven optimum")
    goal = [r for r in rows if r.get("model") == "gpt:350m" and "wall_s" in r]
    for r in goal:
        print(f"goal: GPT-2 medium (gpt 350m, {r['nodes']} nodes) on {r['cluster']}: {r['status']} in "
              f"{r['wall_s']} s (+{r['build_s']} s to build the problem); goal < 60 s")
    return rows


def section_m(cfg: Config) -> list[dict]:
    """The memory and redundancy objectives on the zoo models (see the module docstring)."""
    import shardgym as sg
    from shardgym import workflow
    rows = []
    lim = cfg.memory_time_limit_s
    for model in cfg.memory_models.split(","):
        try:
            _, _, _, p = workflow.model_problem(model, "tiny", sg.Cluster.preset(cfg.memory_cluster))
        except Exception as exc:  # a zoo entry that is missing or broken: report and go on
            rows.append({"model": model, "error": f"{type(exc).__name__}: {exc}"})
            continue
        row = {"model": model, "cluster": cfg.memory_cluster, "nodes": p.num_nodes,
               "strategies": int(p.num_strategies.sum()), "load_avg_before": _load_average()}
        meg, fsdp = (sg.evaluate(p, sg.solve(p, method=m)) for m in ("megatron", "fsdp"))
        bound = 1.05 * meg.step_time_s
        runs = {"memory": dict(objective="memory"),
                "memory_1.05meg": dict(objective="memory", max_step_time_s=bound),
                "redundancy": dict(objective="redundancy")}
        for key, kw in runs.items():
            t0 = time.perf_counter()
            try:
                plan = sg.solve(p, method="ilp", time_limit_s=lim, **kw)
            except Exception as exc:
                row[key] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            c = sg.evaluate(p, plan)
            info = plan.info
            row[key] = {"wall_s": round(time.perf_counter() - t0, 2), "status": info.get("status"),
                        "gap": info.get("gap"), "bound": info.get("bound"),
                        "peak_memory_bytes": c.peak_memory_bytes, "step_time_s": c.step_time_s,
                        "redundant_memory_bytes": c.redundant_memory_bytes}
        row["megatron"] = {"peak_memory_bytes": meg.peak_memory_bytes, "step_time_s": meg.step_time_s}
        row["fsdp"] = {"peak_memory_bytes": fsdp.peak_memory_bytes, "step_time_s": fsdp.step_time_s}
        mt = row.get("memory_1.05meg", {})
        if "peak_memory_bytes" in mt:
            mt["max_step_time_s"] = bound
            mt["saving_vs_megatron"] = 1 - mt["peak_memory_bytes"] / meg.peak_memory_bytes
            mt["saving_vs_fsdp"] = 1 - mt["peak_memory_bytes"] / fsdp.peak_memory_bytes
        row["load_avg_after"] = _load_average()
        rows.append(row)
        print(json.dumps(row), flush=True)
    flat = []
    for r in rows:
        if "error" in r:
            flat.append(r)
            continue
        f = {"model": r["model"], "nodes": r["nodes"]}
        for key in ("memory", "memory_1.05meg", "redundancy"):
            d = r.get(key, {})
            f[key + " s"] = d.get("wall_s", str(d.get("error", ""))[:20])
            f[key + " status"] = d.get("status")
        f["saving vs meg"] = r.get("memory_1.05meg", {}).get("saving_vs_megatron")
        flat.append(f)
    print_table(flat, title=f"(m) memory objective (tiny, {cfg.memory_cluster}, limit {lim:g} s)")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f, v in asdict(Config()).items():
        ap.add_argument("--" + f.replace("_", "-"), type=type(v), default=v)
    cfg = Config(**vars(ap.parse_args(argv)))
    out = {}
    secs = cfg.sections.split(",")
    if "a" in secs:
        out["random"] = section_a(cfg)
    if "b" in secs:
        out["iopddl"] = section_b(cfg)
    if "c" in secs:
        out["zoo"] = section_c(cfg)
    if "m" in secs:
        out["memory_objective"] = section_m(cfg)
    if "s" in secs:
        out["solvers"] = section_s(cfg)
    prev = os.path.join(REPO, "results", "bench_ilp.json")
    if os.path.exists(prev):        # keep the sections this run did not redo
        with open(prev) as f:
            old = json.load(f)
        for key in ("random", "iopddl", "zoo", "memory_objective", "solvers"):
            if key not in out and key in old:
                out[key] = old[key]
    import tempfile
    os.makedirs(os.path.join(REPO, "results"), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.join(REPO, "results")) as tmp:   # write, then rename
        path = os.path.join(REPO, "results", "bench_ilp.json")
        os.replace(write_results("bench_ilp", out, config=asdict(cfg), seed=cfg.seed, results_dir=tmp), path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
