"""shardgym's cost model: tracing, clusters, strategies, costs, Problems and exact solvers."""
from costmodel.graph import Node, OpGraph, Tensor
from costmodel.problem import Cost, Plan, PlanError, Problem, ProblemMeta, evaluate

__all__ = ["Cost", "Node", "OpGraph", "Plan", "PlanError", "Problem", "ProblemMeta", "Tensor", "evaluate"]
