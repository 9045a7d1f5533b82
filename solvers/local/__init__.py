"""The local-search library: one implementation each of the pieces every heuristic solver uses.

=========================  ==========================================  =========================
piece                      implementation                              module
=========================  ==========================================  =========================
local costs, adjacency     ``LocalCosts``, ``incidence``               solvers/local/costs.py
best response (ICM)        ``best_response``                           solvers/local/moves.py
pair / forest moves        ``pair_moves``, ``forest_dp``               solvers/local/moves.py
memory repair              ``repair_memory`` (``repair_tied``)         solvers/local/repair.py
copy bytes of a move       ``CopyMoves``                               solvers/local/copies.py
greedy construction        ``greedy_by_cost``                          solvers/local/greedy.py
decision order             ``decision_order``                          solvers/local/greedy.py
least-usage plan           ``least_usage_plan``                        solvers/local/greedy.py
... that fits (copies)     ``fitting_least_usage_plan``                solvers/local/repair.py
polish                     ``polish``                                  solvers/local/polish.py
LNS refine, improve        ``refine``, ``improve``, ``lns``            solvers/local/lns.py
capped search (budgeted)   ``capped_search``, ``CappedBudget``         solvers/local/budgeted.py
... one neighbourhood      ``subproblem``                              solvers/local/subproblem.py
heuristic plan             ``heuristic_plan``                          solvers/local/heuristic.py
exact reductions           ``Pruning``, ``Contraction``, ``prepare``   solvers/local/prune.py
=========================  ==========================================  =========================

The live-memory profile itself is ``costmodel.profile`` (the lowest layer). ``refine``, ``improve``,
``lns``, ``REFINE_TIME_LIMIT_S``, ``LNS_MAX_NODES`` (which import ``solvers.ilp``) and
``heuristic_plan`` (which imports ``solvers.baselines``) are exported lazily, so that the ILP and
the baselines can use the rest of the library without an import cycle.
"""
from __future__ import annotations

from solvers.local.copies import CopyMoves
from solvers.local.costs import LocalCosts, incidence
from solvers.local.greedy import decision_order, greedy_by_cost, least_measure_plan, least_usage_plan
from solvers.local.moves import best_response, forest_dp, pair_moves
from solvers.local.polish import polish
from solvers.local.prune import Contraction, Pruning, prepare, prune, range_max
from solvers.local.repair import fit_with_copies, fitting_least_usage_plan, repair_memory, repair_tied

_LAZY = {"refine": "lns", "improve": "lns", "lns": "lns", "REFINE_TIME_LIMIT_S": "lns", "LNS_MAX_NODES": "lns",
         "heuristic_plan": "heuristic"}

__all__ = ["Contraction", "CopyMoves", "LocalCosts", "Pruning", "best_response", "decision_order", "forest_dp", "greedy_by_cost",
           "incidence", "least_measure_plan", "least_usage_plan", "fitting_least_usage_plan", "pair_moves", "polish", "prepare", "prune", "range_max",
           "repair_memory", "repair_tied", "fit_with_copies", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"solvers.local.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'solvers.local' has no attribute {name!r}")
