"""Plan: a solver's answer (one strategy index per Problem node), its PartitionSpecs, and its JSON
file; ``as_strategy_array`` validates a plan against its Problem (``PlanError``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class PlanError(ValueError):
    """A plan that does not fit its problem (wrong length, strategy index out of range)."""


def as_strategy_array(problem, plan) -> np.ndarray:
    """Validate a Plan or a sequence of strategy indices against ``problem``."""
    s = plan.strategies if isinstance(plan, Plan) else plan
    s = np.asarray(s, dtype=np.int64).reshape(-1)
    if len(s) != problem.num_nodes:
        raise PlanError(f"plan has {len(s)} strategies but problem {problem.name!r} has {problem.num_nodes} nodes")
    k = problem.num_strategies
    bad = np.nonzero((s < 0) | (s >= k))[0]
    if len(bad):
        i = int(bad[0])
        raise PlanError(f"plan picks strategy {int(s[i])} for node {i}, which has {int(k[i])} strategies")
    return s



def _spec_to_json(spec):
    return None if spec is None else [list(a) if isinstance(a, (tuple, list)) else a for a in spec]


def _spec_from_json(spec):
    return None if spec is None else tuple(tuple(a) if isinstance(a, list) else a for a in spec)


@dataclass
class Plan:
    """A solver's answer: one strategy index per Problem node, plus what it takes to run it.

    ``info``: the solver's report (status, objective, bound, gap, wall_s, ...).
    ``mesh_shape``/``axis_names``: the mesh the plan was made for (empty for IOPDDL).
    ``input_specs``: [(flat input index, keypath, spec)] for every program input leaf.
    ``node_specs``: [(graph node id, spec of output 0)] for every planned operator.
    ``meta``: free-form provenance (model, size, cluster, ...) used by ``shardgym run``.
    """

    strategies: list[int]
    method: str = ""
    objective: str = ""
    problem_name: str = ""
    solve_time_s: float = 0.0
    info: dict = field(default_factory=dict)
    mesh_shape: tuple[int, ...] = ()
    axis_names: tuple[str, ...] = ()
    input_specs: list = field(default_factory=list)
    node_specs: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @classmethod
    def for_problem(cls, problem, strategies, **kw) -> Plan:
        """Make a plan and, for a traced problem, fill in its PartitionSpecs from the meta."""
        s = as_strategy_array(problem, strategies)
        plan = cls(strategies=[int(x) for x in s], problem_name=problem.name, **kw)
        m = problem.meta
        if m is not None:
            plan.mesh_shape = tuple(m.mesh_shape)
            plan.axis_names = tuple(m.axis_names)
            plan.meta.setdefault("cluster", m.cluster_name)
            for i, si in enumerate(s):
                spec = m.out_specs[i][int(si)]
                idx = m.input_index[i] if m.input_index else None
                if idx is not None:
                    plan.input_specs.append((int(idx), m.input_path[i], spec))
                else:
                    plan.node_specs.append((int(m.graph_node[i]), spec))
        return plan

    # ---- PartitionSpecs ----------------------------------------------------------------
    def input_partition_specs(self) -> dict[int, Any]:
        from jax.sharding import PartitionSpec as P
        return {i: P(*spec) if spec is not None else P() for i, _, spec in self.input_specs}

    def arg_specs(self, args) -> Any:
        """PartitionSpec pytree matching ``args`` (params, opt_state, batch) of the traced fn."""
        import jax
        from jax.sharding import PartitionSpec as P
        leaves, treedef = jax.tree.flatten(args)
        by_index = self.input_partition_specs()
        return jax.tree.unflatten(treedef, [by_index.get(i, P()) for i in range(len(leaves))])

    def make_mesh(self, devices=None):
        """The plan's ``jax.sharding.Mesh`` over the first prod(mesh_shape) devices, with **Auto**
        axes: the plan's specs are hints XLA propagates. (``jax.make_mesh`` defaults to Explicit
        axes, where a sharded contraction without ``out_sharding`` is a ShardingTypeError.)"""
        import math

        import jax
        n = math.prod(self.mesh_shape) if self.mesh_shape else 0
        devs = list(jax.devices() if devices is None else devices)
        if not n or len(devs) < n:
            raise ValueError(f"plan needs {n} devices for mesh {dict(zip(self.axis_names, self.mesh_shape))}, "
                             f"{len(devs)} available")
        return jax.make_mesh(tuple(self.mesh_shape), tuple(self.axis_names),
                             axis_types=(jax.sharding.AxisType.Auto,) * len(self.mesh_shape), devices=devs[:n])

    def shardings(self, args, mesh=None):
        """NamedSharding pytree matching ``args`` for ``jax.jit(fn, in_shardings=...)`` or
        ``jax.device_put``. ``mesh``: default ``make_mesh()``; a mesh with Explicit axes (a default
        ``jax.make_mesh``) is used over the same devices with Auto axes."""
        import jax
        from jax.sharding import Mesh, NamedSharding
        if mesh is None:
            mesh = self.make_mesh()
        elif any(t != jax.sharding.AxisType.Auto for t in getattr(mesh, "axis_types", ())):
            mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names))
        if tuple(mesh.axis_names) != tuple(self.axis_names) or tuple(mesh.devices.shape) != tuple(self.mesh_shape):
            raise ValueError(f"mesh {dict(zip(mesh.axis_names, mesh.devices.shape))} is not the plan's mesh "
                             f"{dict(zip(self.axis_names, self.mesh_shape))}")
        return jax.tree.map(lambda s: NamedSharding(mesh, s), self.arg_specs(args))

    def param_entries(self) -> list[tuple[list[str], tuple | None]]:
        """(dict keys below args[0], spec) for every parameter input (path starting with ``[0]``),
        in input order; ``"[0]['Dense_0']['kernel']"`` gives ``['Dense_0', 'kernel']``."""
        import re
        out = []
        for _, path, spec in self.input_specs:
            if path and path.startswith("[0]"):
                keys = [a or b for a, b in re.findall(r"\[['\"]?([^'\"\]]+)['\"]?\]|\.(\w+)", path[3:])]
                out.append((keys, spec))
        return out

    def param_specs(self) -> dict:
        """PartitionSpec pytree for the parameters (the inputs whose path starts with ``[0]``),
        as nested dicts keyed like the Flax params."""
        from jax.sharding import PartitionSpec as P
        tree: dict = {}
        for keys, spec in self.param_entries():
            if not keys:
                continue
            d = tree
            for k in keys[:-1]:
                d = d.setdefault(k, {})
            d[keys[-1]] = P(*spec) if spec is not None else P()
        return tree

    # ---- JSON ---------------------------------------------------------------------------
    def to_json(self, path: str) -> None:
        doc = {
            "format": "shardgym.Plan/1",
            "strategies": [int(x) for x in self.strategies],
            "method": self.method,
            "objective": self.objective,
            "problem_name": self.problem_name,
            "solve_time_s": self.solve_time_s,
            "info": self.info,
            "mesh_shape": list(self.mesh_shape),
            "axis_names": list(self.axis_names),
            "input_specs": [[i, p, _spec_to_json(s)] for i, p, s in self.input_specs],
            "node_specs": [[i, _spec_to_json(s)] for i, s in self.node_specs],
            "meta": self.meta,
        }
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1, default=float)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):   # a failed write (path is a directory, disk full) leaves nothing
                os.remove(tmp)

    @classmethod
    def from_json(cls, path: str) -> Plan:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: malformed plan file, not JSON ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != "shardgym.Plan/1":
            raise ValueError(f"{path}: not a shardgym plan file (missing format 'shardgym.Plan/1')")
        try:
            strategies = [int(x) for x in doc["strategies"]]
            return cls(
                strategies=strategies,
                method=doc.get("method", ""),
                objective=doc.get("objective", ""),
                problem_name=doc.get("problem_name", ""),
                solve_time_s=float(doc.get("solve_time_s", 0.0)),
                info=doc.get("info", {}),
                mesh_shape=tuple(doc.get("mesh_shape", ())),
                axis_names=tuple(doc.get("axis_names", ())),
                input_specs=[(int(i), p, _spec_from_json(s)) for i, p, s in doc.get("input_specs", [])],
                node_specs=[(int(i), _spec_from_json(s)) for i, s in doc.get("node_specs", [])],
                meta=doc.get("meta", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: malformed plan file ({type(exc).__name__}: {exc})") from exc

