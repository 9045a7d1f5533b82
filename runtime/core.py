"""Run a Plan for real: jax.jit + NamedSharding on a Mesh, numerics against the unsharded program,
and XLA's own memory and collective figures beside the cost model's.

``execute(fn, args, graph, plan)``:

1. builds the Mesh ``plan.mesh_shape`` x ``plan.axis_names`` (Auto axes: the plan's per-node specs
   are ``with_sharding_constraint`` hints) over the first prod(mesh_shape) devices;
2. shards every input leaf as ``plan.input_specs`` says (leaves without a spec are replicated);
   outputs that replace an input (``graph.output_aliases``: new params / new optimizer state) get
   that input's sharding, the others are replicated; every argument an output replaces is donated;
3. when the plan has per-node specs, re-evaluates the traced program equation by equation
   (``costmodel.trace.flatten_program``) and pins each planned node's outputs with
   ``jax.lax.with_sharding_constraint`` (a spec that does not divide a dim is allowed: XLA pads);
4. compiles (``compile_time_s``), runs ``warmup`` + ``iters`` steps (``step_time_s`` = median of the
   timed steps), and compares every output leaf with a plain single-device ``jax.jit`` run;
5. reads ``compiled.memory_analysis()`` (per device) and the collectives of ``compiled.as_text()``
   (runtime/hlo.py), and prices the same plan with the cost model.

With ``jax.ShapeDtypeStruct`` args (``zoo.build(..., abstract=True)``) steps 1-3 and 5 run and step 4
stops after compiling: nothing is allocated (GPT-125M compiles in ~5-80 s under 4 GB RSS), and the
Report's numerics fields and step times are None (``compiled_only=True``). Integer leaves may be
real arrays beside them (``zoo.build(..., abstract=True, real_indices=True)``): a halo plan's
exchanges are built from the real index arrays, and the program is still only compiled.

The jobs live apart: ``runtime.shardings`` (mesh, input/output shardings, PRNG keys),
``runtime.program`` (the constrained program), ``runtime.numerics`` (the comparison with the
unsharded run, see its docstring), ``runtime.prediction`` (the Problem a plan file means, with its
cluster and cap, and the cost model's figures), ``runtime.hlo`` (collectives in the compiled HLO).
This module runs them in order and reports (``Report``).
"""
from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field

import jax
import numpy as np

from costmodel.graph import OpGraph
from costmodel.problem import Plan
from runtime.hlo import parse_collectives, summarize
from runtime.numerics import block, compare, loss_index, reference, zero_gradient_leaves
from runtime.prediction import plan_problem, predict
from runtime.program import NODE_SCOPE, cached, constrained_fn
from runtime.shardings import donated_args, input_shardings, is_key, make_mesh, output_shardings

__all__ = ["NODE_SCOPE", "Report", "execute", "xla_figures"]


@dataclass(frozen=True)
class Report:
    """What one sharded run measured (bytes are per device, times in seconds).
    ``xla_memory_bytes`` = argument + output − alias + temp bytes of ``compiled.memory_analysis()``;
    ``xla_peak_memory_bytes`` = its ``peak_memory_in_bytes`` (can be below temp on CPU).
    ``collectives``: per kind {kind, count, bytes, wire_bytes, group_sizes} (runtime/hlo.py);
    ``collective_wire_bytes`` (bytes each device sends, ring formulas) is what compares with
    ``predicted_comm_bytes`` (the cost model's node collectives + resharding, same formulas);
    ``predicted_collectives``: per kind {kind, count, wire_bytes} (see predicted_collectives).
    ``collective_list``: every collective instruction (hlo.Collective as a dict, with op_name).
    ``predicted_*`` are None when no Problem could be built for the plan; they are priced on the
    plan's own Problem (``runtime.prediction.plan_problem``: its cluster and its cap) unless
    ``execute`` is given one. ``predicted_step_time_s``: the modelled step time there;
    ``predicted_cap_bytes``: that Problem's effective memory cap; ``predicted_cluster``: its name.
    ``compiled_only``: the args were ``jax.ShapeDtypeStruct``s, so the plan was lowered and compiled
    without allocating anything; the numerics fields and step times are then None.
    """
    max_abs_err: float | None
    max_rel_err: float | None
    zero_grad_rel_err: float | None
    zero_grad_leaves: tuple
    loss_abs_err: float | None
    loss_rel_err: float | None
    loss: float | None
    ref_loss: float | None
    worst_leaf: str
    xla_memory_bytes: float
    xla_peak_memory_bytes: float
    xla_memory_breakdown: dict
    predicted_memory_bytes: float | None
    collectives: tuple
    collective_list: tuple
    collective_bytes: float
    collective_wire_bytes: float
    predicted_collectives: tuple
    predicted_comm_bytes: float | None
    compile_time_s: float
    step_time_s: float | None
    ref_step_time_s: float | None
    mesh_shape: tuple
    axis_names: tuple
    num_constraints: int
    method: str = ""
    notes: tuple = field(default_factory=tuple)
    compiled_only: bool = False
    predicted_step_time_s: float | None = None
    predicted_cap_bytes: float | None = None
    predicted_cluster: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["collectives"] = [dict(c) for c in self.collectives]
        d["collective_list"] = [dict(c) for c in self.collective_list]
        d["predicted_collectives"] = [dict(c) for c in self.predicted_collectives]
        return d

    def summary(self) -> str:
        mb = 1 / 2**20
        pred_mem = "n/a" if self.predicted_memory_bytes is None else f"{self.predicted_memory_bytes * mb:.3f} MiB"
        pred_comm = "n/a" if self.predicted_comm_bytes is None else f"{self.predicted_comm_bytes * mb:.3f} MiB"
        coll = ", ".join(f"{c['kind']} x{c['count']} {c['wire_bytes'] * mb:.3f} MiB" for c in self.collectives) or "none"
        pcoll = ", ".join(f"{c['kind']} x{c['count']} {c['wire_bytes'] * mb:.3f} MiB"
                          for c in self.predicted_collectives) or "none"
        numerics = ("numerics: not run (compiled only, from ShapeDtypeStructs)" if self.compiled_only else
                    f"numerics: loss {self.loss:.6g} (ref {self.ref_loss:.6g}, |d| {self.loss_abs_err:.2e}), "
                    f"max_rel_err {self.max_rel_err:.2e} ({self.worst_leaf}), max_abs_err {self.max_abs_err:.2e}"
                    + (f"; {len(self.zero_grad_leaves)} zero-gradient params (rel err {self.zero_grad_rel_err:.2g}, "
                       "not counted)" if self.zero_grad_leaves else ""))
        timing = (f"compile {self.compile_time_s:.2f} s" if self.step_time_s is None else
                  f"compile {self.compile_time_s:.2f} s, step {self.step_time_s * 1e3:.2f} ms"
                  + ("" if self.ref_step_time_s is None else f" (unsharded {self.ref_step_time_s * 1e3:.2f} ms)"))
        lines = [
            f"plan {self.method or '?'} on mesh {dict(zip(self.axis_names, self.mesh_shape))}, "
            f"{self.num_constraints} sharding constraints",
            numerics,
            f"memory/device: XLA {self.xla_memory_bytes * mb:.3f} MiB (peak {self.xla_peak_memory_bytes * mb:.3f}), "
            f"predicted {pred_mem}",
            f"collectives (bytes sent/device): XLA {coll}; total {self.collective_wire_bytes * mb:.3f} MiB",
            f"predicted: {pcoll}; total {pred_comm}",
            timing,
        ]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)



def execute(fn, args, graph: OpGraph | None, plan: Plan, check: bool = True, donate: bool = True,
            warmup: int = 1, iters: int = 3, problem=None, devices=None,
            constrain_operands: bool = True, compiler_options: dict | None = None) -> Report:
    """Run ``fn(*args)`` sharded as ``plan`` says; see the module docstring. ``compiler_options``
    go to XLA's compile (e.g. ``{"xla_dump_to": DIR}`` for its buffer assignment)."""
    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    if not isinstance(args, (tuple, list)):
        raise ValueError("args must be the tuple of positional arguments of fn, e.g. (params, opt_state, batch)")
    args = tuple(args)
    leaves = jax.tree.leaves(args)
    abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    if abstract and not all(isinstance(x, jax.ShapeDtypeStruct) or (hasattr(x, "dtype") and np.issubdtype(x.dtype, np.integer))
                           for x in leaves):
        raise ValueError("execute: args mix arrays and ShapeDtypeStructs; give all real arrays (to run) or all "
                         "ShapeDtypeStructs but integer index arrays (to compile only), e.g. zoo.build(..., "
                         "abstract=True)")
    mesh = make_mesh(plan, devices)
    in_sh = input_shardings(args, plan, mesh)
    out_sh, out_shape = output_shardings(fn, args, graph, in_sh, mesh)
    if problem is None and plan.node_specs and graph is not None and (plan.meta or {}).get("cluster"):
        try:
            problem = plan_problem(graph, plan)
        except ValueError:
            problem = None
    run_fn, n_constraints = constrained_fn(fn, args, graph, plan, mesh, problem if constrain_operands else None)

    donate_argnums = donated_args(args, graph) if donate else ()
    jitted = jax.jit(run_fn, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=donate_argnums)

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        shapes = jax.tree.map(lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(
            x.shape, x.dtype), args) if abstract else args   # real index arrays (halo plans) are lowered as shapes
        compiled = jitted.lower(*shapes).compile(compiler_options=compiler_options)
    compile_time_s = time.perf_counter() - t0
    mem, coll_list = xla_figures(compiled, math.prod(plan.mesh_shape))
    pred = predict(graph, plan, problem)
    common = dict(
        xla_memory_bytes=mem["total"], xla_peak_memory_bytes=mem["peak"], xla_memory_breakdown=mem["breakdown"],
        predicted_memory_bytes=pred.memory_bytes, collectives=tuple(summarize(coll_list)),
        collective_list=tuple(c.to_dict() for c in coll_list), collective_bytes=float(sum(c.bytes * c.count for c in coll_list)),
        collective_wire_bytes=float(sum(c.wire_bytes * c.count for c in coll_list)),
        predicted_collectives=pred.collectives, predicted_comm_bytes=pred.comm_bytes, compile_time_s=compile_time_s,
        mesh_shape=tuple(plan.mesh_shape), axis_names=tuple(plan.axis_names), num_constraints=n_constraints,
        method=plan.method, notes=pred.notes, predicted_step_time_s=pred.step_time_s,
        predicted_cap_bytes=pred.cap_bytes, predicted_cluster=pred.cluster)
    if abstract:  # compile-only: nothing was allocated, nothing runs
        return Report(max_abs_err=None, max_rel_err=None, zero_grad_rel_err=None, zero_grad_leaves=(),
                      loss_abs_err=None, loss_rel_err=None, loss=None, ref_loss=None, worst_leaf="",
                      step_time_s=None, ref_step_time_s=None, compiled_only=True, **common)
    host_args = jax.tree.map(lambda x: x if is_key(x) else np.asarray(x), args)  # donation invalidates buffers: keep a copy

    def run_once():
        placed = block(jax.device_put(host_args, in_sh))
        t = time.perf_counter()
        out = block(compiled(*placed))
        return out, time.perf_counter() - t

    out, _ = run_once()
    out_host = [np.asarray(x) for x in jax.tree.leaves(out)]
    del out
    times = []
    for i in range(warmup + iters):
        o, dt = run_once()
        del o
        if i >= warmup:
            times.append(dt)
    step_time_s = statistics.median(times)

    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]]
    li = loss_index(out_shape)
    max_abs = max_rel = loss_abs = loss_rel = ref_step = float("nan")
    loss = ref_loss = float(out_host[li]) if li is not None else float("nan")
    worst, zero_grad, zero_rel = "", set(), float("nan")
    if check:
        dev0 = jax.devices()[0] if devices is None else list(devices)[0]
        ref_host, ref_step = cached(("ref", fn, args, dev0), lambda: reference(fn, host_args, dev0))
        zero_grad = zero_gradient_leaves(ref_host, paths)
        max_abs, max_rel, worst, zero_rel = compare(out_host, ref_host, paths, zero_grad)
        if li is not None:
            ref_loss = float(ref_host[li])
            loss_abs = abs(loss - ref_loss)
            loss_rel = loss_abs / abs(ref_loss) if ref_loss else loss_abs

    return Report(
        max_abs_err=max_abs, max_rel_err=max_rel, zero_grad_rel_err=zero_rel,
        zero_grad_leaves=tuple(sorted(zero_grad)), loss_abs_err=loss_abs, loss_rel_err=loss_rel,
        loss=loss, ref_loss=ref_loss, worst_leaf=worst, step_time_s=step_time_s, ref_step_time_s=ref_step, **common)


def xla_figures(compiled, num_devices: int) -> tuple[dict, list]:
    """XLA's view of a compiled program: ({"total": argument + output − alias + temp bytes,
    "peak": peak_memory_in_bytes, "breakdown": {argument, output, alias, temp}}, every collective
    (runtime.hlo.Collective)), per device."""
    ma = compiled.memory_analysis()
    breakdown = {k: float(getattr(ma, k + "_size_in_bytes", 0) or 0) for k in ("argument", "output", "alias", "temp")}
    total = breakdown["argument"] + breakdown["output"] - breakdown["alias"] + breakdown["temp"]
    mem = {"total": total, "peak": float(getattr(ma, "peak_memory_in_bytes", 0) or 0), "breakdown": breakdown}
    return mem, parse_collectives(compiled.as_text(), num_devices=num_devices)
