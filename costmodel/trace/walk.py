"""The jaxpr walk of ``costmodel.trace``: one record per primitive application, after inlining.

``Tracer.flatten`` appends a ``Rec`` (primitive, operand / result value ids and types, name stack,
FLOPs from ``costmodel.primitives.flops``, json params) for every equation of a jaxpr, inlining
call-like primitives (``primitives.INLINE``), unrolling ``scan`` with 1 <= length <=
``SCAN_UNROLL_MAX`` (synthetic slice / squeeze per step, broadcast_in_dim + concatenate per stacked
output) and turning longer scans, ``while`` and ``cond`` into one replicate-only record each (costs
in costmodel.trace's docstring). A differentiated ``remat2`` with ``prevent_cse`` gets a synthetic
``optimization_barrier`` record on its operands before its body is inlined (``Tracer.remat_barrier``).
A primitive without a cost rule stays a record with ``supported=False`` and is warned about once
per trace.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Literal)

from costmodel import primitives as P
from costmodel.graph import Tensor

SCAN_UNROLL_MAX = 64
CONTROL = ("scan", "while", "cond")


@dataclass
class Rec:
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


class Tracer:
    def __init__(self):
        self.recs: list[Rec] = []
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
        self.recs.append(Rec(prim, list(ins), list(in_types), outs, list(out_types), stack, flops,
                              params, supported))
        return outs

    def clone_record(self, ri, ins) -> list[int]:
        """Append a copy of record ``ri`` reading ``ins`` (costmodel.trace.recompute); its results."""
        r = self.recs[ri]
        return Tracer.add(self, r.prim, ins, r.in_types, r.out_types, r.stack, {**r.params, "recomputed": True},
                          r.flops, r.supported)

    def reorder(self, order: list[int]) -> None:
        """Put the records in ``order`` (a permutation of their indices that is a program order)."""
        self.recs = [self.recs[ri] for ri in order]
        at = {ri: k for k, ri in enumerate(order)}
        self.val_src = [(at[ri], k) for ri, k in self.val_src]

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
                return self.flatten(sub, self.remat_barrier(eqn, prim, ins, stack), stack)
        if prim == "scan" and 1 <= params["length"] <= SCAN_UNROLL_MAX:
            return self.unroll_scan(eqn, ins, stack)
        in_types = self.in_types_of(eqn, ins)
        out_types = [self.tensor(v.aval) for v in eqn.outvars]
        jp = P.json_params(prim, params)
        if prim in CONTROL:
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

    def remat_barrier(self, eqn, prim, ins, stack) -> list:
        """``ins`` with the operands of a differentiated ``remat2`` / ``checkpoint`` (the backward
        pass's recomputation) that has ``prevent_cse`` passed through one synthetic
        ``optimization_barrier`` record, as JAX's own lowering of it does (ad_checkpoint's
        ``_remat_lowering``): without it XLA may CSE the recomputation with the forward pass and
        keep the forward's activations, and the recomputation saves nothing. Other calls: ``ins``.

        Unlike JAX's lowering, program inputs (parameters) stay out of the barrier: nothing computed
        from them alone is a saved activation, and in one barrier node with the activations a
        parameter of another shape would be replicated by the node's iteration space (gpt
        ``remat_mlp``: fc2's kernel [f, d] with fc1's output [B, T, f]). The operands are ordered
        largest first (stable), so the space is the largest operand's."""
        p = eqn.params
        cse = p.get("prevent_cse", False)
        if prim not in ("remat2", "checkpoint") or not p.get("differentiated") or not any(
                cse if isinstance(cse, tuple) else (cse,)):
            return ins
        cse = cse if isinstance(cse, tuple) else (cse,) * len(ins)
        pick = [k for k, r in enumerate(ins)
                if r is not None and cse[k] and self.recs[self.val_src[r][0]].prim != "input"]
        # largest first: the node's iteration space is its first output's, the others align to it
        pick.sort(key=lambda k: -P.size_of(self.val_type[ins[k]]))
        if not pick:
            return ins
        types = [self.val_type[ins[k]] for k in pick]
        outs = self.add("optimization_barrier", [ins[k] for k in pick], types, types, stack,
                        {"synthetic": "remat"}, 0.0)
        ins = list(ins)
        for k, o in zip(pick, outs):
            ins[k] = o
        return ins

    def body_flops(self, closed) -> float:
        sub = Tracer()
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

