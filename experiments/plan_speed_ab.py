"""Raw-decode planning speed of two source trees, interleaved: a base git revision against the working tree.

    python experiments/plan_speed_ab.py --base 88d2c4b --reps 3 --out-name s19c_speed_ab

What it times is experiments/eval_fgnn.py's speed row for the shipped checkpoint: ``FGPlanner.plan(p,
polish=False)`` (``shardgym.solve(method="policy", search=False)``) on ``env.workloads.random_problem``
of ``--sizes`` nodes (seed ``--seed``), uncapped and at each of ``--caps``, the warm call (one call
first compiles any shape). The base revision is exported (``git archive``) into a temporary folder;
each repetition runs one worker process per tree, base then head, so both see the same load (the
machine is shared: timings are noisy, compare the ratios of the same repetition). Each worker also
records the plan's hash and cost, so the run shows whether the head plans exactly as the base.
Writes results/NAME.json: per repetition and tree the rows, /proc/loadavg before and after, the
base and head revisions, and per problem the median seconds of each tree and their ratio.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args) -> None:
    """One tree's rows (run inside that tree: its modules come first on sys.path)."""
    sys.path.insert(0, os.getcwd())
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np

    from agent.planner import Planner
    from costmodel.problem import evaluate
    from env.workloads import random_problem
    fg = Planner.load("fgnn")
    rows = []
    for n in [int(v) for v in args.sizes.split(",")]:
        for cap in [None if c == "none" else float(c) for c in args.caps.split(",")]:
            p = random_problem(np.random.default_rng(args.seed), n, 8, memory_cap_fraction=cap)
            t = time.perf_counter()
            fg.plan(p, polish=False)
            first = time.perf_counter() - t
            t = time.perf_counter()
            x = fg.plan(p, polish=False)
            dt = time.perf_counter() - t
            c = evaluate(p, x)
            rows.append({"nodes": n, "cap_fraction": cap, "plan_s": dt, "plan_s_first_call": first,
                         "plan_sha1": hashlib.sha1(np.asarray(x, np.int64).tobytes()).hexdigest(),
                         "total": float(c.total), "feasible": bool(c.feasible), "loadavg_1m": os.getloadavg()[0]})
    with open(args.worker_json, "w") as f:
        json.dump(rows, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the git revision to compare the working tree with")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--caps", default="none,0.3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-name", default="plan_speed_ab")
    ap.add_argument("--worker-json", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_json:
        return worker(args)
    import numpy as np
    rev = lambda r: subprocess.run(["git", "rev-parse", r], cwd=ROOT, capture_output=True, text=True,  # noqa: E731
                                   check=True).stdout.strip()
    base_rev, head_rev = rev(args.base), rev("HEAD")
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = os.path.join(tmp, "base")
        os.makedirs(base_dir)
        tar = subprocess.run(["git", "archive", base_rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", base_dir], input=tar, check=True)
        for rep in range(args.reps):
            for tree, cwd in (("base", base_dir), ("head", ROOT)):
                out = os.path.join(tmp, f"{tree}{rep}.json")
                load0 = open("/proc/loadavg").read().strip()
                subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "plan_speed_ab.py"),
                                "--sizes", args.sizes, "--caps", args.caps, "--seed", str(args.seed),
                                "--worker-json", out], cwd=cwd, check=True,
                               env={**os.environ, "PYTHONPATH": cwd})
                with open(out) as f:
                    rows = json.load(f)
                runs.append({"rep": rep, "tree": tree, "loadavg_before": load0,
                             "loadavg_after": open("/proc/loadavg").read().strip(), "rows": rows})
                for r in rows:
                    print(rep, tree, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                                      if k != "plan_sha1"}, flush=True)
    summary = []
    keys = sorted({(r["nodes"], -1.0 if r["cap_fraction"] is None else r["cap_fraction"]) for u in runs for r in u["rows"]})
    for n, cap in keys:
        def pick(tree, field, n=n, cap=cap):
            return [r[field] for u in runs if u["tree"] == tree for r in u["rows"]
                    if r["nodes"] == n and (r["cap_fraction"] if r["cap_fraction"] is not None else -1.0) == cap]
        b, h = pick("base", "plan_s"), pick("head", "plan_s")
        pairs = [hh / bb for bb, hh in zip(b, h)]
        summary.append({"nodes": n, "cap_fraction": None if cap < 0 else cap, "base_median_s": float(np.median(b)),
                        "head_median_s": float(np.median(h)), "ratio_median": float(np.median(pairs)),
                        "ratio_per_rep": pairs,
                        "same_plan": len(set(pick("base", "plan_sha1") + pick("head", "plan_sha1"))) == 1,
                        "base_total": pick("base", "total")[0], "head_total": pick("head", "total")[0]})
        print(summary[-1], flush=True)
    sys.path.insert(0, ROOT)
    from experiments.common import write_results
    print("wrote", write_results(args.out_name, {"base_rev": base_rev, "head_rev": head_rev, "head_dirty": dirty,
                                                 "summary": summary, "runs": runs}, config=vars(args), seed=args.seed))


if __name__ == "__main__":
    main()
