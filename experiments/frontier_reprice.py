"""Stored min-memory plans re-priced by the current cost model beside XLA's figures (issue 13, gpt tiny's
min-memory frontier).

Each ``--rows`` entry SOURCE:PLAN:POLICY names a plan of results/SOURCE.json (a ``minmem_breakdown`` or
``minmem_polish`` record: ``plans[k]`` with ``plan`` and ``strategies``, or a polished plan's
top-level ``strategies``) and the recompute policy its program was traced under ('' none). The zoo model's
first size is rebuilt on ``--cluster`` and the plan priced (``sg.evaluate``) against the XLA figure stored
beside it. With ``--compile`` each plan is also compiled with XLA's dump (``runtime.execute``) and
XLA's figure split into what its buffers hold at the peak (``verifier.peak_buffers``: parameters and
outputs plus the union of the temp values live there) and the rest of the temp allocation
(``holes``: alignment and fragmentation, which no live-range rule charges).

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


def xla_split(fn, args, graph, problem, plan) -> dict:
    """XLA's figure, its buffers at the peak (``peak_buffers``' sum) and the rest of its temp allocation."""
    from runtime.core import execute
    from shardgym.verifier import peak_buffers

    with tempfile.TemporaryDirectory(prefix="frontier-") as d:
        rep = execute(fn, args, graph, plan, problem=problem, compiler_options={"xla_dump_to": d})
        held = sum(b for _, b in peak_buffers(d))
    return {"xla_bytes_now": float(rep.xla_memory_bytes), "xla_breakdown": rep.xla_memory_breakdown,
            "xla_held_bytes": float(held), "holes_bytes": float(rep.xla_memory_bytes - held)}


def main(argv=None) -> dict:
    import shardgym as sg
    import zoo
    from experiments.common import write_results

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS), help="SOURCE:PLAN:POLICY entries")
    ap.add_argument("--compile", action="store_true", help="also compile each plan and split XLA's figure")
    ap.add_argument("--out", default="frontier_reprice")
    a = ap.parse_args(argv)
    cfg = Config(model=a.model, rows=tuple(a.rows), compile=a.compile)
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
            r.update(xla_split(fn, args, graph, problem, plan))
            r["pred_over_held"] = pred / r["xla_held_bytes"]
        out.append(r)
        extra = "" if not cfg.compile else (
            f"; XLA now {r['xla_bytes_now'] * mib:.4f}, held at its peak {r['xla_held_bytes'] * mib:.4f} "
            f"(pred / held {r['pred_over_held']:.3f}), holes {r['holes_bytes'] / 1024:.1f} KiB")
        print(f"{source:28s} {label:40s} XLA {xla * mib:.4f} MiB pred {pred * mib:.4f} pred/XLA "
              f"{r['pred_over_xla']:.3f}{extra}", flush=True)
    res = {"model": cfg.model, "rows": out}
    write_results(a.out, res, config=cfg)
    return res


if __name__ == "__main__":
    main()
