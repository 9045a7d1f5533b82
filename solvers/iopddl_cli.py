"""The body of ``shardgym iopddl FILE TIMEOUT_S``: solve one IOPDDL contest instance in time.

Prints progress lines to stderr and, as the LAST line of ``out``, the plan as ``[i, j, ...]`` (or
``[]`` when no feasible plan was found). A deadline is fixed at entry: 95 % of the timeout minus a
margin of min(1 s, 25 % of it), leaving room to print before the contest kills the process; so a
timeout of 1 s and less is kept too (0.5 s: the search stops at 0.35 s).

Bad input is a ValueError naming the file and the field (``Problem.from_iopddl``), and so is a
usage limit that no plan fits (the lowest-usage strategy of every node already exceeds it); ``[]``
is still printed as the last line.

Solving is ``solvers.capped.solve_capped`` (anchor, BP with memory prices, on larger graphs whose
tied graph is small the exact MILP of the tied graph (``solvers.tied_milp``; IOPDDL A: proven
optimal), toulbar2 with adaptive memory prices (``solvers.cfn``), the large-instance search, on MILP-sized graphs the
exact MILP warm-started from the best plan and MILP neighbourhoods), run in a forked child that streams each new best plan back; the parent prints the
best one it holds at the deadline and kills the child, so no native call can overrun it.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from costmodel.problem import Problem, usage_profile
from solvers.capped import solve_guarded


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


def main_iopddl(path: str, time_limit_s: float, out=None, started_s_ago: float = 0.0) -> list[int]:
    """Solve the instance at ``path`` within ``time_limit_s`` seconds (the command's TIMEOUT_S),
    counted from ``started_s_ago`` seconds before the call (the CLI passes the process's age);
    print and return the plan."""
    t0 = time.perf_counter() - float(started_s_ago)
    out = sys.stdout if out is None else out
    time_limit_s = float(time_limit_s)
    if not time_limit_s > 0:
        raise ValueError(f"TIMEOUT_S must be a positive number of seconds, got {time_limit_s}")
    deadline = t0 + 0.95 * time_limit_s - min(1.0, 0.25 * time_limit_s)
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
    if problem.usage_limit is None or problem.num_nodes == 0:
        return
    least = np.minimum.reduceat(problem.node_usages, problem.strategy_offsets[:-1])
    times, live = usage_profile(problem, least)
    k = int(np.argmax(live))
    if live[k] > problem.usage_limit:
        raise ValueError(f"{path}: usage_limit {problem.usage_limit:g} fits no plan: the lowest-usage strategies "
                         f"already need {live[k]:g} at time {int(times[k])}")


def _solve(problem: Problem, deadline: float, t0: float) -> list[int]:
    """The capped-solving core under its watchdog (``solvers.capped.solve_guarded``: a forked
    child streams each new best plan and is killed at the deadline, so no native call overruns)."""
    r = solve_guarded(problem, deadline - time.perf_counter(), progress=_say)
    _say(f"{r.status}: cost={r.cost:.10g} bound={r.bound:.10g} ({time.perf_counter() - t0:.1f}s)")
    return r.plan or []


if __name__ == "__main__":  # pragma: no cover - convenience: python -m solvers.iopddl_cli FILE T
    main_iopddl(sys.argv[1], float(sys.argv[2]))
