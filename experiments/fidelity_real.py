"""The realistic-size fidelity table (issue 13, deliverable 5): merge the per-model runs of
``experiments/fidelity.py --size real`` into one table with the causes of the rows outside, and
diagnose a row (XLA's buffers at its peak beside the cost model's live set at its own peak).

    # one process per model (each writes results/s19d_fidelity_real_<model>.json), then:
    .venv/bin/python -m experiments.fidelity_real merge --models fno,meshgraphnet,unet,vit,gpt
    # a model re-run later (results/s20c_fidelity_real_meshgraphnet.json) beside the others:
    # (the other models' rows re-priced: fidelity --reprice --out s19d_fidelity_real --write s20c_reprice_real_after)
    ... merge --prefix-of meshgraphnet=s20c_fidelity_real --repriced s20c_reprice_real_after --out s20c_fidelity_real
    # a row outside: recompile its stored plan with --xla_dump_to and list both sides' peaks
    .venv/bin/python -m experiments.fidelity_real diagnose --model gpt --plan megatron
    # a tiny-size row of a whole table (results/s21a_fidelity_tiny.json), executed as fidelity runs it
    .venv/bin/python -m experiments.fidelity_real diagnose --source s21a_fidelity_tiny --model gpt --plan ilp-memory

``merge`` writes results/<out>.json: the rows of every per-model file (their full Reports stripped to
keep the file small; the per-model files keep them), each with ``mem_ok`` / ``comm_ok`` against issue
13's 10% on both, and ``cause`` from REAL_CAUSES for a row outside. ``diagnose`` writes
results/<prefix>_diag_<model>_<plan>.json. Both record git revision and load (``write_results``).

Approximate: ``diagnose`` names a copy live at the model's peak by its candidate producers (the copy
groups whose bytes and step match the interval), since ``CopyGroups.intervals`` returns intervals
without their group; two groups of equal size made at one step are both listed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from experiments.common import RESULTS_DIR, cpu_devices, write_results  # noqa: E402

cpu_devices()

from experiments.fidelity import REAL_SIZES, unbounded  # noqa: E402

TOL = 0.10      # issue 13: memory and collective bytes within 10% of XLA
_MGN_LN = ("under (session 19, `diagnose --model meshgraphnet --plan fsdp`, XLA's buffer assignment at its peak, "
           "the edge encoder's backward): XLA 5284.2 MiB, the model 3916.4 MiB, gap 1367.8 MiB. Both hold the 15 "
           "edge-MLP input concatenates (f32[49152,384], 72 MiB each); XLA also holds 3 x 448 MiB = 1344 MiB of "
           "LayerNorm broadcasts written out for its YNNPACK reductions (wrapped_broadcast, bitcast_broadcast_fusion, "
           "broadcast_multiply_fusion: f32[49152,128], 24 MiB each, one per edge LayerNorm), 98% of the gap. The same "
           "cause as gpt tiny ilp-memory (experiments/fidelity.py CAUSES: XLA CPU writes the broadcast out when it "
           "is shared with the forward LayerNorm; a copy-group rule was tried and reverted in session 11), here at "
           "18 LayerNorms over 393,216 edges. Not modelled")
_MGN_LN += (". Session 20: modelled (costmodel.ynn_reads: the scale and rsqrt broadcasts, 2 of the 3 kinds; the "
            "third, broadcast_multiply_fusion, the model already held as the LayerNorm's mul); re-priced 0.911, "
            "re-solved 0.911; what stays under is the LayerNorm input written out beside the dot's result "
            "(broadcast_add_fusion, 448 MiB; charging it was tried and reverted, README session 20)")
_GPT_OVER = ("over (session 20): costmodel.ynn_reads now charges the LayerNorm broadcasts XLA writes (this plan's "
             "HLO: 49 broadcasts read by YNNPACK reductions, the rule 48: +0.04), on top of the over-count gpt "
             "had before (1.063-1.064), the replicated row's cause: a third softmax buffer per attention block")
#: (model, plan) at REAL_SIZES -> the measured cause of a row outside TOL (``diagnose``'s figures)
REAL_CAUSES: dict = {
    ("meshgraphnet", "fsdp"): _MGN_LN,
    **{("meshgraphnet", p): "under: as meshgraphnet fsdp (session 20: the same LayerNorm kinds at XLA's peak "
                            "on ilp-time and replicated, results/s20c_meshgraphnet_layernorm_dumps.json)"
       for p in ("replicated", "ilp-time", "ilp-memory", "policy")},
    **{("gpt", p): _GPT_OVER for p in ("ilp-time", "ilp-memory-1.05", "policy")},
    ("meshgraphnet", "ilp-memory-1.05"): "over: the dp plan (session 20's ILP, 30 s, returns dp's strategies), as "
                                         "meshgraphnet dp (session 23: another plan, 0.999)",
    ("meshgraphnet", "dp"): "over (session 19, `diagnose --model meshgraphnet --plan dp`, the 25 largest buffers each "
                            "side): XLA 4211.3 MiB, the model 4687.2 MiB (+476 MiB), both peaks at block_14's edge "
                            "backward. The model holds four 192 MiB replicated copies (f32[393216,128], made at step "
                            "821 for block_14_edge's readers, ends 823-829), XLA three (all-gather.1 / .78 / .79): "
                            "+192 MiB; the rest (+284 MiB) not attributed (session 20: 1.124 with the LayerNorm "
                            "broadcasts charged). Session 23: the rest was each block's LayerNorm chain output, held "
                            "to the backward reader of the chain's unkept rsqrt * scale (slice_layout.buffer_reads): "
                            "1.030, the fourth all-gather left (XLA issues it after the other three reductions ran)",
    ("gpt", "replicated"): "over (session 19, `diagnose --model gpt --plan replicated`, the 20 largest buffers "
                           "each side): XLA 23749.8 MiB, the model 26693.0 MiB (+2943 MiB). Per attention block the "
                           "model holds three f32[8,12,1024,1024] softmax buffers at its peak (the scores dot, sub, "
                           "div: 3 x 384 MiB), XLA two (ynn_fusion, broadcast_multiply_fusion): +384 MiB a block, "
                           "4608 MiB over 12 blocks if all are held, less under-counts not attributed; the lm_head's "
                           "three 1572 MiB logits buffers agree (session 20: 1.174 with the LayerNorm broadcasts "
                           "charged, which XLA writes too)",
    ("vit", "replicated"): "under (session 19, `diagnose --model vit --plan replicated`, not attributed buffer by "
                           "buffer): XLA 8316.0 MiB, the model 7212.0 MiB (gap 1104 MiB). The fc1 / GELU buffers "
                           "agree (220.5 MiB per block both sides); XLA holds 2128 MiB of LayerNorm broadcast kinds "
                           "at its peak (broadcast_multiply 1153, wrapped_broadcast 516, bitcast_broadcast 459 MiB), "
                           "likely the YNNPACK broadcasts of meshgraphnet fsdp (session 20: 0.973 with them charged)",
}


def merge(models, prefix: str, out: str, prefix_of: dict | None = None, repriced: str = "", fresh=None) -> dict:
    """One table of the per-model files results/<prefix>_<model>.json (rows in file order);
    ``prefix_of``: model -> another prefix for that model's file (a model re-run in a later session).
    ``repriced``: results/<repriced>.json from ``fidelity --reprice --write``: the rows of the models
    not in ``fresh`` (default: those in ``prefix_of``) take its ratios (their stored plans, the current
    model; ``repriced`` True). ``fresh``: the models re-run on the current model, whose ratios stand."""
    fresh = set(prefix_of or {}) if fresh is None else set(fresh)
    rows, sources = [], {}
    rep = {} if not repriced else {(r["model"], r["plan"]): r for r in json.loads(
        (Path(RESULTS_DIR) / f"{repriced}.json").read_text())["program"]["rows"]}
    for m in models:
        path = Path(RESULTS_DIR) / f"{(prefix_of or {}).get(m, prefix)}_{m}.json"
        if not path.exists():
            print(f"missing {path}: {m} left out")
            continue
        d = json.loads(path.read_text())
        sources[m] = {"file": str(path.relative_to(Path(RESULTS_DIR).parent)), "git_rev": d.get("git_rev"),
                      "ilp_time_limit_s": d["config"]["ilp_time_limit_s"], "loadavg": d["env"]["loadavg_1_5_15"]}
        for r in d["rows"]:
            if r.get("ok") == "ERROR":
                rows.append({"model": m, "size": r.get("size"), "plan": r["plan"], "error": r["error"],
                             "mem_ok": False, "comm_ok": False, "cause": "error: " + r["error"]})
                continue
            if rep and m not in fresh:
                p = rep[m, r["plan"]]
                r = r | {"mem_ratio": p["mem_ratio"], "comm_ratio": p["comm_ratio"], "repriced": True,
                         "pred_mem_MiB": p["mem_ratio"] * r["xla_mem_MiB"],
                         "pred_comm_MiB": p["comm_ratio"] * r["xla_comm_MiB"]}
            mem_ok, comm_ok = abs(r["mem_ratio"] - 1) <= TOL, abs(r["comm_ratio"] - 1) <= TOL
            info = r.get("plan_info") or {}
            rows.append({k: r[k] for k in ("model", "size", "plan", "pred_mem_MiB", "xla_mem_MiB", "mem_ratio",
                                           "pred_comm_MiB", "xla_comm_MiB", "comm_ratio", "compile_s", "solve_s")}
                        | {"solver_status": info.get("status"), "solver_gap": info.get("gap"),
                           "mem_ok": mem_ok, "comm_ok": comm_ok, "strategies": r["strategies"],
                           "repriced": bool(r.get("repriced")),
                           "cause": "" if mem_ok and comm_ok else REAL_CAUSES.get((m, r["plan"]), "not diagnosed")})
    outside = [f"{r['model']} {r['plan']}" for r in rows if not (r["mem_ok"] and r["comm_ok"])]
    summary = {"rows": len(rows), "mem_within_10pct": sum(r["mem_ok"] for r in rows),
               "comm_within_10pct": sum(r["comm_ok"] for r in rows),
               "both_within_10pct": len(rows) - len(outside), "outside": outside}
    print(summary)
    for r in rows:
        if "error" in r:
            print(f"{r['model']:13s} {r['plan']:16s} ERROR {r['error']}")
            continue
        print(f"{r['model']:13s} {r['plan']:16s} mem {r['pred_mem_MiB']:10.1f} / {r['xla_mem_MiB']:10.1f} MiB = "
              f"{r['mem_ratio']:.3f}  comm {r['comm_ratio']:.3f}  {r['cause'][:60]}")
    write_results(out, {"what": "experiments.fidelity --size real per model, merged by experiments.fidelity_real "
                                "merge; ratio = the cost model's prediction / XLA's compiled figure, per device",
                        "sources": sources, "summary": summary, "rows": rows})
    return summary


def model_peak(problem, strategies, top: int) -> dict:
    """The cost model's live set at its peak for ``strategies``: the node buffers and copies live at
    the first time point where the profile is largest, largest first."""
    import numpy as np

    from costmodel.problem import as_strategy_array, usage_profile

    s = as_strategy_array(problem, strategies)
    use = problem.node_usages[problem.strategy_offsets[:-1] + s]
    em = problem.edge_memory
    cp = em.intervals(s) if em is not None else None
    times, live = usage_profile(problem, use, extra=cp)
    t = times[int(np.argmax(live))]
    st, en = problem.intervals[:, 0], problem.intervals[:, 1]
    m = problem.meta
    items = [{"what": "node", "node": int(i), "name": m.names[i], "primitive": m.primitives[i],
              "strategy": m.strategy_names[i][s[i]], "bytes": float(use[i])}
             for i in np.nonzero((st <= t) & (t < en) & (use > 0))[0]]
    if cp is not None:
        for a, b, z in zip(*cp):
            if a <= t < b:
                cand = np.nonzero((em.group_bytes == z) & ((em.group_time == a) | np.isin(
                    np.arange(em.num_groups), em.member_group[em.member_time == a])))[0]
                items.append({"what": "copy", "start": int(a), "end": int(b), "bytes": float(z),
                              "producers": sorted({m.names[em.group_node[g]] for g in cand})[:4]})
    items.sort(key=lambda x: -x["bytes"])
    return {"time": int(t), "total_bytes": float(live.max()), "nodes_bytes": sum(x["bytes"] for x in items
                                                                                if x["what"] == "node"),
            "copies_bytes": sum(x["bytes"] for x in items if x["what"] == "copy"), "largest": items[:top]}


def diagnose(model: str, plan_name: str, prefix: str, top: int, source: str = "") -> dict:
    """Recompile the stored plan of (model, plan) from results/<prefix>_<model>.json (or
    results/<source>.json, any table of ``experiments/fidelity.py``: a tiny-size row is built and
    executed as fidelity builds it, as is a step of ``fidelity --outside``) with XLA's dump, and put
    XLA's buffers at its peak (``minmem_bounds.peak_by_kind``, named by Problem node where the HLO
    carries one) beside the model's live set at its peak (``model_peak``)."""
    import shardgym as sg
    import zoo
    from costmodel.graph_part import space_for
    from experiments.fidelity import outside_steps
    from experiments.minmem_bounds import peak_by_kind
    from runtime.core import execute
    from shardgym.verifier import instruction_nodes

    d = json.loads((Path(RESULTS_DIR) / f"{source or prefix + '_' + model}.json").read_text())
    row = next(r for r in d["rows"] if r["plan"] == plan_name and r["model"] == model)
    size = row.get("size") or REAL_SIZES[model]
    outside = outside_steps()   # a train step of fidelity --outside: built as it builds them, executed
    real = model not in outside and size != zoo.sizes(model)[0]   # a real size compiled abstractly
    fn, args = outside[model]() if model in outside else zoo.build(model, size, abstract=real, seed=d["seed"],
                                                                   real_indices=real)
    graph = sg.trace(fn, *args, name=f"{model}-{size}")
    cluster = sg.Cluster.preset(d["config"]["cluster"])
    problem = sg.build_problem(graph, unbounded(cluster) if real else cluster,
                               space=space_for(graph, args) if real else "full")
    plan = sg.Plan.for_problem(problem, row["strategies"], method=plan_name, objective="", info=row["plan_info"])
    with tempfile.TemporaryDirectory(prefix="fid-real-") as tmp:
        rep = execute(fn, args, graph, plan, problem=problem, compiler_options={"xla_dump_to": tmp})
        xla = peak_by_kind(tmp, top)
        text = sorted(Path(tmp).glob("*after_optimizations.txt"))[-1].read_text()
    names = instruction_nodes(text, problem)
    for b in xla["largest"]:
        i = names.get(b["name"])
        b["node"] = None if i is None else int(i)
        b["node_name"] = None if i is None else problem.meta.names[i]
    mp = model_peak(problem, row["strategies"], top)
    mib, u = (2.0 ** -20, "MiB") if real else (2.0 ** -10, "KiB")   # tiny buffers in KiB
    print(f"{model} {plan_name}: model {mp['total_bytes'] * mib:.1f} {u} at step {mp['time']} (nodes "
          f"{mp['nodes_bytes'] * mib:.1f}, copies {mp['copies_bytes'] * mib:.1f}); XLA {rep.xla_memory_bytes * mib:.1f} "
          f"{u} {rep.xla_memory_breakdown}")
    print(f"XLA by kind ({u}):", {k: round(v * mib, 1) for k, v in xla["by_kind_bytes"].items()})
    for b in xla["largest"]:
        print(f"  XLA   {b['bytes'] * mib:9.1f} {u} {b['name']:40s} {b['opcode']:14s} {b['shape'][:40]:40s} "
              f"{b['node_name']}")
    for x in mp["largest"]:
        what = f"{x['name']} {x['primitive']} {x['strategy']}" if x["what"] == "node" else \
            f"copy [{x['start']}, {x['end']}) of {x['producers']}"
        print(f"  model {x['bytes'] * mib:9.1f} {u} {what}")
    res = {"model": model, "size": size, "plan": plan_name, "xla_memory_bytes": rep.xla_memory_bytes,
           "xla_breakdown": rep.xla_memory_breakdown, "xla_peak": xla, "model_peak": mp}
    write_results(f"{source or prefix}_diag_{model}_{plan_name}", res)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("merge", "diagnose"))
    ap.add_argument("--models", default=",".join(m for m in REAL_SIZES if m != "mlp"))
    ap.add_argument("--model", default="")
    ap.add_argument("--plan", default="")
    ap.add_argument("--prefix", default="s19d_fidelity_real", help="per-model files results/<prefix>_<model>.json")
    ap.add_argument("--prefix-of", default="", help="model=prefix,...: per-model prefixes overriding --prefix "
                                                    "(e.g. meshgraphnet=s20c_fidelity_real)")
    ap.add_argument("--repriced", default="", help="results/<REPRICED>.json (fidelity --reprice --write): the "
                                                   "ratios of the models not in --prefix-of")
    ap.add_argument("--fresh", default=None, help="merge: comma-separated models re-run on the current model, whose "
                                                  "ratios stand (default: those in --prefix-of)")
    ap.add_argument("--source", default="", help="diagnose: results/<SOURCE>.json, a whole fidelity table (e.g. the "
                                                 "tiny one) instead of the per-model files of --prefix")
    ap.add_argument("--out", default="s19d_fidelity_real")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    if a.what == "merge":
        return merge([m for m in a.models.split(",") if m], a.prefix, a.out,
                     dict(kv.split("=", 1) for kv in a.prefix_of.split(",") if kv), a.repriced,
                     None if a.fresh is None else [m for m in a.fresh.split(",") if m])
    return diagnose(a.model, a.plan, a.prefix, a.top, a.source)


if __name__ == "__main__":
    main()
