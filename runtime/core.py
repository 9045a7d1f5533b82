"""Run a Plan for real: jax.jit + NamedSharding on a Mesh, numerics against the unsharded program,
and XLA's own memory and collective figures beside the cost model's.

``execute(fn, args, graph, plan)``:

1. builds the Mesh ``plan.mesh_shape`` x ``plan.axis_names`` (Auto axes: the plan's per-node specs
   are ``with_sharding_constraint`` hints) over the first prod(mesh_shape) devices;
2. shards every input leaf as ``plan.input_specs`` says (leaves without a spec are replicated);
   outputs that replace an input (``graph.output_aliases``: new params / new optimizer state) get
   that input's sharding, the others are replicated; params and optimizer state are donated;
3. when the plan has per-node specs, re-evaluates the traced program equation by equation
   (``costmodel.trace.flatten_program``) and pins each planned node's outputs with
   ``jax.lax.with_sharding_constraint`` (a spec that does not divide a dim is allowed: XLA pads);
4. compiles (``compile_time_s``), runs ``warmup`` + ``iters`` steps (``step_time_s`` = median of the
   timed steps), and compares every output leaf with a plain single-device ``jax.jit`` run;
5. reads ``compiled.memory_analysis()`` (per device) and the collectives of ``compiled.as_text()``
   (runtime/hlo.py), and prices the same plan with the cost model.

With ``jax.ShapeDtypeStruct`` args (``zoo.build(..., abstract=True)``) steps 1-3 and 5 run and step 4
stops after compiling: nothing is allocated (GPT-125M compiles in ~5-80 s under 4 GB RSS), and the
Report's numerics fields and step times are None (``compiled_only=True``).

Numerics (see DESIGN.md): ``max_rel_err`` is the largest per-leaf ‖sharded − ref‖₂ / ‖ref‖₂ (AdamW
turns 1e-9 gradient noise into lr-sized elementwise differences where |g| ~ eps, so an elementwise
relative error would be meaningless); ``max_abs_err`` is the largest elementwise |sharded − ref|;
the loss is compared on its own (``loss_abs_err``, ``loss_rel_err``). Parameters whose gradient is
exactly zero in exact arithmetic (attention key biases) get roundoff-only gradients that AdamW
scales to lr-sized steps: they are reported apart (``zero_grad_leaves``, ``zero_grad_rel_err``; see
``zero_gradient_leaves``) and left out of max_rel_err / max_abs_err.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from costmodel.graph import OpGraph
from costmodel.problem import Plan
from runtime import dist_fft, dist_gather
from runtime.hlo import parse_collectives, summarize
from shardgym.validate import constrain, is_key, plan_cluster

#: every equation of graph node i is traced under jax.named_scope(f"{NODE_SCOPE}{i}"), so an HLO
#: instruction's op_name metadata says which node it came from (shardgym/verify.py reads it).
NODE_SCOPE = "sg_node_"
CPU_DEVICES_HINT = ("run with XLA_FLAGS=--xla_force_host_platform_device_count={n} (set before jax is "
                    "imported) to get {n} virtual CPU devices")


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
    ``predicted_*`` are None when no Problem could be built for the plan.
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


# ---- mesh and shardings ----------------------------------------------------------------------
def make_mesh(plan: Plan, devices=None):
    """The plan's Mesh (Auto axes) over the first prod(mesh_shape) devices."""
    import jax
    shape, names = tuple(int(s) for s in plan.mesh_shape), tuple(plan.axis_names)
    if not shape or len(shape) != len(names):
        raise ValueError(f"plan has mesh_shape {shape} and axis_names {names}: give one name per mesh axis "
                         "(a plan made for an IOPDDL problem cannot be executed)")
    if len(set(names)) != len(names):
        raise ValueError(f"plan.axis_names {names} repeats an axis name")
    n = math.prod(shape)
    devs = list(devices) if devices is not None else jax.devices()
    if len(devs) < n:
        raise ValueError(f"plan needs {n} devices for mesh {dict(zip(names, shape))} but only {len(devs)} "
                         f"{devs[0].platform if devs else ''} devices are available; {CPU_DEVICES_HINT.format(n=n)}")
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
                         devices=devs[:n])


def _axes_of(entry) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def check_spec(spec, shape, axis_sizes: dict, where: str, require_divisible: bool = True) -> None:
    """ValueError unless ``spec`` fits an array of ``shape`` on a mesh with ``axis_sizes``."""
    if spec is None:
        return
    if len(spec) > len(shape):
        raise ValueError(f"{where}: spec {spec} has {len(spec)} entries but the array has shape {tuple(shape)}")
    used: set[str] = set()
    for d, entry in enumerate(spec):
        axes = _axes_of(entry)
        for a in axes:
            if a not in axis_sizes:
                raise ValueError(f"{where}: spec {spec} names mesh axis {a!r}, which is not one of "
                                 f"{tuple(axis_sizes)}")
            if a in used:
                raise ValueError(f"{where}: spec {spec} uses mesh axis {a!r} twice")
            used.add(a)
        k = math.prod(axis_sizes[a] for a in axes)
        if require_divisible and k > 1 and shape[d] % k:
            raise ValueError(f"{where}: dim {d} of size {shape[d]} does not divide by {k} "
                             f"(mesh axes {axes} of spec {spec}); pick a spec whose axes divide it")


def _pspec(spec):
    from jax.sharding import PartitionSpec as P
    return P() if spec is None else P(*spec)


def input_shardings(args, plan: Plan, mesh):
    """NamedSharding pytree for ``args`` from ``plan.input_specs`` (missing leaves: replicated);
    validates every spec against its leaf."""
    import jax
    from jax.sharding import NamedSharding
    leaves, treedef = jax.tree.flatten(args)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    specs: dict[int, tuple] = {}
    for idx, path, spec in plan.input_specs:
        if not 0 <= int(idx) < len(leaves):
            raise ValueError(f"plan input spec for {path!r} has flat index {idx}, but args have {len(leaves)} leaves")
        if is_key(leaves[idx]):   # PRNG keys are replicated whatever the plan says (validate.is_key)
            continue
        check_spec(spec, np.shape(leaves[idx]), sizes, f"input {paths[idx]} (plan path {path})")
        specs[int(idx)] = spec
    return jax.tree.unflatten(treedef, [NamedSharding(mesh, _pspec(specs.get(i))) for i in range(len(leaves))])


def _infer_aliases(args, out_shape) -> list[int | None]:
    """Without a graph: output subtree k replaces args[k] (k = 0, 1) when structure and shapes match."""
    import jax
    n_in = [len(jax.tree.leaves(a)) for a in args]
    offsets = np.concatenate([[0], np.cumsum(n_in)]).astype(int)
    aliases: list[int | None] = []
    outs = out_shape if isinstance(out_shape, (tuple, list)) else (out_shape,)
    for k, o in enumerate(outs):
        ol = jax.tree.leaves(o)
        same = (k < min(2, len(args)) and jax.tree.structure(o) == jax.tree.structure(args[k])
                and all(np.shape(a) == b.shape for a, b in zip(jax.tree.leaves(args[k]), ol)))
        aliases += [int(offsets[k] + j) for j in range(len(ol))] if same else [None] * len(ol)
    return aliases


def output_shardings(fn, args, graph: OpGraph | None, in_sh, mesh):
    """Outputs aliasing an input get that input's sharding; the others are replicated."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    out_shape = jax.eval_shape(fn, *args)
    leaves, treedef = jax.tree.flatten(out_shape)
    if graph is not None and len(graph.output_aliases) == len(leaves):
        aliases = list(graph.output_aliases)
    else:
        aliases = _infer_aliases(args, out_shape)
    in_leaves = jax.tree.leaves(in_sh)
    rep = NamedSharding(mesh, P())
    sh = []
    for i, a in enumerate(leaves):
        j = aliases[i] if i < len(aliases) else None
        ok = j is not None and 0 <= j < len(in_leaves)
        sh.append(in_leaves[j] if ok else rep)
    return jax.tree.unflatten(treedef, sh), out_shape


# ---- numerics ------------------------------------------------------------------------------
ZERO_GRAD_RTOL = 1e-6


def _leaf_suffix(path: str) -> str:
    """The parameter part of an output path: ``[1][0].mu['block_0']['w']`` -> ``['block_0']['w']``."""
    i = path.find("['")
    return path[i:] if i >= 0 else path


def zero_gradient_leaves(ref, paths: list[str]) -> set[str]:
    """Parameter suffixes whose gradient is numerically zero in the reference run.

    Detected from the AdamW first moment (optax's ``mu``, the zoo's optimizer): a parameter whose
    ``mu`` leaf has ‖mu‖₂ <= ZERO_GRAD_RTOL x the largest ‖mu‖₂ of any leaf got a gradient made of
    roundoff only (e.g. an attention key bias: softmax is invariant to adding the same q·b_k to
    every logit of a row, so ∂loss/∂b_k = 0 exactly). AdamW normalises that roundoff to lr-sized
    steps, so such a leaf (its param, mu and nu) differs between any two correct programs by O(1)
    relative; its error is reported apart (``zero_grad_rel_err``) and not in ``max_rel_err``.
    Without ``mu`` leaves in the outputs the set is empty.
    """
    mu = {}
    for b, p in zip(ref, paths):
        if ".mu[" in p or p.endswith(".mu"):
            arr = np.asarray(b, dtype=np.float64)
            mu[_leaf_suffix(p)] = float(np.linalg.norm(arr)) if arr.size else 0.0
    if not mu:
        return set()
    top = max(mu.values())
    return {k for k, v in mu.items() if top > 0 and v <= ZERO_GRAD_RTOL * top}


def compare(out, ref, paths: list[str], exclude: set[str] = frozenset()) -> tuple[float, float, str, float]:
    """(max_abs_err, max_rel_err, worst leaf path, zero_grad_rel_err) over matching leaves: rel err
    of a leaf = ‖out − ref‖₂ / ‖ref‖₂ (‖out − ref‖₂ when ‖ref‖₂ = 0); leaves whose parameter suffix
    is in ``exclude`` count only towards zero_grad_rel_err (see zero_gradient_leaves)."""
    max_abs, max_rel, worst, zero_rel = 0.0, 0.0, "", 0.0
    for a, b, p in zip(out, ref, paths):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"output {p}: sharded shape {a.shape} differs from reference {b.shape}")
        if a.size == 0:
            continue
        d = a - b
        ab = float(np.max(np.abs(d)))
        nb = float(np.linalg.norm(b))
        rel = float(np.linalg.norm(d)) / nb if nb > 0 else float(np.linalg.norm(d))
        if not np.isfinite(ab) or not np.isfinite(rel):
            ab = rel = float("inf")
        if _leaf_suffix(p) in exclude:
            zero_rel = max(zero_rel, rel)
            continue
        max_abs = max(max_abs, ab)
        if rel > max_rel or not worst:
            max_rel, worst = rel, p
    return max_abs, max_rel, worst, zero_rel


def _loss_index(out_shape) -> int | None:
    """Flat index of the loss: output [2] of the zoo's (params, opt_state, loss) convention, else
    the last scalar output."""
    import jax
    leaves = jax.tree.leaves(out_shape)
    if isinstance(out_shape, (tuple, list)) and len(out_shape) == 3 and len(jax.tree.leaves(out_shape[2])) == 1:
        return len(jax.tree.leaves(out_shape[0])) + len(jax.tree.leaves(out_shape[1]))
    for i in range(len(leaves) - 1, -1, -1):
        if leaves[i].shape == ():
            return i
    return None


# ---- the cost model's view -------------------------------------------------------------------
def predict(graph: OpGraph | None, plan: Plan, problem=None) -> tuple[float | None, float | None, list[dict], list[str]]:
    """(predicted peak memory bytes/device, predicted comm bytes/device, per-kind predicted
    collectives, notes) for ``plan`` under the cost model (``problem``, or one built from ``graph``
    on the preset named by ``plan.meta['cluster']``)."""
    notes: list[str] = []
    cluster_name = (problem.meta.cluster_name if problem is not None and problem.meta is not None
                    else (plan.meta or {}).get("cluster"))
    if problem is None:
        if graph is None or not cluster_name:
            return None, None, [], ["no Problem given and none buildable (needs graph and plan.meta['cluster'])"]
        try:
            from costmodel.builder import build_problem
            problem = build_problem(graph, plan_cluster(plan), memory_cap_bytes=(plan.meta or {}).get("memory_cap_bytes"))
        except (ImportError, ValueError) as exc:
            return None, None, [], [f"cost model unavailable: {type(exc).__name__}: {exc}"]
    if len(plan.strategies) != problem.num_nodes:
        return None, None, [], [f"plan has {len(plan.strategies)} strategies, problem {problem.num_nodes} nodes: "
                                "no prediction"]
    from costmodel.problem import evaluate
    cost = evaluate(problem, plan)
    kinds = []
    if graph is not None and cluster_name:
        try:
            kinds = predicted_collectives(graph, problem, plan, plan_cluster(plan) if plan.meta else cluster_name)
        except (ImportError, ValueError, KeyError) as exc:
            notes.append(f"no per-kind prediction ({type(exc).__name__}: {exc}); total comm bytes only")
    return float(cost.peak_memory_bytes), float(cost.comm_bytes), kinds, notes


def predicted_collectives(graph: OpGraph, problem, plan: Plan, cluster) -> list[dict]:
    """The cost model's collectives for ``plan``, per kind: {kind, count, wire_bytes} where
    wire_bytes = bytes sent per device (``costmodel.cost.collective``, the same ring formulas as
    hlo.py's wire_bytes). Node collectives come per kind from the chosen strategies
    (``costmodel.builder.strategies_of``); the resharding on edges is one row of kind
    ``"resharding"`` (the cost model prices it as all-gathers and all-to-alls without exposing the
    split), count = edges that move bytes."""
    from costmodel.builder import strategies_of
    from costmodel.cluster import Cluster
    from costmodel.cost import COLLECTIVES, Mesh, lowered_kind, node_collective
    cluster = cluster if isinstance(cluster, Cluster) else Cluster.preset(cluster)
    strats = strategies_of(graph, cluster, space=getattr(problem.meta, "space", None))
    k = problem.num_strategies
    if len(strats) != problem.num_nodes or any(len(st) != int(n) for st, n in zip(strats, k)):
        raise ValueError("strategies_of disagrees with the Problem's strategy counts")
    mesh = Mesh(cluster)
    s = np.asarray(plan.strategies, dtype=int)
    acc: dict[str, dict] = {}
    for i, si in enumerate(s):
        for kind, axes, B in strats[i][si].collectives:
            _, sent, _ = node_collective(kind, axes, B, mesh)
            kind = lowered_kind(kind, mesh)  # as the backend runs it (CPU: no reduce-scatter)
            d = acc.setdefault(kind, {"kind": kind, "count": 0, "wire_bytes": 0.0})
            d["count"] += 1
            d["wire_bytes"] += sent
    rows = [acc[kd] for kd in COLLECTIVES if kd in acc]
    if problem.num_edges:
        u, v = problem.edges[:, 0], problem.edges[:, 1]
        eidx = problem.edge_offsets[:-1] + s[u] * k[v] + s[v]
        eb = problem.edge_comm_bytes[eidx]
        if eb.sum() > 0:
            rows.append({"kind": "resharding", "count": int((eb > 0).sum()), "wire_bytes": float(eb.sum())})
    return rows


# ---- the sharded program ---------------------------------------------------------------------
def constrained_fn(fn, args, graph: OpGraph | None, plan: Plan, mesh, problem=None):
    """``fn`` itself when the plan has no per-node specs; otherwise a function that re-evaluates the
    traced program with a sharding constraint on every output of each planned node (and, given the
    plan's Problem, on each operand as the chosen strategy takes it). Returns (function, number of
    constraints)."""
    if not plan.node_specs:
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
    import jax
    from jax.sharding import NamedSharding

    from costmodel.trace import flatten_program

    flat = _cached(("flat", fn, args), lambda: flatten_program(fn, *args))
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
            sharding_of[v] = NamedSharding(mesh, _pspec(spec))
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
                    op_sharding[(nid, v)] = NamedSharding(mesh, _pspec(ops[k]))
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
    import jax.numpy as jnp
    if all(e is None for e in sharding.spec) or x.ndim == 0:
        return x
    n = x.shape[-1]
    return jnp.matmul(x, jnp.eye(n, dtype=x.dtype), precision="highest")


def _is_missing(x) -> bool:
    return type(x).__name__ == "_Missing"


def _eval_step(kind, payload, ops) -> list:
    import jax
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
    raise ValueError(f"runtime: unknown synthetic step {prim!r}")


_CACHE: dict = {}
_CACHE_SIZE = 4


def _cached(key, make):
    """Memo for the unsharded reference run and the flat program, keyed on the identity of fn and
    of every arg leaf (the objects are kept alive in the entry, so ids cannot be reused); the
    last _CACHE_SIZE entries are kept. Lets several plans of one model share them."""
    import jax
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


def _reference(fn, host_args, dev0):
    """Outputs (host arrays) and step time of plain ``jax.jit(fn)`` on one device."""
    import jax
    ref_jit = jax.jit(fn)
    ref_args = jax.device_put(host_args, dev0)
    _block(ref_jit(*ref_args))
    t = time.perf_counter()
    ref_out = _block(ref_jit(*ref_args))
    ref_step = time.perf_counter() - t
    return [np.asarray(x) for x in jax.tree.leaves(ref_out)], ref_step


def _block(x):
    import jax
    return jax.block_until_ready(x)


def execute(fn, args, graph: OpGraph | None, plan: Plan, check: bool = True, donate: bool = True,
            warmup: int = 1, iters: int = 3, problem=None, devices=None,
            constrain_operands: bool = True, compiler_options: dict | None = None) -> Report:
    """Run ``fn(*args)`` sharded as ``plan`` says; see the module docstring. ``compiler_options``
    go to XLA's compile (e.g. ``{"xla_dump_to": DIR}`` for its buffer assignment)."""
    import jax

    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    if not isinstance(args, (tuple, list)):
        raise ValueError("args must be the tuple of positional arguments of fn, e.g. (params, opt_state, batch)")
    args = tuple(args)
    leaves = jax.tree.leaves(args)
    abstract = any(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    if abstract and not all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
        raise ValueError("execute: args mix arrays and ShapeDtypeStructs; give all real arrays (to run) or all "
                         "ShapeDtypeStructs (to compile only), e.g. zoo.build(..., abstract=True)")
    mesh = make_mesh(plan, devices)
    in_sh = input_shardings(args, plan, mesh)
    out_sh, out_shape = output_shardings(fn, args, graph, in_sh, mesh)
    if problem is None and plan.node_specs and graph is not None and (plan.meta or {}).get("cluster"):
        try:
            from costmodel.builder import build_problem
            problem = build_problem(graph, plan_cluster(plan), memory_cap_bytes=plan.meta.get("memory_cap_bytes"))
        except (ImportError, ValueError):
            problem = None
    run_fn, n_constraints = constrained_fn(fn, args, graph, plan, mesh, problem if constrain_operands else None)

    donate_argnums = tuple(i for i in (0, 1) if i < len(args)) if donate else ()
    jitted = jax.jit(run_fn, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=donate_argnums)

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        compiled = jitted.lower(*args).compile(compiler_options=compiler_options)
    compile_time_s = time.perf_counter() - t0
    mem, coll_list = xla_figures(compiled, math.prod(plan.mesh_shape))
    pred_mem, pred_comm, pred_colls, notes = predict(graph, plan, problem)
    common = dict(
        xla_memory_bytes=mem["total"], xla_peak_memory_bytes=mem["peak"], xla_memory_breakdown=mem["breakdown"],
        predicted_memory_bytes=pred_mem, collectives=tuple(summarize(coll_list)),
        collective_list=tuple(c.to_dict() for c in coll_list), collective_bytes=float(sum(c.bytes * c.count for c in coll_list)),
        collective_wire_bytes=float(sum(c.wire_bytes * c.count for c in coll_list)),
        predicted_collectives=tuple(pred_colls), predicted_comm_bytes=pred_comm, compile_time_s=compile_time_s,
        mesh_shape=tuple(plan.mesh_shape), axis_names=tuple(plan.axis_names), num_constraints=n_constraints,
        method=plan.method, notes=tuple(notes))
    if abstract:  # compile-only: nothing was allocated, nothing runs
        return Report(max_abs_err=None, max_rel_err=None, zero_grad_rel_err=None, zero_grad_leaves=(),
                      loss_abs_err=None, loss_rel_err=None, loss=None, ref_loss=None, worst_leaf="",
                      step_time_s=None, ref_step_time_s=None, compiled_only=True, **common)
    host_args = jax.tree.map(lambda x: x if is_key(x) else np.asarray(x), args)  # donation invalidates buffers: keep a copy

    def run_once():
        placed = _block(jax.device_put(host_args, in_sh))
        t = time.perf_counter()
        out = _block(compiled(*placed))
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
    li = _loss_index(out_shape)
    max_abs = max_rel = loss_abs = loss_rel = ref_step = float("nan")
    loss = ref_loss = float(out_host[li]) if li is not None else float("nan")
    worst, zero_grad, zero_rel = "", set(), float("nan")
    if check:
        dev0 = jax.devices()[0] if devices is None else list(devices)[0]
        ref_host, ref_step = _cached(("ref", fn, args, dev0), lambda: _reference(fn, host_args, dev0))
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
