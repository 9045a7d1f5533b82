"""A user's own train step for ``shardgym plan --fn``: an MLP with dropout, driven by a PRNG key
passed as an argument (split inside the step) and by a key created inside the step."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train=True):
        x = nn.relu(nn.Dense(64)(x))
        x = nn.Dropout(0.1, deterministic=not train)(x)
        x = nn.relu(nn.Dense(64)(x))
        x = nn.Dropout(0.2, deterministic=not train, rng_collection="inner")(x)
        return nn.Dense(16)(x)


def make_step(abstract=False):
    model, opt = Net(), optax.adam(1e-3)
    x = jnp.linspace(-1.0, 1.0, 32 * 48, dtype=jnp.float32).reshape(32, 48)
    y = jnp.cos(jnp.arange(32 * 16, dtype=jnp.float32)).reshape(32, 16)
    params = model.init(jax.random.key(1), x, train=False)
    opt_state = opt.init(params)

    def step(params, opt_state, batch, key):
        _, sub = jax.random.split(key)
        inner = jax.random.fold_in(jax.random.key(7), 3)      # a key made inside the step

        def loss_fn(p):
            out = model.apply(p, batch["x"], rngs={"dropout": sub, "inner": inner})
            return jnp.mean((out - batch["y"]) ** 2)

        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, loss

    args = (params, opt_state, {"x": x, "y": y}, jax.random.key(0))
    if abstract:
        args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    return step, args
