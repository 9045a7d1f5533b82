"""The ``shardgym`` command line: list, plan, compare, run, train, iopddl.

One error contract for every subcommand: bad input (an unknown model, preset, method or flag value, a
malformed or mismatched file, an option a method cannot honour, a plan that breaks a cap) ends with
exactly one line ``shardgym: error: ...`` naming the thing to fix, and exit status 2 — argparse's own
errors included. Ctrl-C exits 130. Anything else is a bug: one line ``shardgym: error: internal error
...`` and exit 1 (``SHARDGYM_DEBUG=1`` shows the traceback). Slow steps show a spinner on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("WANDB_MODE", "offline")

from agent.cliutil import OneLineParser  # noqa: E402
from costmodel.cluster import Cluster  # noqa: E402
from costmodel.limits import LimitError, Limits  # noqa: E402
from costmodel.problem import Plan  # noqa: E402
from shardgym.options import DEFAULT_RTOL, METHODS, OBJECTIVES  # noqa: E402

# Every other project import of this module is inside the command that needs it, on a line marked
# `# lazy:`: `shardgym iopddl` (a contest entry, timed from process start) must not import jax,
# flax or matplotlib, which shardgym.api / workflow / the agent pull in (~3 s).


def _console():
    from rich.console import Console
    # not a terminal: rich's default of 80 columns (COLUMNS overrides). The spinner console writes
    # to a duplicate of fd 2, so it keeps working while xla_log captures fd 2.
    return Console(), Console(file=os.fdopen(os.dup(2), "w", buffering=1))


def _cluster(args):
    if getattr(args, "cluster_file", None):
        return Cluster.from_file(args.cluster_file)
    return Cluster.preset(args.cluster)


def _cap_arg(text):
    """--memory-cap: validated by ``Limits`` (the one check every method shares)."""
    try:
        return Limits.of(memory_cap_bytes=text).memory_cap_bytes
    except LimitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bound_arg(text):
    """--max-step-time: validated by ``Limits``."""
    try:
        return Limits.of(max_step_time_s=text).max_step_time_s
    except LimitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return v


def _add_model_args(p, size_default="tiny"):
    p.add_argument("--model", default="gpt", help="zoo model (see `shardgym list`)")
    p.add_argument("--size", default=size_default, help="model size (zoo.sizes(model))")
    p.add_argument("--fn", default=None, metavar="FILE.py:FUNC",
                   help="your own model instead of --model: FUNC() returns (train_step, args) like zoo.build "
                        "(FILE.py or an importable module; args may be ShapeDtypeStructs)")
    p.add_argument("--cluster", default="cpu-2x4", help="cluster preset (Cluster.presets())")
    p.add_argument("--cluster-file", default=None, help="TOML/JSON cluster description (overrides --cluster)")
    p.add_argument("--memory-cap", dest="memory_cap_bytes", type=_cap_arg, default=None,
                   help="per-device memory cap, e.g. 40GiB; every method plans under min(device memory, cap)")
    p.add_argument("--max-step-time", dest="max_step_time_s", type=_bound_arg, default=None, help="bound on modelled step time (s)")
    p.add_argument("--time-limit", dest="time_limit_s", type=_positive, default=60.0, help="solver time limit (s)")
    p.add_argument("--recompute", default=None, metavar="POLICY",
                   help="trace the step with a recompute policy: dots (every dot/conv result saved for the "
                        "backward pass, the rest recomputed), dots_no_batch (weight matmuls only) or blocks (only "
                        "what crosses a module block); plan --method ilp --objective memory also takes 'auto': "
                        "the planner picks the policy")


def _problem_for(args, err):
    """Trace the model and build its Problem, with a spinner. The limits are applied here, once:
    the cap reaches every method, the pricing and the plots as the Problem's usage_limit."""
    from shardgym import workflow  # lazy: jax
    cluster = _cluster(args)
    source = workflow.ModelSource.from_args(args.model, args.size, args.fn, args.recompute)
    with err.status(f"tracing {source.label} and building the strategy graph on {cluster.name} ..."):
        t0 = time.perf_counter()
        fn, fargs, graph, problem = workflow.source_problem(source, cluster, Limits.of(args.memory_cap_bytes))
    err.print(f"[dim]{len(graph.nodes)} operators ({graph.num_eqns} jaxpr equations), "
              f"{problem.num_nodes} nodes / {len(problem.node_costs)} strategies / {problem.num_edges} edges "
              f"in {time.perf_counter() - t0:.1f} s[/dim]")
    cap = args.memory_cap_bytes
    if cap is not None and problem.usage_limit is not None and cap > problem.usage_limit:
        err.print(f"[dim]--memory-cap {workflow.fmt_bytes(cap)} is above the device memory of {cluster.name} "
                  f"({workflow.fmt_bytes(problem.usage_limit)}): device memory binds[/dim]")
    return source, cluster, fn, fargs, graph, problem


def _check_out_path(path: str) -> None:
    if os.path.isdir(path):
        raise ValueError(f"--out {path}: is a directory; give a file name such as {os.path.join(path, 'plan.json')}")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise ValueError(f"--out {path}: {parent} is a file, not a directory")


def cmd_plan(args) -> int:
    import shardgym.api as sg  # lazy: jax
    from runtime.prediction import cluster_meta  # lazy: jax
    from shardgym import validate, workflow  # lazy: jax
    out, err = _console()
    if args.method != "ilp" and args.objective != "time":
        raise ValueError(f"--objective {args.objective}: --method {args.method} plans for step time only; "
                         f"use --method ilp for the {args.objective} objective")
    if args.out:
        _check_out_path(args.out)
    if args.recompute == "auto":
        source, cluster, fn, fargs, graph, problem, plan, cost, bound = _choose_recompute(args, err)
        args.max_step_time_s = bound
    else:
        source, cluster, fn, fargs, graph, problem = _problem_for(args, err)
        with err.status(f"solving with {args.method} ({args.objective}) ..."):
            plan, cost = workflow.solve_and_price(problem, args.method, args.objective,
                                                  max_step_time_s=args.max_step_time_s, time_limit_s=args.time_limit_s)
    if args.verify:  # compile with XLA (abstractly), charge what the model missed, re-solve
        with err.status(f"verifying against XLA (up to {args.verify} compiles) ..."):
            v = sg.verify(fn, fargs, graph, problem, plan, rounds=args.verify, method=args.method,
                          objective=args.objective, max_step_time_s=args.max_step_time_s, time_limit_s=args.time_limit_s)
        out.print(v.summary())
        plan, cost = v.plan, sg.evaluate(v.problem, v.plan)
    validate.check_divisible(validate.replicate_keys(plan, fargs), fargs, graph=graph)
    plan.meta.update(source.meta(), **cluster_meta(cluster, args.memory_cap_bytes))
    out.print(workflow.cost_table([(args.method, args.objective, plan, cost)], title=f"{source.label} on {cluster.name}"))
    out.print(workflow.module_sharding_table(plan))
    if args.out:
        plan.to_json(args.out)
        out.print(f"plan written to {args.out}")
        if args.plots:
            for p in workflow.plot_plan(problem, plan, os.path.splitext(args.out)[0]):
                out.print(f"plot written to {p}")
    return 0


def _choose_recompute(args, err):
    """``plan --recompute auto``: ``shardgym.recompute.choose`` traces the step under each recompute
    policy and keeps the least predicted peak within --max-step-time (default 1.05 x the plain
    program's Megatron step time); returns _problem_for's tuple, the plan, its Cost and the bound."""
    from shardgym import recompute, workflow  # lazy: jax
    if args.method != "ilp" or args.objective != "memory":
        raise ValueError("--recompute auto: the planner picks recomputation for the min-memory plan; use it with "
                         "--method ilp --objective memory, or name a policy (dots, dots_no_batch, blocks)")
    cluster = _cluster(args)
    plain = workflow.ModelSource.from_args(args.model, args.size, args.fn)
    fn, fargs = plain.build(abstract=True)
    bound = ({"max_step_time_s": args.max_step_time_s} if args.max_step_time_s is not None
             else {"bound_vs_megatron": 1.05})
    with err.status(f"tracing {plain.label} under each recompute policy and solving min-memory on {cluster.name} ..."):
        choice = recompute.choose(fn, fargs, cluster, time_limit_s=args.time_limit_s, name=plain.name, **bound)
    for row in choice.candidates:
        if row["peak_memory_bytes"] is None:   # not solved (its step-time floor is over the bound) or no plan
            err.print(f"recompute {row['policy']}: {row['num_nodes']} operators, {row['status']}",
                      style="dim", markup=False, highlight=False)
            continue
        err.print(f"[dim]recompute {row['policy']}: {row['num_nodes']} operators, peak "
                  f"{workflow.fmt_bytes(row['peak_memory_bytes'])}, step {workflow.fmt_time(row['step_time_s'])}"
                  f"{'' if row['within_bound'] else ' (over the bound)'}[/dim]")
    err.print(f"[dim]chosen: recompute {choice.policy} (step-time bound {workflow.fmt_time(choice.max_step_time_s)})[/dim]")
    problem = Limits.of(args.memory_cap_bytes).apply(choice.problem)
    source = plain.with_recompute(choice.policy)
    return (source, cluster, fn, fargs, choice.graph, problem, choice.plan, workflow.evaluate(problem, choice.plan),
            choice.max_step_time_s)


def cmd_compare(args) -> int:
    """Exit 0 when at least one method gives a plan within the cap and bound; rows that break them
    are shown (``fits NO``), methods that fail are shown as failed with the reason on stderr."""
    from shardgym import workflow  # lazy: jax
    out, err = _console()
    if args.recompute == "auto":
        raise ValueError("--recompute auto: only `shardgym plan --method ilp --objective memory` chooses the policy; "
                         "name one for compare (dots, dots_no_batch, blocks)")
    methods = workflow.parse_methods(args.methods)
    if args.out_dir and os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise ValueError(f"--out-dir {args.out_dir}: is a file, not a directory")
    source, cluster, fn, fargs, graph, problem = _problem_for(args, err)
    rows = workflow.compare(problem, methods, max_step_time_s=args.max_step_time_s, time_limit_s=args.time_limit_s,
                            console=err)
    out.print(workflow.cost_table(rows, title=f"{source.label} on {cluster.name}"))
    if not any(c is not None and c.feasible and not (p.meta or {}).get("unmet") for _, _, p, c in rows):
        raise ValueError("no method gave a plan within --memory-cap / --max-step-time (see the table above); "
                         "raise the cap or the bound")
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        for p in workflow.plot_comparison(problem, rows, args.out_dir):
            out.print(f"plot written to {p}")
    return 0


def cmd_run(args) -> int:
    from runtime import xla_log  # lazy: jax
    from shardgym import validate, workflow  # lazy: jax
    out, err = _console()
    plan = Plan.from_json(args.plan)
    source = validate.check_plan_file(plan, args.plan)
    with err.status(f"checking the plan against {source.label} ..."):
        problem = validate.check_plan_problem(plan, source, args.plan)
    quiet = contextlib.nullcontext(None) if os.environ.get("SHARDGYM_XLA_LOG") else xla_log.capture_fd2()
    with err.status(f"building {source.label}, compiling the sharded step and the reference ..."):
        with quiet as cap:
            report = workflow.run_plan(plan, problem=problem, source=source)
    out.print(workflow.report_table(report, title=f"{source.label}: {plan.method} plan on the local devices"))
    out.print(f"plan: {plan.method} ({plan.objective or 'time'}), solver status {workflow.solver_status(plan)}")
    if cap is not None and cap.lines:
        err.print(xla_log.summarize(cap.lines), markup=False, highlight=False)
    if not report.max_rel_err <= args.rtol:
        out.print(f"numerics MISMATCH: max rel err {report.max_rel_err:.3g} > --rtol {args.rtol:g}")
        return 1
    return 0


def cmd_train(args) -> int:
    """`shardgym train ARGS`: agent/train.py (the same as `python experiments/pretrain.py ARGS`)."""
    from agent import train  # lazy: jax, flax
    return train.main(args.rest, prog="shardgym train") or 0


def cmd_list(args) -> int:
    import zoo  # lazy: flax
    out, _ = _console()
    for name in zoo.names():
        out.print(f"model {name}: sizes {', '.join(zoo.sizes(name))}")
    for name in Cluster.presets():
        c = Cluster.preset(name)
        mesh = " x ".join(f"{a}={n}" for a, n in zip(c.axis_names, c.mesh_shape))
        out.print(f"cluster {name}: mesh {mesh}, {c.memory_limit_bytes / 2**30:.0f} GiB/device")
    return 0


def cmd_iopddl(args) -> int:
    from solvers.iopddl_cli import main_iopddl, process_age_s  # lazy: only this command needs it
    main_iopddl(args.file, args.time_limit_s, started_s_ago=process_age_s())
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="shardgym", description="Plan how a JAX model is sharded over a device mesh.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("list", help="zoo models, their sizes, and cluster presets")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("plan", help="plan one model on one cluster and print the plan")
    _add_model_args(p)
    p.add_argument("--method", default="ilp", choices=METHODS)
    p.add_argument("--objective", default="time", choices=OBJECTIVES, help="memory / redundancy: --method ilp only")
    p.add_argument("--out", default=None, help="write the plan as JSON here")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                   help="with --out, write PNG plots next to the plan")
    p.add_argument("--verify", type=int, nargs="?", const=3, default=0, metavar="ROUNDS",
                   help="compile the plan with XLA (abstractly), charge the buffers the model missed and "
                        "re-solve, at most ROUNDS compiles (default 3); the plan is XLA-checked. With --objective "
                        "memory and --max-step-time: charged every round, the peak LNS between rounds, and the plan "
                        "XLA measures least is kept")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("compare", help="every method side by side for one model and cluster")
    _add_model_args(p)
    p.add_argument("--methods", default="replicated,dp,megatron,fsdp,ilp:time,ilp:memory,policy",
                   help="comma-separated methods, method:objective allowed")
    p.add_argument("--out-dir", default=None, help="write comparison plots here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("run", help="execute a plan file on the local devices, check numerics and memory")
    p.add_argument("plan")
    p.add_argument("--rtol", type=_positive, default=DEFAULT_RTOL,
                   help="fail (exit 1) above this max_rel_err (per-leaf L2 after one step)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("train", add_help=False,
                       help="train the GNN policy (arguments go to agent/train.py; --help lists them)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("iopddl", help="solve an IOPDDL contest instance; the last line is the plan")
    p.add_argument("file")
    p.add_argument("time_limit_s", metavar="TIMEOUT_S", type=_positive, help="wall-clock budget (s), from process start")
    p.set_defaults(func=cmd_iopddl)
    return ap


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["train"]:  # everything after `train` belongs to agent/train.py
            args = argparse.Namespace(func=cmd_train, rest=argv[1:])
        else:
            args = build_parser().parse_args(argv)
        return args.func(args) or 0
    except SystemExit as exc:  # argparse (already printed its one line)
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:
        print("shardgym: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:   # bad input: a value, a file (missing, a directory, unreadable)
        print(f"shardgym: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: still one line unless asked for the traceback
        if os.environ.get("SHARDGYM_DEBUG"):
            raise
        print(f"shardgym: error: internal error ({type(exc).__name__}: {_one_line(exc)}); "
              "rerun with SHARDGYM_DEBUG=1 for the traceback and report it", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
