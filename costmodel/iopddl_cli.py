"""The body of ``shardgym iopddl FILE TIMEOUT_S``: solve one IOPDDL contest instance in time.

Prints progress lines to stderr and, as the LAST line of ``out``, the plan as ``[i, j, ...]`` (or
``[]`` when no feasible plan was found). A deadline is fixed at entry: 95 % of the timeout minus
1 s, leaving room to print before the contest kills the process.

Solving is ``costmodel.capped.solve_capped`` (anchor, BP with memory prices, the large-instance
search, on MILP-sized graphs the exact MILP warm-started from the best plan and MILP
neighbourhoods), run in a forked child that streams each new best plan back; the parent prints the
best one it holds at the deadline and kills the child, so no native call can overrun it.
"""
from __future__ import annotations

import json
import os
import sys
import time

from costmodel.problem import Problem, evaluate



def _say(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def main_iopddl(path: str, timeout_s: float, out=None) -> list[int]:
    """Solve the instance at ``path`` within ``timeout_s`` seconds; print and return the plan."""
    t0 = time.perf_counter()
    out = sys.stdout if out is None else out
    timeout_s = float(timeout_s)
    if not timeout_s > 0:
        raise ValueError(f"TIMEOUT_S must be a positive number of seconds, got {timeout_s}")
    deadline = t0 + 0.95 * timeout_s - 1.0
    best: list[int] = []
    try:
        problem = Problem.from_iopddl(path)
        _say(f"{problem!r} loaded in {time.perf_counter() - t0:.1f}s")
        best = _solve(problem, deadline, t0)
    finally:
        print(json.dumps([int(x) for x in best]), file=out, flush=True)
    return best


def _solve(problem: Problem, deadline: float, t0: float) -> list[int]:
    """The capped-solving core under its watchdog (``costmodel.capped.solve_guarded``: a forked
    child streams each new best plan and is killed at the deadline, so no native call overruns)."""
    from costmodel.capped import solve_guarded
    r = solve_guarded(problem, deadline - time.perf_counter(), progress=_say)
    _say(f"{r.status}: cost={r.cost:.10g} bound={r.bound:.10g} ({time.perf_counter() - t0:.1f}s)")
    return r.plan or []


if __name__ == "__main__":  # pragma: no cover - convenience: python -m costmodel.iopddl_cli FILE T
    main_iopddl(sys.argv[1], float(sys.argv[2]))
