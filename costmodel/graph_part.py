"""Graph partitioning for message passing: node-sharded gathers and scatter-adds with a halo exchange.

A mesh GNN gathers node features along edges (``x[senders]``: a row gather [N, F] -> [E, F]) and
aggregates messages into nodes (``segment_sum(m, receivers, N)``: a row scatter-add [E, F] -> [N, F]).
The generic rules (costmodel.strategies) shard such an op either on the edges with the node table
replicated (its producer pays an all-gather of [N, F]) or on the point-indexed node dim (masked
lookup + all-reduce of [E, F]); an edge-sharded scatter-add all-reduces or reduce-scatters [N, F].
The strategies here shard nodes and edges on the *same* mesh axes A (n = Π|A| shards, device d owns
the contiguous node rows [d·m, (d+1)·m), m = N / n, and the edge rows [d·e, (d+1)·e), e = E / n);
the feature dims may be sharded on other axes:

- ``halo gather``: device d needs the rows its edges index. Rows it owns are local; the others (the
  halo) come from their owners, one ``collective-permute`` per shift s = (owner − d) mod n that
  has any: device j sends to device (j − s) mod n the H_s rows it needs (H_s = the max over devices,
  padded), and the gather reads from [own rows; halo rows].
- ``halo scatter-add``: device d adds its edges' messages into [own rows; halo rows] (partial sums),
  sends the halo part of shift s to its owner (one ``collective-permute`` of H_s rows per shift), and
  the owner adds what it receives into its rows. With edges sorted by receiver, as a mesh's edge list
  is (zoo.meshgraphnet), the aggregation's halo is empty: no communication at all.

The halo comes from the connectivity (``halo_plan``: exact, from the index array the op reads, when
the real arrays are known: ``space_for(graph, args)``). With only shapes (``assumed_halo``): the graph
is assumed to be a 2-D mesh of N nodes numbered by ``locality_order``, so a shard is a band of BFS
levels whose two boundaries (shifts +1 and −1 = n − 1) are each one level of ``ASSUMED_BOUNDARY``
x sqrt(N) rows (a level cuts across the mesh), at most m. Measured on the zoo's periodic lattices
renumbered by ``locality_order``: 954 / 952 rows = 2.6 sqrt(N) on mesh-131k (256 x 512, 6
neighbours) at 8 and 16 shards. Off by the graph's real cross-section: a long thin mesh has fewer,
a 3-D mesh (N^(2/3) per level) or a random graph (nearly all of N) far more.

Node numbering decides the halo: ``locality_order`` (breadth-first levels from a pseudo-peripheral
node, Cuthill–McKee style, per connected component, from senders/receivers only) makes a block of
consecutive ids a band of the mesh, so the halo of a node-sharded gather is about two BFS levels
instead of the whole table. The runtime (runtime/dist_gather.py) executes the plan with
``jax.shard_map``, ``jax.lax.ppermute`` and a local gather / scatter-add (XLA's partitioner
all-gathers the table instead). Cost: FLOPs / n per device, per shift a collective-permute of
H_s x (local feature bytes of a row); memory: the halo rows (``Strategy.extra_bytes``) plus the
host-built lookup constants (``lookup_bytes``). Checked on the 8 CPU devices
(tests/test_graph_part.py, a MeshGraphNet step with 4 halo and 2 edge-sharded message-passing ops):
XLA's collective-permute bytes equal the predicted halo bytes exactly; the whole plan's memory is
predicted at 0.71x XLA's, the gap being resharded copies elsewhere in the plan (costmodel.builder).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from costmodel.space import FULL

#: halo rows per side of a shard, in units of sqrt(N) (N nodes), when only shapes are known
ASSUMED_BOUNDARY = 2.5
MP_PRIMITIVES = ("gather", "scatter-add", "scatter_add")


# ---- which ops --------------------------------------------------------------------------------------
def mp_kind(node) -> str | None:
    """"gather" for a row gather table[idx[:, 0]] (table [N, ...], idx [E, 1]), "scatter" for a row
    scatter-add into [N, ...] of updates [E, ...] at idx [E, 1]; None for any other gather / scatter."""
    if node.primitive not in MP_PRIMITIVES or node.is_input or len(node.operand_types) < 2:
        return None
    p, dn = node.params, node.params.get("dimension_numbers") or {}
    x, idx = node.operand_types[0].shape, node.operand_types[1].shape
    if len(idx) != 2 or idx[1] != 1 or len(x) < 1:
        return None
    rest = list(range(1, len(x)))
    if node.primitive == "gather":
        ok = (list(dn.get("collapsed_slice_dims", ())) == [0] and list(dn.get("start_index_map", ())) == [0]
              and list(dn.get("offset_dims", ())) == rest and not dn.get("operand_batching_dims")
              and list(p.get("slice_sizes", ())) == [1, *x[1:]])
        return "gather" if ok else None
    if len(node.operand_types) < 3:
        return None
    upd = node.operand_types[2].shape
    ok = (list(dn.get("update_window_dims", ())) == rest and list(dn.get("inserted_window_dims", ())) == [0]
          and list(dn.get("scatter_dims_to_operand_dims", ())) == [0] and not dn.get("operand_batching_dims")
          and tuple(upd) == (idx[0], *x[1:]))
    return "scatter" if ok else None


def index_source(graph, nid: int, depth: int = 12) -> int | None:
    """The input node whose values the index operand of node ``nid`` carries: the single input
    reached upward through index-sized nodes (reshape, broadcast, the negative-index wrap
    ``where(i < 0, i + N, i)``, which is the identity on valid indices), else None."""
    start = graph.nodes[nid].operands[1][0]
    size = math.prod(graph.nodes[nid].operand_types[1].shape)
    found, seen, todo = set(), set(), [(start, 0)]
    while todo:
        u, d = todo.pop()
        if u < 0 or u in seen:
            continue
        seen.add(u)
        nd = graph.nodes[u]
        if nd.is_input:
            found.add(u)
            continue
        if d >= depth or math.prod(nd.out.shape) != size:
            return None
        todo += [(s, d + 1) for s, _ in nd.operands]
    return found.pop() if len(found) == 1 else None


# ---- node renumbering -------------------------------------------------------------------------------
def _csr(senders, receivers, n_nodes):
    a = np.concatenate([senders, receivers]).astype(np.int64)
    b = np.concatenate([receivers, senders]).astype(np.int64)
    o = np.argsort(a, kind="stable")
    ptr = np.zeros(n_nodes + 1, np.int64)
    np.cumsum(np.bincount(a, minlength=n_nodes), out=ptr[1:])
    return ptr, b[o]


def _bfs(ptr, nbr, start, mask):
    """Breadth-first order of start's component (vectorised per level), marking ``mask``."""
    mask[start] = True
    order, front = [np.array([start])], np.array([start])
    while front.size:
        deg = ptr[front + 1] - ptr[front]
        cand = nbr[np.repeat(ptr[front], deg) + (np.arange(deg.sum()) - np.repeat(np.cumsum(deg) - deg, deg))]
        cand = np.unique(cand[~mask[cand]]) if cand.size else cand
        mask[cand] = True
        if cand.size:
            order.append(cand)
        front = cand
    return np.concatenate(order)


def locality_order(senders, receivers, n_nodes: int) -> np.ndarray:
    """A locality-aware node order: ``order[i]`` = the old id of new node i. Per connected component
    (in id order of their smallest node), breadth-first levels from a pseudo-peripheral node (the
    last node of a BFS from the component's first node). Cost O(N + E) per BFS, two per component."""
    s, r = np.asarray(senders).ravel(), np.asarray(receivers).ravel()
    if s.shape != r.shape or (s.size and (min(s.min(), r.min()) < 0 or max(s.max(), r.max()) >= n_nodes)):
        raise ValueError(f"locality_order: senders and receivers must be equal-length ids in [0, {n_nodes})")
    ptr, nbr = _csr(s, r, n_nodes)
    done = np.zeros(n_nodes, bool)
    out = []
    for v in range(n_nodes):
        if done[v]:
            continue
        probe = _bfs(ptr, nbr, v, done.copy())
        out.append(_bfs(ptr, nbr, int(probe[-1]), done))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


# ---- the halo of one index array ----------------------------------------------------------------------
@dataclass(frozen=True)
class HaloPlan:
    """The halo of a node-sharded row gather / scatter-add over n shards (module docstring).

    ``shifts[k]`` = s, ``sizes[k]`` = H_s (rows per device, the max over devices). With real
    arrays (``exact``): ``send_rows[k]`` [n, H_s] = the local rows device j sends for shift s (padded
    with 0), ``halo_ids`` [n, H] sorted global ids of each device's halo rows (padded with N) and
    ``halo_pos`` [n, H] their positions in [own rows; shift-s blocks in ``shifts`` order]."""

    n_shards: int
    rows_per_shard: int
    shifts: tuple[int, ...]
    sizes: tuple[int, ...]
    exact: bool
    send_rows: tuple = field(default=(), compare=False, repr=False)
    halo_ids: np.ndarray | None = field(default=None, compare=False, repr=False)
    halo_pos: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def halo_rows(self) -> int:
        return int(sum(self.sizes))

    def lookup_bytes(self) -> int:
        """Per-device bytes of the constants the runtime builds from the plan (int32)."""
        return 4 * (2 * self.halo_rows + sum(self.sizes)) if self.exact else 0


def halo_plan(idx, n_nodes: int, n_shards: int) -> HaloPlan:
    """The exact halo of an index array ``idx`` [E] (global node ids) with nodes and edges in
    n_shards contiguous blocks. ValueError when the blocks do not divide or an id is out of range."""
    idx = np.asarray(idx).ravel().astype(np.int64)
    n, E = int(n_shards), idx.size
    if n < 1 or n_nodes % n or E % n:
        raise ValueError(f"halo_plan: {n} shards must divide the {n_nodes} nodes and {E} edges")
    if E and (idx.min() < 0 or idx.max() >= n_nodes):
        raise ValueError(f"halo_plan: node ids must lie in [0, {n_nodes})")
    m, e = n_nodes // n, E // n
    dev = np.repeat(np.arange(n), e)
    pair = np.unique(dev * n_nodes + idx)             # (device, row) needed, sorted by device then row
    d, g = pair // n_nodes, pair % n_nodes
    s = (g // m - d) % n
    d, g, s = d[s != 0], g[s != 0], s[s != 0]
    cnt = np.zeros((n, n), np.int64)
    np.add.at(cnt, (s, d), 1)
    shifts = tuple(int(x) for x in np.nonzero(cnt.max(axis=1))[0])
    sizes = tuple(int(cnt[x].max()) for x in shifts)
    H = sum(sizes)
    send, ids, pos = [], np.full((n, H), n_nodes, np.int64), np.zeros((n, H), np.int64)
    fill = np.zeros(n, np.int64)
    off = m
    for x, h in zip(shifts, sizes):
        rows = np.zeros((n, h), np.int64)
        sel = s == x
        dd, gg = d[sel], g[sel]                       # sorted by (d, g)
        k = np.arange(dd.size) - np.searchsorted(dd, dd)   # rank within the device
        rows[(dd + x) % n, k] = gg - ((dd + x) % n) * m
        ids[dd, fill[dd] + k] = gg
        pos[dd, fill[dd] + k] = off + k
        np.add.at(fill, dd, 1)
        send.append(rows.astype(np.int32))
        off += h
    o = np.argsort(ids, axis=1, kind="stable")
    ids, pos = np.take_along_axis(ids, o, 1), np.take_along_axis(pos, o, 1)
    return HaloPlan(n, m, shifts, sizes, True, tuple(send), ids.astype(np.int32), pos.astype(np.int32))


def assumed_halo(n_nodes: int, n_shards: int) -> HaloPlan:
    """The halo assumed when only shapes are known (module docstring): ASSUMED_BOUNDARY·sqrt(N) rows
    from each of shifts +1 and −1, at most m."""
    n = int(n_shards)
    m = n_nodes // n
    h = min(m, math.ceil(ASSUMED_BOUNDARY * math.sqrt(n_nodes)))
    shifts = (1,) if n == 2 else (1, n - 1)
    return HaloPlan(n, m, shifts, (h,) * len(shifts), False)


# ---- connectivity and the search space -----------------------------------------------------------------
@dataclass(frozen=True)
class Connectivity:
    """Real index arrays of a traced graph: graph node id (a row gather / scatter-add) -> the index
    values it reads (from the input leaf ``index_source`` finds). Plans are cached per shard count."""

    index_of_node: dict = field(compare=False)
    _plans: dict = field(default_factory=dict, compare=False, repr=False)

    def plan(self, nid: int, n_nodes: int, n_shards: int) -> HaloPlan | None:
        idx = self.index_of_node.get(nid)
        if idx is None:
            return None
        key = (id(idx), n_nodes, n_shards)
        if key not in self._plans:
            self._plans[key] = halo_plan(idx, n_nodes, n_shards)
        return self._plans[key]


def connectivity(graph, args) -> Connectivity:
    """The index arrays of every row gather / scatter-add of ``graph`` that reads an input leaf of
    ``args`` holding real integer values (ShapeDtypeStruct leaves are skipped: shapes only)."""
    import jax
    leaves = jax.tree.leaves(args)
    out = {}
    for nd in graph.nodes:
        if mp_kind(nd) is None:
            continue
        src = index_source(graph, nd.id)
        if src is None:
            continue
        leaf = leaves[graph.nodes[src].input_index]
        if hasattr(leaf, "dtype") and np.issubdtype(leaf.dtype, np.integer) and not isinstance(leaf, jax.ShapeDtypeStruct):
            out[nd.id] = np.asarray(leaf).ravel()
    return Connectivity(out)


def space_for(graph, args, base=None):
    """The full SearchSpace with the graph's real connectivity (``connectivity``), so halo strategies
    are priced from it: ``build_problem(graph, cluster, space=space_for(graph, args))``."""
    return dataclasses.replace(base or FULL, message_passing=True, connectivity=connectivity(graph, args))


# ---- strategies ---------------------------------------------------------------------------------------
def node_plan(node, conn: Connectivity | None, n_shards: int) -> HaloPlan:
    """The halo of ``node`` on n_shards: exact from ``conn`` when it has the node, else assumed."""
    n_nodes = node.operand_types[0].shape[0] if mp_kind(node) == "gather" else node.outputs[0].shape[0]
    hp = conn.plan(node.id, n_nodes, n_shards) if conn is not None else None
    return hp if hp is not None else assumed_halo(n_nodes, n_shards)


def halo_strategies(node, space, mesh, conn: Connectivity | None, make):
    """The node's halo strategies: ``make(assign, flops, collectives, extra_bytes)`` builds one from
    an iteration-dim -> axes assignment of ``space`` (costmodel.strategies.Space). Nodes and edges on
    the same axes A (every non-empty ordered subset, major first), feature dims on the others."""
    kind = mp_kind(node)
    if kind is None or space is None:
        return []
    tab = 0 if kind == "gather" else None
    n_map = space.operand_maps[0] if tab == 0 else space.out_maps[0]
    e_dim = space.operand_maps[1][0]
    k_n = n_map[0]
    f_dims = [k for k in n_map[1:] if k is not None and space.kinds[k] == "par"]
    shape = node.operand_types[0].shape
    item = np.dtype(node.operand_types[0].dtype).itemsize
    N, E = shape[0], node.operand_types[1].shape[0]
    axes = [a for a in mesh.axis_names if mesh.size[a] > 1]
    res = []
    for r in range(1, len(axes) + 1):
        for A in itertools.combinations(axes, r):
            n = mesh.shards(A)
            if N % n or E % n or k_n is None or e_dim is None:
                continue
            hp = node_plan(node, conn, n)
            rest = [a for a in axes if a not in A]
            for fa in [None] + [(f, a) for f in f_dims for a in rest]:
                assign = {k_n: A, e_dim: A}
                f_local = math.prod(shape[1:])
                if fa is not None:
                    if space.sizes[fa[0]] % mesh.size[fa[1]]:
                        continue
                    assign[fa[0]] = (fa[1],)
                    f_local //= mesh.size[fa[1]]
                row = item * f_local
                coll = tuple(("collective-permute", A, float(h * row)) for h in hp.sizes)
                flops = float(node.flops) / (n * (mesh.size[fa[1]] if fa else 1))
                res.append(make(assign, flops, coll, float(hp.halo_rows * row + hp.lookup_bytes())))
    return res
