"""Best-known costs and proven lower bounds for the held-out problems, cached per problem fingerprint.

    python experiments/heldout_reference.py --seconds 300            # every held-out problem
    python experiments/heldout_reference.py --seconds 600 --only "meshgraphnet-tiny@h100-2x8 cap0.5"

A 60-s capped ILP is a weak reference on today's capped held-out problems (its incumbent was 7-30x
worse than the default planner's plan in results/eval_policy_s14b.json), so a ratio to it says
nothing. This keeps, per problem, the least cost any run has found (``cost``, with the ``plan`` so
that it can be checked: ``lookup`` re-evaluates it and drops an entry whose plan no longer fits or
no longer costs what is stored) and the greatest lower bound any run has proven (``bound``: the
HiGHS dual bound, the Lagrangian's or BP's, whichever ``solvers.capped`` reports; the uncapped
optimum's bound is one too). Keyed by the problem's name (``problem_name``: eval_policy's row name)
and ``costmodel.problem.problem_fingerprint``: a hash of every array and the cap the cost model produced, so any
change to the cost model, the memory model or the builder invalidates an entry (it is then
recomputed, never silently reused).

What this script runs per problem: the uncapped problems (and caps that cannot bind,
``solvers.dispatch.binding_cap``) get ``solve_ilp`` for ``--ilp-seconds``, which proves them
optimal in seconds; the capped ones get the capped core (``solvers.dispatch.solve_exact``: BP,
search, uncapped bound, Lagrangian bound, union MILP, capped MILP, LNS) for ``--seconds``, seeded
with every plan at hand: the cached best, the default planner's (``shardgym.solve(method="policy")``),
the least-usage plan and its copy-priced repair. Its result and bound are merged into
results/heldout_reference.json (``record``: the cost only goes down, the bound only up; a bound
above a known cost would be a solver bug and is reported, not stored). Runs on a loaded machine
only find less; the stored figures are what was found, with the run's wall time and load.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np  # noqa: E402

from costmodel.problem import problem_fingerprint  # noqa: E402  (re-exported: the cache key)

DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                            "heldout_reference.json")
#: relative tolerance for "the stored plan still costs the stored cost" and "bound <= cost"
RTOL = 1e-9


def problem_name(w) -> str:
    """eval_policy's row name of workload ``w``: its name plus " cap<fraction>" when capped."""
    return w.name + ("" if w.memory_cap_fraction is None else f" cap{w.memory_cap_fraction:g}")


def heldout_problems(caps=(None, 0.5), only: str = ""):
    """[(name, Workload)] of the held-out split (``env.workloads.heldout_workloads``) under ``caps``."""
    from env.workloads import Workload, heldout_workloads
    ws = [Workload(w.model, w.size, w.cluster, None, c) for w in heldout_workloads() for c in caps]
    return [(problem_name(w), w) for w in ws if only in problem_name(w)]


def load(path: str = DEFAULT_PATH) -> dict:
    """The cached entries {name: entry} (empty when there is no file)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f).get("entries", {})


def lookup(entries: dict, name: str, p) -> dict | None:
    """The entry for ``name`` if it was computed for this exact problem (same fingerprint), with its
    plan re-evaluated: ``cost`` is None when the stored plan no longer fits or costs differently
    (then only a bound is offered, if any). None when there is no entry or the problem changed."""
    from costmodel.problem import evaluate
    e = entries.get(name)
    if e is None or e.get("fingerprint") != problem_fingerprint(p):
        return None
    e = dict(e)
    if e.get("plan") is not None:
        c = evaluate(p, e["plan"])
        if not c.feasible or abs(c.total - e["cost"]) > RTOL * max(abs(c.total), 1e-300):
            e["cost"], e["plan"] = None, None
    return e


@contextlib.contextmanager
def _locked(path: str):
    import fcntl
    import tempfile
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = os.path.join(tempfile.gettempdir(), "heldout_reference-" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12] + ".lock")
    with open(lock, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)


def record(name: str, p, plan=None, bound: float | None = None, source: str = "", note: dict | None = None,
           path: str = DEFAULT_PATH) -> dict:
    """Merge a run's ``plan`` (kept only if it fits and is cheaper than the stored one) and proven
    lower ``bound`` (kept if greater) into the cache under ``name``; an entry for a different
    fingerprint is replaced. ``note`` (wall time, load, status) is appended to the entry's ``runs``.
    Returns the merged entry."""
    from costmodel.problem import evaluate
    fp = problem_fingerprint(p)
    with _locked(path):
        data = {"entries": {}}
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
        e = data["entries"].get(name)
        if e is None or e.get("fingerprint") != fp:
            e = {"fingerprint": fp, "nodes": p.num_nodes, "usage_limit": p.usage_limit, "cost": None, "plan": None,
                 "cost_source": None, "bound": None, "bound_source": None, "runs": []}
        run = {"source": source, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "load1": os.getloadavg()[0], **(note or {})}
        if plan is not None:
            c = evaluate(p, plan)
            run["cost"] = c.total
            run["feasible"] = bool(c.feasible)
            if c.feasible and (e["cost"] is None or c.total < e["cost"]):
                e.update(cost=c.total, plan=[int(s) for s in plan], cost_source=source)
        if bound is not None and np.isfinite(bound):
            run["bound"] = float(bound)
            if e["cost"] is not None and bound > e["cost"] * (1 + 1e-6):
                run["bound_rejected"] = "above the best-known cost (a solver bug?)"
                print(f"{name}: bound {bound:.10g} from {source} is above the best cost {e['cost']:.10g}; not stored",
                      flush=True)
            elif e["bound"] is None or bound > e["bound"]:
                e.update(bound=float(bound), bound_source=source)
        if e["cost"] is not None and e["bound"] is not None:
            e["gap"] = (e["cost"] - e["bound"]) / abs(e["cost"])
            e["proven"] = e["gap"] <= 1e-6
        e["runs"].append(run)
        data["entries"][name] = e
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    return e


def reference_for(entries: dict, name: str, p, ilp_cost: float | None, ilp_bound: float | None = None) -> dict:
    """The best reference for a row: ``ref_cost`` = min(this run's ILP cost, the cached best-known
    cost), ``ref_source`` "ilp" or "cache" (the ILP wins ties), and ``lower_bound`` = max(this
    run's ILP bound, the cached bound) or None."""
    e = lookup(entries, name, p)
    cached = None if e is None else e.get("cost")
    out = {"ref_cost": ilp_cost, "ref_source": "ilp"}
    if cached is not None and (ilp_cost is None or cached < ilp_cost):
        out = {"ref_cost": cached, "ref_source": "cache"}
    bounds = [b for b in (ilp_bound, None if e is None else e.get("bound")) if b is not None and np.isfinite(b)]
    out["lower_bound"] = max(bounds) if bounds else None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="the capped core's budget per capped problem")
    ap.add_argument("--ilp-seconds", type=float, default=60.0, help="solve_ilp's budget where the cap cannot bind")
    ap.add_argument("--caps", default="none,0.5")
    ap.add_argument("--only", default="", help="only problems whose name contains this text")
    ap.add_argument("--capped-only", action="store_true", help="skip problems whose cap cannot bind")
    ap.add_argument("--skip-proven", action="store_true", help="skip problems whose cached cost meets its bound")
    ap.add_argument("--path", default=DEFAULT_PATH)
    args = ap.parse_args(argv)

    import shardgym as sg
    from costmodel.problem import evaluate
    from solvers.dispatch import binding_cap, solve_exact
    from solvers.ilp import solve_ilp
    from solvers.local import fitting_least_usage_plan, least_usage_plan

    caps = [None if c.strip() == "none" else float(c) for c in args.caps.split(",")]
    for name, w in heldout_problems(caps, args.only):
        p = w.build()
        binds = binding_cap(p) is not None
        if args.capped_only and not binds:
            continue
        entries = load(args.path)
        old = lookup(entries, name, p)
        if args.skip_proven and old is not None and old.get("cost") is not None and old.get("proven"):
            continue
        t = time.perf_counter()
        if not binds:
            plan, si = solve_ilp(p, objective="time", time_limit_s=args.ilp_seconds)
            e = record(name, p, plan, si.bound,
                       source=f"solve_ilp {args.ilp_seconds:g}s",
                       note={"status": si.status, "wall_s": time.perf_counter() - t}, path=args.path)
        else:
            seeds = []
            if old is not None and old.get("plan") is not None:
                seeds.append(old["plan"])
            try:
                seeds.append(list(sg.solve(p, method="policy").strategies))
                record(name, p, seeds[-1], source="default planner", path=args.path,
                       note={"wall_s": time.perf_counter() - t})
            except Exception as exc:   # noqa: BLE001 - no plan from the planner: the other seeds
                print(f"{name}: default planner: {type(exc).__name__}: {exc}", flush=True)
            seeds.append(least_usage_plan(p))
            fit = fitting_least_usage_plan(p, time_limit_s=2.0)
            if fit is not None:
                seeds.append(list(fit))
            t = time.perf_counter()
            plan, info = solve_exact(p, "time", None, args.seconds, initial_plans=seeds)
            e = record(name, p, plan, info.get("bound"), source=f"capped core {args.seconds:g}s",
                       note={"status": info.get("status"), "wall_s": time.perf_counter() - t,
                             "from": info.get("source")}, path=args.path)
        print(f"{name}: best {e['cost']:.6g} ({e['cost_source']}), bound "
              f"{'-' if e['bound'] is None else format(e['bound'], '.6g')} ({e['bound_source']}), "
              f"gap {e.get('gap', float('nan')):.3%}, this run {evaluate(p, plan).total:.6g} "
              f"in {time.perf_counter() - t:.0f}s, load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
