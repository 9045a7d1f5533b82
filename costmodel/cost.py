"""Costs on a Cluster: collectives (α-β per mesh axis), compute, resharding, memory of a spec.

Specs. A spec of an n-dim tensor is a tuple of n entries; inside the cost model each entry is a
tuple of mesh-axis names (major first, ``()`` = not sharded). ``norm_spec`` turns the public
form (None / axis name / tuple of names per dim) into that; ``public_spec`` turns it back.

Padding. A dim of size d sharded over n devices holds ceil(d / n) elements per device (XLA pads
the last shard): every per-device size below (memory, FLOPs, collective bytes) uses the padded
shard. Strategies where a dim is smaller than its shard count are never generated.

Units: bytes, seconds, FLOP/s. ``bw`` is the per-device link bandwidth of a mesh axis
(``Cluster.axis_bandwidth_Bps``), ``α`` its per-step latency (``Cluster.axis_latency_s``).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from costmodel import reshard_table

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


# ---- specs --------------------------------------------------------------------------------
def norm_spec(spec, ndim: int | None = None) -> tuple[tuple[str, ...], ...]:
    """Public spec (None / "x" / ("x", "y") per dim, or None for a replicated tensor) ->
    internal form (a tuple of axis-name tuples). ``ndim`` pads/validates the length."""
    if spec is None:
        if ndim is None:
            raise ValueError("norm_spec(None) needs ndim")
        return ((),) * ndim
    out = []
    for e in spec:
        if e is None:
            out.append(())
        elif isinstance(e, str):
            out.append((e,))
        else:
            out.append(tuple(e))
    if ndim is not None:
        if len(out) > ndim:
            raise ValueError(f"spec {spec!r} has more entries than the tensor's {ndim} dims")
        out += [()] * (ndim - len(out))
    return tuple(out)


def public_spec(nspec) -> tuple:
    """Internal spec -> public: () -> None, (a,) -> a, (a, b) -> (a, b)."""
    return tuple(None if not e else (e[0] if len(e) == 1 else tuple(e)) for e in nspec)


def spec_name(nspec, axis_names) -> str:
    """Alpa notation: per dim R (replicated) or S + the mesh-axis indices, e.g. "S01R"."""
    idx = {a: i for i, a in enumerate(axis_names)}
    if not nspec:
        return "R"
    return "".join("R" if not e else "S" + "".join(str(idx[a]) for a in e) for e in nspec)


class Mesh:
    """The mesh view of a Cluster the cost functions need (hashable, cheap to pass around)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.axis_names = tuple(cluster.axis_names)
        self.size = {a: int(n) for a, n in zip(cluster.axis_names, cluster.mesh_shape)}
        self.bw = {a: float(b) for a, b in zip(cluster.axis_names, cluster.axis_bandwidth_Bps)}
        self.lat = {a: float(x) for a, x in zip(cluster.axis_names, cluster.axis_latency_s)}
        self.index = {a: i for i, a in enumerate(cluster.axis_names)}
        self.num_devices = int(cluster.num_devices)
        self.shape = tuple(int(n) for n in cluster.mesh_shape)
        self.backend = str(getattr(cluster, "backend", "gpu"))
        f = np.asarray(cluster.device_flops, dtype=np.float64)
        self.min_flops = float(f.min()) * float(cluster.efficiency)
        self.mean_flops = float(f.mean()) * float(cluster.efficiency)
        self.key = (self.axis_names, tuple(cluster.mesh_shape), tuple(cluster.axis_bandwidth_Bps),
                    tuple(cluster.axis_latency_s))
        _MESHES[self.key] = self

    def fastest_first(self, axes) -> tuple[str, ...]:
        """Axes by bandwidth, highest first (ties: the later mesh axis first)."""
        return tuple(sorted(axes, key=lambda a: (-self.bw[a], -self.index[a])))

    def shards(self, axes) -> int:
        return int(math.prod(self.size[a] for a in axes))


def local_shape(shape, nspec, mesh: Mesh) -> tuple[int, ...]:
    """Per-device (padded) shape: ceil(d / shards(d)) per dim."""
    return tuple(-(-int(d) // mesh.shards(e)) if e else int(d) for d, e in zip(shape, nspec))


def local_bytes(shape, itemsize: int, nspec, mesh: Mesh) -> float:
    """Per-device bytes of a tensor under ``nspec`` = itemsize · Π ceil(d_i / shards_i)."""
    return float(itemsize * math.prod(local_shape(shape, nspec, mesh)))


def replication(nspec, mesh: Mesh) -> int:
    """How many devices hold each element = Π sizes of the mesh axes the spec does not use."""
    used = {a for e in nspec for a in e}
    return int(math.prod(n for a, n in mesh.size.items() if a not in used))


def redundant_bytes(nbytes: float, nspec, mesh: Mesh) -> float:
    """Bytes replication wastes, summed over devices: nbytes · (R − 1), R = ``replication``.
    A fully replicated B-byte tensor on D devices: (D − 1)·B; fully sharded: 0."""
    return float(nbytes) * (replication(nspec, mesh) - 1)


# ---- collectives ----------------------------------------------------------------------------
def _one_axis(kind: str, B: float, n: int, bw: float, lat: float) -> tuple[float, float]:
    """(seconds, bytes sent per device) of one collective over a group of n devices on one axis.

    B = bytes of the whole tensor as seen by the group (the gathered result of an all-gather, the
    unreduced input of a reduce-scatter or all-reduce, Σ of the n local pieces for all-to-all).
      all-reduce:      2(n−1)/n · B/bw + 2(n−1)·α      (ring: reduce-scatter + all-gather)
      all-gather:       (n−1)/n · B/bw +  (n−1)·α
      reduce-scatter:   (n−1)/n · B/bw +  (n−1)·α
      all-to-all:      (n−1)/n² · B/bw + (n−1)·α       (each device keeps 1/n of its B/n piece)
    """
    if n <= 1 or B <= 0:
        return 0.0, 0.0
    if kind == "all-reduce":
        sent = 2.0 * (n - 1) / n * B
        steps = 2 * (n - 1)
    elif kind in ("all-gather", "reduce-scatter"):
        sent = (n - 1) / n * B
        steps = n - 1
    elif kind == "all-to-all":
        sent = (n - 1) / (n * n) * B
        steps = n - 1
    else:
        raise ValueError(f"unknown collective {kind!r}; expected one of {COLLECTIVES}")
    return sent / bw + steps * lat, sent


def collective(kind: str, axes, B: float, mesh: Mesh) -> tuple[float, float]:
    """(seconds, bytes sent per device) of a collective over one or more mesh axes, hierarchical.

    Axes are taken fastest first (a1, a2, ..., ak; n_i devices each) and B_j = B / Π_{i<j} n_i:
      all-gather / reduce-scatter over (a1..ak) = Σ_j AG/RS over a_j on B_j
      all-reduce over (a1..ak) = Σ_{j<k} [RS over a_j on B_j + AG over a_j on B_j] + AR over a_k on B_k
        (e.g. all-reduce over (x, y), y fastest = RS_y(B) + AR_x(B/n_y) + AG_y(B))
      all-to-all over (a1..ak) = Σ_j all-to-all over a_j on B·n_j/N (N = Π n_j; an approximation:
        the exchange is done one axis at a time, each moving the local pieces of its group).
      collective-permute: B = the bytes each device sends to its neighbour (``permute_time``).
    """
    axes = mesh.fastest_first(axes)
    if not axes or B <= 0:
        return 0.0, 0.0
    if kind == "collective-permute":
        return permute_time(axes, B, mesh), float(B)
    t = sent = 0.0
    if kind == "all-to-all":
        N = mesh.shards(axes)
        for a in axes:
            dt, ds = _one_axis(kind, B * mesh.size[a] / N, mesh.size[a], mesh.bw[a], mesh.lat[a])
            t += dt
            sent += ds
        return t, sent
    Bj = float(B)
    for j, a in enumerate(axes):
        n = mesh.size[a]
        if kind == "all-reduce" and j < len(axes) - 1:
            dt, ds = _one_axis("reduce-scatter", Bj, n, mesh.bw[a], mesh.lat[a])
            t += 2 * dt
            sent += 2 * ds
        else:
            dt, ds = _one_axis(kind, Bj, n, mesh.bw[a], mesh.lat[a])
            t += dt
            sent += ds
        Bj /= n
    return t, sent


def lowered_kind(kind: str, mesh: Mesh) -> str:
    """The collective the backend runs for ``kind``: on "cpu" a reduce-scatter is an all-reduce
    (then a slice fused into the consumers; measured on XLA CPU), elsewhere ``kind`` itself."""
    return "all-reduce" if kind == "reduce-scatter" and mesh.backend == "cpu" else kind


def gather_relaid(shape, src, dst, mesh: Mesh) -> bool:
    """Does the backend write a gather ``src`` -> ``dst`` (``dst`` shards no dim more than ``src``,
    one or more dims less) in a layout whose gathered dim is major, so that a reader needing the
    default layout (a buffer read: dot, conv, fft) gets one more copy? On "cpu": XLA CPU's
    all-gather concatenates whole blocks, so layout assignment makes the gathered dim the most major
    (``f32[1,64,32,32]{3,1,0,2}`` gathered on dim 2) and a ``copy`` (``wrapped_copy``,
    ``copy_bitcast_fusion``) relays it out just before the conv / YNNPACK dot; the gather and the
    copy are both live there. No copy when every dim before the gathered one has one element.
    Measured in XLA's buffer assignment and live ranges (``--xla_dump_to``): probes gathering each
    dim of 2-D to 5-D operands read by a conv, a dot, an fft (a dim-0 gather: one buffer; any
    other: two); the 3-D pencil FNO plan (tests/test_dist_fft.py: ``all-gather.7`` 219-220 and
    ``copy_bitcast_fusion.6`` 220-221, 512 KiB each, at XLA's peak, the dot at 221; predicted /
    XLA 0.826 -> 0.964); fno tiny ilp-time (``all-gather.3`` 141-142, ``copy_bitcast_fusion.7``
    from 142, the fc1 dot at 143). A small dot XLA runs with Eigen reads the permuted layout in
    place (f32[4,64,32] @ f32[32,32]: no copy): counted anyway. Re-priced (``experiments.fidelity
    --reprice``): zoo 38 / 40 (fno not re-priceable) and outside 17 / 24 within 10% as before;
    mlp ilp-memory 0.916 -> 0.996, moe dp 1.024 -> 1.039, convae fsdp 0.781 -> 0.810, ilp-memory
    0.710 -> 0.738. Elsewhere (GPU, TPU) not measured: False."""
    if mesh.backend != "cpu":
        return False
    lo_src, lo_dst = local_shape(shape, src, mesh), local_shape(shape, dst, mesh)
    if any(a < b for a, b in zip(lo_dst, lo_src)):
        return False  # not a pure gather (an all-to-all or a slice as well)
    gathered = [d for d, (a, b) in enumerate(zip(lo_dst, lo_src)) if a > b]
    return bool(gathered) and any(lo_dst[e] > 1 for e in range(max(gathered)))


def node_collective(kind: str, axes, B: float, mesh: Mesh) -> tuple[float, float, float]:
    """(seconds, bytes sent per device, extra live bytes) of a node's own collective as the backend
    runs it (``lowered_kind``). Extra live bytes: on CPU a reduce-scatter's whole reduced tensor
    (B per device) stays live with the output instead of its B / n slice, so B − B/n more."""
    run = lowered_kind(kind, mesh)
    t, sent = collective(run, axes, B, mesh)
    extra = float(B) - float(B) / mesh.shards(axes) if run != kind else 0.0
    return t, sent, extra


def permute_time(axes, B: float, mesh: Mesh) -> float:
    """Seconds of a collective-permute in which every device sends B bytes to one neighbour along
    ``axes`` (a halo exchange): B / bw + α of the slowest of the axes (a neighbour along a dim
    sharded over several axes may sit across the slower one). Bytes sent per device = B."""
    return float(B) / min(mesh.bw[a] for a in axes) + max(mesh.lat[a] for a in axes)


# ---- compute ----------------------------------------------------------------------------------
def compute_time(flops_per_device: float, mesh: Mesh) -> tuple[float, float]:
    """(seconds, imbalance seconds) of ``flops_per_device`` (the padded shard's FLOPs; every
    device runs the same SPMD program, so the step waits for the slowest one):
      time_s      = flops / (min_d FLOP/s_d · efficiency)
      imbalance_s = time_s − flops / (mean_d FLOP/s_d · efficiency)   (0 on a uniform mesh)."""
    if flops_per_device <= 0:
        return 0.0, 0.0
    t = flops_per_device / mesh.min_flops
    return t, t - flops_per_device / mesh.mean_flops


# ---- resharding ----------------------------------------------------------------------------------
def reshard(shape, itemsize: int, src, dst, mesh: Mesh) -> tuple[float, float]:
    """(seconds, bytes sent per device) to turn a tensor laid out as ``src`` into ``dst`` (internal
    specs), as XLA does it: the collectives XLA compiled for this transition on this mesh shape
    (``reshard_table.lookup``), each priced with the α-β model of the axes it runs over
    (``transition_time``); bytes sent = the measured fraction x the tensor's bytes. Pairs no table
    holds fall back to ``reshard_rules`` (``reshard_measured`` tells which one applies)."""
    src = tuple(src)
    dst = tuple(dst)
    if src == dst:
        return 0.0, 0.0
    tr = reshard_measured(src, dst, mesh)
    if tr is None:
        return reshard_rules(shape, itemsize, src, dst, mesh)
    whole = float(itemsize * math.prod(int(d) for d in shape))
    return transition_time(tr, whole, mesh), tr.sent_frac * whole


def reshard_measured(src, dst, mesh: Mesh):
    """The measured Transition for src -> dst on ``mesh`` (None: not probed, the rules apply)."""
    return _measured_cached(tuple(src), tuple(dst), mesh.shape, mesh.axis_names)


@lru_cache(maxsize=None)
def _measured_cached(src, dst, shape, axis_names):
    return reshard_table.lookup(shape, spec_name(src, axis_names), spec_name(dst, axis_names))


def transition_time(tr, whole_bytes: float, mesh: Mesh) -> float:
    """Seconds of a measured transition on a tensor of ``whole_bytes``: Σ over its collectives of
    ``collective`` on the mesh axes it ran over with B = its buffer (bytes_frac x whole_bytes;
    for all-to-all B = group size x the per-device operand, ``collective``'s convention), and for
    a collective-permute wire bytes / the slowest of its axes' bandwidth + that axis's latency."""
    t = 0.0
    for kind, axes, bfrac, wfrac, count in tr.collectives:
        names = tuple(mesh.axis_names[a] for a in axes)
        if not names:
            continue
        if kind == "collective-permute":
            slow = min(names, key=lambda a: mesh.bw[a])
            dt = wfrac * whole_bytes / mesh.bw[slow] + mesh.lat[slow]
        else:
            B = bfrac * whole_bytes * (mesh.shards(names) if kind == "all-to-all" else 1)
            dt = collective(kind, names, B, mesh)[0]
        t += count * dt
    return t


def reshard_rules(shape, itemsize: int, src, dst, mesh: Mesh) -> tuple[float, float]:
    """The hand-written rules ``reshard`` falls back to for transitions no table holds: (seconds,
    bytes sent per device) to turn ``src`` into ``dst``. Per mesh axis, comparing where it shards the tensor in src and dst (within a
    dim, the common major prefix of the two axis tuples stays; the rest is "removed"/"added"):
      in dst only                     -> local slice, free (done first: it shrinks what moves);
      removed from dim i, added to j≠i -> all-to-all over that axis, B = local bytes · n_axis;
      removed and not added elsewhere  -> all-gather over that axis (slowest axis first, each on
                                          B = the local bytes after that gather);
      removed and re-added to the same dim in another order -> all-gather (then a free slice).
    The changes are summed; sizes are padded shards of the running layout. Exception (XLA's "involuntary
    full rematerialization"): an axis move together with any other move or all-gather is priced as
    XLA runs it — all-gather of src to fully replicated (as ``reshard(src -> replicated)``), then a free
    slice; e.g. S01R -> RS1 and S0S1 -> S1S0 (the SPMD partitioner has no one-step all-to-all for a
    transposed device order and falls back to replicating; seen in its warnings on cpu-2x4).
    Measured against XLA on f32[8,32,64] over 2x4 these rules were wrong on 5 of 11 pairs (e.g.
    S01RR -> RRS01 is one all-to-all of 1/8 the tensor, S1RR -> RRS0 a full rematerialisation):
    they are only a fallback."""
    src = tuple(src)
    dst = tuple(dst)
    if src == dst:
        return 0.0, 0.0
    nd = len(shape)
    removed, added, remat = axis_changes(src, dst)
    if remat:
        # XLA's SPMD partitioner cannot chain these ("involuntary full rematerialization"): it
        # all-gathers the tensor to replicated over every axis of src, then slices (free).
        return reshard_rules(shape, itemsize, src, ((),) * nd, mesh)
    cur = [list(e) for e in src]
    # 1. free slices: axes only in dst
    for a, d in added.items():
        if a not in removed:
            cur[d].append(a)
    t_total = sent_total = 0.0
    # 2. all-to-all: axis moves between dims
    for a, d_from in list(removed.items()):
        d_to = added.get(a)
        if d_to is not None and d_to != d_from:
            lb = local_bytes(shape, itemsize, tuple(tuple(e) for e in cur), mesh)
            dt, ds = collective("all-to-all", (a,), lb * mesh.size[a], mesh)
            t_total += dt
            sent_total += ds
            cur[d_from].remove(a)
            cur[d_to].append(a)
            del removed[a]
    # 3. all-gathers, slowest axis first
    for a in reversed(mesh.fastest_first(tuple(removed))):
        d = removed[a]
        cur[d].remove(a)
        lb = local_bytes(shape, itemsize, tuple(tuple(e) for e in cur), mesh)
        dt, ds = collective("all-gather", (a,), lb, mesh)
        t_total += dt
        sent_total += ds
    return t_total, sent_total


def axis_changes(src, dst) -> tuple[dict, dict, bool]:
    """Per mesh axis, where ``src`` -> ``dst`` removes it ({axis: dim}) and adds it ({axis: dim}):
    past the common major prefix of each dim's axis tuples; and whether the hand rules take the
    transition for XLA's involuntary full rematerialisation (an axis move with another move or
    all-gather: ``reshard_rules``)."""
    removed: dict[str, int] = {}
    added: dict[str, int] = {}
    for d, (s, t) in enumerate(zip(src, dst)):
        k = 0
        while k < len(s) and k < len(t) and s[k] == t[k]:
            k += 1
        removed.update((a, d) for a in s[k:])
        added.update((a, d) for a in t[k:])
    moves = sum(1 for a, d in removed.items() if a in added and added[a] != d)
    return removed, added, bool(moves) and moves + sum(1 for a in removed if a not in added) >= 2


def reshard_coverage(srcs, dsts, mesh: Mesh) -> tuple[int, int]:
    """(pairs priced from a measured table, pairs priced by the fallback rules) among the
    src != dst pairs of ``reshard_matrix(…, srcs, dsts, mesh)``."""
    measured = fallback = 0
    for s in srcs:
        for d in dsts:
            if tuple(s) != tuple(d):
                if reshard_measured(s, d, mesh) is None:
                    fallback += 1
                else:
                    measured += 1
    return measured, fallback


@lru_cache(maxsize=None)
def _reshard_cached(shape, itemsize, src, dst, mesh_key):
    return reshard(shape, itemsize, src, dst, _MESHES[mesh_key])


_MESHES: dict = {}


def reshard_matrix(shape, itemsize: int, srcs, dsts, mesh: Mesh) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, bytes) matrices [len(srcs), len(dsts)] of ``reshard`` for every spec pair.
    Pairs are memoised per (mesh, shape, itemsize, src, dst)."""
    key = mesh.key
    shape = tuple(int(d) for d in shape)
    T = np.empty((len(srcs), len(dsts)))
    C = np.empty((len(srcs), len(dsts)))
    for i, s in enumerate(srcs):
        for j, d in enumerate(dsts):
            T[i, j], C[i, j] = _reshard_cached(shape, itemsize, s, d, key)
    return T, C


def clear_reshard_cache() -> None:
    """Forget memoised reshard prices and loaded tables (after a table is rebuilt)."""
    _reshard_cached.cache_clear()
    _measured_cached.cache_clear()
    reshard_table.clear_cache()
