"""Checks that keep a plan from running where it would fail late or compute garbage.

* A plan carries its cluster (the full description, so a plan made with ``--cluster-file`` runs
  anywhere) and its memory cap in ``plan.meta`` (``runtime.prediction``: ``cluster_meta`` writes
  them, ``plan_problem`` rebuilds the Problem from them, never from a preset looked up by name).
* ``check_plan_file``: before anything is built, the plan's model source, mesh and cluster agree
  with each other and the local devices are enough (the hint names the device count needed).
* ``check_plan_problem``: against the Problem rebuilt from abstract args (no arrays allocated): node
  count, strategy index ranges, and every spec the plan stores is the one its strategy means.
* ``check_divisible``: every jit argument's sharded dims divide by their mesh axes, and no
  parameter-shaped scatter-add is sharded unevenly (what XLA miscomputes, see the function);
  refused at planning, naming the argument, its dim and the mesh axis. Other uneven inner specs
  are left to XLA's padding and ``shardgym run``'s numerics check.
"""
from __future__ import annotations

import math

import jax

from costmodel.limits import LimitError, Limits
from costmodel.problem import Plan, Problem, as_strategy_array
from runtime.prediction import plan_cluster, plan_problem
from runtime.shardings import is_key
from shardgym import workflow
from shardgym.userfn import ModelSource


def check_plan_file(plan: Plan, where: str = "plan") -> ModelSource:
    """Cheap checks (no tracing): source, mesh against cluster, local device count, cap."""
    source = ModelSource.from_meta(plan.meta, where)
    cluster = plan_cluster(plan, where)
    if tuple(plan.mesh_shape) != tuple(cluster.mesh_shape) or tuple(plan.axis_names) != tuple(cluster.axis_names):
        raise ValueError(f"{where}: mesh_shape {list(plan.mesh_shape)} / axis_names {list(plan.axis_names)} do not "
                         f"match cluster {cluster.name!r} ({list(cluster.mesh_shape)} / {list(cluster.axis_names)})")
    need, have = math.prod(plan.mesh_shape), jax.device_count()
    if need > have:
        platform = jax.devices()[0].platform
        hint = (f"run with XLA_FLAGS=--xla_force_host_platform_device_count={need} (set before jax is imported)"
                if platform == "cpu" else f"run it on a machine with {need} devices")
        raise ValueError(f"{where}: the plan needs {need} devices (mesh {dict(zip(plan.axis_names, plan.mesh_shape))}) "
                         f"but only {have} {platform} devices are available; {hint}")
    cap = (plan.meta or {}).get("memory_cap_bytes")
    try:
        Limits.of(cap)   # what plan_problem applies
    except LimitError as exc:
        raise ValueError(f"{where}: meta.{exc}") from None
    return source


def check_plan_problem(plan: Plan, source: ModelSource, where: str = "plan") -> Problem:
    """Rebuild the plan's Problem from abstract args (its cluster and cap:
    ``runtime.prediction.plan_problem``) and check the plan against it; returns it."""
    cluster = plan_cluster(plan, where)
    _, args, graph = workflow.traced(source, True)
    problem = plan_problem(graph, plan, where)
    try:
        as_strategy_array(problem, plan.strategies)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc} ({source.label} on {cluster.name}); was it made for another model?") from None
    want = replicate_keys(Plan.for_problem(problem, plan.strategies), args)
    if _specs(want.node_specs) != _specs(plan.node_specs) or _specs(want.input_specs) != _specs(plan.input_specs):
        raise ValueError(f"{where}: its PartitionSpecs are not those its strategies mean for {source.label} on "
                         f"{cluster.name} (edited, or made for another model or cluster); remake it with `shardgym plan`")
    check_divisible(plan, args, where, graph)
    return problem


def _specs(entries) -> list:
    return [tuple(None if x is None else tuple(x) if isinstance(x, (list, tuple)) else x for x in e[-1])
            if e[-1] is not None else None for e in entries]


MISCOMPILED_UNEVEN = ("scatter-add", "scatter")


def _uneven(spec, shape, sizes) -> tuple[int, tuple, int] | None:
    """(dim, axes, k) of the first dim of ``shape`` that ``spec``'s mesh axes do not divide."""
    for d, entry in enumerate(spec or ()):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        k = math.prod(sizes.get(a, 1) for a in axes)
        if k > 1 and (d >= len(shape) or shape[d] % k):
            return d, axes, k
    return None


def check_divisible(plan: Plan, args, where: str = "plan", graph=None) -> None:
    """ValueError unless every input spec's mesh axes divide the argument dim they shard; given the
    graph, also every scatter-add whose result has the shape of a parameter or optimizer-state
    argument (args[0], args[1]: an embedding's gradient) and is sharded unevenly: XLA miscomputes it
    (Megatron on a 3x2 mesh for gpt tiny shards the (256, 64) wte gradient scatter-add over y x x = 6
    devices: inf parameters). Other uneven specs are left to XLA's padding, which measured correct
    on that mesh: DP 6.9e-7, FSDP 6.9e-7 (with uneven activations, gathers, reductions and a batch
    scatter-add)."""
    flat = jax.tree_util.tree_flatten_with_path(args)[0]
    leaves = [x for _, x in flat]
    sizes = dict(zip(plan.axis_names, plan.mesh_shape))
    if graph is not None:
        by_shape: dict[tuple, list] = {}
        for path, x in flat:   # parameters and optimizer state: args[0], args[1] (zoo.build's convention)
            name = jax.tree_util.keystr(path)
            if not is_key(x) and name[:3] in ("[0]", "[1]") and len(x.shape):
                by_shape.setdefault(tuple(x.shape), []).append(name)
        for nid, spec in plan.node_specs:
            node = graph.nodes[int(nid)] if 0 <= int(nid) < len(graph.nodes) else None
            if node is None or node.primitive not in MISCOMPILED_UNEVEN or tuple(node.out.shape) not in by_shape:
                continue
            bad = _uneven(spec, tuple(node.out.shape), sizes)
            if bad:
                d, axes, k = bad
                names = by_shape[tuple(node.out.shape)]   # the one named after the node's module, if any
                mod = (node.module_path or "").rsplit("/", 1)[-1]
                arg = next((n for n in names if mod and f"'{mod}'" in n), names[0])
                raise ValueError(f"{where}: argument {arg} dim {d} (size "
                                 f"{node.out.shape[d]}) does not divide by mesh axis {'+'.join(axes)} (size {k}), "
                                 f"which plan {plan.method!r} shards a value of its shape over (node {nid}, "
                                 f"{node.primitive} {node.module_path or ''}); pick a mesh whose axes divide it, "
                                 "or another method")
    for idx, path, spec in plan.input_specs:
        if spec is None or not 0 <= int(idx) < len(leaves) or is_key(leaves[idx]):
            continue
        shape = tuple(leaves[idx].shape)
        bad = _uneven(spec, shape, sizes)
        if bad:
            d, axes, k = bad
            dim = shape[d] if d < len(shape) else "missing"
            raise ValueError(f"{where}: argument {path} dim {d} (size {dim}) does not divide by mesh axis "
                             f"{'+'.join(axes)} (size {k}) as plan {plan.method!r} shards it; pick a mesh "
                             "whose axes divide it, or another method")


def replicate_keys(plan: Plan, args) -> Plan:
    """The plan with every PRNG-key argument replicated (the tracer sees a key as its uint32 key
    data, so a baseline may shard it like a batch); returns ``plan`` (changed in place)."""
    leaves = jax.tree.leaves(args)
    plan.input_specs = [(i, p, None if 0 <= int(i) < len(leaves) and is_key(leaves[i]) else s)
                        for i, p, s in plan.input_specs]
    return plan
