"""shardgym's solvers: everything that turns a Problem into a plan without learning.

The ILP (``solvers.ilp``, HiGHS), the capped core (``solvers.capped``: Lagrangian + cost-function
network in ``solvers.cfn``), min-sum belief propagation (``solvers.bp``), reductions
(``solvers.reduce``), local search (``solvers.search``), the hand-written baselines
(``solvers.baselines``) and the body of ``shardgym iopddl`` (``solvers.iopddl_cli``). They import
costmodel only.
"""
