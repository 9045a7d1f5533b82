"""Meshes and shardings of a Plan: the Mesh, every input's NamedSharding (validated), every
output's, and the one rule for PRNG keys (``is_key``: planned and run replicated) and for the
sharding constraints the constrained program puts on values (``constrain``).

``make_mesh`` builds Auto axes (``jax.make_mesh`` defaults to Explicit ones, DESIGN.md): the
plan's per-node specs are ``with_sharding_constraint`` hints XLA propagates.
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from costmodel.graph import OpGraph
from costmodel.problem import Plan

CPU_DEVICES_HINT = ("run with XLA_FLAGS=--xla_force_host_platform_device_count={n} (set before jax is "
                    "imported) to get {n} virtual CPU devices")


def is_key(x) -> bool:
    """A typed PRNG key array (``jax.random.key``): planned and run replicated, never constrained."""
    dt = getattr(x, "dtype", None)
    return dt is not None and jax.dtypes.issubdtype(dt, jax.dtypes.prng_key)


def constrain(x, sharding):
    """``with_sharding_constraint(x, sharding)``, except for PRNG keys and values of lower rank than
    the spec (a key's trace-time view is its uint32 key data, one dim more): those are left to XLA."""
    if is_key(x) or len(sharding.spec) > getattr(x, "ndim", 0):
        return x
    return jax.lax.with_sharding_constraint(x, sharding)


def make_mesh(plan: Plan, devices=None):
    """The plan's Mesh (Auto axes) over the first prod(mesh_shape) devices."""
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


def pspec(spec):
    return P() if spec is None else P(*spec)


def input_shardings(args, plan: Plan, mesh):
    """NamedSharding pytree for ``args`` from ``plan.input_specs`` (missing leaves: replicated);
    validates every spec against its leaf."""
    leaves, treedef = jax.tree.flatten(args)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    specs: dict[int, tuple] = {}
    for idx, path, spec in plan.input_specs:
        if not 0 <= int(idx) < len(leaves):
            raise ValueError(f"plan input spec for {path!r} has flat index {idx}, but args have {len(leaves)} leaves")
        if is_key(leaves[idx]):   # PRNG keys are replicated whatever the plan says (is_key)
            continue
        check_spec(spec, np.shape(leaves[idx]), sizes, f"input {paths[idx]} (plan path {path})")
        specs[int(idx)] = spec
    return jax.tree.unflatten(treedef, [NamedSharding(mesh, pspec(specs.get(i))) for i in range(len(leaves))])


def _infer_aliases(args, out_shape) -> list[int | None]:
    """Without a graph: output subtree k replaces args[k] (k = 0, 1) when structure and shapes match."""
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


def donated_args(args, graph: OpGraph | None) -> tuple[int, ...]:
    """The positional arguments to donate: every one with a leaf that an output replaces
    (``graph.output_aliases``: new params, every optimizer-state argument, e.g. Adam's m and v
    passed separately), which is what the cost model assumes (an aliased output costs nothing).
    Without a graph, args 0 and 1 (params, optimizer state)."""
    if graph is None or not graph.output_aliases:
        return tuple(i for i in (0, 1) if i < len(args))
    n_in = [len(jax.tree.leaves(a)) for a in args]
    offsets = np.concatenate([[0], np.cumsum(n_in)]).astype(int)
    hit = {int(np.searchsorted(offsets, j, side="right") - 1) for j in graph.output_aliases if j is not None}
    return tuple(sorted(k for k in hit if 0 <= k < len(args)))


def output_shardings(fn, args, graph: OpGraph | None, in_sh, mesh):
    """Outputs aliasing an input get that input's sharding; the others are replicated."""
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
