"""Exact planning: the strategy problem as a mixed-integer program solved by HiGHS.

``solve_ilp(problem, objective="time" | "memory" | "redundancy", memory_cap_bytes=None,
max_step_time_s=None, time_limit_s=60, ...) -> (strategies, SolveInfo)``; ``min_peak_memory``;
``InfeasibleError`` when no plan meets the cap or the bound. The package, by job:

- ``types``: IlpConfig (the solver's tuning, frozen), RunOptions and Request (one solve), Weights,
  SolveInfo, InfeasibleError;
- ``blocks``, ``copy_rows`` and ``model``: model building (edge blocks, memory rows or running
  sums, the z columns of the resharded copies, the time and redundancy rows; plan <-> column vector);
- ``highs``: HiGHS control (options, time limit, the LP tried first, the cutoff callback, status
  and dual bound);
- ``bounds``: exact bounds and tightening without a solver (least-usage plans, peak bounds, seeds);
- ``reduced``: the reduced-problem driver (tighten, reduce, build, solve, expand -> SolveInfo);
- ``objectives`` (time, redundancy, weighted: the entry ``solve_ilp``), ``memory`` (min peak,
  then time) and ``infeasible`` (the errors that say what fails);
- ``peak_shaver``: the memory objective's fast heuristic;
- ``guard``: ``solve_ilp_guarded``, ``solve_ilp`` in a forked child killed past its time limit.
"""
from solvers.ilp.guard import solve_ilp_guarded
from solvers.ilp.highs import new_highs
from solvers.ilp.objectives import min_peak_memory, solve_ilp
from solvers.ilp.types import OBJECTIVES, IlpConfig, InfeasibleError, SolveInfo

__all__ = ["OBJECTIVES", "IlpConfig", "InfeasibleError", "SolveInfo", "min_peak_memory", "new_highs",
           "solve_ilp", "solve_ilp_guarded"]
