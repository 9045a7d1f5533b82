"""The cost model's view of a plan, beside XLA's: the Problem a plan file means, and what it predicts.

A plan file carries its cluster (``meta.cluster_spec``: the full description, so a plan made with
``--cluster-file`` runs anywhere; ``cluster_meta`` writes it) and its memory cap
(``meta.memory_cap_bytes``). ``plan_problem`` rebuilds the Problem from exactly those: the
cluster ``plan_cluster`` reads and the limits ``costmodel.limits.Limits`` applies (effective cap
= min(device memory, the plan's cap)), never a preset looked up by name. ``predict`` prices the
plan on it: peak memory, communication bytes, step time, per-kind collectives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.builder import build_problem, strategies_of
from costmodel.cluster import Cluster
from costmodel.cost import COLLECTIVES, Mesh, lowered_kind, node_collective
from costmodel.graph import OpGraph
from costmodel.limits import Limits
from costmodel.problem import Plan, Problem, evaluate


def cluster_meta(cluster: Cluster, memory_cap_bytes=None) -> dict:
    """The ``plan.meta`` entries ``plan_cluster`` and ``plan_problem`` read back: the cluster's
    name and full description, and the user's memory cap (None: device memory)."""
    return {"cluster": cluster.name, "cluster_spec": cluster.to_dict(), "memory_cap_bytes": memory_cap_bytes}


def plan_cluster(plan: Plan, where: str = "plan") -> Cluster:
    """The Cluster a plan was made for: ``meta.cluster_spec`` if stored, else the preset
    ``meta.cluster``; ValueError naming the field otherwise."""
    meta = plan.meta or {}
    spec = meta.get("cluster_spec")
    if spec is not None:
        c = Cluster.from_dict(dict(spec), source=f"{where}: meta.cluster_spec")
        if meta.get("cluster") not in (None, c.name):
            raise ValueError(f"{where}: meta.cluster {meta['cluster']!r} disagrees with meta.cluster_spec "
                             f"(named {c.name!r}); remake the plan with `shardgym plan`")
        return c
    name = meta.get("cluster")
    if not name:
        raise ValueError(f"{where}: the plan does not say which cluster it was made for (meta.cluster)")
    if name not in Cluster.presets():
        raise ValueError(f"{where}: meta.cluster {name!r} is not a preset ({', '.join(Cluster.presets())}) and the "
                         "plan carries no meta.cluster_spec; remake it with `shardgym plan`")
    return Cluster.preset(name)


def plan_problem(graph: OpGraph, plan: Plan, where: str = "plan") -> Problem:
    """The Problem ``plan`` was made for: ``graph`` built on the plan's own cluster
    (``plan_cluster``) under the plan's limits (``Limits.of(meta.memory_cap_bytes).apply``)."""
    problem = build_problem(graph, plan_cluster(plan, where))
    return Limits.of((plan.meta or {}).get("memory_cap_bytes")).apply(problem)


@dataclass(frozen=True)
class Prediction:
    """The cost model's figures for one plan (per device; None where no Problem could be built).
    ``cap_bytes``: the effective memory cap of the Problem priced (its usage_limit); ``cluster``:
    the name of the cluster it was built on."""

    memory_bytes: float | None
    comm_bytes: float | None
    step_time_s: float | None
    cap_bytes: float | None
    cluster: str
    collectives: tuple
    notes: tuple


def _none(note: str) -> Prediction:
    return Prediction(None, None, None, None, "", (), (note,))


def predict(graph: OpGraph | None, plan: Plan, problem: Problem | None = None) -> Prediction:
    """``plan`` priced by the cost model on ``problem``, or on ``plan_problem(graph, plan)`` (the
    plan file's cluster and cap) when none is given."""
    notes: list[str] = []
    cluster_name = (problem.meta.cluster_name if problem is not None and problem.meta is not None
                    else (plan.meta or {}).get("cluster"))
    if problem is None:
        if graph is None or not cluster_name:
            return _none("no Problem given and none buildable (needs graph and plan.meta['cluster'])")
        try:
            problem = plan_problem(graph, plan)
        except ValueError as exc:
            return _none(f"cost model unavailable: {type(exc).__name__}: {exc}")
    if len(plan.strategies) != problem.num_nodes:
        return _none(f"plan has {len(plan.strategies)} strategies, problem {problem.num_nodes} nodes: no prediction")
    cost = evaluate(problem, plan)
    kinds = []
    if graph is not None and cluster_name:
        try:
            kinds = predicted_collectives(graph, problem, plan, plan_cluster(plan) if plan.meta else cluster_name)
        except (ValueError, KeyError) as exc:
            notes.append(f"no per-kind prediction ({type(exc).__name__}: {exc}); total comm bytes only")
    return Prediction(float(cost.peak_memory_bytes), float(cost.comm_bytes), float(cost.step_time_s),
                      problem.usage_limit, cluster_name or "", tuple(kinds), tuple(notes))


def predicted_collectives(graph: OpGraph, problem: Problem, plan: Plan, cluster) -> list[dict]:
    """The cost model's collectives for ``plan``, per kind: {kind, count, wire_bytes} where
    wire_bytes = bytes sent per device (``costmodel.cost.collective``, the same ring formulas as
    hlo.py's wire_bytes). Node collectives come per kind from the chosen strategies
    (``costmodel.builder.strategies_of``); the resharding on edges is one row of kind
    ``"resharding"`` (the cost model prices it as all-gathers and all-to-alls without exposing the
    split), count = edges that move bytes."""
    cluster = cluster if isinstance(cluster, Cluster) else Cluster.preset(cluster)
    strats = strategies_of(graph, cluster, space=getattr(problem.meta, "space", None))
    k = problem.num_strategies
    if len(strats) != problem.num_nodes or any(len(st) != int(n) for st, n in zip(strats, k)):
        raise ValueError("strategies_of disagrees with the Problem's strategy counts")
    mesh = Mesh(cluster)
    s = np.asarray(plan.strategies, dtype=int)
    acc: dict[str, dict] = {}
    for i, si in enumerate(s):
        for kind, axes, B in strats[i][si].collectives:
            _, sent, _ = node_collective(kind, axes, B, mesh)
            kind = lowered_kind(kind, mesh)  # as the backend runs it (CPU: no reduce-scatter)
            d = acc.setdefault(kind, {"kind": kind, "count": 0, "wire_bytes": 0.0})
            d["count"] += 1
            d["wire_bytes"] += sent
    rows = [acc[kd] for kd in COLLECTIVES if kd in acc]
    if problem.num_edges:
        u, v = problem.edges[:, 0], problem.edges[:, 1]
        eidx = problem.edge_offsets[:-1] + s[u] * k[v] + s[v]
        eb = problem.edge_comm_bytes[eidx]
        if eb.sum() > 0:
            rows.append({"kind": "resharding", "count": int((eb > 0).sum()), "wire_bytes": float(eb.sum())})
    return rows
