"""Contest-like synthetic IOPDDL instances: strategy graphs built the way the contest's are, from
tensor layouts on a device mesh, so that the structure the held-back instances have is there.

What the shared contest instances (../shared/iopddl A, B, M, S) show, and what this mimics
(``python -c`` over the files; session 9):

* **limit = 1.1 x the least-usage peak** (A, B, M, S: 1.0998-1.100); the uncapped optimum of B peaks
  29x over it and costs 4x less than the capped best. Memory binds hard.
* the lowest-usage plan hits forbidden (1e18) edge entries on every instance: the most sharded
  layouts of neighbours are incompatible, so a feasible plan has to be searched for.
* strategies are output layouts on a 2-3 axis mesh: a node of rank r has up to (r+1)^m (M: 9 and 16
  dominate; 16 = 1 replicated + 6 one-axis + 9 two-axis on an 8x8 mesh, usages in ratio 1 : 1/8 :
  1/64). Usage = tensor bytes / the shard degree; tensor sizes are powers of two.
* 76-89 % of node costs are 0; cost lives on the edges (resharding: 0 where layouts agree, an
  all-gather or all-to-all otherwise); 35-68 % of edge entries are forbidden, many of them in
  permutation-tie matrices (5-52 % of edges: identity, the rest forbidden).
* program order: interval start tracks the node index (correlation 0.85-0.999); 6-19 % of nodes
  hold no memory (empty interval); most intervals are 2-3 steps, ~10 % span thousands (parameters,
  activations saved for the backward pass); 1,400-3,100 nodes live at once on the 30k-node graphs.
* 1.3-1.6 edges per node, 60-80 % of nodes of degree 1, hubs of degree 800-5,800 (weights read by
  every unrolled step), edges reaching back thousands of nodes (forward -> backward).

A feasible forbidden-free plan is guaranteed: a witness (a least-usage strategy per node, equal across
ties) has every node and edge entry it uses allowed, and its peak is the least peak, under the limit.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

FORBID = 1e18
PARAM_LOG2 = 4                    # parameters hold 2**this x the bytes of other leaves
DIM_LOG2 = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12])         # log2 of a tensor dim's size
DIM_P = np.array([0.3, 0.12, 0.1, 0.08, 0.08, 0.06, 0.06, 0.05, 0.05, 0.05, 0.05])


@dataclass(frozen=True)
class ContestShape:
    """One instance: node count, max strategies per node, mesh (log2 of each axis' size), max rank
    of an op's tensor, leaves (weights, constants) read per op (Poisson mean), the probability an
    op reads a second, earlier op (a skip, or an activation saved for the backward pass), the
    probability it reads one of the shared weights (hubs), the probability an op has its
    predecessor's shape, and then the probability the edge is a permutation tie, the fraction of
    values kept live for thousands of steps, the fraction of leaves that are parameters (live to the
    end, 16x the bytes), limit factor over the least peak, seed.
    Edges per node ~ (leaves_per_op + 1 + extra_edge_p + weight_read_p) / (leaves_per_op + 1)."""
    name: str
    nodes: int
    k_max: int
    mesh_log2: tuple
    max_rank: int
    leaves_per_op: float
    extra_edge_p: float
    weight_read_p: float
    follow_p: float
    tie_p: float
    long_p: float
    param_p: float
    limit_factor: float
    seed: int


CONTEST_SHAPES = [
    # the held-back 41k-node graph: about one edge per node, up to 41 strategies (score 0.39)
    ContestShape("contest-41k-thin-k41", 41000, 41, (1, 2, 2), 3, 1.5, 0.02, 0.03, 0.5, 0.6, 0.05, 0.3, 1.1, 21),
    # the 35k-65k-node graphs with up to 129 strategies (0.67-0.70)
    ContestShape("contest-45k-k129", 45000, 129, (1, 2, 3), 4, 1.5, 1.0, 0.1, 0.4, 0.4, 0.05, 0.3, 1.1, 22),
]


@lru_cache(maxsize=None)
def layouts(dims_log2: tuple, mesh_log2: tuple) -> np.ndarray:
    """Every assignment of mesh axes to tensor dims (-1: the axis is not used) such that each dim's
    size is divisible by the product of its axes: (k, m) int8, the replicated layout first."""
    r, m = len(dims_log2), len(mesh_log2)
    out = []
    for a in itertools.product(range(-1, r), repeat=m):
        used = np.zeros(r)
        for ax, d in enumerate(a):
            if d >= 0:
                used[d] += mesh_log2[ax]
        if (used <= np.asarray(dims_log2)).all():
            out.append(a)
    out.sort(key=lambda a: sum(x >= 0 for x in a))
    return np.asarray(out, dtype=np.int8).reshape(len(out), m)


def _degree_log2(L: np.ndarray, mesh_log2) -> np.ndarray:
    return ((L >= 0) * np.asarray(mesh_log2)[None, :]).sum(1)


def _reshard(Lu, need, bytes_u, mesh_log2, c_ag, c_a2a) -> tuple[np.ndarray, np.ndarray]:
    """(cost, all-to-all count) of moving u's value from each of its layouts ``Lu`` (ku, m) to each
    needed layout ``need`` (kv, m) in u's dims: per mesh axis, an all-gather when u shards on it and
    the need does not (the gathered shard's bytes), an all-to-all when they shard different dims,
    nothing when the need shards more (a local slice)."""
    du = 2.0 ** _degree_log2(Lu, mesh_log2)
    shard = bytes_u / du
    cost = np.zeros((len(Lu), len(need)))
    a2a = np.zeros((len(Lu), len(need)), dtype=np.int64)
    for a, lg in enumerate(mesh_log2):
        us, nd = Lu[:, a][:, None], need[:, a][None, :]
        ag = (us >= 0) & (nd < 0)
        aa = (us >= 0) & (nd >= 0) & (us != nd)
        cost += ag * (shard[:, None] * 2.0 ** lg * c_ag[a]) + aa * (shard[:, None] * c_a2a[a])
        a2a += aa
    return cost, a2a


def contest_like(shape: ContestShape):
    """The Problem of ``shape`` (module docstring), usage limit included."""
    from costmodel.problem import Problem, evaluate
    rng = np.random.default_rng(shape.seed)
    n, mesh = shape.nodes, tuple(shape.mesh_log2)
    m = len(mesh)
    c_ag = 2.0 ** -np.arange(m) * 3                                 # inner axes are faster links
    c_a2a = 0.5 * c_ag
    # program order: spine ops, each preceded by the leaves it reads (weights, constants: degree 1)
    is_leaf = np.zeros(n, dtype=bool)
    i = 0
    while i < n:
        nl = int(rng.poisson(shape.leaves_per_op))
        is_leaf[i:min(i + nl, n - 1)] = True
        i += nl + 1
    spine = np.nonzero(~is_leaf)[0]
    rp = 0.5 ** np.arange(shape.max_rank)                         # an op's rank: 1 most often
    rank = np.where(is_leaf, rng.integers(1, 3, n), 1 + rng.choice(shape.max_rank, n, p=rp / rp.sum()))
    dims = [tuple(int(x) for x in rng.choice(DIM_LOG2, int(r), p=DIM_P)) for r in rank]
    for j in range(1, len(spine)):      # elementwise followers: the same shape as the op before
        if rng.random() < shape.follow_p:
            dims[spine[j]] = dims[spine[j - 1]]
    L = [layouts(d, mesh) for d in dims]
    batch = [rng.random(len(d)) < 0.5 for d in dims]      # an op's batch-like dims (data parallel: free)
    for b in batch:
        b[0] = True
    for i in range(n):                       # clip to k_max (keep the replicated and most sharded)
        if len(L[i]) > shape.k_max:
            deg = _degree_log2(L[i], mesh)
            keep = np.concatenate([[0], np.argsort(-deg, kind="stable")[:3], rng.permutation(len(L[i]))])
            L[i] = L[i][np.sort(_first_unique(keep, shape.k_max))]
    param = is_leaf & (rng.random(n) < shape.param_p)
    nbytes = 2.0 ** (np.asarray([sum(d) for d in dims]) + rng.integers(1, 4, n) + PARAM_LOG2 * param)
    prods: list[list[int]] = [[] for _ in range(n)]
    tied_to = np.full(n, -1)
    hubs = spine[:max(2, len(spine) // 500)]
    pending: list[int] = []
    prev = -1
    for v in range(n):
        if is_leaf[v]:
            pending.append(v)
            continue
        prods[v] += pending
        pending = []
        if prev >= 0:
            prods[v].append(prev)
            if dims[prev] == dims[v] and rng.random() < shape.tie_p:
                L[v] = L[prev]
                tied_to[v] = prev
        if prev >= 0 and rng.random() < shape.extra_edge_p:   # a skip (near) or a saved activation (far)
            far = rng.random() < 0.5
            w = int(rng.integers(0, v) if far else rng.integers(max(0, v - 200), v))
            if not is_leaf[w]:
                prods[v].append(w)
        if rng.random() < shape.weight_read_p:
            prods[v].append(int(hubs[min(int(rng.pareto(0.8)), len(hubs) - 1)]))   # a few read by thousands
        prev = v
    witness = np.zeros(n, dtype=np.int64)   # a least-usage strategy, equal across ties
    for v in range(n):
        deg = _degree_log2(L[v], mesh)
        witness[v] = witness[tied_to[v]] if tied_to[v] >= 0 else int(rng.choice(np.nonzero(deg == deg.max())[0]))
    edges, ecosts = [], []
    last_use = np.arange(n) + 1
    for v in range(n):
        for u in sorted(set(prods[v])):
            if u >= v:
                continue
            if tied_to[v] == u:
                M = np.full((len(L[u]), len(L[v])), FORBID)
                np.fill_diagonal(M, 0.0)
            else:
                need = _need(L[u], L[v], dims[u], dims[v], rng, batch[v] if is_leaf[u] else 0.1)
                M, a2a = _reshard(L[u], need, nbytes[u], mesh, c_ag, c_a2a)
                M = np.rint(M)
                M[a2a >= 2] = FORBID                       # double all-to-all: not offered
                M[rng.random(M.shape) < 0.15] = FORBID     # and some pairs the partitioner cannot do
                M[witness[u], witness[v]] = min(M[witness[u], witness[v]], np.rint(nbytes[u] / 2.0 ** 3))
            edges.append((u, v))
            ecosts.append(M.ravel())
            last_use[u] = max(last_use[u], v + 1)
    costs, usages = [], []
    for i in range(n):
        deg = _degree_log2(L[i], mesh)
        c = np.zeros(len(L[i]))
        if not is_leaf[i]:      # an axis on a model dim: the partial sums' all-reduce (Megatron)
            on_model = (L[i] >= 0) & ~batch[i][np.maximum(L[i], 0)]
            c += np.rint((on_model * (nbytes[i] / 2.0 ** deg)[:, None] * 2.0 ** np.asarray(mesh)[None, :]
                          * c_ag[None, :]).sum(1))
        c[(deg == 0) & (rng.random(len(c)) < 0.5)] = np.rint(nbytes[i] / 64)     # replicated compute
        c[rng.random(len(c)) < 0.02] = FORBID
        c[witness[i]] = 0.0 if c[witness[i]] >= FORBID else c[witness[i]]
        costs.append(c)
        usages.append(np.maximum(np.rint(nbytes[i] / 2.0 ** deg), 1.0))
    intervals = np.stack([np.arange(n), last_use], 1)
    intervals[hubs, 1] = n
    intervals[param, 1] = n                    # parameters and optimizer state: live to the end
    saved = rng.random(n) < shape.long_p       # weights, saved activations: live for thousands of steps
    intervals[saved, 1] = np.maximum(intervals[saved, 1], intervals[saved, 0]
                                     + (rng.uniform(0.02, 1.0, int(saved.sum())) * (n - intervals[saved, 0])).astype(int))
    empty = rng.random(n) < 0.12
    intervals[empty, 1] = intervals[empty, 0]
    p = Problem.from_lists(shape.name, costs, usages, intervals, edges, ecosts)
    peak = evaluate(p.with_usage_limit(None), witness).peak_memory_bytes
    return p.with_usage_limit(float(np.floor(shape.limit_factor * peak)))


def _first_unique(order: np.ndarray, k: int) -> np.ndarray:
    _, idx = np.unique(order, return_index=True)
    return order[np.sort(idx)][:k]


def _need(Lu, Lv, dims_u, dims_v, rng, batch) -> np.ndarray:
    """The layout of u's value each of v's layouts needs, in u's dims: v's dims map to u's by a random
    partial injection, the identity when the shapes agree (an elementwise follower). A dim of v that
    u lacks (a batch dim of a weight's reader: each with probability ``batch_p``) needs u replicated
    over the axis v shards it on: an all-gather when u is sharded there (the FSDP cost)."""
    ru, rv = len(dims_u), len(dims_v)
    f = np.full(rv + 1, -1)
    tgt = np.arange(ru) if tuple(dims_u) == tuple(dims_v) else rng.permutation(ru)[:rv]
    f[:len(tgt)] = tgt
    drop = np.append(batch, False) if isinstance(batch, np.ndarray) else rng.random(rv + 1) < batch
    f = np.where(drop, -1, f)
    f[rv] = -1                                  # index -1 (axis unused) maps to -1
    return f[Lv.astype(np.int64)]
