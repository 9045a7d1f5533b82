"""MeshGraphNet: encode-process-decode GNN (Pfaff et al. 2021) on a fixed random mesh graph.

Encoders: node MLP and edge MLP to `latent`. n_blocks message-passing blocks, each
  edges <- edges + MLP(concat(edges, x[senders], x[receivers]))               (gathers)
  x     <- x + MLP(concat(x, segment_sum(edges, receivers, num_segments=N)))   (scatter-add)
Decoder MLP to `out_dim` (no LayerNorm). MLP = Dense(latent) relu Dense(latent) relu Dense(out),
LayerNorm after it except in the decoder. Loss = MSE vs the target.

The graph is part of the batch (role batch): `senders`/`receivers` int32 arrays. The mesh is a
periodic 2-D lattice of rows x cols = n_nodes points (rows the largest divisor <= sqrt(n_nodes)); node
r receives edges_per_node = n_edges / n_nodes edges, one from each of its first k lattice neighbours
in `NEIGHBOUR_OFFSETS` (k = 4: the 4-neighbour grid; 6: the triangulated grid; up to 12). Node ids are
a random permutation of the lattice order (as an unordered mesh file gives them: a contiguous block
of ids is scattered over the mesh; costmodel.graph_part.locality_order renumbers it, and
`permute_nodes` applies a renumbering). Edges are sorted by receiver. A batch of `batch` graphs is
their disjoint union (node ids offset by g * n_nodes), so the leading dims are N = batch * n_nodes and
E = batch * n_edges. Node positions are the lattice points (unit square) plus a small jitter. The
target is the graph Laplacian of the first out_dim node features, mean over in-edges of
(x[s] - x[r]): a function a GNN can learn.
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class MeshGraphNetConfig:
    n_nodes: int  # per graph
    n_edges: int  # per graph; a multiple of n_nodes
    latent: int
    n_blocks: int
    batch: int = 1  # graphs per batch (disjoint union)
    node_in: int = 8
    edge_in: int = 3  # relative position (2) and its norm
    out_dim: int = 2
    mlp_hidden_layers: int = 2

    @property
    def total_nodes(self) -> int:
        return self.batch * self.n_nodes

    @property
    def total_edges(self) -> int:
        return self.batch * self.n_edges


SIZES = {
    "tiny": MeshGraphNetConfig(n_nodes=64, n_edges=256, latent=32, n_blocks=2),
    "large": MeshGraphNetConfig(n_nodes=65536, n_edges=393216, latent=128, n_blocks=15),
    "mesh-131k": MeshGraphNetConfig(n_nodes=131072, n_edges=786432, latent=128, n_blocks=15),
}


class MLP(nn.Module):
    latent: int
    out: int
    hidden_layers: int
    layer_norm: bool = True

    @nn.compact
    def __call__(self, x):
        for i in range(self.hidden_layers):
            x = nn.relu(nn.Dense(self.latent, name=f"Dense_{i}")(x))
        x = nn.Dense(self.out, name=f"Dense_{self.hidden_layers}")(x)
        return nn.LayerNorm(name="LayerNorm_0")(x) if self.layer_norm else x


class MeshGraphNet(nn.Module):
    cfg: MeshGraphNetConfig

    @nn.compact
    def __call__(self, batch):
        cfg = self.cfg
        senders, receivers = batch["senders"], batch["receivers"]
        n = batch["nodes"].shape[0]
        mlp = lambda name, out=cfg.latent, ln=True: MLP(cfg.latent, out, cfg.mlp_hidden_layers, ln, name=name)
        x = mlp("node_encoder")(batch["nodes"])
        e = mlp("edge_encoder")(batch["edges"])
        for i in range(cfg.n_blocks):
            e = e + mlp(f"block_{i}_edge")(jnp.concatenate([e, x[senders], x[receivers]], axis=-1))
            agg = jax.ops.segment_sum(e, receivers, num_segments=n)
            x = x + mlp(f"block_{i}_node")(jnp.concatenate([x, agg], axis=-1))
        return mlp("decoder", cfg.out_dim, False)(x)


def model(cfg: MeshGraphNetConfig) -> nn.Module:
    if cfg.n_edges % cfg.n_nodes:
        raise ValueError(f"MeshGraphNetConfig.n_edges={cfg.n_edges} must be a multiple of n_nodes={cfg.n_nodes}")
    if cfg.out_dim > cfg.node_in:
        raise ValueError(f"MeshGraphNetConfig.out_dim={cfg.out_dim} must be <= node_in={cfg.node_in}")
    return MeshGraphNet(cfg)


#: lattice offsets (d_row, d_col) of a node's in-neighbours, nearest first, in symmetric pairs
NEIGHBOUR_OFFSETS = ((0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (-1, -1), (1, -1), (-1, 1),
                     (0, 2), (0, -2), (2, 0), (-2, 0))


def lattice(n_nodes: int) -> tuple[int, int]:
    """(rows, cols) of the periodic lattice: rows = the largest divisor of n_nodes <= sqrt(n_nodes)."""
    rows = max(d for d in range(1, int(n_nodes ** 0.5) + 1) if n_nodes % d == 0)
    return rows, n_nodes // rows


def make_batch(cfg: MeshGraphNetConfig, key) -> dict:
    kp, ks, kn = jax.random.split(key, 3)
    k = cfg.n_edges // cfg.n_nodes
    rows, cols = lattice(cfg.n_nodes)
    if k > len(NEIGHBOUR_OFFSETS) or min(rows, cols) < 5:
        raise ValueError(f"MeshGraphNetConfig: edges per node {k} must be <= {len(NEIGHBOUR_OFFSETS)} and the "
                         f"{rows}x{cols} lattice of n_nodes={cfg.n_nodes} at least 5x5")
    g = cfg.batch
    lat_id = jax.random.permutation(ks, cfg.n_nodes).astype(jnp.int32)   # node id -> lattice point
    node_of = jnp.zeros(cfg.n_nodes, jnp.int32).at[lat_id].set(jnp.arange(cfg.n_nodes, dtype=jnp.int32))
    off = jnp.asarray(NEIGHBOUR_OFFSETS[:k], jnp.int32)
    r_lat = lat_id[:, None]
    nbr = ((r_lat // cols + off[None, :, 0]) % rows) * cols + (r_lat % cols + off[None, :, 1]) % cols
    receivers = jnp.repeat(jnp.arange(cfg.n_nodes, dtype=jnp.int32), k)
    senders = node_of[nbr].reshape(-1)
    offsets = (jnp.arange(g, dtype=jnp.int32) * cfg.n_nodes)[:, None]
    senders = (senders[None] + offsets).reshape(-1)
    receivers = (receivers[None] + offsets).reshape(-1)
    grid = jnp.stack([lat_id // cols / rows, lat_id % cols / cols], axis=-1).astype(jnp.float32)
    pos = jnp.tile(grid, (g, 1)) + 0.1 / cols * jax.random.uniform(kp, (cfg.total_nodes, 2), jnp.float32)
    nodes = jax.random.normal(kn, (cfg.total_nodes, cfg.node_in), jnp.float32)
    rel = pos[senders] - pos[receivers]
    edges = jnp.concatenate([rel, jnp.linalg.norm(rel, axis=-1, keepdims=True)], axis=-1)
    diff = nodes[senders, : cfg.out_dim] - nodes[receivers, : cfg.out_dim]
    target = jax.ops.segment_sum(diff, receivers, num_segments=cfg.total_nodes) / k
    return {"nodes": nodes, "edges": edges, "senders": senders, "receivers": receivers, "target": target}


def permute_nodes(batch: dict, order) -> dict:
    """``batch`` with its nodes renumbered: new node i is old node ``order[i]`` (nodes, target rows,
    senders and receivers follow), edges stably re-sorted by their new receiver. The same graph, so
    the loss is the same up to float summation order."""
    import numpy as np
    order = np.asarray(order)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size, dtype=order.dtype)
    s, r = rank[np.asarray(batch["senders"])], rank[np.asarray(batch["receivers"])]
    e = np.argsort(r, kind="stable")
    return {"nodes": jnp.asarray(np.asarray(batch["nodes"])[order]), "target": jnp.asarray(np.asarray(batch["target"])[order]),
            "edges": jnp.asarray(np.asarray(batch["edges"])[e]), "senders": jnp.asarray(s[e].astype(np.int32)),
            "receivers": jnp.asarray(r[e].astype(np.int32))}


def loss(module, params, batch):
    return jnp.mean((module.apply({"params": params}, batch) - batch["target"]) ** 2)
