"""MeshGraphNet: encode-process-decode GNN (Pfaff et al. 2021) on a fixed random mesh graph.

Encoders: node MLP and edge MLP to `latent`. n_blocks message-passing blocks, each
  edges <- edges + MLP(concat(edges, x[senders], x[receivers]))               (gathers)
  x     <- x + MLP(concat(x, segment_sum(edges, receivers, num_segments=N)))   (scatter-add)
Decoder MLP to `out_dim` (no LayerNorm). MLP = Dense(latent) relu Dense(latent) relu Dense(out),
LayerNorm after it except in the decoder. Loss = MSE vs the target.

The graph is part of the batch (role batch): `senders`/`receivers` int32 arrays. Each node receives
exactly edges_per_node = n_edges / n_nodes edges from distinct-from-itself random senders. A batch
of `batch` graphs is their disjoint union (node ids offset by g * n_nodes), so the leading dims are
N = batch * n_nodes and E = batch * n_edges. The target is the graph Laplacian of the first out_dim
node features, mean over in-edges of (x[s] - x[r]): a function a GNN can learn.
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


def make_batch(cfg: MeshGraphNetConfig, key) -> dict:
    kp, ks, kn = jax.random.split(key, 3)
    k = cfg.n_edges // cfg.n_nodes
    g = cfg.batch
    receivers = jnp.repeat(jnp.arange(cfg.n_nodes, dtype=jnp.int32), k)
    shift = jax.random.randint(ks, (cfg.n_edges,), 1, cfg.n_nodes, dtype=jnp.int32)
    senders = (receivers + shift) % cfg.n_nodes  # never a self-loop
    offsets = (jnp.arange(g, dtype=jnp.int32) * cfg.n_nodes)[:, None]
    senders = (senders[None] + offsets).reshape(-1)
    receivers = (receivers[None] + offsets).reshape(-1)
    pos = jax.random.uniform(kp, (cfg.total_nodes, 2), jnp.float32)
    nodes = jax.random.normal(kn, (cfg.total_nodes, cfg.node_in), jnp.float32)
    rel = pos[senders] - pos[receivers]
    edges = jnp.concatenate([rel, jnp.linalg.norm(rel, axis=-1, keepdims=True)], axis=-1)
    diff = nodes[senders, : cfg.out_dim] - nodes[receivers, : cfg.out_dim]
    target = jax.ops.segment_sum(diff, receivers, num_segments=cfg.total_nodes) / k
    return {"nodes": nodes, "edges": edges, "senders": senders, "receivers": receivers, "target": target}


def loss(module, params, batch):
    return jnp.mean((module.apply({"params": params}, batch) - batch["target"]) ** 2)
