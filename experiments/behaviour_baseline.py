"""Record what the planners return on the zoo's tiny models, to hold a restructuring to "behaviour
preserved" (issue 14).

    python experiments/behaviour_baseline.py --out results/behaviour_baseline.json
    python experiments/behaviour_baseline.py --check results/behaviour_baseline.json

For every zoo model at size "tiny" on cpu-2x4 (fixed seeds throughout) it records:
- the ILP's time optimum (cost, status) and, where the solver proves it within the limit, the
  memory optimum;
- the ILP under a binding memory cap (halfway from the least peak to the time optimum's peak);
- the baselines' costs and peaks (dp, megatron, fsdp, replicated);
- the policy planner (raw decode and with its search), plain and Lagrangian BP, fgnn raw.
``--check`` recomputes and compares: proven ILP optima must agree to 1e-9 relative (an ILP row
that is not proven on both sides is not compared: its incumbent depends on the time limit and the
load), heuristics to the stated tolerance (default 0: they are deterministic on one machine).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")

import shardgym as sg  # noqa: E402
import zoo  # noqa: E402
from solvers.bp import bp_plan  # noqa: E402

MODELS = ("mlp", "gpt", "vit", "fno", "unet", "meshgraphnet")


def _row(problem, plan_or_list):
    c = sg.evaluate(problem, plan_or_list)
    out = {"total": float(c.total), "peak_bytes": float(c.peak_memory_bytes), "feasible": bool(c.feasible)}
    info = getattr(plan_or_list, "info", None) or {}
    if "status" in info:
        out["status"] = info["status"]
    return out


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # recorded, so a later run that raises the same agrees
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def record(models, ilp_s: float) -> dict:
    rows = {}
    cluster = sg.Cluster.preset("cpu-2x4")
    for name in models:
        t0 = time.perf_counter()
        fn, args = zoo.build(name, "tiny", abstract=True)
        problem = sg.build_problem(sg.trace(fn, *args), cluster)
        r = {"nodes": problem.num_nodes, "strategies": int(sum(problem.num_strategies))}
        t = sg.solve(problem, method="ilp", time_limit_s=ilp_s)
        r["ilp_time"] = _row(problem, t)
        r["ilp_memory"] = _try(lambda: _row(problem, sg.solve(problem, method="ilp", objective="memory",
                                                               time_limit_s=ilp_s)))
        least = r["ilp_memory"].get("peak_bytes", r["ilp_time"]["peak_bytes"])
        cap = least + 0.5 * (r["ilp_time"]["peak_bytes"] - least)
        r["cap_bytes"] = cap
        r["ilp_capped"] = _try(lambda: _row(problem, sg.solve(problem, method="ilp", memory_cap_bytes=cap,
                                                               time_limit_s=ilp_s)))
        for m in ("dp", "megatron", "fsdp", "replicated"):
            r[m] = _try(lambda m=m: _row(problem, sg.solve(problem, method=m)))
        r["policy_raw"] = _try(lambda: _row(problem, sg.solve(problem, method="policy", search=False)))
        r["policy"] = _try(lambda: _row(problem, sg.solve(problem, method="policy")))
        r["fgnn_raw"] = _try(lambda: _row(problem, sg.solve(problem, method="policy", search=False,
                                                             checkpoint="fgnn")))
        r["bp_plain"] = _try(lambda: _row(problem, bp_plan(problem, memory_prices=False)))
        r["bp_lagrangian"] = _try(lambda: _row(problem, bp_plan(problem, memory_prices=True)))
        r["wall_s"] = time.perf_counter() - t0
        rows[name] = r
        print(f"{name:13s} nodes {r['nodes']:4d}  ilp {r['ilp_time']['total']:.6g} ({r['ilp_time'].get('status')})  "
              f"policy_raw {r['policy_raw'].get('total', r['policy_raw'].get('error'))}  {r['wall_s']:.0f} s",
              flush=True)
    return rows


def compare(old: dict, new: dict, rtol: float) -> list[str]:
    """The differences that break 'behaviour preserved'."""
    bad = []
    for model, rows in old["rows"].items():
        for key, a in rows.items():
            b = new["rows"].get(model, {}).get(key)
            if not isinstance(a, dict):
                continue
            if b is None or ("error" in a) != ("error" in b):
                bad.append(f"{model}.{key}: {a} -> {b}")
                continue
            if "error" in a:
                continue
            proven = a.get("status") == "optimal" and b.get("status") == "optimal"
            if key.startswith("ilp") and not proven:
                continue   # a time-limited MILP's incumbent depends on the limit and the load
            tol = 1e-9 if proven else rtol
            for f in ("total", "peak_bytes"):
                if f == "peak_bytes" and key.startswith("ilp") and proven and key != "ilp_memory":
                    continue   # ties: an optimum's peak is not unique
                x, y = a[f], b[f]
                if abs(x - y) > tol * max(abs(x), 1e-30) + 1e-30:
                    bad.append(f"{model}.{key}.{f}: {x:.9g} -> {y:.9g}")
            if a.get("feasible") != b.get("feasible"):
                bad.append(f"{model}.{key}.feasible: {a.get('feasible')} -> {b.get('feasible')}")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/behaviour_baseline.json")
    ap.add_argument("--check", help="a recorded JSON to compare against (writes --out too)")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--ilp-s", type=float, default=60.0, help="time limit of each ILP solve")
    ap.add_argument("--rtol", type=float, default=0.0, help="tolerance for heuristics (not proven optima)")
    a = ap.parse_args(argv)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"git_rev": rev, "config": vars(a), "rows": record(a.models, a.ilp_s)}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}")
    if a.check:
        with open(a.check) as f:
            old = json.load(f)
        bad = compare(old, out, a.rtol)
        print("\n".join(bad) if bad else f"behaviour preserved against {a.check} ({old['git_rev'][:7]})")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
