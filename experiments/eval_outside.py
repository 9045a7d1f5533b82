"""The default planner on train steps it has never seen, traced from code outside the zoo.

Issue 18's point "train steps it has never seen ... on cpu-2x4, uncapped and under a binding cap:
default policy / ILP median <= 1.02, planned faster than the ILP on each; raw decode median
<= 1.05". Steps: ``outside:NAME`` for every step of tests/data/outside_steps.py (moe, rnn, convae; since session 28
also mixer, ssm, gnn, gqa, conv3d)
and ``autoencoder``, ``moe_adam`` (experiments/bench_capped.py), plus ``tcn`` written here (a
temporal convolution net: causal 1-D convolutions with dilations 1, 2, 4 and residuals, SGD), none
of them in any training split. Per step and cluster: uncapped, and under a cap half way between the
least-usage plan's peak and the uncapped ILP optimum's peak (a cheap, binding cap: skipped when the
two peaks meet). For each: ``solve(method="ilp", time_limit_s=--seconds)`` (cost, status, wall),
``solve(method="policy")`` (the default: decode + search) and ``solve(method="policy", search=False)``
(raw decode), cost / ILP cost and wall time, and the default's status ("optimal" where its search proved
the plan optimal, since session 27). Records the load average per cell.

    nice -n 10 python experiments/eval_outside.py              # results/eval_outside.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np  # noqa: E402


def tcn_step():
    """A temporal convolution net (the zoo has no 1-D or dilated-causal convolutions): three causal
    1-D convolutions, dilations 1, 2, 4, residual after the first, a linear read-out, MSE, SGD."""
    import jax
    import jax.numpy as jnp

    def conv(x, w, d):
        k = w.shape[0]
        x = jnp.pad(x, ((0, 0), ((k - 1) * d, 0), (0, 0)))   # causal: pad the past only
        return jax.lax.conv_general_dilated(x, w, (1,), "VALID", rhs_dilation=(d,),
                                            dimension_numbers=("NWC", "WIO", "NWC"))

    def loss(p, x, t):
        h = jax.nn.relu(conv(x, p["c1"], 1))
        h = jax.nn.relu(conv(h, p["c2"], 2)) + h
        h = jax.nn.relu(conv(h, p["c3"], 4))
        return jnp.mean((h @ p["out"] - t) ** 2)

    def step(p, x, t):
        g = jax.grad(loss)(p, x, t)
        return jax.tree.map(lambda w, gi: w - 1e-2 * gi, p, g)

    k = jax.random.split(jax.random.PRNGKey(2), 6)
    c = 32
    p = {"c1": jax.random.normal(k[0], (3, 4, c)) * 0.1, "c2": jax.random.normal(k[1], (3, c, c)) * 0.1,
         "c3": jax.random.normal(k[2], (3, c, c)) * 0.1, "out": jax.random.normal(k[3], (c, 2)) * 0.1}
    return step, (p, jax.random.normal(k[4], (8, 256, 4)), jax.random.normal(k[5], (8, 256, 2)))


def binding_cap(problem, optimum) -> float | None:
    """The eval's binding cap on ``problem`` (uncapped): half way from the least-usage plan's peak to the peak of
    ``optimum`` (the uncapped ILP's plan); None where those peaks meet (no cap between them binds)."""
    import shardgym as sg
    from solvers.local import least_usage_plan
    free = sg.evaluate(problem, optimum).peak_memory_bytes
    lo = sg.evaluate(problem, least_usage_plan(problem)).peak_memory_bytes
    return lo + 0.5 * (free - lo) if lo < free else None


def _steps():
    from experiments.bench_capped import OUTSIDE, _step
    from experiments.fidelity import outside_steps
    out = {f"outside:{n}": (lambda n=n: _step(f"outside:{n}")) for n in outside_steps()}
    out.update(OUTSIDE)
    out["tcn"] = tcn_step
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="cpu-2x4")
    ap.add_argument("--seconds", type=float, default=60.0, help="the ILP's time limit")
    ap.add_argument("--only", default="", help="comma list of step names")
    ap.add_argument("--out", default="eval_outside")
    a = ap.parse_args(argv)
    import shardgym as sg
    from experiments.common import git_rev, print_table, write_results
    steps = _steps()
    names = a.only.split(",") if a.only else list(steps)
    rows = []
    for name in names:
        fn, args = steps[name]()
        g = sg.trace(fn, *args)
        for cl in a.clusters.split(","):
            p = sg.build_problem(g, sg.Cluster.preset(cl)).with_usage_limit(None)
            caps = [None]
            for cap in caps:
                row = {"step": name, "cluster": cl, "nodes": p.num_nodes, "cap_bytes": cap, "git_rev": git_rev(),
                       "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
                t = time.perf_counter()
                ilp = sg.solve(p, method="ilp", memory_cap_bytes=cap, time_limit_s=a.seconds)
                row.update(ilp_s=round(time.perf_counter() - t, 2), ilp_status=ilp.info.get("status"),
                           ilp_gap=ilp.info.get("gap"))
                pc = p if cap is None else p.with_usage_limit(cap)
                opt = sg.evaluate(pc, ilp).total
                row["ilp_cost"] = opt
                for key, kw in (("default", {}), ("raw", {"search": False})):
                    t = time.perf_counter()
                    try:
                        plan = sg.solve(p, method="policy", memory_cap_bytes=cap, **kw)
                        c = sg.evaluate(pc, plan)
                        row[key + "_status"] = plan.info.get("status")     # "optimal" where the planner proved it
                        row[key] = c.total / opt if opt > 0 else float("nan")
                        row[key + "_feasible"] = bool(c.feasible)
                    except (RuntimeError, ValueError) as exc:
                        row[key], row[key + "_feasible"] = float("inf"), False
                        row[key + "_error"] = str(exc)[:200]
                    row[key + "_s"] = round(time.perf_counter() - t, 2)
                row["default_faster"] = row["default_s"] < row["ilp_s"]
                row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
                rows.append(row)
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
                if cap is None and (half := binding_cap(p, ilp)) is not None:
                    caps.append(half)

    def summary(sub):
        out = {}
        for key in ("default", "raw"):
            v = [r[key] for r in sub]
            out[key] = {"median": float(np.median(v)) if v else None, "max": float(np.max(v)) if v else None,
                        "all_feasible": all(r[key + "_feasible"] for r in sub)}
        out["default_faster_than_ilp"] = sum(r["default_faster"] for r in sub)
        out["default_proven_optimal"] = sum(r.get("default_status") == "optimal" for r in sub)
        out["cells"] = len(sub)
        return out

    res = {"rows": rows, "summary": summary(rows),
           "summary_uncapped": summary([r for r in rows if r["cap_bytes"] is None]),
           "summary_capped": summary([r for r in rows if r["cap_bytes"] is not None])}
    print_table(rows, ["step", "cluster", "nodes", "cap_bytes", "ilp_status", "ilp_s", "default", "default_s",
                       "raw", "raw_s"], title="cost / ILP cost on steps from outside the zoo")
    for k in ("summary", "summary_uncapped", "summary_capped"):
        print(k, res[k])
    write_results(a.out, res, config=vars(a))


if __name__ == "__main__":
    main()
