"""XLA's schedule of a traced step, read once before any plan exists: ``xla_scheduled(fn, args,
graph)`` compiles the unsharded step on one device, every equation under its node's scope
(``runtime.program``, no sharding constraint), the donated arguments donated as ``execute`` does,
and returns the graph whose node order follows the compiled program's schedule
(``costmodel.schedule.follow_schedule``, whose docstring says why and by how much). Compiles
abstractly (``jax.ShapeDtypeStruct``s): nothing is allocated.
"""
from __future__ import annotations

import warnings

import jax

from costmodel.graph import OpGraph
from costmodel.problem import Plan
from costmodel.schedule import follow_schedule
from runtime.program import constrained_fn
from runtime.shardings import donated_args, make_mesh


def scheduled_text(fn, args, graph: OpGraph, devices=None) -> str:
    """The scheduled HLO module (``compiled.as_text()``) of ``fn(*args)`` unsharded on one device,
    each node's equations under its ``NODE_SCOPE``."""
    plan = Plan(strategies=[], mesh_shape=(1,), axis_names=("one",),
                node_specs=[(nd.id, None) for nd in graph.nodes if not nd.is_input])
    mesh = make_mesh(plan, devices)
    run, _ = constrained_fn(fn, args, graph, plan, mesh)
    abstract = jax.tree.map(lambda x: x if isinstance(x, jax.ShapeDtypeStruct) or not hasattr(x, "shape")
                            else jax.ShapeDtypeStruct(x.shape, x.dtype), args)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        compiled = jax.jit(run, donate_argnums=donated_args(args, graph)).lower(*abstract).compile()
    return compiled.as_text()


def xla_scheduled(fn, args, graph: OpGraph, devices=None) -> OpGraph:
    """``graph`` with its node order following XLA's schedule of the unsharded step."""
    return follow_schedule(graph, scheduled_text(fn, args, graph, devices))
