"""shardgym's Flax model zoo: training steps of GPT, ViT, FNO, U-Net, MeshGraphNet and MLP, tiny to 7B.

    train_step, (params, opt_state, batch) = zoo.build("gpt", "125m", abstract=True)

`train_step(params, opt_state, batch) -> (new_params, new_opt_state, loss)` is one un-jitted AdamW
step (see zoo.common for the conventions: `params` is Flax's `variables['params']`, unwrapped).
The first entry of `sizes(name)` is the small size tests execute on 8 CPU devices.
"""
from __future__ import annotations

import importlib

from zoo import fno, gpt, meshgraphnet, mlp, unet, vit  # noqa: F401  (zoo.gpt.matmul_flops etc.)
from zoo.common import LEARNING_RATE, WEIGHT_DECAY, build_step, optimizer, with_batch

_MODULES = ("gpt", "vit", "fno", "unet", "meshgraphnet", "mlp")

__all__ = ["build", "names", "sizes", "config", "LEARNING_RATE", "WEIGHT_DECAY", "optimizer"]


def _spec(name: str):
    if name not in _MODULES:
        raise ValueError(f"unknown zoo model {name!r}; valid names: {', '.join(_MODULES)}")
    return importlib.import_module(f"zoo.{name}")


def names() -> list[str]:
    """Model names, in a fixed order."""
    return list(_MODULES)


def sizes(name: str) -> list[str]:
    """Sizes of model `name`, smallest first."""
    return list(_spec(name).SIZES)


def config(name: str, size: str):
    """The frozen config dataclass of `name` at `size`."""
    table = _spec(name).SIZES
    if size not in table:
        raise ValueError(f"unknown size {size!r} for zoo model {name!r}; valid sizes: {', '.join(table)}")
    return table[size]


def build(name: str, size: str, abstract: bool = False, seed: int = 0, batch_size: int | None = None,
          real_indices: bool = False):
    """(train_step, (params, opt_state, batch)) for model `name` at `size`.

    abstract=True gives jax.ShapeDtypeStruct leaves (nothing allocated; fine for 7B);
    otherwise real float32 arrays seeded by `seed`. With abstract=True, real_indices=True keeps the
    batch's integer leaves real (``zoo.common.build_step``: a halo plan compiles abstractly). `batch_size` overrides the config's batch
    (for meshgraphnet: the number of copies of the mesh graph in one disjoint-union batch).
    """
    cfg = with_batch(config(name, size), batch_size)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    return build_step(_spec(name), cfg, abstract=abstract, seed=seed, real_indices=real_indices)
