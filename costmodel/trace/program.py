"""``flatten_program(fn, *args)``: the program ``trace`` sees, as steps runtime/core.py evaluates.

``CaptureTracer`` is the walk's ``Tracer`` that also keeps each record's JAX equation and the values
of its constant operands; the steps are grouped by the same ``fold.group_program`` as the OpGraph.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Literal)

from costmodel.graph import OpGraph
from costmodel.trace.build import trace
from costmodel.trace.fold import group_program
from costmodel.trace.recompute import apply as recompute_records
from costmodel.trace.walk import Tracer


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


class CaptureTracer(Tracer):
    """``Tracer`` that also keeps each record's equation and the values of constant operands."""

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
        return self.cval.get(a, MISSING)

    def add(self, prim, ins, in_types, out_types, stack, params, flops, supported=True):
        if prim == "input" and not self._eqns:
            self.rec_src.append(("input", None))
            self.rec_consts.append([])
        elif params.get("synthetic"):
            self.rec_src.append(("synthetic", None))
            self.rec_consts.append([MISSING] * len(ins))
        else:
            eqn, vals = self._eqns[-1]
            self.rec_src.append(("eqn", eqn))
            self.rec_consts.append(list(vals))
        return super().add(prim, ins, in_types, out_types, stack, params, flops, supported)

    def clone_record(self, ri, ins):
        self.rec_src.append(self.rec_src[ri])
        self.rec_consts.append(self.rec_consts[ri])
        return super().clone_record(ri, ins)

    def reorder(self, order):
        self.rec_src = [self.rec_src[ri] for ri in order]
        self.rec_consts = [self.rec_consts[ri] for ri in order]
        super().reorder(order)

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


class Missing:
    def __repr__(self):
        return "<constant not recovered>"


MISSING = Missing()


def flatten_program(fn, *args, fold: bool = True, recompute: str | None = None) -> FlatProgram:
    """The program ``trace(fn, *args, fold=fold)`` sees, as evaluable steps (see FlatProgram).

    The DCE and folding are ``trace``'s (``fold.group_program``); the result is checked
    against ``trace``'s own graph (node count, primitives, output types) and a mismatch raises.
    """
    graph = trace(fn, *args, fold=fold, recompute=recompute)
    closed = jax.make_jaxpr(fn)(*args)
    jaxpr = closed.jaxpr
    tr = CaptureTracer()
    in_refs = [tr.add("input", [], [], [tr.tensor(v.aval)], (), {}, 0.0)[0] for v in jaxpr.invars]
    n_in = len(in_refs)
    out_refs = tr.flatten(closed, in_refs, ())
    out_consts = list(tr._last_out_consts)
    recompute_records(tr, n_in, recompute)
    recs, val_src = tr.recs, tr.val_src
    gp = group_program(recs, val_src, out_refs, n_in, fold)
    group, heads, kept = gp.group, gp.heads, gp.kept
    value_node = {}
    for nid, h in enumerate(heads):
        vids = gp.node_outs[h]
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
