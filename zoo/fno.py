"""FNO: a 2-D Fourier neural operator (Li et al. 2021) learning the heat-equation solution operator.

lift (Dense on [a(x), x, y]) -> n_layers x [spectral conv + pointwise Dense skip, gelu (not after
the last)] -> projection MLP. Spectral conv: jnp.fft.rfft2 over the two spatial axes, keep the
`modes` lowest frequencies (first axis: both the positive block [:modes] and the negative block
[-modes:]; second axis: [:modes] of the half spectrum), multiply by complex weights with a complex
einsum over channels (weights stored as two real params, `w_real`/`w_imag`), scatter into a zero
spectrum, jnp.fft.irfft2 back. Loss = MSE against the target field.
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class FNOConfig:
    grid: int
    width: int
    modes: int
    n_layers: int
    batch: int
    in_channels: int = 1
    out_channels: int = 1
    proj: int = 128
    diffusivity: float = 0.01  # heat-equation time x diffusivity of the target operator


SIZES = {
    "tiny": FNOConfig(grid=32, width=16, modes=8, n_layers=2, batch=8),
    "large": FNOConfig(grid=256, width=64, modes=16, n_layers=4, batch=16),
}


class SpectralConv2d(nn.Module):
    features: int
    modes: int

    @nn.compact
    def __call__(self, x):
        b, h, w, c = x.shape
        m = self.modes
        scale = 1.0 / (c * self.features)
        init = lambda key, shape: scale * jax.random.uniform(key, shape, jnp.float32)
        shape = (2, m, m, c, self.features)  # [positive, negative] first-axis frequency blocks
        weights = jax.lax.complex(self.param("w_real", init, shape), self.param("w_imag", init, shape))
        x_ft = jnp.fft.rfft2(x, axes=(1, 2))  # (b, h, w//2+1, c) complex64
        low = jnp.einsum("bxyi,xyio->bxyo", x_ft[:, :m, :m, :], weights[0])
        high = jnp.einsum("bxyi,xyio->bxyo", x_ft[:, h - m:, :m, :], weights[1])
        out_ft = jnp.zeros((b, h, w // 2 + 1, self.features), jnp.complex64)
        out_ft = out_ft.at[:, :m, :m, :].set(low).at[:, h - m:, :m, :].set(high)
        return jnp.fft.irfft2(out_ft, s=(h, w), axes=(1, 2))


class FNO(nn.Module):
    cfg: FNOConfig

    @nn.compact
    def __call__(self, batch):
        cfg = self.cfg
        a = batch["a"]
        b, h, w, _ = a.shape
        gy, gx = jnp.meshgrid(jnp.linspace(0.0, 1.0, h), jnp.linspace(0.0, 1.0, w), indexing="ij")
        grid = jnp.broadcast_to(jnp.stack([gy, gx], axis=-1)[None], (b, h, w, 2))
        x = nn.Dense(cfg.width, name="lift")(jnp.concatenate([a, grid], axis=-1))
        for i in range(cfg.n_layers):
            y = SpectralConv2d(cfg.width, cfg.modes, name=f"spectral_{i}")(x)
            y = y + nn.Dense(cfg.width, name=f"skip_{i}")(x)
            x = nn.gelu(y) if i < cfg.n_layers - 1 else y
        x = nn.gelu(nn.Dense(cfg.proj, name="proj_0")(x))
        return nn.Dense(cfg.out_channels, name="proj_1")(x)


def model(cfg: FNOConfig) -> nn.Module:
    if not (0 < cfg.modes <= cfg.grid // 2):
        raise ValueError(f"FNOConfig.modes={cfg.modes} must be in 1..grid//2={cfg.grid // 2}")
    return FNO(cfg)


def make_batch(cfg: FNOConfig, key) -> dict:
    """Input a(x): white noise; target u(x): the heat equation's solution, exp(-D|k|^2) in Fourier space."""
    n = cfg.grid
    a = jax.random.normal(key, (cfg.batch, n, n, cfg.in_channels), jnp.float32)
    ky = jnp.fft.fftfreq(n) * n
    kx = jnp.fft.rfftfreq(n) * n
    decay = jnp.exp(-cfg.diffusivity * (ky[:, None] ** 2 + kx[None, :] ** 2))[None, :, :, None]
    u = jnp.fft.irfft2(jnp.fft.rfft2(a, axes=(1, 2)) * decay, s=(n, n), axes=(1, 2))
    return {"a": a, "u": u[..., : cfg.out_channels].astype(jnp.float32)}


def loss(module, params, batch):
    return jnp.mean((module.apply({"params": params}, batch) - batch["u"]) ** 2)
