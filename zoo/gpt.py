"""GPT: a decoder-only transformer language model (float32, one Python loop over layers).

Token embedding (gather) + learned position embedding, `n_layers` pre-LayerNorm blocks with
explicit causal multi-head self-attention (einsum) and a 4x gelu MLP, a final LayerNorm and an
untied LM head (Dense, no bias); loss = mean next-token cross-entropy. No nn.scan / nn.remat,
so every layer appears in the traced graph.

``GPTConfig.remat_attention`` (default False) is Megatron-LM's "selective activation
recomputation": the core attention (scores q.k^T, causal mask, softmax, probs.v) runs under
``jax.checkpoint`` with nothing saveable, so the backward pass keeps only q, k, v and recomputes
the [b, h, t, t] scores and probabilities instead of keeping them from the forward pass.
``GPTConfig.remat_mlp`` (default False) puts the MLP's gelu and fc2 under ``jax.checkpoint``
(flax ``nn.remat``, nothing saveable): the backward pass keeps only fc1's output and recomputes
gelu from it (gelu's tanh and output are not kept); fc2's forward dot is not recomputed (its
backward needs gelu's output and the cotangent, not fc2's result), so the extra work is gelu's
elementwise ops only. Parameter names are those of the plain program.
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.common import check_divides, cross_entropy


@dataclass(frozen=True)
class GPTConfig:
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    vocab: int
    seq_len: int
    batch: int
    remat_attention: bool = False
    remat_mlp: bool = False

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


SIZES = {
    "tiny": GPTConfig(n_layers=2, d_model=64, n_heads=4, d_ff=256, vocab=256, seq_len=32, batch=8),
    "125m": GPTConfig(n_layers=12, d_model=768, n_heads=12, d_ff=3072, vocab=50304, seq_len=1024, batch=8),
    # GPT-2 medium: the "GPT-2-medium-sized graph" of the ILP benchmark (same 24 layers as 1.3b)
    "350m": GPTConfig(n_layers=24, d_model=1024, n_heads=16, d_ff=4096, vocab=50304, seq_len=1024, batch=8),
    "1.3b": GPTConfig(n_layers=24, d_model=2048, n_heads=16, d_ff=8192, vocab=50304, seq_len=2048, batch=8),
    "7b": GPTConfig(n_layers=32, d_model=4096, n_heads=32, d_ff=16384, vocab=50304, seq_len=2048, batch=8),
}


class SelfAttention(nn.Module):
    """Multi-head self-attention written out: Dense q/k/v, einsum scores, softmax, einsum with v, Dense out."""

    n_heads: int
    causal: bool = True
    remat: bool = False

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        h, dh = self.n_heads, d // self.n_heads
        q = nn.Dense(d, name="query")(x).reshape(b, t, h, dh)
        k = nn.Dense(d, name="key")(x).reshape(b, t, h, dh)
        v = nn.Dense(d, name="value")(x).reshape(b, t, h, dh)
        core = jax.checkpoint(_core_attention, static_argnums=(3,)) if self.remat else _core_attention
        out = core(q, k, v, self.causal).reshape(b, t, d)
        return nn.Dense(d, name="out")(out)


def _core_attention(q, k, v, causal: bool):
    """softmax(q.k^T / sqrt(d_head), causal mask) . v on [b, t, h, d_head] operands (no parameters)."""
    t, dh = q.shape[1], q.shape[3]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(dh))
    if causal:
        mask = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then + fc2(gelu(fc1(ln2(x))))."""

    n_heads: int
    d_ff: int
    causal: bool = True
    remat_attention: bool = False
    remat_mlp: bool = False

    @nn.compact
    def __call__(self, x):
        x = x + SelfAttention(self.n_heads, self.causal, self.remat_attention, name="attn")(nn.LayerNorm(name="ln1")(x))
        y = nn.LayerNorm(name="ln2")(x)
        y = nn.Dense(self.d_ff, name="fc1")(y)
        if self.remat_mlp:   # keep fc1's output only; gelu is recomputed in the backward pass
            y = nn.remat(_GeluDense)(x.shape[-1], name="fc2")(y)
        else:
            y = nn.Dense(x.shape[-1], name="fc2")(nn.gelu(y))
        return x + y


class _GeluDense(nn.Dense):
    """Dense(gelu(x)): ``remat_mlp``'s fc2 (its parameters are fc2's)."""

    def __call__(self, x):
        return super().__call__(nn.gelu(x))


class GPT(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, batch):
        tokens = batch["inputs"]
        cfg = self.cfg
        x = nn.Embed(cfg.vocab, cfg.d_model, name="wte")(tokens)
        pos = self.param("wpe", nn.initializers.normal(0.02), (cfg.seq_len, cfg.d_model))
        x = x + pos[None, : tokens.shape[1]]
        for i in range(cfg.n_layers):
            x = Block(cfg.n_heads, cfg.d_ff, remat_attention=cfg.remat_attention, remat_mlp=cfg.remat_mlp,
                      name=f"block_{i}")(x)
        x = nn.LayerNorm(name="ln_f")(x)
        return nn.Dense(cfg.vocab, use_bias=False, name="lm_head")(x)


def model(cfg: GPTConfig) -> nn.Module:
    check_divides(cfg, "d_model", "n_heads")
    return GPT(cfg)


def make_batch(cfg: GPTConfig, key) -> dict:
    """Random token sequences of length seq_len+1, split into inputs and next-token targets."""
    seq = jax.random.randint(key, (cfg.batch, cfg.seq_len + 1), 0, cfg.vocab, dtype=jnp.int32)
    return {"inputs": seq[:, :-1], "targets": seq[:, 1:]}


def loss(module, params, batch):
    return cross_entropy(module.apply({"params": params}, batch), batch["targets"])


def matmul_flops(cfg: GPTConfig) -> float:
    """Closed-form dot_general FLOPs of one training step (forward + backward), as jax.grad computes it.

    A dot_general with result R and contracting size K costs 2*|R|*K FLOPs. With B = batch,
    T = seq_len, d = d_model, f = d_ff, V = vocab, L = n_layers, the forward pass per layer has
      q, k, v projections      3 * 2*B*T*d*d
      scores  q.k^T            2*B*T*T*d      (B*h*T*T results, contracting d_head; h*d_head = d)
      probs.v                  2*B*T*T*d      (B*T*h*d_head results, contracting T)
      output projection        2*B*T*d*d
      MLP fc1 + fc2            2 * 2*B*T*d*f
    and once: the LM head      2*B*T*d*V.
    The token embedding is a gather (jnp.take) and the position embedding an add: no matmul.
    Backward: reverse-mode emits, for every forward dot, one dot per operand that needs a
    gradient, each of the same FLOPs as the forward dot. Every operand of every dot needs one:
    Dense kernels are parameters; the Dense inputs are activations downstream of the embedding
    parameters (even in block 0, since wte and wpe are trained); both attention operands are
    activations. No dot touches the integer tokens. Hence backward = 2 x forward, total = 3 x forward.
    Biases, LayerNorm, softmax, gelu, the loss and AdamW are elementwise/reductions: not counted.
    """
    b, t, d, f, v = cfg.batch, cfg.seq_len, cfg.d_model, cfg.d_ff, cfg.vocab
    per_layer = 3 * 2 * b * t * d * d + 2 * b * t * t * d + 2 * b * t * t * d + 2 * b * t * d * d + 2 * 2 * b * t * d * f
    forward = cfg.n_layers * per_layer + 2 * b * t * d * v
    return float(3 * forward)
