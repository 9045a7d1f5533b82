"""`make demo`: plan GPT tiny on the 8-device CPU mesh with every method, run the chosen plan.

1. trace one full training step of zoo GPT tiny (forward, backward, AdamW) and build its
   strategy graph on the cpu-2x4 preset;
2. price replicated, data parallel, Megatron-LM, FSDP/ZeRO-3, the ILP (min time; min memory) and
   the pretrained policy side by side;
3. pick the ILP's min-memory plan whose step time is within 5% of Megatron's (Shi et al.'s
   setting), execute it on the 8 CPU devices and check numerics against the unsharded step;
4. write the plan and three plots under results/demo/.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep XLA's partitioner warnings out of the demo's tables

from rich.console import Console  # noqa: E402

import shardgym as sg  # noqa: E402
from runtime import xla_log  # noqa: E402
from runtime.prediction import cluster_meta  # noqa: E402
from shardgym import workflow  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m shardgym.demo")
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--cluster", default="cpu-2x4")
    ap.add_argument("--out-dir", default="results/demo")
    ap.add_argument("--time-limit", type=float, default=30.0, help="ILP time limit per solve (s)")
    args = ap.parse_args(argv)

    out = Console(width=None if sys.stdout.isatty() else 150)
    err = Console(file=os.fdopen(os.dup(2), "w", buffering=1))   # keeps working while fd 2 is captured
    t_start = time.perf_counter()
    cluster = sg.Cluster.preset(args.cluster)
    with err.status(f"tracing {args.model} {args.size} and building its strategy graph on {cluster.name} ..."):
        fn, fargs, graph, problem = workflow.model_problem(args.model, args.size, cluster)
    out.print(f"[bold]{args.model} {args.size}[/bold]: {graph.num_eqns} jaxpr equations -> {len(graph.nodes)} operators; "
              f"strategy graph {problem.num_nodes} nodes, {len(problem.node_costs)} strategies, {problem.num_edges} edges")

    methods = ["replicated", "dp", "megatron", "fsdp", "ilp:time", "ilp:memory", "policy"]
    rows = workflow.compare(problem, methods, time_limit_s=args.time_limit, console=err)
    by = {(m, o): (p, c) for m, o, p, c in rows}
    mega = by.get(("megatron", "time"), (None, None))[1]
    chosen, cost = by.get(("ilp", "memory"), (None, None))
    if mega is not None:
        with err.status("ILP: min memory with step time <= 1.05 x Megatron ..."):
            try:
                plan, cost = workflow.solve_and_price(problem, "ilp", "memory", max_step_time_s=1.05 * mega.step_time_s,
                                                      time_limit_s=args.time_limit)
            except (RuntimeError, ValueError) as exc:
                err.print(f"[red]bounded min-memory ILP failed: {exc}[/red]")
                plan = None
        if plan is not None:
            plan.meta["note"] = "min peak memory s.t. step time <= 1.05 x megatron"
            plan.meta["label"] = "ilp (memory, time <= 1.05 x megatron)"
            rows.append(("ilp", "memory<=1.05xMeg", plan, cost))
            chosen = plan
    if chosen is None:
        raise SystemExit("no ILP plan to execute: see the errors above")
    out.print(workflow.cost_table(rows, title=f"{args.model} {args.size} on {cluster.name} (cost model)"))
    if mega is not None and cost is not None:
        fsdp = by.get(("fsdp", "time"), (None, None))[1]
        saved = 1 - cost.peak_memory_bytes / mega.peak_memory_bytes
        line = (f"ILP min-memory plan within 5% of Megatron's step time: peak {workflow.fmt_bytes(cost.peak_memory_bytes)} "
                f"vs Megatron {workflow.fmt_bytes(mega.peak_memory_bytes)} ({saved:.0%} less)")
        if fsdp is not None:
            line += f", FSDP {workflow.fmt_bytes(fsdp.peak_memory_bytes)}"
        out.print(line + "; Shi et al. report up to 67% saved against Megatron-LM.")

    os.makedirs(args.out_dir, exist_ok=True)
    chosen.meta.update(model=args.model, size=args.size, **cluster_meta(cluster))
    plan_path = os.path.join(args.out_dir, "plan.json")
    chosen.to_json(plan_path)
    out.print(workflow.module_sharding_table(chosen, max_rows=24))

    with err.status("executing the chosen plan on the 8 CPU devices and the unsharded reference ..."):
        with xla_log.capture_fd2() as cap:
            report = workflow.run_plan(chosen, problem=problem)
    out.print(workflow.report_table(report, title="chosen plan executed with jax.jit + NamedSharding"))
    if cap.lines:
        err.print(xla_log.summarize(cap.lines), markup=False, highlight=False)

    with err.status("plotting (the Pareto front runs an ILP sweep) ..."):
        paths = workflow.plot_comparison(problem, rows, args.out_dir)
    for p in [plan_path] + paths:
        out.print(f"wrote {p}")
    ok = report.max_rel_err <= workflow.DEFAULT_RTOL
    out.print(f"numerics {'OK' if ok else 'MISMATCH'} (max rel err {report.max_rel_err:.2e}); "
              f"demo took {time.perf_counter() - t_start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
