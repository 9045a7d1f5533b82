"""The body of ``shardgym iopddl FILE TIMEOUT_S``: solve one IOPDDL contest instance in time.

Prints progress lines to stderr and, as the LAST line of ``out``, the plan as ``[i, j, ...]`` (or
``[]`` when no feasible plan was found). A deadline is fixed at entry: 95 % of the timeout minus a
margin of min(1 s, 25 % of it), leaving room to print before the contest kills the process; so a
timeout of 1 s and less is kept too (0.5 s: the search stops at 0.35 s).

Bad input is a ValueError naming the file and the field (``Problem.from_iopddl``), and so is a
usage limit that no plan fits (the lowest-usage strategy of every node already exceeds it); ``[]``
is still printed as the last line.

Small instances (up to ``SMALL_EDGE_ENTRIES`` edge-cost entries after loading) get a quick
heuristic plan, then the exact MILP (``costmodel.ilp.solve_ilp``, warm-started from that plan)
with the rest of the budget; the answer is the proven optimum when HiGHS finishes. Large ones go
through ``costmodel.search.solve_large``.
"""
from __future__ import annotations

import json
import os
import sys
import time

from costmodel.problem import Problem, evaluate

SMALL_EDGE_ENTRIES = 1_000_000
SMALL_NODES = 5_000


def _say(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere): the contest's clock starts
    at launch, so interpreter start-up and imports count against the timeout."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def main_iopddl(path: str, timeout_s: float, out=None, started_s_ago: float = 0.0) -> list[int]:
    """Solve the instance at ``path`` within ``timeout_s`` seconds, counted from ``started_s_ago``
    seconds before the call (the CLI passes the process's age); print and return the plan."""
    t0 = time.perf_counter() - float(started_s_ago)
    out = sys.stdout if out is None else out
    timeout_s = float(timeout_s)
    if not timeout_s > 0:
        raise ValueError(f"TIMEOUT_S must be a positive number of seconds, got {timeout_s}")
    deadline = t0 + 0.95 * timeout_s - min(1.0, 0.25 * timeout_s)
    best: list[int] = []
    try:
        problem = Problem.from_iopddl(path)
        _say(f"{problem!r} loaded in {time.perf_counter() - t0:.1f}s")
        check_fits(problem, path)
        best = _solve(problem, deadline, t0)
    finally:
        print(json.dumps([int(x) for x in best]), file=out, flush=True)
    return best


def check_fits(problem: Problem, path: str = "problem") -> None:
    """ValueError when even the lowest-usage strategy of every node breaks the usage limit."""
    import numpy as np

    from costmodel.problem import usage_profile
    if problem.usage_limit is None or problem.num_nodes == 0:
        return
    least = np.minimum.reduceat(problem.node_usages, problem.strategy_offsets[:-1])
    times, live = usage_profile(problem, least)
    k = int(np.argmax(live))
    if live[k] > problem.usage_limit:
        raise ValueError(f"{path}: usage_limit {problem.usage_limit:g} fits no plan: the lowest-usage strategies "
                         f"already need {live[k]:g} at time {int(times[k])}")


def _solve(problem: Problem, deadline: float, t0: float) -> list[int]:
    from costmodel.search import solve_large
    left = deadline - time.perf_counter()
    small = len(problem.edge_costs) <= SMALL_EDGE_ENTRIES and problem.num_nodes <= SMALL_NODES
    if not small or left < 3.0:
        plan = solve_large(problem, max(left, 0.1), progress=_say)
        return plan or []
    # quick heuristic first: a fallback and a MIP start
    plan = solve_large(problem, min(0.15 * left, 10.0), progress=_say, use_lns=False)
    if plan is None:
        _say("no plan fits the usage limit")
        return []
    best, best_cost = plan, evaluate(problem, plan).total
    _say(f"heuristic: {best_cost:.10g} at {time.perf_counter() - t0:.1f}s")
    left = deadline - time.perf_counter()
    if left > 2.0:
        from costmodel.ilp import solve_ilp
        try:
            ilp_plan, info = solve_ilp(problem, time_limit_s=left - 1.0, initial_plan=best, relax_cap=False,
                                       threads=min(os.cpu_count() or 2, 8))
            c = evaluate(problem, ilp_plan)
            _say(f"milp: {c.total:.10g} status={info.status} bound={info.bound:.10g} "
                 f"at {time.perf_counter() - t0:.1f}s")
            if c.feasible and c.total <= best_cost:
                best, best_cost = ilp_plan, c.total
        except (RuntimeError, ValueError) as exc:   # no MILP plan in time: keep the heuristic one
            _say(f"milp gave no plan: {exc}")
    return best


if __name__ == "__main__":  # pragma: no cover - convenience: python -m costmodel.iopddl_cli FILE T
    main_iopddl(sys.argv[1], float(sys.argv[2]))
