"""One real accelerator against the cost model: the step time and per-device memory of zoo models
run whole on ONE GPU, next to what the cost model predicts for a one-device cluster of that GPU.

It runs where a GPU is lent (the sessions' device machine: one H200, jax with CUDA), so it checks
the two terms that need no mesh: compute time (FLOPs / (peak x efficiency)) and memory on XLA's
GPU backend (the CPU mesh checks the rest). Per model: trace with real arrays, build the Problem on
a one-device cluster (``--peak-flops``, ``--efficiency``, ``--memory``), take the replicated plan,
``sg.execute`` it (warm-up, then ``--iters`` timed steps, numerics against the same step unsharded),
and record measured / predicted step time, XLA's FLOPs per step and the FLOP/s achieved, XLA's
memory / predicted memory. Nothing here is a test: one run, JSON under results/ (or ``--out-dir``).

    python -m experiments.gpu_check --models gpt:125m,vit:base,unet:large,fno:large,meshgraphnet:large
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def save(a, out: dict) -> None:
    """Write the rows so far (after every model: a run stopped at its limit keeps what it measured)."""
    if a.out_dir:
        from experiments.common import git_rev
        out = {**out, "git_rev": git_rev(), "seed": None}
        os.makedirs(a.out_dir, exist_ok=True)
        with open(os.path.join(a.out_dir, "gpu_check.json"), "w") as f:
            json.dump(out, f, indent=1, default=str)
    else:
        from experiments.common import write_results
        write_results("gpu_check", out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt:125m,vit:base,unet:large,fno:large,meshgraphnet:large,mlp:large,gpt:350m")
    ap.add_argument("--peak-flops", type=float, default=495e12,
                    help="the cluster's peak FLOP/s per device (H100/H200 dense TF32: 495e12, the h100 presets' figure)")
    ap.add_argument("--efficiency", type=float, default=0.5, help="the cluster's efficiency (the presets' 0.5)")
    ap.add_argument("--memory", default="139GiB", help="device memory of the one-device cluster")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dump", default="", help="a folder for XLA's dumps (its *buffer-assignment.txt per model)")
    ap.add_argument("--out-dir", default="", help="where gpu_check.json goes (default results/)")
    a = ap.parse_args(argv)

    import jax

    import shardgym as sg
    import zoo
    from costmodel.cluster import Cluster, parse_bytes

    dev = jax.devices()[0]
    cluster = Cluster("gpu-1", (1,), ("gpu",), (450e9,), (3e-6,), (parse_bytes(a.memory),), (a.peak_flops,),
                      a.efficiency, "gpu")
    rows = []
    for spec in a.models.split(","):
        name, size = spec.split(":")
        row = {"model": name, "size": size}
        t0 = time.perf_counter()
        try:
            fn, args = zoo.build(name, size, abstract=False)
            graph = sg.trace(fn, *args)
            problem = sg.build_problem(graph, cluster)
            plan = sg.solve(problem, method="replicated")
            cost = sg.evaluate(problem, plan)
            opts = {"xla_dump_to": os.path.join(a.dump, f"{name}-{size}")} if a.dump else None
            r = sg.execute(fn, args, graph, plan, iters=a.iters, problem=problem, compiler_options=opts)
            flops = float(graph.flops_by_primitive() and sum(graph.flops_by_primitive().values()))
            row.update(
                nodes=problem.num_nodes, model_flops=flops,
                predicted_step_time_s=float(cost.step_time_s), measured_step_time_s=r.step_time_s,
                time_ratio=(r.step_time_s / cost.step_time_s) if r.step_time_s and cost.step_time_s else None,
                achieved_flops_per_s=(flops / r.step_time_s) if r.step_time_s else None,
                predicted_memory_bytes=r.predicted_memory_bytes, xla_memory_bytes=r.xla_memory_bytes,
                xla_peak_memory_bytes=r.xla_peak_memory_bytes, xla_memory_breakdown=r.xla_memory_breakdown,
                memory_ratio=(r.predicted_memory_bytes / r.xla_memory_bytes) if r.xla_memory_bytes else None,
                max_rel_err=r.max_rel_err, loss_rel_err=r.loss_rel_err,
                compile_time_s=getattr(r, "compile_time_s", None))
        except Exception as exc:   # noqa: BLE001 -- one model's failure is a row, not the end
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-2000:]
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        keep = ("model", "size", "predicted_step_time_s", "measured_step_time_s", "time_ratio", "memory_ratio",
                "achieved_flops_per_s", "max_rel_err", "error", "wall_s")
        print(json.dumps({k: row.get(k) for k in keep}), flush=True)
        save(a, {"device": str(dev), "device_kind": getattr(dev, "device_kind", None), "jax": jax.__version__,
                 "cluster": cluster.to_dict(), "config": vars(a), "rows": rows,
                 "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
