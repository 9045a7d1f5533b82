"""Benchmark build_problem on every zoo model and size on every cluster preset.

Columns: OpGraph nodes, Problem strategies (total and max per node), edges, trace time (once per
model/size) and build time (per preset), plus the replicated plan's peak memory per device. The
goal: GPT-1.3B on h100-2x8 builds in under 30 s.

    python -m experiments.bench_problem [--models gpt,vit] [--sizes tiny,1.3b] [--presets h100-2x8]

Writes results/bench_problem.json.
"""
from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import dataclass, field


@dataclass
class Config:
    models: list[str] = field(default_factory=list)   # empty = all zoo models
    sizes: list[str] = field(default_factory=list)    # empty = all sizes
    presets: list[str] = field(default_factory=list)  # empty = all cluster presets
    max_strategies: int = 32
    seed: int = 0


def run(cfg: Config) -> list[dict]:
    import zoo
    from costmodel.builder import build_problem
    from costmodel.cluster import Cluster
    from costmodel.problem import evaluate
    from costmodel.trace import trace

    rows = []
    for name in cfg.models or zoo.names():
        for size in cfg.sizes or zoo.sizes(name):
            if size not in zoo.sizes(name):
                continue
            fn, args = zoo.build(name, size, abstract=True, seed=cfg.seed)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = trace(fn, *args, name=f"{name}-{size}")
            trace_s = time.perf_counter() - t0
            for preset in cfg.presets or Cluster.presets():
                cl = Cluster.preset(preset)
                t0 = time.perf_counter()
                p = build_problem(g, cl, max_strategies=cfg.max_strategies)
                build_s = time.perf_counter() - t0
                k = p.num_strategies
                rep = evaluate(p, [0] * p.num_nodes)
                row = {"model": name, "size": size, "preset": preset, "nodes": p.num_nodes,
                       "strategies": int(k.sum()), "max_k": int(k.max()), "edges": p.num_edges,
                       "edge_entries": int(len(p.edge_costs)), "trace_s": round(trace_s, 3),
                       "build_s": round(build_s, 3), "replicated_peak_gib": rep.peak_memory_bytes / 2**30}
                rows.append(row)
                print(f"{name:12s} {size:6s} {preset:16s} nodes {row['nodes']:6d} strategies {row['strategies']:7d} "
                      f"max {row['max_k']:3d} edges {row['edges']:6d} build {build_s:6.2f} s", flush=True)
    return rows


def main(argv=None) -> None:
    from experiments.common import print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--sizes", default="", help="comma-separated sizes (default: all)")
    ap.add_argument("--presets", default="", help="comma-separated cluster presets (default: all)")
    ap.add_argument("--max-strategies", type=int, default=Config.max_strategies)
    a = ap.parse_args(argv)
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    cfg = Config(models=split(a.models), sizes=split(a.sizes), presets=split(a.presets),
                 max_strategies=a.max_strategies)
    rows = run(cfg)
    print_table(rows, ["model", "size", "preset", "nodes", "strategies", "max_k", "edges", "trace_s", "build_s",
                       "replicated_peak_gib"], title="build_problem")
    goal = [r for r in rows if r["model"] == "gpt" and r["size"] == "1.3b" and r["preset"] == "h100-2x8"]
    summary = {"gpt_1.3b_h100_2x8_build_s": goal[0]["build_s"] if goal else None,
               "goal_build_s": 30.0, "max_build_s": max((r["build_s"] for r in rows), default=None)}
    print(summary)
    path = write_results("bench_problem", {"rows": rows, "summary": summary}, config=cfg, seed=cfg.seed)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
