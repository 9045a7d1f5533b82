"""The body of ``shardgym iopddl FILE TIMEOUT_S``: solve one IOPDDL contest instance in time.

Prints progress lines to stderr and, as the LAST line of ``out``, the plan as ``[i, j, ...]`` (or
``[]`` when no feasible plan was found). A deadline is fixed at entry: 95 % of the timeout minus
1 s, leaving room to print before the contest kills the process.

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
