"""Benchmark ``shardgym iopddl FILE TIMEOUT_S`` on a set of contest-format instances, as the contest runs it.

The set: the five shared contest instances (../shared/iopddl, ``--set shared``) and our own
(``--set bench``): the committed files in experiments/iopddl_bench/ plus the large ones that
``python experiments/iopddl_gen.py`` writes to experiments/iopddl_bench/generated/ (deterministic
from seeds; see that script for what each family covers).

Each instance runs in its own subprocess (the venv's ``shardgym`` console script) with TIMEOUT_S
(default 60 s). Per instance: the plan's cost (contest rules: node + edge costs; a plan over the
usage limit, a wrong length or ``[]`` scores 0), feasibility, score = best / cost where best is the
lowest cost any run has found (experiments/iopddl_bench/best_known.json, updated by every run; for
the shared five the contest's best-known cost from ../shared/iopddl/best_known.json, unless a run
beat it), time to the first feasible plan (wall time at the first progress line that reports a
cost), wall time, and the machine's load average (``os.getloadavg()``) before and after: the
machine is shared, and a loaded machine solves less in 60 s.

Resumable: rows are appended to results/bench_iopddl.json (``--out-name``) as they finish; ``--resume`` skips the
instances already in it for the same timeout and tag. Runs one instance at a time. Usage:

    nohup python experiments/bench_iopddl.py --set bench,shared --resume > /tmp/bench.log 2>&1 &
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from costmodel.problem import Problem, evaluate  # noqa: E402
from experiments.common import RESULTS_DIR, git_rev, print_table, write_results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_DIR = os.path.join(HERE, "iopddl_bench")
BEST_PATH = os.path.join(BENCH_DIR, "best_known.json")
SHARED = os.path.join(HERE, "..", "..", "shared", "iopddl")
COST_RE = re.compile(r"[:=]\s*(-?[0-9][0-9.eE+-]*)")


def instances(sets: str) -> list[tuple[str, str]]:
    """(name, path) of every instance in the comma-separated sets ``bench`` and ``shared``."""
    out = []
    for s in sets.split(","):
        if s == "shared":
            for letter in "ABGMS":
                out.append((letter, os.path.join(SHARED, f"asplos-2025-iopddl-{letter}.json.gz")))
        elif s == "bench":
            files = sorted(glob.glob(os.path.join(BENCH_DIR, "*.json.gz")))
            files += sorted(glob.glob(os.path.join(BENCH_DIR, "generated", "*.json.gz")))
            out += [(os.path.basename(f)[:-len(".json.gz")], f) for f in files]
        elif s:
            raise ValueError(f"--set: unknown set {s!r}; use bench and/or shared")
    return out


def load_best() -> dict:
    best = {}
    if os.path.exists(BEST_PATH):
        with open(BEST_PATH) as f:
            best = json.load(f)
    with open(os.path.join(SHARED, "best_known.json")) as f:
        shared = json.load(f)["best_known_cost"]
    for k, v in shared.items():
        best[k] = min(best.get(k, float("inf")), float(v))
    return best


def save_best(best: dict) -> None:
    tmp = BEST_PATH + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(sorted(best.items())), f, indent=1)
    os.replace(tmp, BEST_PATH)


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_one(name: str, path: str, timeout_s: float) -> dict:
    """One ``shardgym iopddl`` subprocess: plan, price, time to the first reported cost."""
    exe = os.path.join(os.path.dirname(sys.executable), "shardgym")
    cmd = ([exe, "iopddl"] if os.path.exists(exe) else [sys.executable, "-m", "shardgym.cli", "iopddl"])
    load_before = _load()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd + [path, f"{timeout_s:g}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    first = [None]
    log: list[str] = []

    def read_err():
        for line in proc.stderr:
            log.append(line.rstrip())
            if first[0] is None and COST_RE.search(line) and "loaded" not in line and "pruned" not in line:
                first[0] = time.perf_counter() - t0

    chunks: list[str] = []

    def read_out():
        chunks.append(proc.stdout.read())

    # each pipe has its own reader thread and nothing else reads it (communicate() beside a thread
    # reading stderr raced it: the solver blocked writing a full pipe until killed by hand)
    threads = [threading.Thread(target=f, daemon=True) for f in (read_err, read_out)]
    for th in threads:
        th.start()
    killed = False
    try:
        proc.wait(timeout=timeout_s + 5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        killed = True
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)   # the solver and the children it reaped
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    for th in threads:
        th.join(timeout=5)
    out = "".join(chunks)
    lines = out.strip().splitlines()
    try:
        plan = json.loads(lines[-1]) if lines and not killed else []
    except json.JSONDecodeError:
        plan = []
    p = Problem.from_iopddl(path)
    cost, feasible = float("inf"), False
    if isinstance(plan, list) and len(plan) == p.num_nodes:
        c = evaluate(p, plan)
        cost, feasible = float(c.total), bool(c.feasible)
    return {"instance": name, "nodes": p.num_nodes, "edges": p.num_edges,
            "max_strategies": int(p.num_strategies.max()), "timeout_s": timeout_s, "wall_s": round(wall, 1),
            "cost": cost, "feasible": feasible, "killed": killed,
            "first_plan_s": None if first[0] is None else round(first[0], 1),
            "load_avg_before": load_before, "load_avg_after": _load(), "cpu_s": round(cpu, 1), "log_tail": log[-6:],
            "log": log if os.environ.get("BENCH_IOPDDL_FULL_LOG") else None}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="bench,shared")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--only", default="", help="comma-separated instance names")
    ap.add_argument("--resume", action="store_true", help="skip instances already in results for this tag")
    ap.add_argument("--tag", default="", help="a label for this run (default: the git revision)")
    ap.add_argument("--out-name", default="bench_iopddl",
                    help="results/<NAME>.json (default bench_iopddl: the README's figures; name a trial run otherwise)")
    a = ap.parse_args(argv)
    results = os.path.join(RESULTS_DIR, f"{a.out_name}.json")
    tag = a.tag or git_rev(short=True)
    only = set(filter(None, a.only.split(",")))
    prev = {}
    if os.path.exists(results):
        with open(results) as f:
            prev = json.load(f)
    rows = [r for r in prev.get("rows", []) if a.resume and r.get("tag") == tag and r["timeout_s"] == a.timeout]
    done = {r["instance"] for r in rows}
    best = load_best()
    for name, path in instances(a.set):
        if (only and name not in only) or name in done:
            continue
        r = run_one(name, path, a.timeout)
        r["tag"] = tag
        if r["feasible"] and r["cost"] < best.get(name, float("inf")):
            r["new_best"] = True
            best[name] = r["cost"]
            save_best(best)
        rows.append(r)
        _score(rows, best)
        print({k: v for k, v in r.items() if k != "log_tail"}, flush=True)
        write_results(a.out_name, {"tag": tag, "rows": rows, "summary": _summary(rows)},
                      config=vars(a))
    _score(rows, best)
    print_table([{k: r[k] for k in ("instance", "nodes", "max_strategies", "cost", "score", "feasible",
                                    "first_plan_s", "wall_s", "load_avg_before")} for r in rows],
                title=f"shardgym iopddl at {a.timeout:g} s (tag {tag})")
    summary = _summary(rows)
    print(json.dumps(summary))
    write_results(a.out_name, {"tag": tag, "rows": rows, "summary": summary}, config=vars(a))


def _score(rows: list[dict], best: dict) -> None:
    """score = best cost any run found / this run's cost (0 when infeasible), recomputed for all rows."""
    for r in rows:
        b = min(best.get(r["instance"], float("inf")), r["cost"] if r["feasible"] else float("inf"))
        r["best"] = b
        r["score"] = round(b / r["cost"], 4) if r["feasible"] and r["cost"] > 0 else (1.0 if r["feasible"] else 0.0)


def _summary(rows: list[dict]) -> dict:
    out = {}
    for label, sel in (("shared", [r for r in rows if r["instance"] in tuple("ABGMS")]),
                       ("bench", [r for r in rows if r["instance"] not in tuple("ABGMS")])):
        if sel:
            sc = [r["score"] for r in sel]
            out[label] = {"n": len(sel), "mean_score": round(sum(sc) / len(sc), 4), "min_score": min(sc),
                          "feasible": sum(r["feasible"] for r in sel)}
    return out


if __name__ == "__main__":
    main()
