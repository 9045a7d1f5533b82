"""Benchmark the tracer on every zoo model and size (abstract args, nothing allocated).

Each (model, size) is traced in its own subprocess so its peak RSS (``ru_maxrss``) is its own:
the figure shows that GPT-7B graphs in well under 4 GB. Columns: equations after inlining,
nodes without and with folding, total GFLOPs of the step, trace time (make_jaxpr + graph
building, folded), peak RSS of the process, and RSS right after imports for reference. With
``--schedule xla`` also ``schedule_s``: the extra time ``sg.trace(..., schedule="xla")`` spends
compiling the unsharded step on one device (abstractly, ``runtime.schedule``) and mapping its
schedule onto the nodes; the peak RSS then includes that compile.

    python -m experiments.bench_trace [--models gpt,vit] [--sizes tiny,7b] [--timeout-s 600]
    ... --schedule xla --sizes tiny,125m,350m,7b,large --out bench_trace_schedule

Writes results/bench_trace.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Config:
    models: list[str] = field(default_factory=list)   # empty = all zoo models
    sizes: list[str] = field(default_factory=list)    # empty = all sizes of each model
    timeout_s: float = 900.0
    schedule: str = "program"                        # "xla": also time the schedule compile
    seed: int = 0


def _one(name: str, size: str, schedule: str = "program") -> dict:
    """Trace one model/size in this process; returns the row."""
    import resource

    import zoo
    from costmodel.trace import trace

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fn, args = zoo.build(name, size, abstract=True)
    t0 = time.perf_counter()
    g = trace(fn, *args, name=f"{name}-{size}")
    trace_s = time.perf_counter() - t0
    schedule_s = None
    if schedule == "xla":
        from runtime.schedule import xla_scheduled
        t0 = time.perf_counter()
        xla_scheduled(fn, args, g)
        schedule_s = time.perf_counter() - t0
    return {
        "model": name, "size": size, "eqns": g.num_eqns, "nodes_unfolded": g.num_nodes_unfolded,
        "nodes_folded": len(g), "gflops": g.total_flops / 1e9,
        "dot_gflops": g.flops_by_primitive().get("dot_general", 0.0) / 1e9,
        "gbytes": g.total_bytes / 1e9, "unsupported": sorted({n.primitive for n in g.nodes if not n.supported}),
        "trace_s": trace_s, "schedule_s": schedule_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "import_rss_mb": rss0,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--sizes", default="", help="comma-separated sizes (default: all)")
    ap.add_argument("--timeout-s", type=float, default=Config.timeout_s)
    ap.add_argument("--schedule", default="program", choices=("program", "xla"),
                    help="xla: also time the compile of XLA's schedule (sg.trace's schedule=)")
    ap.add_argument("--out", default="bench_trace", help="results/<out>.json")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "SIZE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print("ROW " + json.dumps(_one(*a.one, schedule=a.schedule)), flush=True)
        return

    import zoo
    from experiments.common import print_table, write_results

    cfg = Config(models=[m for m in a.models.split(",") if m], sizes=[s for s in a.sizes.split(",") if s],
                 timeout_s=a.timeout_s, schedule=a.schedule)
    models = cfg.models or zoo.names()
    rows = []
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    for name in models:
        for size in zoo.sizes(name):
            if cfg.sizes and size not in cfg.sizes:
                continue
            t0 = time.perf_counter()
            try:
                p = subprocess.run([sys.executable, "-m", "experiments.bench_trace", "--one", name, size,
                                    "--schedule", cfg.schedule],
                                   capture_output=True, text=True, timeout=cfg.timeout_s, cwd=root, env=env)
                line = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
                if p.returncode != 0 or not line:
                    row = {"model": name, "size": size, "error": (p.stderr or p.stdout).strip()[-500:]}
                else:
                    row = json.loads(line[-1][4:])
            except subprocess.TimeoutExpired:
                row = {"model": name, "size": size, "error": f"timeout after {cfg.timeout_s} s"}
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(f"{name:>13} {size:>6}: " + (row.get("error", "")[:200] or
                  f"{row['nodes_folded']} nodes, {row['gflops']:.4g} GFLOP, {row['trace_s']:.2f} s, "
                  f"schedule {row['schedule_s'] or 0:.2f} s, {row['peak_rss_mb']:.0f} MB"), flush=True)
    print_table([r for r in rows if "error" not in r],
                ["model", "size", "eqns", "nodes_unfolded", "nodes_folded", "gflops", "trace_s", "schedule_s",
                 "peak_rss_mb"],
                title="costmodel.trace on the zoo (abstract args, fold=True)")
    path = write_results(a.out, {"rows": rows}, config=cfg, seed=cfg.seed)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
