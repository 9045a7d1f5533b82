"""The factor-graph network against the baselines on the harder held-out split (agent.fgnn_data.
heldout_split: models, sizes and clusters never in training, caps at 10% and 30% of the way from
the least to the greatest peak, five uncapped problems, plus meshgraphnet large under a binding
cap), and its planning speed. ``python experiments/eval_policy.py --split fg [--fgnn PATH]`` runs
it; ``--reuse JSON`` takes the network-independent rows from an earlier run's JSON.

Per problem, cost / ILP cost (the label of ``fgnn_data.ilp_label``, seeded with Lagrangian BP's
plan and never worse than it: ``--ilp-seconds``, 300 s above 2,000 nodes, unless a label of the
same problem is already cached, whatever limit made it; its status says whether it is a proven
optimum), every row a raw plan unless named otherwise:
* ``fgnn_raw``: one forward pass + bp.py's masked decode (``solve(method="policy", search=False)``
  with this checkpoint; for ``base="lagrangian"`` up to 12 decodes, at each price update and the
  last round, each only memory-repaired by ``fit_with_copies``, the cheapest kept, as
  ``bp_lagrangian_raw``); ``fgnn``: the same + the planner's polish/refine;
* ``fgnn_bpmsg_raw``: the ablation: learned prices and readout kept, messages plain BP's;
* ``fgnn_finetuned_raw``: the raw decode after ``--finetune-seconds`` of ``FGPlanner.finetune`` on
  that problem (imitation + DAgger with ILP completions), only where zero-shot is above 1.02;
* ``bp_raw`` / ``bp_lagrangian_raw``: 60 rounds of min-sum BP without / with memory prices;
* ``replicated_raw``: every node replicated (strategy 0), then ``repair_memory`` if over the cap;
* ``greedy_cost_raw``, ``random_raw``: greedy by cost and random valid actions (memory-repaired);
* ``policy_raw`` / ``policy``: the old shipped GNN policy, raw decode / with its polish.
Summary: median, max and feasibility over all problems and over those whose cap binds (the
uncapped ILP plan is over the cap); a plan that does not fit counts as inf in the median and max
(before session 6 the summary dropped those, and its ratios were over copy-blind 20 s labels that
were up to 3,000x worse than BP's plan, so its medians below 1 meant nothing). Speed: warm
planning time of the raw decode on random problems of 1,000 and 10,000 nodes, uncapped and under a binding cap
(the first call compiles a shape), for the checkpoint, the untrained network and one with every correction live.
Writes results/eval_fgnn.json and results/eval_fgnn.png; ``--speed-only``: the speed rows alone,
results/eval_fgnn_speed.json.
"""
from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np

FG_ROWS = ("fgnn_raw", "fgnn", "fgnn_bpmsg_raw", "fgnn_finetuned_raw", "fgnn_finetune")


def _reusable(prev: dict | None, row: dict) -> dict:
    """The network-independent entries of an earlier run's row of the same problem and label."""
    if not prev or prev.get("nodes") != row["nodes"] or prev.get("ilp_cost") != row["ilp_cost"]:
        return {}
    return {k: v for k, v in prev.items() if k not in row and not k.startswith(FG_ROWS)}


def _rows_for(p, name, fg, old, args, prev=None):
    from agent.fgnn import FGNN
    from agent.fgnn_data import ilp_label
    from agent.fgnn_planner import FGPlanner
    from costmodel.problem import evaluate
    from experiments.eval_policy import random_policy_plan
    from solvers.bp import bp_plan
    from solvers.local import greedy_by_cost, repair_memory
    lab = ilp_label(p, 300.0 if p.num_nodes > 2000 else args.ilp_seconds)
    if lab is None:
        print(f"{name}: no ILP plan; skipped", flush=True)
        return None
    opt = lab["cost"]
    row = {"problem": name, "nodes": p.num_nodes, "ilp_status": lab["status"], "ilp_s": lab["ilp_s"],
           "ilp_cost": opt, "capped": p.usage_limit is not None}
    if p.usage_limit is not None:
        free = ilp_label(p.with_usage_limit(None), args.ilp_seconds)
        row["cap_binds"] = free is not None and not evaluate(p, free["plan"]).feasible
    else:
        row["cap_binds"] = False
    rep = evaluate(p, [0] * p.num_nodes)
    row["replicated_optimal"] = bool(rep.feasible and rep.total <= opt * 1.0005)

    def record(key, fn):
        t = time.perf_counter()
        try:
            plan = fn()
        except (ValueError, RuntimeError) as exc:
            row[key], row[key + "_feasible"] = float("nan"), False
            row[key + "_error"] = str(exc)[:120]
            return
        row[key + "_s"] = time.perf_counter() - t
        if plan is not None and not evaluate(p, plan).feasible:
            plan = repair_memory(p, plan)
        if plan is None:
            row[key], row[key + "_feasible"] = float("nan"), False
            return
        c = evaluate(p, plan)
        row[key] = c.total / opt if opt > 0 else float("nan")
        row[key + "_feasible"] = bool(c.feasible)

    reuse = _reusable(prev, row)
    record("fgnn_raw", lambda: fg.plan(p, polish=False))
    record("fgnn", lambda: fg.plan(p, polish=True))
    record("fgnn_bpmsg_raw", lambda: fg.plan(p, polish=False, params=FGNN.bp_messages(fg.params)))
    if args.finetune_seconds > 0 and row.get("fgnn_raw", 0) > 1.02:
        ft = FGPlanner(fg.params, fg.config.to_dict(), source=fg.source)   # a copy: fg stays zero-shot
        t = time.perf_counter()
        stats = ft.finetune(p, args.finetune_seconds, seed=args.seed)
        row["fgnn_finetune_s"] = time.perf_counter() - t
        row["fgnn_finetune_blocks"] = len(stats) - 1
        record("fgnn_finetuned_raw", lambda: ft.plan(p, polish=False))
    if reuse:
        row.update(reuse)
        return row
    record("bp_raw", lambda: bp_plan(p, rounds=60, memory_prices=False))
    record("bp_lagrangian_raw", lambda: bp_plan(p, rounds=60, memory_prices=True))
    record("replicated_raw", lambda: [0] * p.num_nodes)
    record("greedy_cost_raw", lambda: greedy_by_cost(p))
    record("random_raw", lambda: random_policy_plan(p, args.seed))
    if old is not None and p.num_nodes <= args.old_policy_max_nodes:
        record("policy_raw", lambda: old.plan(p, polish=False, seed=args.seed))
        record("policy", lambda: old.plan(p, polish=True, seed=args.seed))
    return row


METHODS = ("fgnn_raw", "fgnn", "fgnn_bpmsg_raw", "fgnn_finetuned_raw", "bp_raw", "bp_lagrangian_raw", "replicated_raw",
           "greedy_cost_raw", "random_raw", "policy_raw", "policy")


def summarise(rows):
    """Per method over ``rows``: median / max / mean of cost / ILP label, a plan that does not fit
    (or none) counted as inf (so a median is over every problem, not only those it solved), and
    how many plans fit."""
    out = {}
    for m in METHODS:
        have = [r for r in rows if m in r]
        if have:
            vals = np.array([r[m] if r.get(m + "_feasible", False) else np.inf for r in have], np.float64)
            fin = vals[np.isfinite(vals)]
            out[m] = {"n": len(vals), "feasible": int(len(fin)), "median": float(np.median(vals)),
                      "max": float(vals.max()), "geomean_feasible": float(np.exp(np.mean(np.log(fin)))) if len(fin)
                      else float("nan"), "all_feasible": bool(len(fin) == len(vals)),
                      "median_s": float(np.nanmedian([r.get(m + "_s", np.nan) for r in have]))}
    return out


def speed(fg, seed: int = 0, sizes=(1000, 10000)) -> list:
    """Warm raw-decode planning time on random problems (a first call compiles the shape), for the
    given planner (``fg``: its checkpoint), the untrained network (Lagrangian BP: every correction
    zero, so planning skips them all) and that network with every correction live (random output
    layers: what a trained network pays, the per-message MLP at every round)."""
    import jax

    from agent.fgnn import FGNN, FGConfig
    from costmodel.problem import evaluate
    from env.workloads import random_problem
    base = FGNN(FGConfig())
    rng, live = np.random.default_rng(seed), dict(base.params)
    for key in ("msg", "price", "read"):
        mlp = dict(live[key])
        mlp["Dense_2"] = jax.tree.map(lambda a: rng.normal(0.0, 0.1, np.shape(a)).astype(np.float32), mlp["Dense_2"])
        live[key] = mlp
    live["soft"] = np.full(base.config.rounds, 0.1, np.float32)
    nets = [("checkpoint", lambda p: fg.plan(p, polish=False)), ("untrained", base.plan),
            ("all_live", lambda p: base.plan(p, params=live))]
    out = []
    for n in sizes:
        for cap in (None, 0.3):
            p = random_problem(np.random.default_rng(seed), n, 8, memory_cap_fraction=cap)
            for label, plan in nets:
                t = time.perf_counter()
                plan(p)
                first = time.perf_counter() - t
                t = time.perf_counter()
                x = plan(p)
                out.append({"network": label, "nodes": n, "edges": p.num_edges, "cap_fraction": cap,
                            "plan_s": time.perf_counter() - t, "plan_s_first_call": first,
                            "feasible": bool(evaluate(p, x).feasible), "total": float(evaluate(p, x).total),
                            "loadavg_1m": os.getloadavg()[0]})
                print(out[-1], flush=True)
    return out


def main(args):
    from agent.fgnn_data import heldout_split
    from agent.planner import Planner
    from experiments.common import print_table, write_results
    fg = Planner.load(args.fgnn)
    if getattr(args, "speed_only", False):
        write_results(args.out_name or "eval_fgnn_speed", {"speed": speed(fg, args.seed), "fgnn": fg.describe()},
                      config=vars(args), seed=args.seed)
        return
    try:
        old = Planner.load(args.checkpoint)
    except (FileNotFoundError, ValueError):
        old = None
    rows = []
    out_name = getattr(args, "out_name", "") or ("eval_fgnn_nocopies" if getattr(args, "no_copies", False) else "eval_fgnn")
    prev = {}
    if getattr(args, "reuse", None):
        import json
        with open(args.reuse) as f:
            prev = {r["problem"]: r for r in json.load(f)["rows"]}
    split = heldout_split(big=not args.no_big)
    split = split[-1:] + [split[j] for j in np.argsort([j % 4 for j in range(len(split) - 1)], kind="stable")] \
        if not args.no_big else split      # the big one, then models interleaved: a cut-short run stays diverse
    for name, build in split:
        if args.only and args.only not in name:
            continue
        p = build()
        if getattr(args, "no_copies", False):
            p = replace(p, edge_memory=None)
        row = _rows_for(p, name, fg, old, args, prev.get(name))
        if row is not None:
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                   if not k.endswith("_feasible")}, flush=True)
            write_results(out_name, {"rows": rows, "partial": True, "summary": summarise(rows),
                                        "summary_binding": summarise([r for r in rows if r["cap_binds"]])},
                          config=vars(args), seed=args.seed)
    summary = summarise(rows)
    binding = [r for r in rows if r["cap_binds"]]
    summary_binding = summarise(binding)
    sp = [] if args.no_speed else speed(fg, args.seed)
    cols = ["problem", "nodes", "ilp_status"] + [m for m in METHODS if any(m in r for r in rows)]
    print_table(rows, cols, title="cost / ILP cost on the fg held-out split (raw plans unless named)")
    for title, s in (("all problems", summary), (f"the {len(binding)} binding-cap problems", summary_binding)):
        print_table([{"method": k, **v} for k, v in s.items()], ["method", "n", "feasible", "median", "max", "geomean_feasible",
                                                                  "median_s"], title=f"summary over {title}")
    rep_share = float(np.mean([r["replicated_optimal"] for r in rows])) if rows else float("nan")
    print(f"replicated is optimal on {rep_share:.0%} of the split")
    write_results(out_name, {"rows": rows, "summary": summary, "summary_binding": summary_binding,
                                "replicated_optimal_share": rep_share, "speed": sp, "loadavg": os.getloadavg(),
                                "fgnn": fg.describe(), "old_policy": None if old is None else old.describe()},
                  config=vars(args), seed=args.seed)
    plot(rows, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                            out_name + ".png"))


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(16, 5.5))
    from experiments.eval_policy import bars
    bars(ax, rows, [m for m in METHODS if any(m in r for r in rows)], str,
         "fg held-out split: factor-graph network vs baselines", fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
