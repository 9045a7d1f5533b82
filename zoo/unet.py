"""U-Net: a 2-D denoising U-Net (Ronneberger et al. 2015), no BatchNorm (no mutable state).

Encoder: per level a ConvBlock (2 x [3x3 SAME Conv, GroupNorm, silu]) at base*2^level channels, the
skip saved, then a 3x3 stride-2 Conv to halve the resolution. Bottleneck ConvBlock at base*2^levels.
Decoder: 2x2 stride-2 ConvTranspose, concatenate the skip, ConvBlock. A 1x1 Conv back to the image
channels. Loss = MSE between the prediction from the noisy image and the clean image.
``dims=3`` makes every conv 3-D (3x3x3 kernels, a volume instead of an image).

Scientific sizes (batch 1, fewer samples than devices): hires-1024 (a 1024^2 field), 3d-tiny (runs on
the CPU mesh) and 3d-128 (a 128^3 volume).
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.common import check_divides, check_spatial_dims


@dataclass(frozen=True)
class UNetConfig:
    image: int
    channels: int
    base: int
    levels: int
    batch: int
    groups: int = 4
    noise: float = 0.5  # std of the additive Gaussian noise
    dims: int = 2  # spatial dims: 2 (images) or 3 (volumes)


class ConvBlock(nn.Module):
    features: int
    groups: int
    dims: int = 2

    @nn.compact
    def __call__(self, x):
        for j in range(2):
            x = nn.Conv(self.features, (3,) * self.dims, padding="SAME", name=f"conv_{j}")(x)
            x = nn.GroupNorm(num_groups=self.groups, name=f"norm_{j}")(x)
            x = nn.silu(x)
        return x


class UNet(nn.Module):
    cfg: UNetConfig

    @nn.compact
    def __call__(self, batch):
        cfg = self.cfg
        x = batch["noisy"]
        k = cfg.dims
        skips = []
        for i in range(cfg.levels):
            x = ConvBlock(cfg.base * 2**i, cfg.groups, k, name=f"down_{i}")(x)
            skips.append(x)
            x = nn.Conv(cfg.base * 2**i, (3,) * k, strides=(2,) * k, padding="SAME", name=f"downsample_{i}")(x)
        x = ConvBlock(cfg.base * 2**cfg.levels, cfg.groups, k, name="mid")(x)
        for i in reversed(range(cfg.levels)):
            x = nn.ConvTranspose(cfg.base * 2**i, (2,) * k, strides=(2,) * k, name=f"upsample_{i}")(x)
            x = jnp.concatenate([x, skips[i]], axis=-1)
            x = ConvBlock(cfg.base * 2**i, cfg.groups, k, name=f"up_{i}")(x)
        return nn.Conv(cfg.channels, (1,) * k, name="out")(x)


SIZES = {
    "tiny": UNetConfig(image=32, channels=3, base=8, levels=2, batch=8, groups=4),
    "large": UNetConfig(image=256, channels=3, base=64, levels=4, batch=16, groups=32),
    # a scientific field at batch 1 (fewer samples than devices): only spatial splits scale
    "hires-1024": UNetConfig(image=1024, channels=3, base=8, levels=4, batch=1, groups=4),
    # the same field with a realistic width (base 32, as weather / PDE U-Nets use)
    "hires-1024-c32": UNetConfig(image=1024, channels=3, base=32, levels=4, batch=1, groups=8),
    "3d-tiny": UNetConfig(image=16, channels=1, base=4, levels=2, batch=1, groups=2, dims=3),
    "3d-128": UNetConfig(image=128, channels=1, base=8, levels=3, batch=1, groups=4, dims=3),
    "3d-128-c32": UNetConfig(image=128, channels=1, base=32, levels=3, batch=1, groups=8, dims=3),
    "3d-256": UNetConfig(image=256, channels=1, base=32, levels=3, batch=1, groups=8, dims=3),
}


def model(cfg: UNetConfig) -> nn.Module:
    check_divides(cfg, "image", "2**levels", 2**cfg.levels)
    check_spatial_dims(cfg)
    check_divides(cfg, "base", "groups")
    return UNet(cfg)


def make_batch(cfg: UNetConfig, key) -> dict:
    """Clean images: smooth random fields (noise at 1/8 resolution, bilinear upsampled); noisy = clean + noise."""
    kc, kn = jax.random.split(key)
    low = max(cfg.image // 8, 1)
    coarse = jax.random.normal(kc, (cfg.batch,) + (low,) * cfg.dims + (cfg.channels,), jnp.float32)
    clean = jax.image.resize(coarse, (cfg.batch,) + (cfg.image,) * cfg.dims + (cfg.channels,), "linear")
    noisy = clean + cfg.noise * jax.random.normal(kn, clean.shape, jnp.float32)
    return {"noisy": noisy, "clean": clean}


def loss(module, params, batch):
    return jnp.mean((module.apply({"params": params}, batch) - batch["clean"]) ** 2)
