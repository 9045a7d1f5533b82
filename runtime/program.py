"""The constrained program: the traced step re-evaluated equation by equation inside jit, each
planned node's values pinned with ``with_sharding_constraint`` (and, given the plan's Problem,
each operand as the chosen strategy reads it), distributed FFTs and halo gathers swapped in
(``runtime.dist_fft``, ``runtime.dist_gather``), every equation under the node's named scope so
XLA's op_name says which node an instruction came from (``NODE_SCOPE``; shardgym/verifier.py
reads it). ``cached`` memoises the flat program and the reference run per (fn, args).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from costmodel.graph import OpGraph
from costmodel.problem import Plan
from costmodel.schedule import NODE_SCOPE
from costmodel.trace import flatten_program
from runtime import dist_fft, dist_gather
from runtime.shardings import check_spec, constrain, pspec

#: NODE_SCOPE (costmodel.schedule): every equation of graph node i is traced under
#: jax.named_scope(f"{NODE_SCOPE}{i}"), so an HLO instruction's op_name says which node it came from
#: (shardgym/verifier.py and costmodel.schedule read it).


def constrained_fn(fn, args, graph: OpGraph | None, plan: Plan, mesh, problem=None):
    """``fn`` itself when the plan has no per-node specs and the graph is the program as written (no
    recompute policy); otherwise a function that re-evaluates the
    traced program with a sharding constraint on every output of each planned node (and, given the
    plan's Problem, on each operand as the chosen strategy takes it). Returns (function, number of
    constraints)."""
    if not plan.node_specs and getattr(graph, "recompute", None) is None:
        return fn, 0
    return _constrained_program(fn, args, graph, plan, mesh, problem)


def _spec_rank_ok(spec, shape) -> bool:
    return spec is not None and len(spec) <= len(shape)


def _operand_specs(problem, plan: Plan, graph: OpGraph) -> dict[int, tuple]:
    """node id -> the chosen strategy's operand specs (one per graph operand), from the Problem's
    meta; {} when the problem does not carry them or does not match the plan."""
    m = getattr(problem, "meta", None) if problem is not None else None
    if m is None or not m.operand_specs or len(plan.strategies) != problem.num_nodes:
        return {}
    out = {}
    for i, si in enumerate(plan.strategies):
        nid = int(m.graph_node[i])
        ops = m.operand_specs[i][int(si)]
        if not graph.nodes[nid].is_input and len(ops) == len(graph.nodes[nid].operands):
            out[nid] = ops
    return out


def _constrained_program(fn, args, graph: OpGraph | None, plan: Plan, mesh, problem=None):
    """Re-evaluate the program ``trace`` sees (``costmodel.trace.flatten_program``) inside jit,
    with ``with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))`` on every value a planned
    node exposes. A node's spec is that of its output 0; its other outputs (a folded group's
    values used elsewhere) of the same rank get the same spec, others are left unconstrained.
    All-None specs still constrain (replicate), as the plan says.

    Operands: given the plan's Problem, every equation of node v that reads a value of another node
    u reads it constrained to the operand spec of v's chosen strategy (the layout the cost model
    prices the u -> v resharding to). Without it XLA picks the operand layouts itself, e.g. it
    all-reduces a weight gradient where the plan all-gathers the activations first."""
    policy = getattr(graph, "recompute", None)   # a recompute graph replays the recomputing program
    flat = cached(("flat", fn, args, policy), lambda: flatten_program(fn, *args, recompute=policy))
    g = flat.graph
    if graph is not None and (len(graph.nodes) != len(g.nodes)
                              or any(a.primitive != b.primitive for a, b in zip(graph.nodes, g.nodes))):
        raise ValueError(f"graph has {len(graph.nodes)} nodes but tracing fn gives {len(g.nodes)} (or other "
                         "primitives): pass the graph traced from this fn and these args")
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    specs: dict[int, tuple] = {}
    for nid, spec in plan.node_specs:
        if not 0 <= int(nid) < len(g.nodes):
            raise ValueError(f"plan.node_specs names graph node {nid}, but the graph has {len(g.nodes)} nodes")
        node = g.nodes[int(nid)]
        if spec is not None:
            check_spec(spec, node.out.shape, sizes, f"node {nid} ({node.primitive}, {node.module_path or '-'})",
                       require_divisible=False)
        specs[int(nid)] = spec
    sharding_of: dict[int, NamedSharding] = {}
    for v, (nid, k) in flat.value_node.items():
        spec = specs.get(nid)
        if spec is None or g.nodes[nid].is_input:
            continue
        shape = g.nodes[nid].outputs[k].shape
        if len(shape) == len(g.nodes[nid].out.shape) and _spec_rank_ok(spec, shape):
            sharding_of[v] = NamedSharding(mesh, pspec(spec))
    op_sharding: dict[tuple[int, int], NamedSharding] = {}   # (consumer node, value id) -> sharding
    if graph is not None and problem is not None and flat.step_node:
        for nid, ops in _operand_specs(problem, plan, g).items():
            loc_of = {loc: k for k, loc in enumerate(g.nodes[nid].operands)}
            for v, loc in flat.value_node.items():
                k = loc_of.get(loc)
                if k is None or ops[k] is None:
                    continue
                shape = g.nodes[nid].operand_types[k].shape
                if len(ops[k]) == len(shape):
                    op_sharding[(nid, v)] = NamedSharding(mesh, pspec(ops[k]))
    out_treedef = jax.tree.structure(jax.eval_shape(fn, *args))
    fft_dist = _distributed_ffts(problem, plan, g) if graph is not None and problem is not None else {}
    halo = dist_gather.planned(problem, plan, g, args, sizes) if graph is not None and problem is not None else {}

    def run(*call_args):
        leaves = jax.tree.leaves(call_args)
        env: dict[int, object] = {}
        cache: dict[tuple[int, int], object] = {}
        for si, (kind, payload, ins, outs, consts) in enumerate(flat.steps):
            if kind == "input":
                res = [leaves[payload]]
            else:
                nid = flat.step_node[si] if flat.step_node else -1
                ops = []
                for k, r in enumerate(ins):
                    if r is not None:
                        sh = op_sharding.get((nid, r))
                        if sh is None:
                            ops.append(env[r])
                        else:
                            if (nid, r) not in cache:  # the resharded copy is the consumer's (verify)
                                with jax.named_scope(f"{NODE_SCOPE}{nid}"):
                                    cache[(nid, r)] = constrain(env[r], sh)
                            ops.append(cache[(nid, r)])
                    elif k < len(consts) and not _is_missing(consts[k]):
                        ops.append(consts[k])
                    else:
                        raise ValueError(f"runtime: operand {k} of {payload!r} is a constant the tracer did not "
                                         "recover; this program cannot be re-evaluated with per-node constraints")
                fft_sh = None
                if kind == "eqn" and nid in halo and payload.primitive.name in ("gather", "scatter-add"):
                    res = [dist_gather.apply(*halo[nid][:1], ops, *halo[nid][1:], mesh)]
                    for o, x in zip(outs, res):
                        sh = sharding_of.get(o)
                        env[o] = constrain(x, sh) if sh is not None else x
                    continue
                if kind == "eqn" and nid in fft_dist and payload.primitive.name == "fft":
                    res = [dist_fft.apply(payload.params, ops[0], *fft_dist[nid], mesh)]
                    for o, x in zip(outs, res):
                        sh = sharding_of.get(o)
                        env[o] = constrain(x, sh) if sh is not None else x
                    continue
                if kind == "eqn" and payload.primitive.name == "fft" and ins and ins[0] is not None:
                    fft_sh = op_sharding.get((nid, ins[0])) or sharding_of.get(ins[0])
                    if fft_sh is not None:
                        ops = [_row_major(ops[0], fft_sh), *ops[1:]]
                with jax.named_scope(f"{NODE_SCOPE}{nid}"):  # XLA's op_name names the node (verify)
                    res = _eval_step(kind, payload, ops)
                if fft_sh is not None:
                    res = [_row_major(r, fft_sh) for r in res]
            for o, x in zip(outs, res):
                sh = sharding_of.get(o)
                env[o] = constrain(x, sh) if sh is not None else x
        out = [env[r] if r is not None else c for r, c in zip(flat.outputs, flat.output_consts)]
        return jax.tree.unflatten(out_treedef, out)

    return run, len(sharding_of) + len(op_sharding)


def _distributed_ffts(problem, plan: Plan, graph: OpGraph) -> dict[int, tuple]:
    """graph node id -> (operand spec, result spec) of every fft node whose chosen strategy is a
    distributed FFT (runtime/dist_fft.py runs those; the replicated one stays XLA's)."""
    m = getattr(problem, "meta", None)
    if m is None or not m.operand_specs or len(plan.strategies) != problem.num_nodes:
        return {}
    out = {}
    for i, si in enumerate(plan.strategies):
        nid = int(m.graph_node[i])
        if graph.nodes[nid].primitive != "fft":
            continue
        ins, res = m.operand_specs[i][int(si)][0], m.out_specs[i][int(si)]
        if dist_fft.is_distributed(ins, res):
            out[nid] = (ins, res)
    return out


def _row_major(x, sharding):
    """``x`` itself, computed by an identity matmul over its last dim so that XLA gives it the
    default (row-major) layout, when ``sharding`` shards it at all (else ``x`` untouched).

    XLA all-gathers an FFT's operand whenever it is sharded (even on batch dims only), and layout
    assignment may hand the FFT a gathered operand with permuted dims (e.g. ``{1,3,2,0}``); XLA's CPU
    FFT thunk rejects it (fft_thunk.cc:168 RET_CHECK IsMonotonicWithDim0Major: CPU layout assignment
    pins dot / conv operands and results to row-major but not FFT's; it gives the FFT operand the
    layout its consumers want of the result). A dot's operands and result are pinned, so feeding the
    FFT from ``x @ I`` and reading its result through ``y @ I`` keeps both row-major. Exact (each element is x·1 plus
    zeros); costs n² MACs per row of n elements, negligible beside the FFT; not in the cost model."""
    if all(e is None for e in sharding.spec) or x.ndim == 0:
        return x
    n = x.shape[-1]
    return jnp.matmul(x, jnp.eye(n, dtype=x.dtype), precision="highest")


def _tied_barrier(ops) -> list:
    """``optimization_barrier(ops)``, each floating result plus a zero computed from every operand.

    The barrier keeps XLA from CSE-ing a backward recomputation with the forward pass, but XLA CPU
    expands it away before scheduling, and its scheduler then hoists every recomputation to where
    q, k, v are ready, in the forward pass: gpt 125m under Megatron's plan held all 12 layers'
    recomputed probabilities at its peak (3,704 MiB, as without recomputation). The zero ties each
    result to all operands (e.g. the attention output's cotangent), so the recomputation cannot
    start before the backward reaches it. Exact: the zero is ``select(z == z, z, 0)`` of
    ``z = x[0, ..., 0] * 0`` (XLA does not fold a float ``x * 0``: NaN), so ``x + 0`` changes at most
    the sign of a zero. Costs one element-wise add per operand and, on a sharded operand, a
    one-element collective (not in the cost model; ``x.ravel()[0]`` all-gathered the whole operand)."""
    outs = list(jax.lax.optimization_barrier(tuple(ops)))
    fl = [o for o in outs if jnp.issubdtype(o.dtype, jnp.floating) and o.size]
    if not fl:
        return outs
    z = sum(jax.lax.slice(o, (0,) * o.ndim, (1,) * o.ndim).reshape(()).astype(jnp.float32) * 0.0 for o in fl)
    z = jnp.where(z == z, z, 0.0)
    return [o + z.astype(o.dtype) if jnp.issubdtype(o.dtype, jnp.floating) else o for o in outs]


def _is_missing(x) -> bool:
    return type(x).__name__ == "_Missing"


def _eval_step(kind, payload, ops) -> list:
    if kind == "eqn":
        res = payload.primitive.bind(*ops, **payload.params)
        return list(res) if payload.primitive.multiple_results else [res]
    prim, p = payload
    (x, *rest) = ops
    if prim == "slice":
        return [jax.lax.slice(x, p["start_indices"], p["limit_indices"])]
    if prim == "squeeze":
        return [jax.lax.squeeze(x, p["dimensions"])]
    if prim == "broadcast_in_dim":
        return [jax.lax.broadcast_in_dim(x, p["shape"], p["broadcast_dimensions"])]
    if prim == "concatenate":
        return [jax.lax.concatenate([x, *rest], p["dimension"])]
    if prim == "optimization_barrier":   # a recomputation's operands (walk.remat_barrier, trace.recompute)
        return _tied_barrier([x, *rest])
    raise ValueError(f"runtime: unknown synthetic step {prim!r}")


_CACHE: dict = {}
_CACHE_SIZE = 4


def cached(key, make):
    """Memo for the unsharded reference run and the flat program, keyed on the identity of fn and
    of every arg leaf (the objects are kept alive in the entry, so ids cannot be reused); the
    last _CACHE_SIZE entries are kept. Lets several plans of one model share them."""
    tag, fn, args, *rest = key
    k = (tag, id(fn), tuple(id(x) for x in jax.tree.leaves(args)), *rest)
    hit = _CACHE.get(k)
    if hit is not None:
        return hit[0]
    val = make()
    _CACHE[k] = (val, fn, args)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    return val
