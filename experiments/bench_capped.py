"""``shardgym.solve(method="ilp")`` under binding memory caps against ``method="policy"``.

Per problem (zoo tiny models and train steps written here, outside the zoo) on a cluster: lo = the
least peak any plan reaches (``solvers.ilp.min_peak_memory``), hi = the peak of the uncapped
time-optimal plan (ILP, ``--uncapped-seconds``); per cap at 25 / 50 / 75 % of the way from lo to
hi: the ILP's plan at ``--seconds`` (cost, status, bound, gap, wall) and the policy's (cost,
wall), ratio = ILP cost / policy cost (<= 1: never worse). Records the load average.

The outside-the-zoo steps (plain JAX, no Flax): ``autoencoder`` (four convolutions, two of them
residual, and a transposed convolution, MSE, SGD with momentum) and ``moe_adam`` (a six-expert soft mixture of
MLPs with a softmax gate, Adam written out).

    python experiments/bench_capped.py --problems gpt:tiny,autoencoder,moe_adam --clusters cpu-2x4
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


def autoencoder_step():
    import jax
    import jax.numpy as jnp

    def conv(x, w, stride=1):
        return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(p, x):
        h = jax.nn.relu(conv(x, p["enc1"]))
        h = jax.nn.relu(conv(h, p["enc2"], 2))
        h = jax.nn.relu(conv(h, p["mid1"])) + h
        h = jax.nn.relu(conv(h, p["mid2"])) + h
        y = jax.lax.conv_transpose(h, p["dec"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean((y - x) ** 2)

    def step(p, mom, x):
        g = jax.grad(loss)(p, x)
        mom = jax.tree.map(lambda m, gi: 0.9 * m + gi, mom, g)
        return jax.tree.map(lambda w, m: w - 1e-2 * m, p, mom), mom

    k = jax.random.split(jax.random.PRNGKey(0), 6)
    p = {"enc1": jax.random.normal(k[0], (3, 3, 8, 32)) * 0.1, "enc2": jax.random.normal(k[1], (3, 3, 32, 64)) * 0.1,
         "mid1": jax.random.normal(k[4], (3, 3, 64, 64)) * 0.1, "mid2": jax.random.normal(k[5], (3, 3, 64, 64)) * 0.1,
         "dec": jax.random.normal(k[2], (3, 3, 64, 8)) * 0.1}
    mom = jax.tree.map(jnp.zeros_like, p)
    return step, (p, mom, jax.random.normal(k[3], (16, 32, 32, 8)))


def moe_adam_step():
    import jax
    import jax.numpy as jnp

    def loss(p, x, t):
        gate = jax.nn.softmax(x @ p["gate"], axis=-1)
        y = 0.0
        for e in range(E):
            y = y + gate[:, e:e + 1] * (jax.nn.relu(x @ p[f"w1_{e}"]) @ p[f"w2_{e}"])
        return jnp.mean((y - t) ** 2)

    def step(p, m, v, x, t):
        g = jax.grad(loss)(p, x, t)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        p = jax.tree.map(lambda w, a, b: w - 1e-3 * a / (jnp.sqrt(b) + 1e-8), p, m, v)
        return p, m, v

    E = 6
    k = jax.random.split(jax.random.PRNGKey(1), 3 + 2 * E)
    d, h = 64, 256
    p = {"gate": jax.random.normal(k[0], (d, E)) * 0.1}
    for e in range(E):
        p[f"w1_{e}"] = jax.random.normal(k[1 + 2 * e], (d, h)) * 0.1
        p[f"w2_{e}"] = jax.random.normal(k[2 + 2 * e], (h, d)) * 0.1
    z = jax.tree.map(jnp.zeros_like, p)
    return step, (p, z, z, jax.random.normal(k[-2], (64, d)), jax.random.normal(k[-1], (64, d)))


OUTSIDE = {"autoencoder": autoencoder_step, "moe_adam": moe_adam_step}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default="gpt:tiny,autoencoder,moe_adam")
    ap.add_argument("--clusters", default="cpu-2x4")
    ap.add_argument("--fractions", default="0.25,0.5,0.75")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--uncapped-seconds", type=float, default=30.0)
    ap.add_argument("--no-policy", action="store_true")
    a = ap.parse_args(argv)
    import shardgym as sg
    import zoo
    from experiments.common import print_table, write_results
    from solvers.ilp import min_peak_memory
    rows = []
    for spec in a.problems.split(","):
        if spec in OUTSIDE:
            fn, args = OUTSIDE[spec]()
        else:
            m, s = spec.split(":")
            fn, args = zoo.build(m, s, abstract=True)
        graph = sg.trace(fn, *args)
        for cl in a.clusters.split(","):
            p = sg.build_problem(graph, sg.Cluster.preset(cl)).with_usage_limit(None)
            fast = sg.solve(p, method="ilp", time_limit_s=a.uncapped_seconds)   # seeded with replicated
            hi = sg.evaluate(p, fast).peak_memory_bytes
            lo = min_peak_memory(p)
            for f in (float(x) for x in a.fractions.split(",")):
                cap = lo + f * (hi - lo)
                pc = p.with_usage_limit(cap)
                row = {"problem": spec, "cluster": cl, "nodes": p.num_nodes, "cap_fraction": f, "cap_bytes": cap,
                       "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
                t = time.perf_counter()
                plan = sg.solve(p, method="ilp", memory_cap_bytes=cap, time_limit_s=a.seconds)
                row["ilp_s"] = round(time.perf_counter() - t, 1)
                c = sg.evaluate(pc, plan)
                row.update(ilp_cost=c.total, ilp_feasible=c.feasible, status=plan.info.get("status"),
                           bound=plan.info.get("bound"), gap=plan.info.get("gap"), source=plan.info.get("source"))
                if not a.no_policy:
                    t = time.perf_counter()
                    pol = sg.solve(p, method="policy", memory_cap_bytes=cap)
                    row["policy_s"] = round(time.perf_counter() - t, 1)
                    pcst = sg.evaluate(pc, pol)
                    row.update(policy_cost=pcst.total, policy_feasible=pcst.feasible,
                               ilp_over_policy=round(c.total / pcst.total, 4) if pcst.total > 0 else None)
                row["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
                rows.append(row)
                print(row, flush=True)
                write_results("bench_capped", {"rows": rows}, config=vars(a))
    print_table(rows, ["problem", "cluster", "nodes", "cap_fraction", "ilp_cost", "status", "gap", "ilp_s",
                       "policy_cost", "ilp_over_policy", "policy_s", "load_avg_before"],
                title=f"solve(method='ilp') under binding caps at {a.seconds:g} s vs method='policy'")
    write_results("bench_capped", {"rows": rows}, config=vars(a))


if __name__ == "__main__":
    main()
