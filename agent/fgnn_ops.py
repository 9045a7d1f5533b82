"""The factor-graph network's array helpers (agent/fgnn.py), over one problem's padded arrays ``A``
(agent/fgnn_inputs.py) in jax.numpy: beliefs, priced costs, usage profiles and per-node minima.
"""
from __future__ import annotations


def symlog(x):
    import jax.numpy as jnp
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def belief(A, cp, to_u, to_v):
    import jax
    Sp = A["c"].shape[0]
    return cp + jax.ops.segment_sum(to_u * A["umask"], A["u_flat"], Sp) \
        + jax.ops.segment_sum(to_v * A["vmask"], A["v_flat"], Sp)


def priced(A, lam):
    """Node costs plus usage × Σ_{t∈live(i)} λ_t (usage over the cap)."""
    import jax.numpy as jnp
    cum = jnp.concatenate([jnp.zeros(1), jnp.cumsum(lam * A["tmask"])])
    return A["c"] + A["un"] * (A["live"] * (cum[A["hi"]] - cum[A["lo"]]))[A["node_of"]]


def profile(A, usage_node):
    import jax.numpy as jnp
    Tp = A["pmin"].shape[0]
    acc = jnp.zeros(Tp + 1).at[A["lo"]].add(usage_node * A["live"]).at[A["hi"]].add(-usage_node * A["live"])
    return jnp.cumsum(acc)[:-1]


def node_min(A, b):
    import jax
    import jax.numpy as jnp
    return jax.ops.segment_min(jnp.where(A["smask"] > 0, b, 3e38), A["node_of"], A["lo"].shape[0])


def argmin_usage(A, b):
    """Per node, the usage of its first cheapest strategy (``LocalCosts.seg_argmin``'s)."""
    import jax
    import jax.numpy as jnp
    Sp, npad = A["c"].shape[0], A["lo"].shape[0]
    m = node_min(A, b)
    first = jax.ops.segment_min(jnp.where((b <= m[A["node_of"]]) & (A["smask"] > 0), jnp.arange(Sp), Sp),
                                A["node_of"], npad)
    return jax.ops.segment_sum(jnp.where(jnp.arange(Sp) == first[A["node_of"]], A["un"], 0.0), A["node_of"], npad)


def expected_usage(A, b):
    import jax
    import jax.numpy as jnp
    smask, npad = A["smask"], A["lo"].shape[0]
    d = jnp.where(smask > 0, b - node_min(A, b)[A["node_of"]], 50.0)     # no inf on padded slots
    w = jnp.where(smask > 0, jnp.exp(-jnp.clip(d, 0.0, 50.0)), 0.0)
    z = jax.ops.segment_sum(w, A["node_of"], npad)
    return jax.ops.segment_sum(w * A["un"], A["node_of"], npad) / jnp.maximum(z, 1e-30)
