"""XLA's schedule of a traced step, read once before any plan exists: ``xla_scheduled(fn, args,
graph)`` compiles the unsharded step on one device, every equation under its node's scope
(``runtime.program``, no sharding constraint), the donated arguments donated as ``execute`` does,
and returns the graph whose node order follows the compiled program's schedule
(``costmodel.schedule.follow_schedule``, whose docstring says why and by how much). Compiles
abstractly (``jax.ShapeDtypeStruct``s): nothing is allocated.

Cost (experiments/bench_trace.py ``--schedule xla``, results/bench_trace_s13c_schedule.json, this
2-core machine at load 7-10): the compile takes 3-6x the trace itself, e.g. gpt tiny 2.1 s trace +
12.3 s schedule, gpt 125m 7.2 + 35.3 s, gpt 350m 21.4 + 66.0 s. XLA CPU's LLVM options do not cut
it (gpt tiny, ``xla_backend_optimization_level=0`` with ``xla_llvm_disable_expensive_passes``: the
same schedule, compile time within noise). So the order is memoised per process (``_ORDERS``),
keyed by the graph itself (its nodes, outputs and aliases, the arguments' leaf counts): tracing the
same step again compiles nothing; two steps with equal OpGraphs share one order.
"""
from __future__ import annotations

import dataclasses
import hashlib
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


#: graph fingerprint -> (node orders in XLA's schedule); a handful of steps per process
_ORDERS: dict[str, tuple[int, ...]] = {}
_MAX_ORDERS = 32


def _fingerprint(args, graph: OpGraph) -> str:
    leaves = tuple(len(jax.tree.leaves(a)) for a in args)
    key = repr((graph.nodes, graph.outputs, graph.output_aliases, leaves))
    return hashlib.sha1(key.encode()).hexdigest()


def xla_scheduled(fn, args, graph: OpGraph, devices=None) -> OpGraph:
    """``graph`` with its node order following XLA's schedule of the unsharded step (memoised per
    process by the graph's fingerprint: the module docstring)."""
    key = _fingerprint(args, graph)
    if key not in _ORDERS:
        if len(_ORDERS) >= _MAX_ORDERS:
            _ORDERS.pop(next(iter(_ORDERS)))
        out = follow_schedule(graph, scheduled_text(fn, args, graph, devices))
        _ORDERS[key] = tuple(nd.order for nd in out.nodes)
    order = _ORDERS[key]
    return dataclasses.replace(graph, schedule="xla", nodes=tuple(dataclasses.replace(nd, order=o)
                                                                  for nd, o in zip(graph.nodes, order)))
