"""Stored min-memory plans re-priced by the current cost model beside XLA's figures (issue 13, gpt tiny's
min-memory frontier).

Each ``--rows`` entry SOURCE:PLAN:POLICY names a plan of results/SOURCE.json (a ``minmem_breakdown`` or
``minmem_polish`` record: ``plans[k]`` with ``plan`` and ``strategies``, or a polished plan's
top-level ``strategies``) and the recompute policy its program was traced under ('' none). The zoo model's
first size is rebuilt on ``--cluster`` and the plan priced (``sg.evaluate``) against the XLA figure stored
beside it. With ``--compile`` each plan is also compiled with XLA's dump (``runtime.execute``) and
XLA's figure split into what its buffers hold at the peak (``verifier.peak_buffers``: parameters and
outputs plus the union of the temp values live there) and the rest of the temp allocation
(``holes``: alignment and fragmentation, which no live-range rule charges). ``--top N`` also lists XLA's N
largest buffers at its peak (named by Problem node, with their live ranges) and the model's N largest items at
its own peak (``fidelity_real.model_peak``); ``--cuts`` (model steps) compares, per range of steps, the model's
largest live total with XLA's largest held total over the schedule positions whose values belong to that range
(a position maps to the median step of the nodes whose values it defines, the previous one's where it defines
none: approximate where XLA reorders).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/frontier_reprice.py \\
        --rows "s23b_polish_blocks:polished (600 s LNS):blocks" --compile --out s24a_frontier

Writes results/<out>.json (config, git revision, load).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import RESULTS_DIR, cpu_devices  # noqa: E402

cpu_devices()

DEFAULT_ROWS = ("s23b_polish_blocks:polished (600 s LNS):blocks",
                "s23b_polish_blocks_seed1:polished (600 s LNS):blocks",
                "s23b_polish_blocks_seed1_2:polished (600 s LNS):blocks",
                "s23b_breakdown_blocks:blocks min-memory 1.05x:blocks",
                "s23b_breakdown_polished:s23b_polish_blocks_2: start:blocks",
                "s23b_breakdown:dots_no_batch min-memory 1.05x:dots_no_batch",
                "s23b_breakdown:plain min-memory 1.05x:",
                "s23b_breakdown:plain megatron:")


@dataclass
class Config:
    model: str = "gpt"
    cluster: str = "cpu-2x4"
    rows: tuple = field(default_factory=lambda: DEFAULT_ROWS)
    compile: bool = False
    top: int = 0
    cuts: tuple = ()


def stored(source: str, label: str) -> tuple[list, float]:
    """(strategies, XLA bytes) of plan ``label`` of results/<source>.json."""
    d = json.loads((Path(RESULTS_DIR) / f"{source}.json").read_text())
    row = next((r for r in d["plans"] if r["plan"] == label), None)
    if row is None:
        raise ValueError(f"no plan {label!r} in results/{source}.json; it has {[r['plan'] for r in d['plans']]}")
    st = row.get("strategies") or (d.get("strategies") if label.startswith("polished") else None)
    if st is None:
        raise ValueError(f"plan {label!r} of results/{source}.json has no strategies")
    xla = row["xla_bytes"] if "xla_bytes" in row else row["xla_MiB"] * 2.0 ** 20
    return list(st), float(xla)


def _temp_values(dump_dir) -> list:
    """(instruction, (first, last position), offset, bytes) of every value of XLA's temp allocation."""
    import re

    from shardgym import verifier as V

    ba, lr = V._dump_file(dump_dir, "buffer-assignment"), V._dump_file(dump_dir, "live-range")
    live = {m[0]: (int(m[1]), int(m[2])) for m in V._RANGE.findall(lr)}
    out = []
    for block in re.split(r"^(?=allocation \d+:)", ba, flags=re.M)[1:]:
        if "preallocated-temp" in block.split("\n", 1)[0]:
            out += [(n, live[n + (ix or "{}")], int(off), int(sz)) for n, ix, sz, off in V._VALUE.findall(block)
                    if n + (ix or "{}") in live]
    return out


def _regions(problem, strategies, temp, names, fixed: float, cuts) -> list[dict]:
    """Per range of model steps [a, b): the model's largest live total and XLA's largest held total."""
    import numpy as np

    from costmodel.problem import as_strategy_array, usage_profile
    from shardgym.verifier import _union

    s = as_strategy_array(problem, strategies)
    use = problem.node_usages[problem.strategy_offsets[:-1] + s]
    em = problem.edge_memory
    times, prof = usage_profile(problem, use, extra=em.intervals(s) if em is not None else None)
    defs: dict = {}
    for n, (a, _), _, _ in temp:
        if names.get(n) is not None:
            defs.setdefault(a, []).append(int(problem.intervals[names[n], 0]))
    step, last = {}, 0
    for t in sorted({a for _, (a, _), _, _ in temp}):
        last = int(np.median(defs[t])) if t in defs else last
        step[t] = last
    held = {t: fixed + sum(_union([(o, z) for _, (a, e), o, z in temp if a <= t <= e])) for t in step}
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        xs = [held[t] for t in step if a <= step[t] < b]
        ms = prof[(times >= a) & (times < b)]
        out.append({"steps": [int(a), int(b)], "xla_held_max_bytes": max(xs, default=0.0),
                    "model_max_bytes": float(ms.max()) if len(ms) else 0.0})
    return out


def xla_split(fn, args, graph, problem, plan, top: int = 0, cuts=()) -> dict:
    """XLA's figure, its buffers at the peak (``peak_buffers``' sum) and the rest of its temp allocation;
    with ``top`` / ``cuts`` the largest buffers on both sides and the per-range comparison (module doc)."""
    from experiments.fidelity_real import model_peak
    from runtime.core import execute
    from shardgym.verifier import instruction_nodes, peak_buffers

    with tempfile.TemporaryDirectory(prefix="frontier-") as d:
        rep = execute(fn, args, graph, plan, problem=problem, compiler_options={"xla_dump_to": d})
        bufs = peak_buffers(d)
        temp = _temp_values(d) if top or cuts else []
        text = sorted(Path(d).glob("*after_optimizations.txt"))[-1].read_text() if top or cuts else ""
    held = sum(b for _, b in bufs)
    out = {"xla_bytes_now": float(rep.xla_memory_bytes), "xla_breakdown": rep.xla_memory_breakdown,
           "xla_held_bytes": float(held), "holes_bytes": float(rep.xla_memory_bytes - held)}
    if not (top or cuts):
        return out
    names = instruction_nodes(text, problem)
    m = problem.meta
    ranges = {n: ae for n, ae, _, _ in temp}
    if top:
        out["xla_largest"] = [{"name": n, "bytes": b, "live": ranges.get(n), "node": names.get(n),
                               "node_name": m.names[names[n]] if names.get(n) is not None else None}
                              for n, b in sorted(bufs, key=lambda x: -x[1])[:top]]
        out["model_peak"] = model_peak(problem, plan.strategies, top)
    if cuts:
        fixed = rep.xla_memory_bytes - rep.xla_memory_breakdown["temp"]
        out["regions"] = _regions(problem, plan.strategies, temp, names, fixed, cuts)
    return out


def main(argv=None) -> dict:
    import shardgym as sg
    import zoo
    from experiments.common import write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS), help="SOURCE:PLAN:POLICY entries")
    ap.add_argument("--compile", action="store_true", help="also compile each plan and split XLA's figure")
    ap.add_argument("--top", type=int, default=0, help="with --compile: the N largest buffers, XLA's and the model's")
    ap.add_argument("--cuts", default="", help="with --compile: comma-separated model steps, e.g. 0,140,200,320,470,800")
    ap.add_argument("--out", default="frontier_reprice")
    a = ap.parse_args(argv)
    cfg = Config(model=a.model, rows=tuple(a.rows), compile=a.compile, top=a.top,
                 cuts=tuple(int(c) for c in a.cuts.split(",") if c))
    size = zoo.sizes(cfg.model)[0]
    fn, args = zoo.build(cfg.model, size)
    cluster = sg.Cluster.preset(cfg.cluster)
    built: dict = {}
    out = []
    mib = 2.0 ** -20
    for spec in cfg.rows:
        source, rest = spec.split(":", 1)
        label, policy = rest.rsplit(":", 1)
        if policy not in built:
            graph = sg.trace(fn, *args, name=f"{cfg.model}-{size}", recompute=policy or None)
            built[policy] = (graph, sg.build_problem(graph, cluster))
        graph, problem = built[policy]
        strategies, xla = stored(source, label)
        plan = sg.Plan.for_problem(problem, strategies)
        pred = float(sg.evaluate(problem, plan).peak_memory_bytes)
        r = {"source": source, "plan": label, "policy": policy, "xla_bytes": xla, "pred_bytes": pred,
             "pred_over_xla": pred / xla}
        if cfg.compile:
            r.update(xla_split(fn, args, graph, problem, plan, cfg.top, cfg.cuts))
            r["pred_over_held"] = pred / r["xla_held_bytes"]
        out.append(r)
        extra = "" if not cfg.compile else (
            f"; XLA now {r['xla_bytes_now'] * mib:.4f}, held at its peak {r['xla_held_bytes'] * mib:.4f} "
            f"(pred / held {r['pred_over_held']:.3f}), holes {r['holes_bytes'] / 1024:.1f} KiB")
        print(f"{source:28s} {label:40s} XLA {xla * mib:.4f} MiB pred {pred * mib:.4f} pred/XLA "
              f"{r['pred_over_xla']:.3f}{extra}", flush=True)
        for g in r.get("regions", ()):
            print(f"   steps {g['steps']}: XLA held max {g['xla_held_max_bytes'] / 1024:.1f} KiB, model max "
                  f"{g['model_max_bytes'] / 1024:.1f} KiB", flush=True)
    res = {"model": cfg.model, "rows": out}
    write_results(a.out, res, config=cfg)
    return res


if __name__ == "__main__":
    main()
