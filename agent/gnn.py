"""The policy/value network: a message-passing GNN over the strategy graph (Flax linen).

The network reads a compact *model input* made from an env observation by ``model_input``:
``nodes (N, F_node + 2 F_act)`` = the env's node features plus the mean and the min over each
node's valid strategies of its action features (so a node's embedding sees, e.g., the resharding
its neighbours' decisions already impose on it), ``edge_index (E, 2)`` (producer, consumer),
``edge_features (E, F_edge)``, masks ``node_mask (N,)`` / ``edge_mask (E,)`` that zero the
padding, ``current_node ()``, ``cur_action (K, F_act)`` = action features of the node being
decided, and its ``action_mask (K,)``. Only the current node's action features are kept, which
keeps stored rollouts small (the policy head scores one node per step).

* ``encode``: h⁰ = MLP(node_features); then ``rounds`` times, with separate weights for messages
  along edges (producer → consumer) and against them (consumer → producer):
      m_fwd[v] = mean_{(u,v)} relu(W_f [h[u], e_uv]),   m_bwd[u] = mean_{(u,v)} relu(W_b [h[v], e_uv])
      h ← LayerNorm(h + MLP([h, m_fwd, m_bwd])) · node_mask
  (jax.ops.segment_sum over the edge list; mean = sum / max(degree, 1), so graph size does not
  shift the scale). The graph embedding g = [masked mean(h), masked max(h)].
* ``logits``: for each strategy s of a node i, MLP([h[i], g, action_features[i, s]]) → one logit;
  masked strategies get −1e9. Works for any K and any number of nodes; no node ids are features.
* ``value``: MLP([g, h[current]]) → scalar.

Batches: ``pad_inputs`` stacks model inputs into one batch padded to power-of-two sizes
(``bucket``), so jit compiles a handful of shapes; ``init_params`` initialises a network from one
env observation.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -1e9


class MLP(nn.Module):
    sizes: Sequence[int]
    final_act: bool = False

    @nn.compact
    def __call__(self, x):
        for j, size in enumerate(self.sizes):
            x = nn.Dense(size)(x)
            if j < len(self.sizes) - 1 or self.final_act:
                x = nn.relu(x)
        return x


class ShardingGNN(nn.Module):
    """Policy and value network; see the module docstring for the equations."""

    hidden: int = 64
    rounds: int = 4

    def setup(self):
        H = self.hidden
        self.embed = MLP((H, H), final_act=True)
        self.edge_embed = nn.Dense(H)
        self.msg_fwd = [nn.Dense(H) for _ in range(self.rounds)]
        self.msg_bwd = [nn.Dense(H) for _ in range(self.rounds)]
        self.update = [MLP((H, H)) for _ in range(self.rounds)]
        self.norms = [nn.LayerNorm() for _ in range(self.rounds)]
        self.policy_head = MLP((H, H, 1))
        self.value_head = MLP((H, H, 1))

    def encode(self, node_features, edge_index, edge_features, node_mask, edge_mask):
        """Node embeddings h (N, H) and graph embedding g (2H,) of one padded graph."""
        n = node_features.shape[0]
        nm = node_mask.astype(jnp.float32)[:, None]
        em = edge_mask.astype(jnp.float32)[:, None]
        src, dst = edge_index[:, 0], edge_index[:, 1]
        deg_in = jnp.maximum(jax.ops.segment_sum(em[:, 0], dst, num_segments=n), 1.0)[:, None]
        deg_out = jnp.maximum(jax.ops.segment_sum(em[:, 0], src, num_segments=n), 1.0)[:, None]
        h = self.embed(node_features) * nm
        e = nn.relu(self.edge_embed(edge_features))
        for r in range(self.rounds):
            mf = nn.relu(self.msg_fwd[r](jnp.concatenate([h[src], e], -1))) * em
            mb = nn.relu(self.msg_bwd[r](jnp.concatenate([h[dst], e], -1))) * em
            agg_f = jax.ops.segment_sum(mf, dst, num_segments=n) / deg_in
            agg_b = jax.ops.segment_sum(mb, src, num_segments=n) / deg_out
            h = self.norms[r](h + self.update[r](jnp.concatenate([h, agg_f, agg_b], -1))) * nm
        count = jnp.maximum(nm.sum(), 1.0)
        g = jnp.concatenate([h.sum(0) / count, jnp.where(nm > 0, h, -1e4).max(0)], -1)
        return h, g

    def logits(self, h_nodes, g, action_features, action_mask):
        """Logits (..., K) for nodes with embeddings h_nodes (..., H) and features (..., K, F_act)."""
        k = action_features.shape[-2]
        hb = jnp.broadcast_to(h_nodes[..., None, :], h_nodes.shape[:-1] + (k, h_nodes.shape[-1]))
        gb = jnp.broadcast_to(g, hb.shape[:-1] + g.shape[-1:])
        out = self.policy_head(jnp.concatenate([hb, gb, action_features], -1))[..., 0]
        return jnp.where(action_mask > 0, out, NEG_INF)

    def value(self, h_node, g):
        return self.value_head(jnp.concatenate([g, h_node], -1))[..., 0]

    def embed_graph(self, x):
        return self.encode(x["nodes"], x["edge_index"], x["edge_features"], x["node_mask"], x["edge_mask"])

    def __call__(self, x):
        """(logits (K,), value ()) for the current node of one model input (see ``model_input``)."""
        h, g = self.embed_graph(x)
        hc = h[x["current_node"]]
        logits = self.logits(hc, g, x["cur_action"], x["action_mask"])
        return logits, self.value(hc, g)


def np_mlp(layers: dict, x: np.ndarray, final_act: bool = False) -> np.ndarray:
    """Apply a Flax ``MLP`` (Dense_0..Dense_{L-1}, relu between, and after the last with
    ``final_act``) in numpy."""
    names = sorted(layers, key=lambda s: int(s.split("_")[1]))
    for j, name in enumerate(names):
        x = x @ layers[name]["kernel"] + layers[name]["bias"]
        if j < len(names) - 1 or final_act:
            x = np.maximum(x, 0.0)
    return x


def np_encode(params: dict, nodes: np.ndarray, edge_index: np.ndarray, edge_features: np.ndarray,
              rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """``ShardingGNN.encode`` in numpy for one unpadded graph: the same equations and parameters,
    without jit, so a planner's first call costs what its later calls cost (jit compiled each new
    padded shape: 1.6 s of a 3.1 s first plan of a 2,000-node problem). float32 throughout; agrees
    with the Flax version to float32 rounding (LayerNorm here takes the two-pass variance)."""
    p = params["params"]
    relu = (lambda x: np.maximum(x, 0.0))

    def dense(d, x):
        return x @ np.asarray(d["kernel"], np.float32) + np.asarray(d["bias"], np.float32)

    mlp = np_mlp

    def layer_norm(d, x):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-6) * np.asarray(d["scale"], np.float32) + np.asarray(d["bias"], np.float32)

    nodes = np.asarray(nodes, np.float32)
    n = nodes.shape[0]
    src, dst = np.asarray(edge_index[:, 0], np.int64), np.asarray(edge_index[:, 1], np.int64)
    deg_in = np.maximum(np.bincount(dst, minlength=n), 1).astype(np.float32)[:, None]
    deg_out = np.maximum(np.bincount(src, minlength=n), 1).astype(np.float32)[:, None]
    h = mlp(p["embed"], nodes, final_act=True)
    e = relu(dense(p["edge_embed"], np.asarray(edge_features, np.float32)))
    H = h.shape[1]

    def message(d, x, ends):
        # W [h[ends], e] + b = (h W_h)[ends] + (e W_e + b): the product per node, not per edge
        k = np.asarray(d["kernel"], np.float32)
        return relu((x @ k[:H])[ends] + (e @ k[H:] + np.asarray(d["bias"], np.float32)))

    for r in range(rounds):
        mf = message(p[f"msg_fwd_{r}"], h, src)
        mb = message(p[f"msg_bwd_{r}"], h, dst)
        agg_f = np.zeros_like(h)
        agg_b = np.zeros_like(h)
        np.add.at(agg_f, dst, mf)
        np.add.at(agg_b, src, mb)
        upd = mlp(p[f"update_{r}"], np.concatenate([h, agg_f / deg_in, agg_b / deg_out], -1))
        h = layer_norm(p[f"norms_{r}"], h + upd)
    g = np.concatenate([h.mean(0), h.max(0)], -1) if n else np.zeros(2 * h.shape[1], np.float32)
    return h, g


def node_inputs(node_features: np.ndarray, action_features: np.ndarray) -> np.ndarray:
    """[node features, mean and min over valid strategies of the action features] per node.
    Validity is the env's "valid" action feature (column 0)."""
    valid = action_features[:, :, :1] > 0
    cnt = np.maximum(valid.sum(1), 1)
    mean = np.where(valid, action_features, 0).sum(1) / cnt
    mn = np.where(valid, action_features, np.inf).min(1)
    mn = np.where(np.isfinite(mn), mn, 0)
    return np.concatenate([node_features, mean, mn], 1).astype(np.float32)


def model_input(obs: dict) -> dict:
    """Trimmed, compact copy of one env observation: rows beyond the real nodes/edges dropped
    (the env keeps real rows first), only the current node's action features kept."""
    n = int(obs["node_mask"].sum())
    e = int(obs["edge_mask"].sum())
    cur = int(np.asarray(obs["current_node"]).reshape(-1)[0])
    af = obs["action_features"]
    return {
        "nodes": node_inputs(obs["node_features"][:n], af[:n]),
        "edge_index": np.array(obs["edge_index"][:e], np.int32),
        "edge_features": np.array(obs["edge_features"][:e], np.float32),
        "node_mask": np.ones(n, np.int8),
        "edge_mask": np.ones(e, np.int8),
        "current_node": np.int32(cur),
        "cur_action": np.array(af[cur], np.float32),
        "action_mask": np.array(obs["action_mask"], np.int8),
    }


# ---- batches ------------------------------------------------------------------------------
def bucket(n: int, lo: int = 8) -> int:
    """Smallest power of two ≥ max(n, lo): the padded size jit compiles for."""
    return max(lo, 1 << max(int(n) - 1, 0).bit_length())


def pad_inputs(xs: list[dict], n_pad: int | None = None, e_pad: int | None = None,
               k_pad: int | None = None) -> dict:
    """Stack model inputs (``agent.gnn.model_input``) into a batch padded to (n_pad, e_pad, k_pad)
    (default: bucketed maxima). Padding has mask 0 and zero features; padded edges point at node 0."""
    n_pad = n_pad or bucket(max(x["nodes"].shape[0] for x in xs))
    e_pad = e_pad or bucket(max(x["edge_index"].shape[0] for x in xs))
    k_pad = k_pad or bucket(max(x["action_mask"].shape[0] for x in xs), lo=2)
    B = len(xs)
    x0 = xs[0]
    fn, fe, fa = x0["nodes"].shape[1], x0["edge_features"].shape[1], x0["cur_action"].shape[1]
    out = {
        "nodes": np.zeros((B, n_pad, fn), np.float32),
        "edge_index": np.zeros((B, e_pad, 2), np.int32),
        "edge_features": np.zeros((B, e_pad, fe), np.float32),
        "node_mask": np.zeros((B, n_pad), np.int8),
        "edge_mask": np.zeros((B, e_pad), np.int8),
        "current_node": np.zeros((B,), np.int32),
        "cur_action": np.zeros((B, k_pad, fa), np.float32),
        "action_mask": np.zeros((B, k_pad), np.int8),
    }
    for b, x in enumerate(xs):
        n, e, k = x["nodes"].shape[0], x["edge_index"].shape[0], x["action_mask"].shape[0]
        out["nodes"][b, :n] = x["nodes"]
        out["edge_index"][b, :e] = x["edge_index"]
        out["edge_features"][b, :e] = x["edge_features"]
        out["node_mask"][b, :n] = x["node_mask"]
        out["edge_mask"][b, :e] = x["edge_mask"]
        out["current_node"][b] = x["current_node"]
        out["cur_action"][b, :k] = x["cur_action"]
        out["action_mask"][b, :k] = x["action_mask"]
    return out


def init_params(model, obs: dict, key):
    """Initialise parameters from one env observation."""
    return model.init(key, {k: jnp.asarray(v[0]) for k, v in pad_inputs([model_input(obs)]).items()})
