"""The memory objective's fast heuristic: ``PeakShaver(problem).shave(start, cap, deadline)`` lowers
a plan's peak to ``cap`` and then wins back time under ``cap`` (no proof; the exact bisection in
``solvers.ilp.memory`` supplies the bounds). With resharded copies (``Problem.edge_memory``) the
repair prices each move's copy bytes (``solvers.local.CopyMoves``) and best response keeps the
copies within ``cap``. It replaced the copy-aware single-move shaver (solvers/copy_search.py, gone):
``min_peak_memory(p, 30 s)`` on cpu-2x4 (load 11-13) mlp tiny 19,316 -> 18,932 B, unet tiny
3,015,524 -> 1,303,376 B, gpt tiny 1,513,620 -> 1,288,084 B; shaving the uncapped optimum to a
cap 75 % of the way from the least peak to its own: unet tiny fits in 0.3 s (the old shaver: no
plan in 20 s), gpt tiny the same cost in 0.08 s (1.7 s).

Both steps are the shared local-search library's (``solvers.local``): ``repair_memory`` (at the
peak, the live node whose lower-usage strategy adds the least time per byte saved, until the plan
fits) and ``best_response`` under the cap. This module only binds them to a cap and a deadline.
"""
from __future__ import annotations

import time

from costmodel.problem import Problem
from solvers.local import LocalCosts, best_response, repair_memory


class PeakShaver:
    """``shave(start, cap, deadline)``: ``start`` repaired to fit ``cap`` and polished under it,
    or None when the repair finds no fit before ``deadline`` (a ``time.perf_counter()`` value)."""

    def __init__(self, problem: Problem):
        self.p = problem

    def shave(self, start, cap, deadline):
        capped = self.p.with_usage_limit(float(cap))
        lc = LocalCosts(capped)
        s = repair_memory(capped, start, lc=lc, time_limit_s=max(deadline - time.perf_counter(), 0.0))
        if s is None:
            return None
        left = deadline - time.perf_counter()
        if left <= 0:
            return s
        return [int(x) for x in best_response(capped, s, time_limit_s=left, lc=lc)]
