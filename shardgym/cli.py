"""The ``shardgym`` command line: plan, compare, run, train, iopddl.

Every subcommand turns bad input (unknown model, preset, method, malformed file) into one line
``shardgym: error: ...`` and exit status 2; anything slow shows a progress spinner on stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("WANDB_MODE", "offline")


def _console():
    from rich.console import Console
    return Console(width=None if sys.stdout.isatty() else 150), Console(stderr=True)


def _cluster(args):
    from costmodel.cluster import Cluster
    if getattr(args, "cluster_file", None):
        return Cluster.from_file(args.cluster_file)
    return Cluster.preset(args.cluster)


def _bytes_arg(text):
    from costmodel.cluster import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_model_args(p, size_default="tiny"):
    p.add_argument("--model", default="gpt", help="zoo model (see `shardgym list`)")
    p.add_argument("--size", default=size_default, help="model size (zoo.sizes(model))")
    p.add_argument("--cluster", default="cpu-2x4", help="cluster preset (Cluster.presets())")
    p.add_argument("--cluster-file", default=None, help="TOML/JSON cluster description (overrides --cluster)")
    p.add_argument("--memory-cap", type=_bytes_arg, default=None, help="per-device memory cap, e.g. 40GiB")
    p.add_argument("--max-step-time", type=float, default=None, help="bound on modelled step time (s)")
    p.add_argument("--time-limit", type=float, default=60.0, help="solver time limit (s)")


def _problem_for(args, err):
    """Trace the model and build its Problem, with a spinner."""
    import shardgym as sg
    from shardgym import workflow
    cluster = _cluster(args)
    with err.status(f"tracing {args.model} {args.size} and building the strategy graph on {cluster.name} ..."):
        t0 = time.perf_counter()
        fn, fargs, graph, problem = workflow.model_problem(args.model, args.size, cluster,
                                                           memory_cap_bytes=args.memory_cap)
    err.print(f"[dim]{len(graph.nodes)} operators ({graph.num_eqns} jaxpr equations), "
              f"{problem.num_nodes} nodes / {len(problem.node_costs)} strategies / {problem.num_edges} edges "
              f"in {time.perf_counter() - t0:.1f} s[/dim]")
    del sg
    return cluster, fn, fargs, graph, problem


def cmd_plan(args) -> int:
    from shardgym import workflow
    out, err = _console()
    cluster, fn, fargs, graph, problem = _problem_for(args, err)
    with err.status(f"solving with {args.method} ({args.objective}) ..."):
        plan, cost = workflow.solve_and_price(problem, args.method, args.objective, args.memory_cap,
                                              args.max_step_time, args.time_limit)
    if args.verify:  # compile with XLA (abstractly), charge what the model missed, re-solve
        import shardgym as sg
        with err.status(f"verifying against XLA (up to {args.verify} compiles) ..."):
            v = sg.verify(fn, fargs, graph, problem, plan, rounds=args.verify, memory_cap_bytes=args.memory_cap,
                          method=args.method, objective=args.objective, max_step_time_s=args.max_step_time,
                          time_limit_s=args.time_limit)
        out.print(v.summary())
        plan, cost = v.plan, sg.evaluate(v.problem, v.plan)
    plan.meta.update(model=args.model, size=args.size, cluster=cluster.name,
                     cluster_spec=cluster.to_dict())
    out.print(workflow.cost_table([(args.method, args.objective, plan, cost)], title=f"{args.model} {args.size} on {cluster.name}"))
    out.print(workflow.module_sharding_table(plan))
    if args.out:
        plan.to_json(args.out)
        out.print(f"plan written to {args.out}")
        if args.plots:
            paths = workflow.plot_plan(problem, plan, os.path.splitext(args.out)[0])
            for p in paths:
                out.print(f"plot written to {p}")
    return 0


def cmd_compare(args) -> int:
    from shardgym import workflow
    out, err = _console()
    cluster, fn, fargs, graph, problem = _problem_for(args, err)
    rows = workflow.compare(problem, args.methods.split(","), memory_cap_bytes=args.memory_cap,
                            max_step_time_s=args.max_step_time, time_limit_s=args.time_limit, console=err)
    out.print(workflow.cost_table(rows, title=f"{args.model} {args.size} on {cluster.name}"))
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        for p in workflow.plot_comparison(problem, rows, args.out_dir):
            out.print(f"plot written to {p}")
    return 0


def cmd_run(args) -> int:
    from costmodel.problem import Plan
    from shardgym import workflow
    out, err = _console()
    plan = Plan.from_json(args.plan)
    model, size = plan.meta.get("model"), plan.meta.get("size")
    if not model or not size:
        raise ValueError(f"{args.plan}: the plan does not say which model it was made for (meta.model/meta.size); "
                         "make it with `shardgym plan --model ... --out plan.json`")
    with err.status(f"building {model} {size}, compiling the sharded step and the reference ..."):
        report = workflow.run_plan(plan)
    out.print(workflow.report_table(report, title=f"{model} {size}: {plan.method} plan on the local devices"))
    return 0 if report.max_rel_err <= args.rtol else 1


def cmd_train(args) -> int:
    """`shardgym train ARGS` = `python experiments/pretrain.py ARGS` (run from a clone)."""
    try:
        from experiments import pretrain
    except ImportError:
        raise ValueError("`shardgym train` runs experiments/pretrain.py from a clone of the repository; "
                         "run it from the repository root") from None
    return pretrain.main(args.rest) or 0


def cmd_list(args) -> int:
    import zoo
    from costmodel.cluster import Cluster
    out, _ = _console()
    for name in zoo.names():
        out.print(f"model {name}: sizes {', '.join(zoo.sizes(name))}")
    for name in Cluster.presets():
        c = Cluster.preset(name)
        mesh = " x ".join(f"{a}={n}" for a, n in zip(c.axis_names, c.mesh_shape))
        out.print(f"cluster {name}: mesh {mesh}, {c.memory_limit_bytes / 2**30:.0f} GiB/device")
    return 0


def cmd_iopddl(args) -> int:
    from costmodel.iopddl_cli import main_iopddl
    main_iopddl(args.file, args.timeout_s)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from shardgym.api import METHODS, OBJECTIVES
    ap = argparse.ArgumentParser(prog="shardgym", description="Plan how a JAX model is sharded over a device mesh.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("list", help="zoo models, their sizes, and cluster presets")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("plan", help="plan one model on one cluster and print the plan")
    _add_model_args(p)
    p.add_argument("--method", default="ilp", choices=METHODS)
    p.add_argument("--objective", default="time", choices=OBJECTIVES)
    p.add_argument("--out", default=None, help="write the plan as JSON here")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                   help="with --out, write PNG plots next to the plan")
    p.add_argument("--verify", type=int, nargs="?", const=3, default=0, metavar="ROUNDS",
                   help="compile the plan with XLA (abstractly), charge the buffers the model missed and "
                        "re-solve, at most ROUNDS compiles (default 3); the plan is XLA-checked")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("compare", help="every method side by side for one model and cluster")
    _add_model_args(p)
    p.add_argument("--methods", default="replicated,dp,megatron,fsdp,ilp:time,ilp:memory,policy",
                   help="comma-separated methods, method:objective allowed")
    p.add_argument("--out-dir", default=None, help="write comparison plots here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("run", help="execute a plan file on the local devices, check numerics and memory")
    p.add_argument("plan")
    p.add_argument("--rtol", type=float, default=1e-4, help="fail (exit 1) above this max_rel_err")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("train", add_help=False,
                       help="train the GNN policy with PPO (arguments go to experiments/pretrain.py; --help lists them)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("iopddl", help="solve an IOPDDL contest instance; the last line is the plan")
    p.add_argument("file")
    p.add_argument("timeout_s", type=float)
    p.set_defaults(func=cmd_iopddl)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # everything after `train` belongs to experiments/pretrain.py
        args = argparse.Namespace(func=cmd_train, rest=argv[1:])
    else:
        args = ap.parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"shardgym: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("shardgym: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
