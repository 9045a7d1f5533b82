"""Shared machinery of the zoo: turn (Flax module, loss, batch maker) into one AdamW training step.

Every model module (gpt, vit, fno, unet, meshgraphnet, mlp) provides
  SIZES: dict[str, Config]            sizes, smallest first (the first one is what tests execute)
  model(cfg) -> flax.linen.Module
  make_batch(cfg, key) -> dict        deterministic from `key`; works under jax.eval_shape
  loss(module, params, batch) -> ()   scalar float32 loss; params = variables['params']
and `build_step` below does the rest.

Conventions (a contract for the tracer and runtime):
  train_step(params, opt_state, batch) -> (new_params, new_opt_state, loss)
  params    = the Flax `variables['params']` dict (top-level keys are module names such as
              'Dense_0', 'block_3'), NOT wrapped in {'params': ...};
  opt_state = optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY).init(params);
  batch     = dict of arrays; its leading dim is the batch (or node/edge count) and divides by 8.
train_step is not jitted: callers jit it.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import optax

LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01


def optimizer() -> optax.GradientTransformation:
    """The zoo's optimizer: AdamW with a fixed learning rate (no schedule)."""
    return optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY)


def check_divides(cfg, field: str, by: str, value: int | None = None) -> None:
    """ValueError naming ``cfg``'s field unless ``cfg.<field>`` divides by ``cfg.<by>`` (or by
    ``value``, written as ``by`` in the message)."""
    d = getattr(cfg, by) if value is None else value
    if getattr(cfg, field) % d:
        raise ValueError(f"{type(cfg).__name__}.{field}={getattr(cfg, field)} must divide by {by}={d}")


def check_spatial_dims(cfg) -> None:
    """ValueError unless ``cfg.dims`` (spatial dims of a conv / FFT model) is 2 or 3."""
    if cfg.dims not in (2, 3):
        raise ValueError(f"{type(cfg).__name__}.dims={cfg.dims} must be 2 or 3")


def cross_entropy(logits, targets):
    """Mean softmax cross-entropy with integer labels (a gather, no one-hot matmul)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def classification_batch(cfg, key, name: str, shape: tuple) -> dict:
    """``{name: N(0, 1) inputs of (cfg.batch, *shape), "labels": uniform ints < cfg.n_classes}``
    (float32 / int32), from one split of ``key``."""
    kx, ky = jax.random.split(key)
    return {
        name: jax.random.normal(kx, (cfg.batch, *shape), jnp.float32),
        "labels": jax.random.randint(ky, (cfg.batch,), 0, cfg.n_classes, dtype=jnp.int32),
    }


def make_train_step(module, loss):
    """One full training step: loss, value_and_grad, AdamW update, apply_updates."""
    tx = optimizer()

    def train_step(params, opt_state, batch):
        value, grads = jax.value_and_grad(lambda p: loss(module, p, batch))(params)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        return new_params, new_opt_state, value

    return train_step


def with_batch(cfg, batch_size: int | None):
    """`cfg` with its `batch` field replaced (ValueError unless a positive multiple of 8)."""
    if batch_size is None:
        return cfg
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int (or None for the size's default), got {batch_size!r}")
    return dataclasses.replace(cfg, batch=batch_size)


def build_step(spec, cfg, abstract: bool = False, seed: int = 0, real_indices: bool = False):
    """(train_step, (params, opt_state, batch)) for model module `spec` at config `cfg`.

    abstract=True: every leaf is a jax.ShapeDtypeStruct (init and optimizer init run under
    jax.eval_shape, so nothing is allocated). abstract=False: real arrays from PRNGKey(seed).
    abstract=True with real_indices=True: the batch's integer leaves (a graph's senders / receivers,
    token ids) are the real arrays abstract=False gives (the batch alone is made, once, on the
    host), every other leaf a ShapeDtypeStruct: what ``runtime.execute`` needs to compile a halo
    plan, whose exchanges follow the real connectivity, without allocating the rest.
    Repeated builds of one (model, config) return the same train_step object (so callers'
    jax.jit caches hit) and reuse one compiled initialiser (the seed is its argument); the
    returned containers are always fresh.
    """
    train_step, shapes, init = _prepared(spec.__name__, cfg)
    if abstract:
        params, opt_state, batch = jax.tree.map(lambda x: x, shapes)
        if real_indices:   # the batch make_args would make from this seed
            real = jax.jit(spec.make_batch, static_argnums=0)(cfg, _arg_keys(jax.random.PRNGKey(seed))[1])
            batch = jax.tree.map(lambda s, r: r if jnp.issubdtype(s.dtype, jnp.integer) else s, batch, real)
        return train_step, (params, opt_state, batch)
    return train_step, init(jax.random.PRNGKey(seed))


_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_FAST_COMPILE_MAX_BYTES = 64 << 20


def _arg_keys(key):
    """(init key, batch key) of one build's seed: ``_prepared``'s make_args and ``real_indices`` read the same."""
    return jax.random.split(key)


@functools.lru_cache(maxsize=64)
def _prepared(spec_name: str, cfg):
    spec = importlib.import_module(spec_name)
    module = spec.model(cfg)
    tx = optimizer()

    def make_args(key):
        init_key, batch_key = _arg_keys(key)
        batch = spec.make_batch(cfg, batch_key)
        params = module.init(init_key, batch)["params"]
        return params, tx.init(params), batch

    shapes = jax.eval_shape(make_args, jax.random.PRNGKey(0))
    compiled = None

    def init(key):
        nonlocal compiled
        if compiled is None:
            nbytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes))
            # Small models: initialisation is compile-bound (RNG code), so skip XLA's optimisation passes.
            options = _FAST_COMPILE if nbytes <= _FAST_COMPILE_MAX_BYTES else None
            compiled = jax.jit(make_args).lower(key).compile(compiler_options=options)
        return compiled(key)

    return make_train_step(module, spec.loss), shapes, init
