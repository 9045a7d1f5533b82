"""U-Net: a 2-D denoising U-Net (Ronneberger et al. 2015), no BatchNorm (no mutable state).

Encoder: per level a ConvBlock (2 x [3x3 SAME Conv, GroupNorm, silu]) at base*2^level channels, the
skip saved, then a 3x3 stride-2 Conv to halve the resolution. Bottleneck ConvBlock at base*2^levels.
Decoder: 2x2 stride-2 ConvTranspose, concatenate the skip, ConvBlock. A 1x1 Conv back to the image
channels. Loss = MSE between the prediction from the noisy image and the clean image.
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class UNetConfig:
    image: int
    channels: int
    base: int
    levels: int
    batch: int
    groups: int = 4
    noise: float = 0.5  # std of the additive Gaussian noise


SIZES = {
    "tiny": UNetConfig(image=32, channels=3, base=8, levels=2, batch=8, groups=4),
    "large": UNetConfig(image=256, channels=3, base=64, levels=4, batch=16, groups=32),
}


class ConvBlock(nn.Module):
    features: int
    groups: int

    @nn.compact
    def __call__(self, x):
        for j in range(2):
            x = nn.Conv(self.features, (3, 3), padding="SAME", name=f"conv_{j}")(x)
            x = nn.GroupNorm(num_groups=self.groups, name=f"norm_{j}")(x)
            x = nn.silu(x)
        return x


class UNet(nn.Module):
    cfg: UNetConfig

    @nn.compact
    def __call__(self, batch):
        cfg = self.cfg
        x = batch["noisy"]
        skips = []
        for i in range(cfg.levels):
            x = ConvBlock(cfg.base * 2**i, cfg.groups, name=f"down_{i}")(x)
            skips.append(x)
            x = nn.Conv(cfg.base * 2**i, (3, 3), strides=(2, 2), padding="SAME", name=f"downsample_{i}")(x)
        x = ConvBlock(cfg.base * 2**cfg.levels, cfg.groups, name="mid")(x)
        for i in reversed(range(cfg.levels)):
            x = nn.ConvTranspose(cfg.base * 2**i, (2, 2), strides=(2, 2), name=f"upsample_{i}")(x)
            x = jnp.concatenate([x, skips[i]], axis=-1)
            x = ConvBlock(cfg.base * 2**i, cfg.groups, name=f"up_{i}")(x)
        return nn.Conv(cfg.channels, (1, 1), name="out")(x)


def model(cfg: UNetConfig) -> nn.Module:
    if cfg.image % 2**cfg.levels:
        raise ValueError(f"UNetConfig.image={cfg.image} must divide by 2**levels={2**cfg.levels}")
    if cfg.base % cfg.groups:
        raise ValueError(f"UNetConfig.base={cfg.base} must divide by groups={cfg.groups}")
    return UNet(cfg)


def make_batch(cfg: UNetConfig, key) -> dict:
    """Clean images: smooth random fields (noise at 1/8 resolution, bilinear upsampled); noisy = clean + noise."""
    kc, kn = jax.random.split(key)
    low = max(cfg.image // 8, 1)
    coarse = jax.random.normal(kc, (cfg.batch, low, low, cfg.channels), jnp.float32)
    clean = jax.image.resize(coarse, (cfg.batch, cfg.image, cfg.image, cfg.channels), "linear")
    noisy = clean + cfg.noise * jax.random.normal(kn, clean.shape, jnp.float32)
    return {"noisy": noisy, "clean": clean}


def loss(module, params, batch):
    return jnp.mean((module.apply({"params": params}, batch) - batch["clean"]) ** 2)
