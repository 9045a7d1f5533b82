"""Train steps written outside the zoo (plain JAX, no Flax), of kinds the zoo lacks, at small size:
``moe``: a softmax-gated mixture of four SiLU-GLU experts batched along an expert dimension
(einsums), with Adam written out; ``rnn``: a tanh
recurrent cell unrolled by ``lax.scan`` with a linear read-out and SGD with momentum; ``convae``: a
strided convolution encoder, a transposed-convolution decoder and a residual block, SGD.
Added in session 28, of five more kinds: ``mixer``: an MLP-Mixer block (token mixing over a transposed
sequence axis, channel mixing, mean-pool head, softmax cross-entropy over integer labels); ``ssm``: a
diagonal linear recurrence computed by ``lax.associative_scan`` (a parallel scan, no loop); ``gnn``: one
message-passing layer over a fixed random graph (gathers by edge index, ``segment_sum`` scatter to the
receivers); ``gqa``: causal grouped-query attention (2 key/value groups for 8 query heads, 5-D einsums);
``conv3d``: two 3-D "SAME" convolutions on one volume at batch 1. Those five use SGD.
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


def _sgd(loss):
    """A train step (params, *batch) -> (params updated by SGD at 1e-2, loss)."""
    def step(p, *batch):
        value, g = jax.value_and_grad(loss)(p, *batch)
        return jax.tree.map(lambda w, gi: w - 1e-2 * gi, p, g), value
    return step


def make_mixer():
    k = jax.random.split(jax.random.PRNGKey(10), 7)
    T, C, B = 16, 32, 8

    def loss(p, x, y):
        h = x + jnp.swapaxes(jax.nn.gelu(jnp.swapaxes(x, 1, 2) @ p["t1"]) @ p["t2"], 1, 2)   # token mixing
        h = h + jax.nn.gelu(h @ p["c1"]) @ p["c2"]                                           # channel mixing
        logits = h.mean(1) @ p["head"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    p = {"t1": jax.random.normal(k[0], (T, 64)) * 0.1, "t2": jax.random.normal(k[1], (64, T)) * 0.1,
         "c1": jax.random.normal(k[2], (C, 128)) * 0.1, "c2": jax.random.normal(k[3], (128, C)) * 0.1,
         "head": jax.random.normal(k[4], (C, 10)) * 0.1}
    return _sgd(loss), (p, jax.random.normal(k[5], (B, T, C)), jax.random.randint(k[6], (B,), 0, 10))


def make_ssm():
    k = jax.random.split(jax.random.PRNGKey(11), 5)
    B, L, D = 8, 64, 32

    def loss(p, x, t):
        u = x @ p["win"]
        a = jnp.broadcast_to(jax.nn.sigmoid(p["a"]), u.shape)
        _, h = jax.lax.associative_scan(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]), (a, u), axis=1)
        return jnp.mean((h @ p["wout"] - t) ** 2)

    p = {"a": jax.random.normal(k[0], (D,)) * 0.1, "win": jax.random.normal(k[1], (D, D)) * 0.1,
         "wout": jax.random.normal(k[2], (D, D)) * 0.1}
    return _sgd(loss), (p, jax.random.normal(k[3], (B, L, D)), jax.random.normal(k[4], (B, L, D)))


def make_gnn():
    k = jax.random.split(jax.random.PRNGKey(12), 6)
    N, E, F = 256, 1024, 32

    def loss(p, x, senders, receivers, t):
        m = jax.nn.relu(jnp.concatenate([x[senders], x[receivers]], -1) @ p["we"])
        agg = jax.ops.segment_sum(m, receivers, num_segments=N)
        return jnp.mean((jax.nn.relu(jnp.concatenate([x, agg], -1) @ p["wn"]) - t) ** 2)

    p = {"we": jax.random.normal(k[0], (2 * F, F)) * 0.1, "wn": jax.random.normal(k[1], (2 * F, F)) * 0.1}
    return _sgd(loss), (p, jax.random.normal(k[2], (N, F)), jax.random.randint(k[3], (E,), 0, N),
                        jax.random.randint(k[4], (E,), 0, N), jax.random.normal(k[5], (N, F)))


def make_gqa():
    k = jax.random.split(jax.random.PRNGKey(13), 5)
    B, L, D, H, G = 4, 32, 64, 8, 2
    hd = D // H

    def loss(p, x, t):
        q = (x @ p["q"]).reshape(B, L, G, H // G, hd)
        kv = (x @ p["kv"]).reshape(B, L, 2, G, hd)
        s = jnp.einsum("blghd,bmgd->bghlm", q, kv[:, :, 0]) / hd ** 0.5
        s = jnp.where(jnp.tril(jnp.ones((L, L), bool)), s, -1e9)
        o = jnp.einsum("bghlm,bmgd->blghd", jax.nn.softmax(s, -1), kv[:, :, 1]).reshape(B, L, D)
        return jnp.mean((o @ p["o"] - t) ** 2)

    p = {"q": jax.random.normal(k[0], (D, D)) * 0.1, "kv": jax.random.normal(k[1], (D, 2 * G * hd)) * 0.1,
         "o": jax.random.normal(k[2], (D, D)) * 0.1}
    return _sgd(loss), (p, jax.random.normal(k[3], (B, L, D)), jax.random.normal(k[4], (B, L, D)))


def make_conv3d():
    k = jax.random.split(jax.random.PRNGKey(14), 4)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1, 1), "SAME", dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))

    def loss(p, x, t):
        return jnp.mean((conv(jax.nn.relu(conv(x, p["c1"])), p["c2"]) - t) ** 2)

    p = {"c1": jax.random.normal(k[0], (3, 3, 3, 2, 8)) * 0.1, "c2": jax.random.normal(k[1], (3, 3, 3, 8, 2)) * 0.1}
    return _sgd(loss), (p, jax.random.normal(k[2], (1, 16, 16, 16, 2)), jax.random.normal(k[3], (1, 16, 16, 16, 2)))


STEPS = {"moe": make_moe, "rnn": make_rnn, "convae": make_convae, "mixer": make_mixer, "ssm": make_ssm,
         "gnn": make_gnn, "gqa": make_gqa, "conv3d": make_conv3d}
