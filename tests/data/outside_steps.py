"""Train steps written outside the zoo (plain JAX, no Flax), of kinds the zoo lacks, at small size:
``moe``: a softmax-gated mixture of four SiLU-GLU experts batched along an expert dimension
(einsums), with Adam written out; ``rnn``: a tanh
recurrent cell unrolled by ``lax.scan`` with a linear read-out and SGD with momentum; ``convae``: a
strided convolution encoder, a transposed-convolution decoder and a residual block, SGD.
Each ``make_<name>()`` returns (step, args) with concrete arrays."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def make_moe():
    E, d, h = 4, 32, 64

    def loss(p, x, t):
        gate = jax.nn.softmax(x @ p["gate"], axis=-1)                       # [B, E]
        a = jnp.einsum("bd,edh->ebh", x, p["w_in"])                        # experts batched
        g = jax.nn.silu(jnp.einsum("bd,edh->ebh", x, p["w_gate"]))
        y = jnp.einsum("ebh,ehd->ebd", a * g, p["w_out"])
        return jnp.mean((jnp.einsum("be,ebd->bd", gate, y) - t) ** 2)

    def step(p, m, v, x, t):
        g = jax.grad(loss)(p, x, t)
        m = jax.tree.map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree.map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        return jax.tree.map(lambda w, a, b: w - 1e-3 * a / (jnp.sqrt(b) + 1e-8), p, m, v), m, v

    k = jax.random.split(jax.random.PRNGKey(1), 6)
    p = {"gate": jax.random.normal(k[0], (d, E)) * 0.1, "w_in": jax.random.normal(k[1], (E, d, h)) * 0.1,
         "w_gate": jax.random.normal(k[2], (E, d, h)) * 0.1, "w_out": jax.random.normal(k[3], (E, h, d)) * 0.1}
    z = jax.tree.map(jnp.zeros_like, p)
    return step, (p, z, z, jax.random.normal(k[4], (64, d)), jax.random.normal(k[5], (64, d)))


def make_rnn():
    B, T, d, h = 16, 8, 16, 64

    def loss(p, xs, t):
        def cell(s, x):
            s = jnp.tanh(x @ p["wx"] + s @ p["wh"] + p["b"])
            return s, s
        s, _ = jax.lax.scan(cell, jnp.zeros((B, h)), xs)
        return jnp.mean((s @ p["wo"] - t) ** 2)

    def step(p, mom, xs, t):
        g = jax.grad(loss)(p, xs, t)
        mom = jax.tree.map(lambda m, gi: 0.9 * m + gi, mom, g)
        return jax.tree.map(lambda w, m: w - 1e-2 * m, p, mom), mom

    k = jax.random.split(jax.random.PRNGKey(2), 6)
    p = {"wx": jax.random.normal(k[0], (d, h)) * 0.1, "wh": jax.random.normal(k[1], (h, h)) * 0.1,
         "b": jnp.zeros((h,)), "wo": jax.random.normal(k[2], (h, 8)) * 0.1}
    return step, (p, jax.tree.map(jnp.zeros_like, p), jax.random.normal(k[3], (T, B, d)),
                  jax.random.normal(k[4], (B, 8)))


def make_convae():
    def conv(x, w, stride=1):
        return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(p, x):
        h = jax.nn.relu(conv(x, p["enc"], 2))
        h = jax.nn.relu(conv(h, p["mid"])) + h
        y = jax.lax.conv_transpose(h, p["dec"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean((y - x) ** 2)

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree.map(lambda w, gi: w - 1e-2 * gi, p, g)

    k = jax.random.split(jax.random.PRNGKey(3), 4)
    p = {"enc": jax.random.normal(k[0], (3, 3, 4, 16)) * 0.1, "mid": jax.random.normal(k[1], (3, 3, 16, 16)) * 0.1,
         "dec": jax.random.normal(k[2], (3, 3, 16, 4)) * 0.1}
    return step, (p, jax.random.normal(k[3], (8, 16, 16, 4)))


STEPS = {"moe": make_moe, "rnn": make_rnn, "convae": make_convae}
