"""Build resharding tables (costmodel/reshard_table.py) by asking XLA: one tiny compile per pair.

A probe of src -> dst compiles ``jit(lambda x: wsc(wsc(x, src), dst), in_shardings=src,
out_shardings=dst)`` on a ``jax.ShapeDtypeStruct`` (nothing is allocated) over a Mesh of the first
N devices in row-major order, and reads the compiled program: its collectives
(``runtime.hlo.parse_collectives``, with the mesh axes each runs over from its replica groups)
and ``memory_analysis().temp_size_in_bytes``. Every pair is probed on two f32 shapes whose dims
are multiples of N (``probe_shapes``); the fractions of the second are kept and ``stable`` says
whether both agreed (to 1e-6 of the tensor).

Meshes with more devices than this process has are probed in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (set before jax is imported).

    python -m runtime.reshard_probe --preset cpu-2x4 --ranks 1-4            # -> the user cache
    python -m runtime.reshard_probe --preset cpu-2x4 --ranks 1-4 --shipped  # -> costmodel/reshard_tables
    python -m runtime.reshard_probe --mesh 2x8 --ranks 1-3

One probe takes 30-300 ms on the 2-core CPU box (two per pair); ranks 1-4 on a 2x4 mesh are 1,352
pairs (5 + 11 + 19 + 29 specs per rank, squared, minus the identities... counted by ``all_specs``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from costmodel import reshard_table
from costmodel.cluster import Cluster
from costmodel.reshard_table import Transition
from runtime.hlo import mesh_axes, parse_collectives

_EPS = 1e-6


def all_specs(mesh_shape, rank: int) -> list[tuple[tuple[int, ...], ...]]:
    """Every spec of a rank-``rank`` tensor over the mesh axes of size > 1 (axis indices per dim,
    major first; each axis used at most once; every order of the axes within a dim)."""
    axes = [a for a, n in enumerate(mesh_shape) if int(n) > 1]
    out = set()
    for place in itertools.product(range(-1, rank), repeat=len(axes)):
        per_dim = [[a for a, d in zip(axes, place) if d == k] for k in range(rank)]
        for orders in itertools.product(*[itertools.permutations(p) for p in per_dim]):
            out.add(tuple(tuple(o) for o in orders))
    return sorted(out, key=lambda s: (sum(len(e) for e in s), s))


def name_of(spec) -> str:
    """Alpa notation over axis indices (as costmodel.cost.spec_name on axis names "0", "1", ...)."""
    return "".join("R" if not e else "S" + "".join(str(a) for a in e) for e in spec)


def probe_shapes(rank: int, num_devices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes with every dim a multiple of the device count: N·(i+2) and N·(rank−i+2)."""
    n = int(num_devices)
    return tuple(n * (i + 2) for i in range(rank)), tuple(n * (rank - i + 2) for i in range(rank))


def measure(mesh, src, dst, shape):
    """(collectives [(kind, axes, bytes_frac, wire_frac, count)], temp_frac) of one probe."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = mesh.axis_names

    def pspec(spec):
        return P(*[tuple(names[a] for a in e) if e else None for e in spec])

    s, d = NamedSharding(mesh, pspec(src)), NamedSharding(mesh, pspec(dst))
    wsc = jax.lax.with_sharding_constraint
    f = jax.jit(lambda x: wsc(wsc(x, s), d), in_shardings=s, out_shardings=d)
    compiled = f.lower(jax.ShapeDtypeStruct(shape, jnp.float32)).compile()
    whole = 4.0 * math.prod(shape)
    n = int(mesh.devices.size)
    colls = []
    for c in parse_collectives(compiled.as_text(), num_devices=n):
        colls.append((c.kind, mesh_axes(c, mesh.devices.shape), c.bytes / whole, c.wire_bytes / whole, c.count))
    temp = float(compiled.memory_analysis().temp_size_in_bytes or 0) / whole
    return colls, temp


def _same(a, b) -> bool:
    return (len(a) == len(b) and all(x[0] == y[0] and x[1] == y[1] and x[4] == y[4]
                                     and abs(x[2] - y[2]) < _EPS and abs(x[3] - y[3]) < _EPS for x, y in zip(a, b)))


def probe(mesh, src, dst) -> Transition:
    """Measure src -> dst (index-form specs) on ``mesh`` (a jax Mesh, devices row-major)."""
    rank = len(src)
    shapes = probe_shapes(rank, mesh.devices.size)
    (c1, t1), (c2, t2) = (measure(mesh, src, dst, sh) for sh in shapes)
    remat = any(dst) and any(b >= 1 - _EPS for _, _, b, _, _ in c2)  # a whole-tensor buffer, dst sharded
    return Transition(collectives=tuple(c2), sent_frac=float(sum(w * n for _, _, _, w, n in c2)), remat=bool(remat),
                      temp_frac=t2, stable=_same(c1, c2) and abs(t1 - t2) < 0.02)


def build_here(mesh_shape, ranks, pairs=None, log=None) -> dict[str, Transition]:
    """Probe every pair of specs of the given ranks (or just ``pairs`` [(src, dst)]) in this process."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, Mesh

    n = math.prod(mesh_shape)
    devs = jax.devices()
    if len(devs) < n:
        raise ValueError(f"mesh {mesh_tag(mesh_shape)} needs {n} devices, this process has {len(devs)}: "
                         "use build() (it starts a subprocess)")
    names = tuple(f"a{i}" for i in range(len(mesh_shape)))
    mesh = Mesh(np.array(devs[:n]).reshape(mesh_shape), names, axis_types=(AxisType.Auto,) * len(names))
    todo = list(pairs) if pairs is not None else [
        (s, d) for r in ranks for s in all_specs(mesh_shape, r) for d in all_specs(mesh_shape, r) if s != d]
    out = {}
    t0 = time.perf_counter()
    for i, (s, d) in enumerate(todo):
        out[reshard_table.pair_key(name_of(s), name_of(d))] = probe(mesh, s, d)
        if log and (i + 1) % 100 == 0:
            log(f"{i + 1}/{len(todo)} pairs, {time.perf_counter() - t0:.0f} s")
    return out


def mesh_tag(mesh_shape) -> str:
    return reshard_table.mesh_tag(mesh_shape)


def build(mesh_shape, ranks=(1, 2, 3, 4), out: str | Path | None = None, log=print) -> Path:
    """Probe all pairs of ``ranks`` on ``mesh_shape`` and write the table to ``out`` (default: the
    user cache for this JAX version). Runs in a subprocess when this process lacks the devices."""
    mesh_shape = tuple(int(x) for x in mesh_shape)
    path = Path(out) if out is not None else reshard_table.table_paths(mesh_shape)[1]
    n = math.prod(mesh_shape)
    have = _device_count()
    if have is not None and have >= n:
        t0 = time.perf_counter()
        entries = build_here(mesh_shape, ranks, log=log)
        header = {"ranks": list(ranks), "probe_s": round(time.perf_counter() - t0, 1),
                  "probe": "jit(wsc(wsc(x, src), dst)), in/out shardings src/dst, f32, CPU backend"}
        return reshard_table.write(path, mesh_shape, entries, header)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip())
    cmd = [sys.executable, "-m", "runtime.reshard_probe", "--mesh", mesh_tag(mesh_shape),
           "--ranks", ",".join(str(r) for r in ranks), "--out", str(path)]
    subprocess.run(cmd, env=env, check=True)
    return path


def _device_count() -> int | None:
    """Devices of this process's jax (imports jax; the XLA_FLAGS of the process apply)."""
    import jax
    return len(jax.devices())


def _parse_ranks(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    if not out or min(out) < 1:
        raise ValueError(f"--ranks {text!r}: give ranks >= 1 like 1-4 or 1,2,3")
    return tuple(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--preset", help="a Cluster preset (its mesh shape is probed)")
    g.add_argument("--mesh", help="a mesh shape like 2x4")
    ap.add_argument("--ranks", default="1-4")
    ap.add_argument("--shipped", action="store_true", help="write into costmodel/reshard_tables (to ship)")
    ap.add_argument("--out", default=None, help="table file (default: the user cache)")
    a = ap.parse_args(argv)
    if a.preset:
        shape = tuple(Cluster.preset(a.preset).mesh_shape)
    else:
        try:
            shape = tuple(int(x) for x in a.mesh.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--mesh {a.mesh!r}: give a shape like 2x4") from None
    out = a.out or (reshard_table.table_paths(shape)[0] if a.shipped else None)
    path = build(shape, _parse_ranks(a.ranks), out)
    doc = json.loads(Path(path).read_text())
    print(f"wrote {path}: {len(doc['entries'])} pairs on mesh {mesh_tag(shape)} (jax {doc['jax']})")


if __name__ == "__main__":
    main()
