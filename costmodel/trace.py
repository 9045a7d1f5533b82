"""Trace a JAX function into an OpGraph (``trace(fn, *args, fold=True, name="")``).

Pipeline: ``jax.make_jaxpr(fn)(*args)`` (args may be ``jax.ShapeDtypeStruct`` pytrees, so nothing
is allocated) -> a flat list of primitive applications ("records") -> dead-code elimination ->
optional folding of element-wise chains -> ``OpGraph``.

Inputs. One input node (primitive ``"input"``) per leaf of ``args`` in ``jax.tree.leaves(args)``
order, with ``input_index`` and ``input_path`` (``jax.tree_util.keystr`` of the leaf's path in the
args tuple, e.g. ``"[0]['Dense_0']['kernel']"``). Roles: a train step ``fn(params, opt_state,
batch)`` gives param / opt_state / batch. Other arities: arg 0 is ``param``, the last arg (when
there are at least two) is ``batch``; for exactly three args the middle one is ``opt_state``,
with four or more args the middle ones are ``other``. Scalar leaves (Python ints, optax's
``count``) are ordinary 0-d inputs.

Inlining. Call-like primitives (``jit``/``pjit``, ``closed_call``, ``core_call``,
``custom_jvp_call``, ``custom_vjp_call``, ``remat2``/``checkpoint``, ...; see
``primitives.INLINE``) are inlined by mapping the outer operands onto the sub-jaxpr's invars;
closed-over constants become literals. Control flow:
- ``scan`` with 1 <= length <= 64 is unrolled: per iteration each scanned input gets a synthetic
  ``slice`` + ``squeeze``, the body is inlined, and each stacked output is rebuilt from per-step
  ``broadcast_in_dim`` (to a leading 1) + one ``concatenate``. Longer scans become one node whose
  FLOPs = length x body FLOPs.
- ``while`` becomes one node costed as ONE iteration of cond + body (the trip count is unknown).
- ``cond`` becomes one node costed as its most expensive branch.
These single nodes carry ``params["replicate_only"] = True``: the strategy enumerator should only
offer them replicated.

Records and costs. Each primitive application gets FLOPs from ``primitives.flops`` (formulas in
that module), ``bytes_read`` = bytes of its operands (literals included), ``bytes_written`` = bytes
of its results; FLOPs are rounded to integers so that every sum of them is exact in float64 (the
fft formula is not integral). A primitive without a rule stays a node with ``supported=False``
(replicate-only) and ``warnings.warn`` names it once per trace. Records none of whose results are used (directly
or transitively) by the program outputs are dropped; ``num_eqns`` counts the records that remain.

Module paths and roles. ``module_path`` is the Flax scope path from the equation's name stack
(outer call stacks prepended), with transforms and einsum specs dropped:
``transpose(jvp(GPT))/Block_0/Dense_0`` becomes ``GPT/Block_0/Dense_0`` and
``GPT/block_0/attn/bqhd,bkhd->bhqk`` becomes ``GPT/block_0/attn``; the raw string is kept in
``params["name_stack"]``. An op's role
is ``"gradient"`` when its name stack contains a ``transpose`` transform (it was produced by
reverse-mode differentiation), else ``"activation"`` (this includes the optimizer update).
``operand_roles[k]`` is the role of operand k's producer node, ``"constant"`` for literals.

Folding (``fold=True``, Alpa's "follow" nodes). Walking records in program order, an element-wise
op (``primitives.FOLDABLE``) with one result joins the group of one of its operands' producers: the
candidates are its non-literal operands that have the op's result shape and are produced by an op
(never an input node), largest first, then first in operand order; it joins the first candidate
group for which the graph stays acyclic, else it heads its own node. Acyclicity invariant (see
``_fold_target``): each group edge H -> G either goes forward in program order (head of H before
head of G) or starts at a *pinned source*, a group that depends on no op group and never will
(e.g. ``reshape(bias)`` or ``0.9 * mu`` computed from inputs only). So the bias add after a matmul
and Adam's ``0.9 * mu + 0.1 * grad`` fold, but in ``x - max(x)`` the ``sub`` cannot join ``x``'s
group (``max(x)`` depends on it). Element-wise ops may broadcast size-1 dims implicitly in
jaxprs; only an operand of exactly the result's shape is a candidate. A
group node has the head's primitive and params, ``folded`` = absorbed primitives in order,
``outputs`` = every group value used outside the group (another node or a program output) in
program order, ``operands`` = the head's operands followed by the absorbed ops' external
non-literal operands (deduplicated; ``params["num_head_operands"]`` tells where the head's stop).
FLOPs, bytes_read and bytes_written of a group are the SUMS over its members, so folding preserves
``total_flops`` and ``total_bytes`` exactly (bytes are therefore an unfused upper bound on memory
traffic). ``num_nodes_unfolded`` = inputs + records, the node count with ``fold=False``.

Outputs. ``OpGraph.outputs`` follow ``jax.tree.leaves(fn(*args))``; a literal output is (-1, 0), a
pass-through input is (its input node, 0). ``output_aliases[i]`` is the flat input index output i
replaces when the output is a tuple/list whose first (and second) entries have the same tree
structure, shapes and dtypes as ``args[0]`` (and ``args[1]``), for args that are not the batch;
None otherwise.

Node ids are positions in ``graph.nodes``: inputs first, then op nodes in a topological order that
follows program order of the heads wherever dependencies allow. ``order`` = id - number of inputs
for op nodes (their step in that sequential schedule; with ``fold=False`` exactly the equation's
program position after inlining and dead-code elimination), 0 for inputs.
"""
from __future__ import annotations

import functools
import gc
import re
import warnings
from dataclasses import dataclass, field

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Literal)

from costmodel import primitives as P
from costmodel.graph import Node, OpGraph, Tensor

SCAN_UNROLL_MAX = 64
_CONTROL = ("scan", "while", "cond")
_EINSUM = re.compile(r",|->")  # jnp.einsum pushes its spec ("bqhd,bkhd->bhqk") as a scope


@dataclass
class _Rec:
    """One primitive application after inlining (or a program input when prim == "input")."""

    prim: str
    ins: list            # operand value ids; None = literal / constant
    in_types: list       # Tensor per operand
    outs: list           # result value ids
    out_types: list      # Tensor per result
    stack: tuple = ()    # name stack elements (Scope / Transform)
    flops: float = 0.0
    params: dict = field(default_factory=dict)
    supported: bool = True


class _Tracer:
    def __init__(self):
        self.recs: list[_Rec] = []
        self.val_src: list[tuple[int, int]] = []     # value id -> (record index, result index)
        self.val_type: list[Tensor] = []
        self.warned: set[str] = set()
        self._tcache: dict = {}

    # ---- helpers ---------------------------------------------------------------------------
    def tensor(self, aval) -> Tensor:
        key = (getattr(aval, "shape", None), getattr(aval, "dtype", None))
        try:
            t = self._tcache.get(key)
        except TypeError:
            return P.tensor_of(aval)
        if t is None:
            t = self._tcache[key] = P.tensor_of(aval)
        return t

    def add(self, prim, ins, in_types, out_types, stack, params, flops, supported=True) -> list[int]:
        ri = len(self.recs)
        outs = []
        for k, t in enumerate(out_types):
            outs.append(len(self.val_src))
            self.val_src.append((ri, k))
            self.val_type.append(t)
        self.recs.append(_Rec(prim, list(ins), list(in_types), outs, list(out_types), stack, flops,
                              params, supported))
        return outs

    def warn(self, prim: str, why: str = "no cost/sharding rule"):
        if prim not in self.warned:
            self.warned.add(prim)
            warnings.warn(f"shardgym.trace: primitive {prim!r} has {why}; it stays a replicate-only "
                          f"node (supported=False)", stacklevel=3)

    # ---- flattening ------------------------------------------------------------------------
    def flatten(self, jaxpr, in_refs, prefix: tuple) -> list:
        """Append records for ``jaxpr`` (an open Jaxpr or ClosedJaxpr); returns its output refs."""
        if hasattr(jaxpr, "jaxpr") and hasattr(jaxpr, "consts"):  # ClosedJaxpr
            const_refs = [None] * len(jaxpr.jaxpr.constvars)
            jaxpr = jaxpr.jaxpr
        else:
            const_refs = [None] * len(jaxpr.constvars)
        if len(in_refs) != len(jaxpr.invars):
            raise ValueError(f"internal: {len(in_refs)} operands for a jaxpr with {len(jaxpr.invars)} invars")
        env = {}
        for v, r in zip(jaxpr.constvars, const_refs):
            env[v] = r
        for v, r in zip(jaxpr.invars, in_refs):
            env[v] = r

        def read(a):
            return None if isinstance(a, jax.extend.core.Literal) else env[a]

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            ns = eqn.source_info.name_stack
            stack = prefix + tuple(getattr(ns, "stack", ()))
            prim = eqn.primitive.name
            outs = self.eqn(eqn, prim, ins, stack)
            for v, r in zip(eqn.outvars, outs):
                env[v] = r
        return [read(a) for a in jaxpr.outvars]

    def in_types_of(self, eqn, ins):
        return [self.val_type[r] if r is not None else self.tensor(a.aval) for a, r in zip(eqn.invars, ins)]

    def eqn(self, eqn, prim, ins, stack) -> list:
        params = eqn.params
        sub_key = P.INLINE.get(prim)
        if sub_key is not None and sub_key in params:
            sub = params[sub_key]
            inner = sub.jaxpr if hasattr(sub, "consts") else sub
            if len(inner.invars) == len(ins) and len(inner.outvars) == len(eqn.outvars):
                return self.flatten(sub, ins, stack)
        if prim == "scan" and 1 <= params["length"] <= SCAN_UNROLL_MAX:
            return self.unroll_scan(eqn, ins, stack)
        in_types = self.in_types_of(eqn, ins)
        out_types = [self.tensor(v.aval) for v in eqn.outvars]
        jp = P.json_params(prim, params)
        if prim in _CONTROL:
            f = self.control_flops(prim, params)
            jp["replicate_only"] = True
            supported = True
        else:
            f = P.flops(prim, params, in_types, out_types)
            supported = f is not None
            if not supported:
                self.warn(prim)
                f = 0.0
        return self.add(prim, ins, in_types, out_types, stack, jp, float(round(f)), supported)

    def body_flops(self, closed) -> float:
        sub = _Tracer()
        sub.warned = self.warned
        inner = closed.jaxpr if hasattr(closed, "consts") else closed
        refs = []
        for v in inner.invars:
            refs.append(sub.add("input", [], [], [sub.tensor(v.aval)], (), {}, 0.0)[0])
        sub.flatten(closed, refs, ())
        return float(sum(r.flops for r in sub.recs))

    def control_flops(self, prim, params) -> float:
        if prim == "scan":
            return params["length"] * self.body_flops(params["jaxpr"])
        if prim == "while":
            return self.body_flops(params["cond_jaxpr"]) + self.body_flops(params["body_jaxpr"])
        return max((self.body_flops(b) for b in params["branches"]), default=0.0)  # cond

    def unroll_scan(self, eqn, ins, stack) -> list:
        p = eqn.params
        length, nc, ncarry, reverse = p["length"], p["num_consts"], p["num_carry"], p["reverse"]
        body = p["jaxpr"]
        in_types = self.in_types_of(eqn, ins)
        consts, carry, xs = ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]
        x_types = in_types[nc + ncarry:]
        ny = len(eqn.outvars) - ncarry
        y_types = [self.tensor(v.aval) for v in eqn.outvars[ncarry:]]
        pieces = [[None] * length for _ in range(ny)]
        steps = range(length - 1, -1, -1) if reverse else range(length)
        for i in steps:
            x_refs = []
            for r, t in zip(xs, x_types):
                if r is None:
                    x_refs.append(None)
                    continue
                sl_t = Tensor((1,) + t.shape[1:], t.dtype)
                sp = {"start_indices": [i] + [0] * (len(t.shape) - 1), "limit_indices": [i + 1] + list(t.shape[1:]),
                      "strides": None, "synthetic": "scan"}
                (s,) = self.add("slice", [r], [t], [sl_t], stack, sp, 0.0)
                sq_t = Tensor(t.shape[1:], t.dtype)
                (q,) = self.add("squeeze", [s], [sl_t], [sq_t], stack, {"dimensions": [0], "synthetic": "scan"}, 0.0)
                x_refs.append(q)
            outs = self.flatten(body, list(consts) + list(carry) + x_refs, stack)
            carry = outs[:ncarry]
            for j, y in enumerate(outs[ncarry:]):
                pieces[j][i] = y
        results = list(carry)
        for j in range(ny):
            yt = y_types[j]
            one_t = Tensor((1,) + yt.shape[1:], yt.dtype)
            el_t = Tensor(yt.shape[1:], yt.dtype)
            expanded, ex_types = [], []
            for y in pieces[j]:
                bp = {"shape": list(one_t.shape), "broadcast_dimensions": list(range(1, len(one_t.shape))),
                      "synthetic": "scan"}
                (b,) = self.add("broadcast_in_dim", [y], [el_t], [one_t], stack, bp, 0.0)
                expanded.append(b)
                ex_types.append(one_t)
            (c,) = self.add("concatenate", expanded, ex_types, [yt], stack,
                            {"dimension": 0, "synthetic": "scan"}, 0.0)
            results.append(c)
        return results


# ---- helpers over the flat records -------------------------------------------------------------
@functools.lru_cache(maxsize=16384)
def _module_path(stack) -> str:
    return "/".join(e.name for e in stack if type(e).__name__ == "Scope" and not _EINSUM.search(e.name))


@functools.lru_cache(maxsize=16384)
def _raw_stack(stack) -> str:
    from jax._src import source_info_util as siu
    try:
        return str(siu.NameStack(tuple(stack)))
    except Exception:  # pragma: no cover - name stack internals changed
        return _module_path(stack)


@functools.lru_cache(maxsize=16384)
def _is_grad(stack) -> bool:
    return any(type(e).__name__ == "Transform" and e.name == "transpose" for e in stack)


def _arg_roles(nargs: int) -> list[str]:
    if nargs == 1:
        return ["param"]
    if nargs == 3:
        return ["param", "opt_state", "batch"]
    return ["param"] + ["other"] * (nargs - 2) + ["batch"]


def _output_aliases(args, out_shape, in_leaves, out_leaves, roles) -> list:
    aliases = [None] * len(out_leaves)
    if not isinstance(out_shape, (tuple, list)):
        return aliases
    in_off, out_off = 0, 0
    in_offsets, out_offsets = [], []
    for a in args:
        in_offsets.append(in_off)
        in_off += len(jax.tree.leaves(a))
    for o in out_shape:
        out_offsets.append(out_off)
        out_off += len(jax.tree.leaves(o))
    for k in range(min(2, len(args), len(out_shape))):
        if roles[k] == "batch":
            break
        if jax.tree.structure(args[k]) != jax.tree.structure(out_shape[k]):
            break
        n = len(jax.tree.leaves(args[k]))
        ok = all(in_leaves[in_offsets[k] + j] == out_leaves[out_offsets[k] + j] for j in range(n))
        if not ok:
            break
        for j in range(n):
            aliases[out_offsets[k] + j] = in_offsets[k] + j
    return aliases


def _fold_target(rec, in_groups, source, pinned, n_in):
    """The group an element-wise record joins, or None (rule in the module docstring).

    Acyclicity invariant: every group edge H -> G has pos(H) < pos(G) (pos = head's program
    position), or H is a *pinned source*: a group with no op-group predecessors that must keep
    none. A record may join G if each other op-group operand H is earlier than G or a source (which
    gets pinned); a pinned G may only absorb records without other op-group operands.
    """
    out_shape = rec.out_types[0].shape
    cands = [k for k, g in enumerate(in_groups)
             if g is not None and g >= n_in and rec.in_types[k].shape == out_shape]
    cands.sort(key=lambda k: -P.size_of(rec.in_types[k]))  # stable: largest first, then first
    for k in cands:
        target = in_groups[k]
        others = {h for h in in_groups if h is not None and h >= n_in and h != target}
        if pinned[target] and others:
            continue
        if all(h < target or source[h] for h in others):
            for h in others:
                if h > target:
                    pinned[h] = True
            if others:
                source[target] = False
            return target
    return None


def _live_records(recs, out_refs, n_in: int) -> list[int]:
    """Dead-code elimination: the record indices whose outputs reach a program output (inputs
    are always kept), in program order."""
    live = [ri < n_in for ri in range(len(recs))]
    used = set(r for r in out_refs if r is not None)
    for ri in range(len(recs) - 1, n_in - 1, -1):
        if any(o in used for o in recs[ri].outs):
            live[ri] = True
            used.update(r for r in recs[ri].ins if r is not None)
    return [ri for ri in range(len(recs)) if live[ri]]


def _group_records(recs, val_src, kept: list[int], n_in: int, fold: bool):
    """Alpa-style folding: (group, members) where group[record] = its group's head record and
    members[head] = the group's records in program order (see _fold_target for the rule)."""
    group = {ri: ri for ri in range(n_in)}   # record index -> head record index
    source: dict[int, bool] = {}             # op group without op-group predecessors
    pinned: dict[int, bool] = {}             # source group that must stay one (see _fold_target)
    for ri in kept[n_in:]:
        rec = recs[ri]
        in_groups = [group[val_src[r][0]] if r is not None else None for r in rec.ins]
        if fold and rec.prim in P.FOLDABLE and len(rec.outs) == 1:
            target = _fold_target(rec, in_groups, source, pinned, n_in)
            if target is not None:
                group[ri] = target
                continue
        group[ri] = ri
        source[ri] = all(g is None or g < n_in for g in in_groups)
        pinned[ri] = False
    members: dict[int, list[int]] = {}
    for ri in kept:
        members.setdefault(group[ri], []).append(ri)
    return group, members


def _toposort(preds: dict[int, set[int]]) -> list[int]:
    """Kahn's algorithm over group heads; ties broken by program position of the head."""
    import heapq
    succs: dict[int, list[int]] = {h: [] for h in preds}
    indeg = {h: len(p) for h, p in preds.items()}
    for h, ps in preds.items():
        for p in ps:
            succs[p].append(h)
    ready = [h for h, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        h = heapq.heappop(ready)
        out.append(h)
        for s in succs[h]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if len(out) != len(preds):  # pragma: no cover - the folding rule guarantees a DAG
        raise RuntimeError("internal: folded operator graph has a cycle")
    return out


def trace(fn, *args, fold: bool = True, name: str = "") -> OpGraph:
    """Trace ``fn(*args)`` into an OpGraph; see the module docstring for every convention."""
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
    roles_by_arg = _arg_roles(len(args))
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the graph build allocates many small objects and no cycles: ~2x faster without GC
    try:
        return _build_graph(closed, out_shape, args, leaves_with_path, roles_by_arg, fold, name)
    finally:
        if gc_was_enabled:
            gc.enable()


def _build_graph(closed, out_shape, args, leaves_with_path, roles_by_arg, fold, name) -> OpGraph:
    jaxpr = closed.jaxpr
    tr = _Tracer()
    in_refs, in_roles, in_paths = [], [], []
    for (path, _leaf), v in zip(leaves_with_path, jaxpr.invars):
        in_refs.append(tr.add("input", [], [], [tr.tensor(v.aval)], (), {}, 0.0)[0])
        in_roles.append(roles_by_arg[path[0].idx] if path and hasattr(path[0], "idx") else "other")
        in_paths.append(jax.tree_util.keystr(path))
    n_in = len(in_refs)
    out_refs = tr.flatten(closed, in_refs, ())

    recs, val_src = tr.recs, tr.val_src
    kept = _live_records(recs, out_refs, n_in)
    group, members = _group_records(recs, val_src, kept, n_in, fold)
    # values that leave their group, and the group graph
    exported: set[int] = set(r for r in out_refs if r is not None)
    preds: dict[int, set[int]] = {h: set() for h in members}
    for ri in kept:
        g = group[ri]
        for r in recs[ri].ins:
            if r is not None and group[val_src[r][0]] != g:
                exported.add(r)
                preds[g].add(group[val_src[r][0]])
    heads = _toposort(preds)   # inputs first, then program order of heads where dependencies allow
    node_id = {h: i for i, h in enumerate(heads)}
    val_loc: dict[int, tuple[int, int]] = {}
    node_outs: dict[int, list[int]] = {}
    for h in heads:
        if h < n_in:
            vids = list(recs[h].outs)
        else:
            vids = [o for ri in members[h] for o in recs[ri].outs if o in exported]
        node_outs[h] = vids
        for k, o in enumerate(vids):
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
        seen = set(o for o in operands if o[0] >= 0)
        fl, br, bw, fbp, folded, supported = 0.0, 0.0, 0.0, {}, [], True
        for ri in members[h]:
            m = recs[ri]
            if ri != h:
                folded.append(m.prim)
                for r, t in zip(m.ins, m.in_types):
                    if r is None or group[val_src[r][0]] == h:
                        continue
                    loc = val_loc[r]
                    if loc not in seen:
                        seen.add(loc)
                        operands.append(loc)
                        op_types.append(t)
            fl += m.flops
            br += P.bytes_read(m.in_types)
            bw += P.bytes_written(m.out_types)
            fbp[m.prim] = fbp.get(m.prim, 0.0) + m.flops
            supported = supported and m.supported
        params = dict(rec.params)
        params["name_stack"] = _raw_stack(rec.stack)
        if folded:
            params["num_head_operands"] = n_head
        role = "gradient" if _is_grad(rec.stack) else "activation"
        roles.append(role)
        op_roles = tuple(roles[o[0]] if o[0] >= 0 else "constant" for o in operands)
        nodes.append(Node(id=nid, primitive=rec.prim, operands=tuple(operands), operand_types=tuple(op_types),
                          outputs=outs, params=params, flops=fl, bytes_read=br, bytes_written=bw,
                          module_path=_module_path(rec.stack), operand_roles=op_roles, role=role,
                          folded=tuple(folded), flops_by_primitive=fbp, order=nid - n_in, supported=supported))

    outputs = tuple(val_loc[r] if r is not None else (-1, 0) for r in out_refs)
    in_leaves = [tr.val_type[r] for r in in_refs]
    out_leaves = [tr.tensor(v.aval) for v in jaxpr.outvars]
    aliases = _output_aliases(args, out_shape, in_leaves, out_leaves, roles_by_arg)
    return OpGraph(nodes=tuple(nodes), outputs=outputs, output_aliases=tuple(aliases),
                   num_eqns=len(kept) - n_in, num_nodes_unfolded=len(kept), name=name)


# ---- flat program for the runtime (runtime/core.py re-evaluates it with sharding constraints) ----
@dataclass
class FlatProgram:
    """The inlined program ``trace`` sees, in evaluable form, with each value's graph node.

    ``steps[i]`` = (kind, payload, ins, outs, const_vals): kind "input" (payload = flat input
    index), "eqn" (payload = the JAX equation; evaluate with ``payload.primitive.bind(*vals,
    **payload.params)``) or "synthetic" (payload = (primitive name, json params) of the slice /
    squeeze / broadcast_in_dim / concatenate records that unroll a scan). ``ins`` are value ids,
    None where the operand is a constant whose value is ``const_vals[k]`` (a literal, a closed-over
    constant, or a constant passed into an inlined call). ``outputs`` are the program's flat output
    value ids (None = constant ``output_consts[k]``). ``value_node[v]`` = (graph node id, output
    index) for every value the OpGraph exposes (node outputs), from the same DCE and folding as
    ``trace``; ``graph`` is that OpGraph (``trace(fn, *args, fold=fold)``).
    """

    steps: list
    outputs: list
    output_consts: list
    value_node: dict
    graph: OpGraph
    step_node: list = field(default_factory=list)   # per step: the graph node id of its group


class _CaptureTracer(_Tracer):
    """``_Tracer`` that also keeps each record's equation and the values of constant operands."""

    def __init__(self):
        super().__init__()
        self.rec_src: list = []        # per record: ("input", None) | ("eqn", eqn) | ("synthetic", None)
        self.rec_consts: list = []     # per record: values of operands whose ref is None
        self.cval: dict = {}           # jaxpr Var -> constant value (closed consts, constants passed in)
        self._eqns: list = []          # stack of (eqn, operand constant values)
        self._last_out_consts: list = []

    def const_of(self, a):
        if isinstance(a, jax.extend.core.Literal):
            return a.val
        return self.cval.get(a, _MISSING)

    def add(self, prim, ins, in_types, out_types, stack, params, flops, supported=True):
        if prim == "input" and not self._eqns:
            self.rec_src.append(("input", None))
            self.rec_consts.append([])
        elif params.get("synthetic"):
            self.rec_src.append(("synthetic", None))
            self.rec_consts.append([_MISSING] * len(ins))
        else:
            eqn, vals = self._eqns[-1]
            self.rec_src.append(("eqn", eqn))
            self.rec_consts.append(list(vals))
        return super().add(prim, ins, in_types, out_types, stack, params, flops, supported)

    def flatten(self, jaxpr, in_refs, prefix):
        if hasattr(jaxpr, "jaxpr") and hasattr(jaxpr, "consts"):
            for v, c in zip(jaxpr.jaxpr.constvars, jaxpr.consts):
                self.cval[v] = c
            inner = jaxpr.jaxpr
        else:
            inner = jaxpr
        if self._eqns:  # constants passed into an inlined call (or a scan body's consts / carry)
            eqn, vals = self._eqns[-1]
            nc = eqn.params.get("num_consts", 0) if eqn.primitive.name == "scan" else 0
            for k, (v, r) in enumerate(zip(inner.invars, in_refs)):
                if r is None and k < len(vals) and (eqn.primitive.name != "scan" or k < nc):
                    self.cval[v] = vals[k]
        outs = super().flatten(jaxpr, in_refs, prefix)
        self._last_out_consts = [self.const_of(a) if r is None else None for a, r in zip(inner.outvars, outs)]
        return outs

    def eqn(self, eqn, prim, ins, stack):
        vals = [self.const_of(a) if r is None else None for a, r in zip(eqn.invars, ins)]
        self._eqns.append((eqn, vals))
        try:
            outs = super().eqn(eqn, prim, ins, stack)
        finally:
            self._eqns.pop()
        if any(r is None for r in outs):  # an inlined call returned a constant
            for v, r, c in zip(eqn.outvars, outs, self._last_out_consts):
                if r is None:
                    self.cval[v] = c
        return outs


class _Missing:
    def __repr__(self):
        return "<constant not recovered>"


_MISSING = _Missing()


def flatten_program(fn, *args, fold: bool = True) -> FlatProgram:
    """The program ``trace(fn, *args, fold=fold)`` sees, as evaluable steps (see FlatProgram).

    The DCE and folding below replay ``trace``'s (same rules, same helpers); the result is checked
    against ``trace``'s own graph (node count, primitives, output types) and a mismatch raises.
    """
    graph = trace(fn, *args, fold=fold)
    closed = jax.make_jaxpr(fn)(*args)
    jaxpr = closed.jaxpr
    tr = _CaptureTracer()
    in_refs = [tr.add("input", [], [], [tr.tensor(v.aval)], (), {}, 0.0)[0] for v in jaxpr.invars]
    n_in = len(in_refs)
    out_refs = tr.flatten(closed, in_refs, ())
    out_consts = list(tr._last_out_consts)
    recs, val_src = tr.recs, tr.val_src
    kept = _live_records(recs, out_refs, n_in)
    group, members = _group_records(recs, val_src, kept, n_in, fold)
    exported = set(r for r in out_refs if r is not None)
    preds: dict[int, set[int]] = {h: set() for h in members}
    for ri in kept:
        for r in recs[ri].ins:
            if r is not None and group[val_src[r][0]] != group[ri]:
                exported.add(r)
                preds[group[ri]].add(group[val_src[r][0]])
    heads = _toposort(preds)
    value_node = {}
    for nid, h in enumerate(heads):
        vids = list(recs[h].outs) if h < n_in else [o for ri in members[h] for o in recs[ri].outs if o in exported]
        node = graph.nodes[nid] if nid < len(graph.nodes) else None
        prim = "input" if h < n_in else recs[h].prim
        if (node is None or node.primitive != prim
                or tuple(node.outputs) != tuple(tr.val_type[v] for v in vids)):
            raise RuntimeError(f"flatten_program: replay of trace's folding disagrees with trace at node {nid}")
        for k, v in enumerate(vids):
            value_node[v] = (nid, k)
    if len(heads) != len(graph.nodes):
        raise RuntimeError("flatten_program: replay of trace's folding gives a different node count")
    node_of_head = {h: nid for nid, h in enumerate(heads)}
    step_node = [node_of_head[group[ri]] for ri in kept]
    steps = []
    for ri in kept:
        kind, src = tr.rec_src[ri]
        rec = recs[ri]
        payload = ri if kind == "input" else src if kind == "eqn" else (rec.prim, rec.params)
        steps.append((kind, payload, list(rec.ins), list(rec.outs), tr.rec_consts[ri]))
    return FlatProgram(steps=steps, outputs=list(out_refs), output_consts=out_consts,
                       value_node=value_node, graph=graph, step_node=step_node)
