"""Run a distributed FFT strategy: ``jax.shard_map`` over the plan's mesh, ``jnp.fft`` along single
dims and ``jax.lax.all_to_all`` transposes, in the order ``costmodel.fft_plan.schedule`` gives.

XLA's SPMD partitioner all-gathers a sharded fft operand and transforms it replicated, so where a
plan picks a sharded fft strategy the runtime's constrained program (runtime/core.py) calls
``apply`` instead of binding the fft equation. ``apply`` computes the same transform: an n-D FFT is
the composition of 1-D FFTs along its dims (any order; IFFT's 1/N is the product of the per-dim
1/n_d; RFFT = rfft along the last dim then complex FFTs; IRFFT = complex IFFTs then irfft along the
last dim), so results agree with the unsharded equation to float rounding.
"""
from __future__ import annotations

from costmodel.fft_plan import fft_type, schedule


def _pspec(spec):
    from jax.sharding import PartitionSpec as P
    return P(*[None if not e else (e[0] if len(e) == 1 else tuple(e)) for e in spec])


def _norm(spec, nd):
    out = []
    for e in tuple(spec or ()) + (None,) * (nd - len(tuple(spec or ()))):
        out.append(() if e is None else ((e,) if isinstance(e, str) else tuple(e)))
    return tuple(out)


def is_distributed(in_spec, out_spec) -> bool:
    """True when the strategy shards the fft's operand or result (else plain XLA runs it)."""
    return any(e for e in (in_spec or ()) if e) or any(e for e in (out_spec or ()) if e)


def apply(params: dict, x, in_spec, out_spec, mesh):
    """The fft equation with ``params`` applied to ``x`` (global shape), operand laid out as
    ``in_spec`` and result as ``out_spec`` (public PartitionSpec tuples) on ``mesh``. ValueError
    when the layouts are not a schedulable strategy."""
    import jax
    import jax.numpy as jnp

    ft = fft_type(params)
    lengths = [int(n) for n in params["fft_lengths"]]
    nd = x.ndim
    ins, outs = _norm(in_spec, nd), _norm(out_spec, nd)
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    steps = schedule(ft, tuple(x.shape), lengths, ins, outs, sizes)
    if steps is None:
        raise ValueError(f"fft {ft} of shape {tuple(x.shape)}: operand spec {in_spec} -> result spec {out_spec} "
                         "is not a distributed-FFT strategy (costmodel.fft_plan)")
    last = nd - 1
    inverse = ft in ("IFFT", "IRFFT")

    def local(v):
        for st in steps:
            if st[0] == "fft":
                d = st[1]
                if d == last and ft == "RFFT":
                    v = jnp.fft.rfft(v, axis=d)
                elif d == last and ft == "IRFFT":
                    v = jnp.fft.irfft(v, n=lengths[-1], axis=d)
                else:
                    v = jnp.fft.ifft(v, axis=d) if inverse else jnp.fft.fft(v, axis=d)
            else:
                _, axes, split, concat, _loc, _c = st
                name = axes[0] if len(axes) == 1 else tuple(axes)
                v = jax.lax.all_to_all(v, name, split, concat, tiled=True)
        return v

    fn = jax.shard_map(local, mesh=mesh, in_specs=(_pspec(ins),), out_specs=_pspec(outs), check_vma=False)
    return fn(x)
