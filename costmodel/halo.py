"""Halo exchange of a spatially partitioned convolution: widths, bytes and the collectives XLA runs.

A ``conv_general_dilated`` spatial dim has input (lhs) size L, window (rhs) size K, output size O,
window stride s, lhs dilation ld, rhs (window) dilation rd and padding (lo, hi). In the padded,
dilated input, input row r sits at position p = lo + r·ld; output i with window tap j reads
p = i·s + j·rd. So a set of outputs i ∈ [i0, i1] and taps j ∈ [j0, j1] reads the input rows

    r_min = max(0,     ceil((i0·s + j0·rd − lo) / ld)),
    r_max = min(L − 1, floor((i1·s + j1·rd − lo) / ld)).

Sharding a spatial dim n ways, shard k owns the input rows [k·l, (k+1)·l), l = L / n. Two regimes:

- ``out`` (forward convs and the data-gradient convs, K <= O): shard k computes outputs
  [k·o, (k+1)·o), o = O / n, with all K taps; lhs and output are sharded alike, the window is whole.
- ``window`` (weight-gradient convs, K > O: the "window" is the output gradient): shard k runs the
  taps [k·w, (k+1)·w), w = K / n, for every output; lhs and rhs are sharded alike and the output
  holds partial sums (all-reduced like any contracting dim).

The halo of shard k is left_k = max(0, k·l − r_min), right_k = max(0, r_max − ((k+1)·l − 1)); XLA's
SPMD partitioner exchanges the same width on every shard, the max over k (``halo_widths``).
E.g. a 3-tap SAME conv (lo = hi = 1), stride 1: (1, 1); stride 2 on an even L (lo = 0, hi = 1):
(0, 1); dilation 2 (lo = hi = 2): (2, 2).

Collectives (what XLA runs, checked on the 8-device CPU mesh, tests/test_halo.py): for each sharded
spatial dim in dim order, one collective-permute per non-zero side to the neighbour along the
dim's mesh axes, moving halo_side x (the local tile's other dims). The tile grows by each exchange:
a dim exchanged later moves the corners too (2-D sharding of 32x32 on 2x4: 1x8 rows, then
18x1 columns). Each device sends B = halo bytes (``collective-permute`` in costmodel.cost).
Memory: the haloed copy of the lhs, local bytes x Π (l + left + right) / l, live during the conv.

Emitted only when it is exact: the shard count divides L, O (``out``) or K (``window``), and the
halo fits in one neighbour (left, right <= l); otherwise the strategy is not offered.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodel.cost import local_shape


@dataclass(frozen=True)
class SpatialDim:
    """One spatial dim of a convolution (sizes in elements)."""

    lhs: int
    window: int
    out: int
    stride: int = 1
    lhs_dilation: int = 1
    rhs_dilation: int = 1
    pad_lo: int = 0
    pad_hi: int = 0

    @property
    def regime(self) -> str:
        """``"out"`` when the output is partitioned (K <= O), ``"window"`` when the window is."""
        return "out" if self.window <= self.out else "window"


def spatial_dims(params: dict, lhs_shape, rhs_shape, out_shape) -> list[SpatialDim]:
    """The SpatialDims of a conv_general_dilated equation (trace params), in spatial order."""
    dn = params["dimension_numbers"]
    ls, rs, os_ = dn["lhs_spec"], dn["rhs_spec"], dn["out_spec"]
    n = len(ls) - 2
    strides = params.get("window_strides") or (1,) * n
    pads = params.get("padding") or ((0, 0),) * n
    ld = params.get("lhs_dilation") or (1,) * n
    rd = params.get("rhs_dilation") or (1,) * n
    return [SpatialDim(int(lhs_shape[ls[2 + i]]), int(rhs_shape[rs[2 + i]]), int(out_shape[os_[2 + i]]),
                       int(strides[i]), int(ld[i]), int(rd[i]), int(pads[i][0]), int(pads[i][1]))
            for i in range(n)]


def _rows(d: SpatialDim, i0: int, i1: int, j0: int, j1: int) -> tuple[int, int]:
    lo_p = i0 * d.stride + j0 * d.rhs_dilation - d.pad_lo
    hi_p = i1 * d.stride + j1 * d.rhs_dilation - d.pad_lo
    r_min = max(0, -(-lo_p // d.lhs_dilation))
    r_max = min(d.lhs - 1, hi_p // d.lhs_dilation)
    return r_min, r_max


def halo_widths(d: SpatialDim, n: int) -> tuple[int, int] | None:
    """(left, right) halo rows of ``d`` split ``n`` ways (the max over shards, see the module
    docstring), or None when the split is not exact (n does not divide the sizes, or a halo is
    wider than one shard)."""
    if n <= 1:
        return 0, 0
    part = d.out if d.regime == "out" else d.window
    if d.lhs % n or part % n:
        return None
    l, p = d.lhs // n, part // n
    left = right = 0
    for k in range(n):
        if d.regime == "out":
            r_min, r_max = _rows(d, k * p, (k + 1) * p - 1, 0, d.window - 1)
        else:
            r_min, r_max = _rows(d, 0, d.out - 1, k * p, (k + 1) * p - 1)
        if r_min > r_max:
            continue
        left = max(left, k * l - r_min)
        right = max(right, r_max - ((k + 1) * l - 1))
    if left > l or right > l:
        return None
    return left, right


@dataclass(frozen=True)
class Halo:
    """The halo exchange of one strategy: ``collectives`` as (kind, axes, bytes sent per device),
    and ``copy_bytes`` = per-device bytes of the haloed lhs copy."""

    collectives: tuple
    copy_bytes: float


def conv_halo(dims: list[SpatialDim], lhs_local_shape, lhs_spatial_axes, itemsize: int,
              axes_of_dim: list[tuple], shards_of_dim: list[int]) -> Halo | None:
    """Halo of a conv whose spatial dim i is split over mesh axes ``axes_of_dim[i]`` into
    ``shards_of_dim[i]`` parts. ``lhs_local_shape``: the lhs shard (per device); ``lhs_spatial_axes``:
    the lhs tensor dim of spatial dim i. None when some dim cannot be split exactly."""
    tile = [int(x) for x in lhs_local_shape]
    colls = []
    base = math.prod(tile) * itemsize
    for i, d in enumerate(dims):
        n = shards_of_dim[i]
        if n <= 1:
            continue
        w = halo_widths(d, n)
        if w is None:
            return None
        ax = lhs_spatial_axes[i]
        rest = math.prod(tile) // tile[ax] * itemsize
        for side in w:
            if side > 0:
                colls.append(("collective-permute", tuple(axes_of_dim[i]), float(side * rest)))
        tile[ax] += w[0] + w[1]
    copy = float(math.prod(tile) * itemsize) if colls else 0.0
    return Halo(tuple(colls), copy if copy > base else 0.0)


def strategy_halo(node, operand_maps, assign: dict, lhs_spec, mesh):
    """(``conv_halo`` of a conv strategy, whether reduce-scatter variants are offered). ``operand_maps``:
    the conv's iteration-space maps (costmodel.strategies.Space); ``assign``: iteration dim -> mesh
    axes; ``lhs_spec``: the strategy's lhs spec.
    The halo is None — the strategy is not offered — where the spatial split is not exact, or where
    XLA's SPMD partitioner does not run it as a halo exchange (tests/test_halo.py compiles every
    spatial strategy of stride 1 / 2, dilation 2 and transposed convs, forward and gradients, on the
    2x4 CPU mesh). Measured and so left out:
    - a forward / data-gradient conv (``out`` regime) split spatially and on its out-feature dim:
      XLA all-gathers the kernel and all-reduces partial outputs;
    - a weight-gradient conv (``window`` regime) split spatially together with any other dim
      (batch, features) all-gathers or all-reduces once per axis; split spatially over only some of
      the mesh axes, XLA uses the idle axes too and all-reduces over every device; its
      reduce-scatter variant all-reduces over every device; with lhs dilation (the weight gradient
      of a transposed conv) it all-gathers. So a window-regime split is offered only
      with every mesh axis on window spatial dims, with one all-reduce over all of them (XLA's flat
      ring over the group moves the same bytes as costmodel.cost's hierarchical all-reduce)."""
    p = node.params
    lhs, rhs = node.operand_types[0], node.operand_types[1]
    dims = spatial_dims(p, lhs.shape, rhs.shape, node.outputs[0].shape)
    ls = p["dimension_numbers"]["lhs_spec"]
    lsp = [ls[2 + i] for i in range(len(dims))]
    lmap = operand_maps[0]
    ax_of = [tuple(assign.get(lmap[d], ())) for d in lsp]
    window = {lmap[d] for d, sd in zip(lsp, dims) if sd.regime == "window"}
    spatial = {lmap[d] for d in lsp}
    allow_rs = True
    if any(k in window for k in assign):
        used = {a for v in assign.values() for a in v}
        dilated = any(sd.lhs_dilation > 1 and lmap[d] in assign for d, sd in zip(lsp, dims))
        if dilated or any(k not in window for k in assign) or any(mesh.size[a] > 1 and a not in used
                                                               for a in mesh.axis_names):
            return None, False
        allow_rs = False
    elif any(k in spatial for k in assign):
        out_feature = operand_maps[1][p["dimension_numbers"]["rhs_spec"][0]]
        if out_feature in assign:
            return None, False
    return conv_halo(dims, local_shape(lhs.shape, lhs_spec, mesh), lsp, np.dtype(lhs.dtype).itemsize,
                     ax_of, [mesh.shards(a) for a in ax_of]), allow_rs
