"""Evaluate the shipped policy on the HELD-OUT split (models, sizes, clusters never trained on).

    python experiments/eval_policy.py                       # full: 60 s fine-tune per problem
    python experiments/eval_policy.py --finetune-seconds 15 --ilp-seconds 30   # quick
    python experiments/eval_policy.py --split fg --ilp-seconds 60   # the factor-graph network (eval_fgnn.py)

Per held-out problem (``env.workloads.heldout_workloads()``, each uncapped and under the memory
cap fractions in ``--caps``): the ILP optimum (``solvers.ilp.solve_ilp``, time limit
``--ilp-seconds``; its status is reported: a "time_limit" incumbent is not a proven optimum) and,
as cost / ILP cost, with and without the local-search polish:
* ``policy_greedy``: the argmax decode (with polish: ``Planner.plan``'s default, which under a cap
  adds the uncapped decode as a second start and refines; ``policy_greedy_norefine``: without
  that refinement, polish only); ``policy_best16``: the cheapest feasible of ``--samples``
  decodes (the argmax one and samples − 1 sampled); ``policy_finetuned``: the same after
  ``--finetune-seconds`` of PPO on that problem alone;
* ``random``: a uniformly random valid action at every step of the env (its memory mask on);
* ``greedy_cost``: each node in order takes its least node + resharding cost to decided neighbours;
* ``bp`` / ``bp_lagrangian``: 60 rounds of min-sum belief propagation (``solvers.bp.bp_plan``),
  without / with Lagrangian memory prices, then its masked one-node-at-a-time decode.
"With polish" means the same post-processing the planner gives its own decode
(``solvers.local.improve``: repair, polish and, under a cap, refine), so the rows compare starts.
The summary is printed over all problems and over those whose memory cap binds (the policy's
uncapped plan is over it; ``cap_binds`` in each row).
Plus feasibility of every plan, planning wall time vs ILP wall time, and the planning time of a
2,000-node random problem (first call and warm; the planner compiles nothing, so they should agree).

The 60-s ILP is a weak reference where the cap binds (its incumbent was 7-30x worse than the default
planner's plan in eval_policy_s14b), so each row also has ``ref_cost`` = min(this run's ILP cost, the
cached best-known cost of ``experiments.heldout_reference``, matched by problem fingerprint), with
``ref_source`` "ilp" or "cache", and ``lower_bound`` = max(this ILP's dual bound, the cached proven
bound). Every method key ``k`` then has ``k_vs_ref`` (cost / ref_cost) and ``k_vs_lb`` (cost /
lower_bound: an upper bound on how far from optimal it can be); ``k`` itself stays cost / this ILP's
cost. The run's ILP plan and bound and the default planner's plan are merged into the cache
afterwards (``--no-record``: not).
Writes results/eval_policy.json and results/eval_policy.png (``--out-name``: results/NAME.*).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np  # noqa: E402


def random_policy_plan(problem, seed: int) -> list[int]:
    from env.sharding_env import ShardingEnv
    env = ShardingEnv(workloads=problem, copy_obs=False)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    while True:
        valid = np.nonzero(obs["action_mask"])[0]
        obs, _, term, trunc, info = env.step(int(rng.choice(valid)))
        if term or trunc:
            return info["plan"]


def finish(problem, plan, polish_it: bool, refine_time_s: float = 0.0):
    """Memory-repair (if needed) then, with ``polish_it``, what the planner does to its own decode
    (``solvers.local.improve``: polish, then refine for ``refine_time_s``); None when no repair fits
    or there is no plan to start from."""
    from costmodel.problem import evaluate
    from solvers.local import improve, repair_memory
    if plan is None:   # e.g. bp_plan when nothing fits the limit
        return None
    if polish_it:
        return improve(problem, plan, refine_time_limit_s=refine_time_s)
    return plan if evaluate(problem, plan).feasible else repair_memory(problem, plan)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="pretrained")
    ap.add_argument("--caps", default="none,0.5", help="comma list: 'none' or a memory_cap_fraction")
    ap.add_argument("--ilp-seconds", type=float, default=120.0)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--finetune-seconds", type=float, default=60.0)
    ap.add_argument("--big-nodes", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems (0 = all)")
    ap.add_argument("--only", default="", help="evaluate only problems whose name contains this text")
    ap.add_argument("--skip-policy", action="store_true",
                    help="only the rows that need no policy (random, greedy_cost, bp, bp_lagrangian); the cap "
                         "counts as binding when the uncapped ILP plan is over it")
    ap.add_argument("--split", choices=("heldout", "fg"), default="heldout",
                    help="fg: the harder held-out split and the factor-graph network (experiments/eval_fgnn.py)")
    ap.add_argument("--fgnn", default="fgnn", help="--split fg: the network's checkpoint")
    ap.add_argument("--old-policy-max-nodes", type=int, default=2000, help="--split fg: old policy rows up to this size")
    ap.add_argument("--no-big", action="store_true", help="--split fg: leave out the >4,000-node problem")
    ap.add_argument("--no-speed", action="store_true", help="--split fg: skip the planning-speed rows")
    ap.add_argument("--speed-only", action="store_true",
                    help="--split fg: only the planning-speed rows (results/eval_fgnn_speed.json or --out-name)")
    ap.add_argument("--reuse", default=None, metavar="JSON",
                    help="--split fg: take the rows that do not depend on the network (BP, replicated, greedy, random, "
                         "old policy) from this earlier eval_fgnn JSON where the problem and its label match; "
                         "only the fgnn rows are run again")
    ap.add_argument("--no-copies", action="store_true",
                    help="--split fg: drop the problems' edge memory (resharded copies), the model the BP family "
                         "prices; writes results/eval_fgnn_nocopies.json")
    ap.add_argument("--no-record", action="store_true",
                    help="do not merge this run's ILP and default plans into results/heldout_reference.json")
    ap.add_argument("--out-name", default="", help="results/NAME.json and .png instead of eval_policy (eval_fgnn with --split fg)")
    args = ap.parse_args(argv)
    if args.split == "fg":
        from experiments.eval_fgnn import main as fg_main
        return fg_main(args)

    from agent.planner import Planner
    from costmodel.problem import evaluate
    from env.workloads import Workload, heldout_workloads, random_problem
    from experiments.common import print_table, write_results
    from experiments.heldout_reference import load as load_reference
    from experiments.heldout_reference import problem_name, reference_for
    from experiments.heldout_reference import record as record_ref
    from solvers.bp import bp_plan
    from solvers.local import REFINE_TIME_LIMIT_S, fitting_least_usage_plan, greedy_by_cost, least_usage_plan

    caps = [None if c.strip() == "none" else float(c) for c in args.caps.split(",")]
    workloads = [Workload(w.model, w.size, w.cluster, None, c) for w in heldout_workloads() for c in caps]
    if args.only:
        workloads = [w for w in workloads if args.only in w.name]
    if args.limit:
        workloads = workloads[:args.limit]
    base = Planner.load(args.checkpoint)
    reference = load_reference()
    rows = []
    for w in workloads:
        p = w.build()
        name = problem_name(w)
        row = {"problem": name, "nodes": p.num_nodes}
        t = time.perf_counter()
        try:
            # seeded with the least-memory plan (feasible if any plan is, without resharded copies) and
            # that plan repaired with its copies priced (without it the 60-s ILP found no plan for
            # meshgraphnet tiny cap 0.5 at load 3-9 in eval_policy_s13b), never with a policy's
            fit = fitting_least_usage_plan(p, time_limit_s=2.0) if p.usage_limit is not None else None
            ilp, si = guarded_ilp(p, args.ilp_seconds, [least_usage_plan(p)] + ([] if fit is None else [list(fit)]))
        except (ValueError, RuntimeError) as exc:
            print(f"{name}: ILP failed ({exc}); skipped", flush=True)
            continue
        if ilp is None:
            print(f"{name}: the ILP was stopped and no seed fits; skipped", flush=True)
            continue
        row["ilp_s"] = time.perf_counter() - t
        row["ilp_status"] = si.status
        opt = evaluate(p, ilp).total
        row["ilp_cost"] = opt
        row.update(reference_for(reference, name, p, opt, getattr(si, "bound", None)))
        ref, lb = row["ref_cost"], row["lower_bound"]
        plans = {}

        def record(key, plan, seconds=None):
            if plan is None:
                row[key] = float("nan")
                row[key + "_feasible"] = False
                return
            c = evaluate(p, plan)
            plans[key] = plan
            row[key] = c.total / opt if opt > 0 else float("nan")
            row[key + "_vs_ref"] = c.total / ref if ref > 0 else float("nan")
            if lb is not None and lb > 0:
                row[key + "_vs_lb"] = c.total / lb
            row[key + "_feasible"] = bool(c.feasible)
            if seconds is not None:
                row[key + "_s"] = seconds

        planner = Planner(base.params, base.config, source=base.source)
        for pol in (() if args.skip_policy else (False, True)):
            sfx = "" if pol else "_raw"
            t = time.perf_counter()
            plan, info = planner.plan(p, mode="greedy", polish=pol, seed=args.seed, return_info=True)
            record("policy_greedy" + sfx, plan, time.perf_counter() - t)
            if pol:
                row["cap_binds"] = bool(info["cap_binds"])
            t = time.perf_counter()
            record("policy_best16" + sfx, planner.plan(p, mode="greedy", samples=args.samples, polish=pol, seed=args.seed),
                   time.perf_counter() - t)
        if args.skip_policy:
            free = guarded_ilp(p.with_usage_limit(None), args.ilp_seconds, [])[0]
            # (no uncapped plan in time: counted as binding)
            row["cap_binds"] = p.usage_limit is not None and (free is None or not evaluate(p, free).feasible)
        else:
            t = time.perf_counter()
            record("policy_greedy_norefine", planner.plan(p, mode="greedy", refine_time_limit_s=0.0, seed=args.seed),
                   time.perf_counter() - t)
        if args.finetune_seconds > 0 and not args.skip_policy:
            planner.finetune(p, args.finetune_seconds, seed=args.seed)
            for pol in (False, True):
                sfx = "" if pol else "_raw"
                record("policy_finetuned" + sfx, planner.plan(p, mode="greedy", samples=args.samples, polish=pol,
                                                              seed=args.seed))
        rp = random_policy_plan(p, args.seed)
        record("random_raw", finish(p, rp, False))
        refine_s = REFINE_TIME_LIMIT_S if row["cap_binds"] else 0.0   # what the planner gave its own plan
        record("random", finish(p, rp, True, refine_s))
        g = greedy_by_cost(p)
        record("greedy_cost_raw", finish(p, g, False))
        record("greedy_cost", finish(p, g, True, refine_s))
        for key, search in (("default", True), ("default_raw", False)):   # what solve(method="policy") does today
            t = time.perf_counter()
            record(key, _default_plan(p, search), time.perf_counter() - t)
        for key, prices in (("bp", False), ("bp_lagrangian", True)):   # min-sum BP, no learning
            t = time.perf_counter()
            bp = bp_plan(p, rounds=60, memory_prices=prices)
            record(key + "_raw", bp, time.perf_counter() - t)
            record(key, finish(p, bp, True, refine_s))
        if not args.no_record:   # for later runs: what this one found (never lowers the cache's figures)
            record_ref(name, p, ilp, getattr(si, "bound", None), f"eval_policy ILP {args.ilp_seconds:g}s",
                       note={"status": si.status, "wall_s": row["ilp_s"]})
            if plans.get("default") is not None:
                record_ref(name, p, plans["default"], None, "eval_policy default",
                           note={"wall_s": row.get("default_s")})
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)

    # planning time on a large problem
    big_row = None
    if not args.skip_policy:
        big = random_problem(np.random.default_rng(args.seed), args.big_nodes, 8)
        t = time.perf_counter()
        base.plan(big)
        first_s = time.perf_counter() - t
        t = time.perf_counter()
        big_plan = base.plan(big)
        warm_s = time.perf_counter() - t
        big_row = {"nodes": big.num_nodes, "edges": big.num_edges, "plan_s_first_call": first_s,
                   "plan_s_warm": warm_s, "feasible": evaluate(big, big_plan).feasible}

    methods = ["default", "policy_greedy", "policy_greedy_norefine", "policy_best16", "policy_finetuned", "random",
               "greedy_cost", "bp", "bp_lagrangian"]

    def summarise(subset):
        out = {}
        for m in methods:
            for sfx in ("_raw", "", "_raw_vs_ref", "_vs_ref", "_raw_vs_lb", "_vs_lb"):
                k = m + sfx
                feas = k.replace("_vs_ref", "").replace("_vs_lb", "")
                vals = [r[k] for r in subset if k in r]
                proven = [r[k] for r in subset if k in r and r["ilp_status"] == "optimal"]
                if vals:
                    out[k] = {"median": float(np.nanmedian(vals)), "mean": float(np.nanmean(vals)),
                              "max": float(np.nanmax(vals)),
                              "median_proven": float(np.nanmedian(proven)) if proven else float("nan"),
                              "all_feasible": all(r.get(feas + "_feasible", False) for r in subset if k in r)}
        return out

    summary = summarise(rows)
    capped_rows = [r for r in rows if r.get("cap_binds")]
    summary_capped = summarise(capped_rows)
    table = [{"method": k, **{kk: v for kk, v in s.items()}} for k, s in summary.items()]
    print_table(rows, ["problem", "nodes", "ilp_status", "ilp_s", "default_raw", "default", "default_s",
                       "policy_greedy_raw", "policy_greedy",
                       "policy_best16", "policy_finetuned", "random", "greedy_cost", "bp_raw", "bp_lagrangian_raw",
                       "bp_lagrangian", "policy_greedy_s"],
                title="cost / ILP cost on the held-out split (lower is better; 1 = ILP)")
    print_table(rows, ["problem", "ilp_status", "ref_source", "default_raw_vs_ref", "default_vs_ref", "default_vs_lb",
                       "greedy_cost_vs_ref", "bp_lagrangian_vs_ref"],
                title="cost / best reference (min of this ILP and the cached best-known) and / the best lower bound")
    table = [t for t in table if t["method"].endswith(("_vs_ref", "_vs_lb"))] + \
        [t for t in table if not t["method"].endswith(("_vs_ref", "_vs_lb"))]
    print_table(table, ["method", "median", "median_proven", "mean", "max", "all_feasible"],
                title="summary over held-out problems (median_proven: where the ILP proved its optimum)")
    if capped_rows:
        print_table([{"method": k, **v} for k, v in summary_capped.items()],
                    ["method", "median", "median_proven", "mean", "max", "all_feasible"],
                    title=f"summary over the {len(capped_rows)} problems whose cap binds")
    if big_row is not None:
        print(f"{big_row['nodes']}-node problem: first call {big_row['plan_s_first_call']:.2f}s, "
              f"warm {big_row['plan_s_warm']:.2f}s")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if args.skip_policy:     # a partial run: its own file, the full evaluation's is left alone
        write_results(args.out_name or "eval_policy_baselines", {"rows": rows, "summary": summary, "summary_capped": summary_capped},
                      config=vars(args), seed=args.seed)
        plot(rows, methods, os.path.join(root, "results", (args.out_name or "eval_policy_baselines") + ".png"), None)
        return
    write_results(args.out_name or "eval_policy", {"rows": rows, "summary": summary, "summary_capped": summary_capped,
                                  "big_problem": big_row,
                                  "planner": base.describe()}, config=vars(args), seed=args.seed)
    plot(rows, methods, os.path.join(root, "results", (args.out_name or "eval_policy") + ".png"), big_row)


def guarded_ilp(p, seconds: float, seeds):
    """``solve_ilp`` (time objective, ``seeds`` as initial plans) under the watchdog
    (``solvers.ilp.guard.solve_ilp_guarded``: killed 2 s + 5 % past its limit). HiGHS's presolve can
    ignore the limit: the first s15 run sat 16 min in ``strengthenInequalities`` on fno tiny @
    a100-hetero-2x4 cap 0.5. Stopped, the answer is the cheapest fitting seed with status "killed"
    and no bound (the row's reference then comes from the cache); (None, info) when none fits."""
    from types import SimpleNamespace

    from solvers.ilp.bounds import best_seed
    from solvers.ilp.guard import SolveOverrun, solve_ilp_guarded
    try:
        return solve_ilp_guarded(p, objective="time", time_limit_s=seconds, initial_plans=seeds)
    except SolveOverrun as exc:
        print(f"{p.name}: {exc}", flush=True)
        best = best_seed(p, [list(s) for s in list(exc.incumbents) + list(seeds)], p.usage_limit, None,
                         key=lambda c: c.total)
        return best, SimpleNamespace(status="killed", bound=None)


def _default_plan(p, search: bool):
    """``shardgym.solve(p, method="policy", search=search)``'s strategies (the shipped default planner:
    the factor-graph network; ``search=False`` is its raw decode), None where it raises (no plan fits)."""
    import shardgym as sg
    try:
        return sg.solve(p, method="policy", search=search).strategies
    except Exception as exc:   # noqa: BLE001 - an unmet cap is a row, not a crash
        print(f"default planner (search={search}): {type(exc).__name__}: {exc}", flush=True)
        return None


def bars(ax, rows, present, label_of, title, fontsize: int = 8, ncol: int = 1, ref: str = "ILP"):
    """Grouped bars of cost / ``ref`` cost per problem (log scale), one bar per key in ``present``."""
    x = np.arange(len(rows))
    w = 0.8 / max(len(present), 1)
    for j, m in enumerate(present):
        ax.bar(x + j * w - 0.4 + w / 2, [r.get(m, np.nan) for r in rows], w, label=label_of(m))
    ax.axhline(1.0, color="k", ls="--", lw=1, label=ref)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels([r["problem"] for r in rows], rotation=35, ha="right", fontsize=fontsize)
    ax.set_ylabel(f"plan cost / {ref} cost (log scale)")
    ax.set_title(title)
    ax.legend(fontsize=fontsize, ncol=ncol)


def plot(rows, methods, path, big_row):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [3, 1.3]})
    keys = ["default_raw"] + [m for m in methods if any(m in r for r in rows)]
    present = [k + "_vs_ref" for k in keys if any(k + "_vs_ref" in r for r in rows)]
    bars(ax, rows, present, lambda m: m[:-len("_vs_ref")].replace("_raw", ", raw decode").replace("_", " ")
         + ("" if "_raw" in m else " (+ post-processing)"),
         "Held-out problems vs the best reference (min of this ILP and the cached best-known)", ref="best-known")
    ilp_s = [r["ilp_s"] for r in rows]
    timed = "policy_greedy_s" if any("policy_greedy_s" in r for r in rows) else "default_s"
    pol_s = [r.get(timed, np.nan) for r in rows]
    ax2.scatter(ilp_s, pol_s, label=f"held-out problems ({timed[:-2].replace('_', ' ')})")
    if big_row is not None:
        ax2.scatter([np.nan], [big_row["plan_s_warm"]])
        ax2.axhline(big_row["plan_s_warm"], color="C1", ls=":", label=f"{big_row['nodes']}-node plan (warm)")
    lo = min([v for v in ilp_s + pol_s if v > 0] + [0.01])
    ax2.plot([lo, max(ilp_s + [1])], [lo, max(ilp_s + [1])], "k--", lw=1, label="equal time")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("ILP wall time (s)")
    ax2.set_ylabel("policy planning time (s)")
    ax2.set_title("Planning time")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
