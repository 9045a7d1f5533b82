"""Where a plan's per-device memory goes, by the cost model and by XLA, in the categories of a train
step: parameters, Adam's m and v, the batch, forward activations (recomputed clones apart), gradients
and other backward values, the optimizer's updated states, copies / collective buffers (issue 13's
gpt tiny diagnosis).

Per plan (plain Megatron; FSDP; the min-memory ILP under ``--bound`` x plain Megatron's step time,
on the plain program and on each ``--policies`` recompute program): the model's live set at its
peak (``fidelity_real.model_peak``) and XLA's buffers at its peak (``minmem_bounds.peak_by_kind``'s
source, ``verifier.peak_buffers``, each named by its Problem node with ``verifier.instruction_nodes``)
summed per category. Also the whole states' bytes (unsharded) and, per plan, the states' bytes per
device as the plan shards them (the inputs' strategies), which no recomputation changes.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/minmem_breakdown.py \
        --model gpt:tiny --policies dots_no_batch --ilp-time-limit-s 60 --out s23b_breakdown

Approximate: an XLA buffer whose instruction carries no node scope (a copy XLA inserted, a fusion
of collectives) is "unattributed"; a model copy is "copies". Writes results/<out>.json (config,
seed, git revision, load; each plan's strategies, so a later run can re-execute it).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import cpu_devices  # noqa: E402

cpu_devices()


@dataclass
class Config:
    model: str = "gpt:tiny"
    cluster: str = "cpu-2x4"
    bound: float = 1.05
    policies: tuple = ("dots_no_batch",)
    ilp_time_limit_s: float = 60.0
    seed: int = 0


def categories(problem) -> list[str]:
    """Per Problem node its category (the module docstring)."""
    m = problem.meta
    g = m.graph
    updated = {g.outputs[k][0] for k, a in enumerate(g.output_aliases) if a is not None}
    out = []
    for i, gi in enumerate(m.graph_node):
        node = g.nodes[int(gi)]
        if node.is_input:
            path = node.input_path or ""
            out.append({"param": "params", "batch": "batch"}.get(node.role) or
                       ("adam_m" if ".mu" in path else "adam_v" if ".nu" in path else "opt_other"))
        elif node.id in updated:
            out.append("updated_states")
        elif node.params.get("recomputed"):
            out.append("recomputed")
        elif node.role == "gradient":
            out.append("grads_backward")
        else:
            out.append("activations")
    return out


def state_bytes_per_device(problem, strategies) -> dict:
    """Bytes per device of each input category as the plan shards the inputs (no temporaries)."""
    import numpy as np

    cat = categories(problem)
    use = problem.node_usages[problem.strategy_offsets[:-1] + np.asarray(strategies)]
    out: dict = {}
    for i, c in enumerate(cat):
        if problem.meta.graph.nodes[int(problem.meta.graph_node[i])].is_input:
            out[c] = out.get(c, 0.0) + float(use[i])
    return out


def breakdown(fn, args, graph, problem, plan) -> dict:
    """The model's and XLA's peak, per category (bytes), for ``plan``."""
    import shardgym as sg
    from experiments.fidelity_real import model_peak
    from runtime.core import execute
    from shardgym.verifier import instruction_nodes, peak_buffers

    cat = categories(problem)
    with tempfile.TemporaryDirectory(prefix="breakdown-") as d:
        rep = execute(fn, args, graph, plan, problem=problem, compiler_options={"xla_dump_to": d})
        bufs = peak_buffers(d)
        text = sorted(Path(d).glob("*after_optimizations.txt"))[-1].read_text()
    names = instruction_nodes(text, problem)
    xla: dict = {}
    for name, b in bufs:
        i = names.get(name)
        k = "unattributed" if i is None else cat[i]
        if i is not None and name.startswith(("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                                              "collective-permute")):
            k = "collectives"
        xla[k] = xla.get(k, 0.0) + b
    mp = model_peak(problem, plan.strategies, 10 ** 6)
    model: dict = {}
    for x in mp["largest"]:
        k = "copies" if x["what"] == "copy" else cat[x["node"]]
        model[k] = model.get(k, 0.0) + x["bytes"]
    c = sg.evaluate(problem, plan)
    return {"xla_bytes": float(rep.xla_memory_bytes), "xla_breakdown": rep.xla_memory_breakdown,
            "pred_bytes": float(c.peak_memory_bytes), "step_time_s": float(c.step_time_s),
            "xla_by_category": dict(sorted(xla.items(), key=lambda kv: -kv[1])),
            "model_by_category": dict(sorted(model.items(), key=lambda kv: -kv[1])),
            "states_per_device": state_bytes_per_device(problem, plan.strategies),
            "max_rel_err": rep.max_rel_err, "strategies": [int(s) for s in plan.strategies]}


def main(argv=None) -> dict:
    import shardgym as sg
    import zoo
    from experiments.common import write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt:tiny")
    ap.add_argument("--policies", default="dots_no_batch", help="comma-separated recompute policies ('' none)")
    ap.add_argument("--ilp-time-limit-s", type=float, default=60.0)
    ap.add_argument("--bound", type=float, default=1.05)
    ap.add_argument("--no-plain", action="store_true", help="skip FSDP and the plain program's min-memory plan")
    ap.add_argument("--stored", default="", help="SOURCE:PLAN:POLICY: also break down plan PLAN of results/SOURCE.json "
                    "(a row with strategies), traced under POLICY ('' none)")
    ap.add_argument("--out", default="minmem_breakdown")
    a = ap.parse_args(argv)
    cfg = Config(model=a.model, policies=tuple(p for p in a.policies.split(",") if p), bound=a.bound,
                 ilp_time_limit_s=a.ilp_time_limit_s)
    name, _, size = cfg.model.partition(":")
    size = size or "tiny"
    if size != zoo.sizes(name)[0]:
        raise ValueError(f"minmem_breakdown executes the step: give the zoo's first size of {name}, not {size!r}")
    fn, args = zoo.build(name, size, seed=cfg.seed)
    cluster = sg.Cluster.preset(cfg.cluster)
    plain = sg.trace(fn, *args, name=f"{name}-{size}")
    pp = sg.build_problem(plain, cluster)
    mega = sg.solve(pp, method="megatron")
    bound_s = cfg.bound * sg.evaluate(pp, mega).step_time_s
    total = {}
    for n in plain.nodes:
        if n.is_input:
            total[n.role] = total.get(n.role, 0.0) + n.out.nbytes
    runs = [("plain megatron", plain, pp, mega)]
    if not a.no_plain:
        runs.append(("plain fsdp", plain, pp, sg.solve(pp, method="fsdp")))
    for policy in ((None,) if not a.no_plain else ()) + cfg.policies:
        graph = plain if policy is None else sg.trace(fn, *args, name=f"{name}-{size}", recompute=policy)
        prob = pp if policy is None else sg.build_problem(graph, cluster)
        t0 = time.perf_counter()
        plan = sg.solve(prob, method="ilp", objective="memory", max_step_time_s=bound_s,
                        time_limit_s=cfg.ilp_time_limit_s)
        print(f"  {policy}: min-memory solved in {time.perf_counter() - t0:.0f} s", flush=True)
        runs.append((f"{policy or 'plain'} min-memory {cfg.bound}x", graph, prob, plan))
    if a.stored:
        import json

        from experiments.common import RESULTS_DIR
        src, label, policy = a.stored.split(":")
        row = next(r for r in json.loads((Path(RESULTS_DIR) / f"{src}.json").read_text())["plans"] if r["plan"] == label)
        graph = sg.trace(fn, *args, name=f"{name}-{size}", recompute=policy or None)
        prob = sg.build_problem(graph, cluster)
        runs.append((f"{src}: {label}", graph, prob, sg.Plan.for_problem(prob, row["strategies"], method="stored",
                                                                         objective="memory")))
    rows = []
    mib = 2.0 ** -20
    for label, graph, prob, plan in runs:
        r = {"plan": label, **breakdown(fn, args, graph, prob, plan)}
        r["step_vs_plain_megatron"] = r["step_time_s"] / (bound_s / cfg.bound)
        rows.append(r)
        print(f"{label}: XLA {r['xla_bytes'] * mib:.3f} MiB, model {r['pred_bytes'] * mib:.3f} MiB, step "
              f"{r['step_vs_plain_megatron']:.3f}x; XLA {r['xla_breakdown']}", flush=True)
        for side in ("xla_by_category", "model_by_category", "states_per_device"):
            print(f"   {side:18s}", {k: round(v * mib, 4) for k, v in r[side].items()}, flush=True)
    res = {"model": cfg.model, "state_bytes_unsharded": total, "bound_s": bound_s, "plans": rows}
    write_results(a.out, res, config=cfg, seed=cfg.seed)
    return res


if __name__ == "__main__":
    main()
