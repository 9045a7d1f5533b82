"""``trace(fn, *args)``: the OpGraph of a JAX function (conventions in costmodel.trace's docstring).

The walk (``walk.Tracer``) gives the records, ``fold.group_program`` their groups; this module
assembles one ``Node`` per group (operands, summed FLOPs and bytes, roles, module path) and the
graph's outputs and aliases.
"""
from __future__ import annotations

import gc

import jax

from costmodel import primitives as P
from costmodel.graph import Node, OpGraph
from costmodel.trace.fold import group_program
from costmodel.trace.recompute import apply as recompute_records
from costmodel.trace.recompute import check_policy
from costmodel.trace.roles import arg_roles, is_grad, module_path_of, output_aliases, raw_stack
from costmodel.trace.walk import Tracer


def trace(fn, *args, fold: bool = True, name: str = "", recompute: str | None = None) -> OpGraph:
    """Trace ``fn(*args)`` into an OpGraph; see costmodel.trace's docstring for every convention.
    ``recompute``: a policy of costmodel.trace.recompute (None: the program as written)."""
    check_policy(recompute)
    if not callable(fn):
        raise ValueError(f"trace: fn must be callable, got {type(fn).__name__}")
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    except TypeError as e:
        raise ValueError(f"trace: could not trace fn with the given args (leaves must be arrays, "
                         f"ShapeDtypeStructs or scalars): {e}") from e
    leaves_with_path, _ = jax.tree_util.tree_flatten_with_path(args)
    jaxpr = closed.jaxpr
    if len(leaves_with_path) != len(jaxpr.invars):
        raise ValueError(f"trace: {len(leaves_with_path)} argument leaves but the jaxpr has "
                         f"{len(jaxpr.invars)} inputs; static (non-array) arguments are not supported")
    roles_by_arg = arg_roles(len(args))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the graph build allocates many small objects and no cycles: ~2x faster without GC
    try:
        return _build_graph(closed, out_shape, args, leaves_with_path, roles_by_arg, fold, name, recompute)
    finally:
        if gc_was_enabled:
            gc.enable()


def _build_graph(closed, out_shape, args, leaves_with_path, roles_by_arg, fold, name, recompute) -> OpGraph:
    jaxpr = closed.jaxpr
    tr = Tracer()
    in_refs, in_roles, in_paths = [], [], []
    for (path, _leaf), v in zip(leaves_with_path, jaxpr.invars):
        in_refs.append(tr.add("input", [], [], [tr.tensor(v.aval)], (), {}, 0.0)[0])
        in_roles.append(roles_by_arg[path[0].idx] if path and hasattr(path[0], "idx") else "other")
        in_paths.append(jax.tree_util.keystr(path))
    n_in = len(in_refs)
    out_refs = tr.flatten(closed, in_refs, ())
    recompute_records(tr, n_in, recompute)

    recs, val_src = tr.recs, tr.val_src
    gp = group_program(recs, val_src, out_refs, n_in, fold)
    group, members, heads, node_outs = gp.group, gp.members, gp.heads, gp.node_outs
    node_id = {h: i for i, h in enumerate(heads)}
    val_loc: dict[int, tuple[int, int]] = {}
    for h in heads:
        for k, o in enumerate(node_outs[h]):
            val_loc[o] = (node_id[h], k)

    nodes: list[Node] = []
    roles: list[str] = []
    for h in heads:
        rec = recs[h]
        nid = node_id[h]
        outs = tuple(tr.val_type[o] for o in node_outs[h])
        if h < n_in:
            role = in_roles[h]
            roles.append(role)
            nodes.append(Node(id=nid, primitive="input", operands=(), operand_types=(), outputs=outs,
                              role=role, input_index=h, input_path=in_paths[h], order=0))
            continue
        operands, op_types = [], []
        for r, t in zip(rec.ins, rec.in_types):
            operands.append(val_loc[r] if r is not None else (-1, 0))
            op_types.append(t)
        n_head = len(operands)
        seen = {o: k for k, o in reversed(list(enumerate(operands))) if o[0] >= 0}   # -> its first index
        fl, br, bw, fbp, folded, supported = 0.0, 0.0, 0.0, {}, [], True
        deps: dict = {}   # group value -> the node operand indices it is computed from
        for ri in members[h]:
            m = recs[ri]
            d: set = set()
            if ri != h:
                folded.append(m.prim)
                for r, t in zip(m.ins, m.in_types):
                    if r is None:
                        continue
                    if group[val_src[r][0]] == h:
                        d |= deps.get(r, set())
                        continue
                    loc = val_loc[r]
                    if loc not in seen:
                        seen[loc] = len(operands)
                        operands.append(loc)
                        op_types.append(t)
                    d.add(seen[loc])
            else:
                d = {k for k, o in enumerate(operands) if o[0] >= 0}
            for o in m.outs:
                deps[o] = d
            fl += m.flops
            br += P.bytes_read(m.in_types)
            bw += P.bytes_written(m.out_types)
            fbp[m.prim] = fbp.get(m.prim, 0.0) + m.flops
            supported = supported and m.supported
        params = dict(rec.params)
        params["name_stack"] = raw_stack(rec.stack)
        if folded:
            params["num_head_operands"] = n_head
            params["out_operands"] = tuple(tuple(sorted(deps[o])) for o in node_outs[h])
        role = "gradient" if is_grad(rec.stack) else "activation"
        roles.append(role)
        op_roles = tuple(roles[o[0]] if o[0] >= 0 else "constant" for o in operands)
        nodes.append(Node(id=nid, primitive=rec.prim, operands=tuple(operands), operand_types=tuple(op_types),
                          outputs=outs, params=params, flops=fl, bytes_read=br, bytes_written=bw,
                          module_path=module_path_of(rec.stack), operand_roles=op_roles, role=role,
                          folded=tuple(folded), flops_by_primitive=fbp, order=nid - n_in, supported=supported))

    outputs = tuple(val_loc[r] if r is not None else (-1, 0) for r in out_refs)
    in_leaves = [tr.val_type[r] for r in in_refs]
    out_leaves = [tr.tensor(v.aval) for v in jaxpr.outvars]
    aliases = output_aliases(args, out_shape, in_leaves, out_leaves, roles_by_arg)
    return OpGraph(nodes=tuple(nodes), outputs=outputs, output_aliases=tuple(aliases),
                   num_eqns=len(gp.kept) - n_in, num_nodes_unfolded=len(gp.kept), name=name, recompute=recompute)

