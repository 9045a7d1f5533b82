"""Distributed FFT strategies: which layouts an fft can run in, the schedule, and its cost.

XLA's SPMD partitioner all-gathers a sharded FFT operand (``space.SearchSpace.xla_fft_replicated``), so
these strategies are not what plain XLA does: the runtime (runtime/dist_fft.py) runs the schedule
below with ``jax.shard_map``, ``jnp.fft`` along single dims and ``jax.lax.all_to_all``.

An fft equation transforms the last k dims T of its operand (``fft_lengths``); the other dims are
batch dims. A strategy gives each mesh axis (size > 1) either nothing, a batch dim it shards in both
operand and result ("stay": local FFTs, no communication), or a move (i -> j, i != j, i or j in T):
the axis shards dim i of the operand and dim j of the result. Slab decomposition is one moving axis
between two transformed dims, pencil two; a transformed operand dim can also move to a batch dim
(one all-to-all before local FFTs) and a batch dim to a transformed result dim (one after).

Schedule (``schedule``; greedy, the same in the cost model and the runtime):
  1. transform every transformed dim that is whole (no axis on it) and may go now;
  2. pick a pending move out of a transformed dim i whose destination j is whole and done (a batch
     dim or a transformed dim already transformed): ``all_to_all`` splitting j, concatenating i;
     back to 1 until no move out of a transformed dim is pending; stuck = infeasible;
  3. moves out of batch dims, after all transforms: ``all_to_all`` splitting j, concatenating i.
Order constraints: RFFT's last dim (real -> n//2+1) goes first and must be whole in the operand;
IRFFT's last dim (n//2+1 -> n, real) goes last. Every split must divide the dim (shard_map needs even
shards), so e.g. an rfft result's n//2+1 dim is rarely a destination.

Cost (``fft_strategies``): FLOPs / (devices the strategy splits the work over); per all-to-all
B = local bytes of the tensor at that step x group size (costmodel.cost.collective's convention:
each device sends (n-1)/n of its local piece). Memory is the result's local bytes (builder), the
intermediate pieces are not counted (they live within the node).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

FFT_TYPES = ("FFT", "IFFT", "RFFT", "IRFFT")


def fft_type(params) -> str:
    t = params.get("fft_type")
    name = getattr(t, "name", None) or str(t).split(".")[-1]
    name = name.upper()
    if name not in FFT_TYPES:
        raise ValueError(f"unknown fft_type {t!r}; expected one of {FFT_TYPES}")
    return name


def out_shape_of(fft_type: str, in_shape, fft_lengths) -> tuple[int, ...]:
    """Result shape of an fft equation."""
    s = list(in_shape)
    if fft_type == "RFFT":
        s[-1] = int(fft_lengths[-1]) // 2 + 1
    elif fft_type == "IRFFT":
        s[-1] = int(fft_lengths[-1])
    return tuple(s)


def schedule(fft_type: str, in_shape, fft_lengths, in_spec, out_spec, axis_sizes: dict):
    """The steps of one strategy, or None when infeasible: a list of ("fft", dim) and
    ("a2a", axes, split_dim, concat_dim, local shape before the step, complex: bool)."""
    nd = len(in_shape)
    k = len(fft_lengths)
    T = list(range(nd - k, nd))
    last = nd - 1
    moves = {}
    for i in range(nd):
        a_in = tuple(in_spec[i])
        if not a_in:
            continue
        js = [j for j in range(nd) if tuple(out_spec[j]) == a_in]
        if len(js) != 1:
            return None
        if js[0] != i:
            moves[i] = (a_in, js[0])
    shape = list(in_shape)
    cur = [tuple(e) for e in in_spec]   # axes on each dim now
    done: set = set()
    steps: list = []
    is_complex = fft_type != "RFFT"
    out_shape = out_shape_of(fft_type, in_shape, fft_lengths)

    def shards(axes):
        return math.prod(axis_sizes[a] for a in axes)

    def local():
        return tuple(d // shards(cur[i]) for i, d in enumerate(shape))

    def may_go(d):
        if fft_type == "RFFT" and d != last and last not in done:
            return False
        if fft_type == "IRFFT" and d == last and any(t not in done for t in T if t != last):
            return False
        return True

    def transform_whole():
        nonlocal is_complex
        progress = True
        while progress:
            progress = False
            for d in T:
                if d not in done and not cur[d] and may_go(d):
                    steps.append(("fft", d))
                    done.add(d)
                    if d == last:
                        shape[last] = out_shape[last]
                        is_complex = fft_type != "IRFFT"
                    progress = True

    def a2a(axes, i, j):
        n = shards(axes)
        loc = local()
        if loc[j] % n:
            return False
        steps.append(("a2a", tuple(axes), j, i, loc, is_complex))
        cur[i] = ()
        cur[j] = tuple(axes)
        return True

    if fft_type == "RFFT" and in_spec[last]:
        return None
    transform_whole()
    pending = {i: mv for i, mv in moves.items() if i in T}
    while pending:
        ready = [i for i, (axes, j) in pending.items() if not cur[j] and (j not in T or j in done)]
        if not ready:
            return None
        i = ready[0]
        axes, j = pending.pop(i)
        if not a2a(axes, i, j):
            return None
        transform_whole()
    if any(t not in done for t in T):
        return None
    for i, (axes, j) in moves.items():
        if i in T:
            continue
        if cur[j] or not a2a(axes, i, j):
            return None
    if [tuple(e) for e in cur] != [tuple(e) for e in out_spec]:
        return None
    for i, d in enumerate(shape):
        if d % shards(cur[i]):
            return None
    return steps


def _group_spec(nd, choice, axes, which):
    spec = [()] * nd
    for a, c in zip(axes, choice):
        if c is not None:
            spec[c[which]] = spec[c[which]] + (a,)
    return tuple(spec)


def fft_strategies(node, mesh, cap: int, make_strategy, rank_and_cap):
    """Distributed strategies of an fft node (module docstring); ``make_strategy(out_spec, in_spec,
    flops, collectives)`` builds one Strategy, ``rank_and_cap`` is strategies._cap."""
    p = node.params
    ft = fft_type(p)
    lengths = [int(x) for x in p["fft_lengths"]]
    x = node.operand_types[0]
    in_shape = tuple(x.shape)
    out_shape = out_shape_of(ft, in_shape, lengths)
    nd = len(in_shape)
    T = set(range(nd - len(lengths), nd))
    sizes = {a: mesh.size[a] for a in mesh.axis_names}
    axes = [a for a in mesh.axis_names if mesh.size[a] > 1]
    opts = [None] + [(i, i) for i in range(nd) if i not in T]
    opts += [(i, j) for i in range(nd) for j in range(nd) if i != j and (i in T or j in T)]
    in_item = np.dtype(x.dtype).itemsize
    complex_item = in_item if ft in ("FFT", "IFFT", "IRFFT") else 2 * in_item
    res = [make_strategy(((),) * len(out_shape), ((),) * nd, float(node.flops), ())]
    seen = set()
    for choice in itertools.product(opts, repeat=len(axes)):
        if all(c is None for c in choice):
            continue
        in_spec = _group_spec(nd, choice, axes, 0)
        out_spec = _group_spec(nd, choice, axes, 1)
        if (in_spec, out_spec) in seen:
            continue
        seen.add((in_spec, out_spec))
        if any(in_shape[d] % mesh.shards(e) for d, e in enumerate(in_spec) if e) or \
           any(out_shape[d] % mesh.shards(e) for d, e in enumerate(out_spec) if e):
            continue
        steps = schedule(ft, in_shape, lengths, in_spec, out_spec, sizes)
        if steps is None:
            continue
        n_used = mesh.shards(tuple(a for a, c in zip(axes, choice) if c is not None))
        coll = []
        for st in steps:
            if st[0] == "a2a":
                _, ax, _j, _i, loc, cplx = st
                item = complex_item if cplx else complex_item // 2
                coll.append(("all-to-all", ax, float(item * math.prod(loc)) * mesh.shards(ax)))
        res.append(make_strategy(out_spec, in_spec, float(node.flops) / n_used, tuple(coll)))
    return rank_and_cap(res, node, mesh, cap)
