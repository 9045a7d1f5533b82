"""FNO: a 2-D (or 3-D, ``dims=3``) Fourier neural operator (Li et al. 2021) learning the heat-equation
solution operator.

lift (Dense on [a(x), x, y]) -> n_layers x [spectral conv + pointwise Dense skip, gelu (not after
the last)] -> projection MLP. Spectral conv: jnp.fft.rfft2 over the two spatial axes, keep the
`modes` lowest frequencies (first axis: both the positive block [:modes] and the negative block
[-modes:]; second axis: [:modes] of the half spectrum), multiply by complex weights with a complex
einsum over channels (weights stored as two real params, `w_real`/`w_imag`), scatter into a zero
spectrum, jnp.fft.irfft2 back. 3-D (``SpectralConv3d``): jnp.fft.rfftn over the three spatial axes,
the four low-mode corner blocks (positive/negative on the first two axes, [:modes] of the half
spectrum on the last), irfftn back. ``complex_fft=True``: the same on complex FFTs (fftn of the input
cast to complex64, the same low-mode blocks of the full spectrum, the real part of ifftn back), so
a plan's fft nodes are FFT / IFFT rather than RFFT / IRFFT. Loss = MSE against the target field.

Scientific sizes (batch below the device count, as PDE / weather training runs): hires-512 and
hires-1024 (2-D, batch 2 and 1), 3d-tiny (runs on the CPU mesh) and 3d-128 (a 128^3 field).
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.common import check_spatial_dims


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
    dims: int = 2  # spatial dims: 2 or 3
    #: the spectral conv on complex FFTs (fftn of the input cast to complex64, the same low-mode blocks of
    #: the full spectrum, the real part of ifftn back) instead of rfftn / irfftn: the fft2 / fftn variant
    complex_fft: bool = False


SIZES = {
    "tiny": FNOConfig(grid=32, width=16, modes=8, n_layers=2, batch=8),
    "large": FNOConfig(grid=256, width=64, modes=16, n_layers=4, batch=16),
    "hires-512": FNOConfig(grid=512, width=128, modes=32, n_layers=4, batch=2, proj=256),
    "hires-1024": FNOConfig(grid=1024, width=64, modes=32, n_layers=4, batch=1, proj=256),
    "3d-tiny": FNOConfig(grid=16, width=8, modes=4, n_layers=2, batch=1, proj=32, dims=3),
    "3d-128": FNOConfig(grid=128, width=32, modes=12, n_layers=4, batch=1, proj=128, dims=3),
}


def _forward(x, k: int, complex_fft: bool):
    """The spectrum over spatial axes 1..k: rfftn (half spectrum on the last axis) or fftn of complex64 x."""
    axes = tuple(range(1, k + 1))
    return jnp.fft.fftn(x.astype(jnp.complex64), axes=axes) if complex_fft else jnp.fft.rfftn(x, axes=axes)


def _inverse(out_ft, s: tuple, complex_fft: bool):
    """Back to the field: irfftn to size ``s``, or the real part of ifftn."""
    axes = tuple(range(1, len(s) + 1))
    return jnp.real(jnp.fft.ifftn(out_ft, axes=axes)) if complex_fft else jnp.fft.irfftn(out_ft, s=s, axes=axes)


class SpectralConv2d(nn.Module):
    features: int
    modes: int
    complex_fft: bool = False

    @nn.compact
    def __call__(self, x):
        b, h, w, c = x.shape
        m = self.modes
        scale = 1.0 / (c * self.features)
        init = lambda key, shape: scale * jax.random.uniform(key, shape, jnp.float32)
        shape = (2, m, m, c, self.features)  # [positive, negative] first-axis frequency blocks
        weights = jax.lax.complex(self.param("w_real", init, shape), self.param("w_imag", init, shape))
        x_ft = _forward(x, 2, self.complex_fft)  # (b, h, w//2+1, c) complex64 (w, not w//2+1, if complex)
        low = jnp.einsum("bxyi,xyio->bxyo", x_ft[:, :m, :m, :], weights[0])
        high = jnp.einsum("bxyi,xyio->bxyo", x_ft[:, h - m:, :m, :], weights[1])
        out_ft = jnp.zeros((b, h, w if self.complex_fft else w // 2 + 1, self.features), jnp.complex64)
        out_ft = out_ft.at[:, :m, :m, :].set(low).at[:, h - m:, :m, :].set(high)
        return _inverse(out_ft, (h, w), self.complex_fft)


class SpectralConv3d(nn.Module):
    features: int
    modes: int
    complex_fft: bool = False

    @nn.compact
    def __call__(self, x):
        b, d1, d2, d3, c = x.shape
        m = self.modes
        scale = 1.0 / (c * self.features)
        init = lambda key, shape: scale * jax.random.uniform(key, shape, jnp.float32)
        shape = (4, m, m, m, c, self.features)  # corners: (+,+), (-,+), (+,-), (-,-) on the first two axes
        weights = jax.lax.complex(self.param("w_real", init, shape), self.param("w_imag", init, shape))
        x_ft = _forward(x, 3, self.complex_fft)  # (b, d1, d2, d3//2+1, c) complex64 (d3 if complex)
        out_ft = jnp.zeros((b, d1, d2, d3 if self.complex_fft else d3 // 2 + 1, self.features), jnp.complex64)
        for k, (s1, s2) in enumerate([(slice(0, m), slice(0, m)), (slice(d1 - m, d1), slice(0, m)),
                                      (slice(0, m), slice(d2 - m, d2)), (slice(d1 - m, d1), slice(d2 - m, d2))]):
            block = jnp.einsum("bxyzi,xyzio->bxyzo", x_ft[:, s1, s2, :m, :], weights[k])
            out_ft = out_ft.at[:, s1, s2, :m, :].set(block)
        return _inverse(out_ft, (d1, d2, d3), self.complex_fft)


class FNO(nn.Module):
    cfg: FNOConfig

    @nn.compact
    def __call__(self, batch):
        cfg = self.cfg
        b, *space, _ = batch["a"].shape
        coords = jnp.meshgrid(*[jnp.linspace(0.0, 1.0, n) for n in space], indexing="ij")
        grid = jnp.broadcast_to(jnp.stack(coords, axis=-1)[None], (b, *space, len(space)))
        x = nn.Dense(cfg.width, name="lift")(jnp.concatenate([batch["a"], grid], axis=-1))
        spectral = SpectralConv2d if cfg.dims == 2 else SpectralConv3d
        for i in range(cfg.n_layers):
            y = spectral(cfg.width, cfg.modes, cfg.complex_fft, name=f"spectral_{i}")(x)
            y = y + nn.Dense(cfg.width, name=f"skip_{i}")(x)
            x = nn.gelu(y) if i < cfg.n_layers - 1 else y
        x = nn.gelu(nn.Dense(cfg.proj, name="proj_0")(x))
        return nn.Dense(cfg.out_channels, name="proj_1")(x)


def model(cfg: FNOConfig) -> nn.Module:
    if not (0 < cfg.modes <= cfg.grid // 2):
        raise ValueError(f"FNOConfig.modes={cfg.modes} must be in 1..grid//2={cfg.grid // 2}")
    check_spatial_dims(cfg)
    return FNO(cfg)


def make_batch(cfg: FNOConfig, key) -> dict:
    """Input a(x): white noise; target u(x): the heat equation's solution, exp(-D|k|^2) in Fourier space."""
    n, k = cfg.grid, cfg.dims
    a = jax.random.normal(key, (cfg.batch,) + (n,) * k + (cfg.in_channels,), jnp.float32)
    freqs = [jnp.fft.fftfreq(n) * n] * (k - 1) + [jnp.fft.rfftfreq(n) * n]
    k2 = sum(f.reshape([-1 if i == j else 1 for j in range(k)]) ** 2 for i, f in enumerate(freqs))
    decay = jnp.exp(-cfg.diffusivity * k2)[None, ..., None]
    axes = tuple(range(1, k + 1))
    u = jnp.fft.irfftn(jnp.fft.rfftn(a, axes=axes) * decay, s=(n,) * k, axes=axes)
    return {"a": a, "u": u[..., : cfg.out_channels].astype(jnp.float32)}


def loss(module, params, batch):
    return jnp.mean((module.apply({"params": params}, batch) - batch["u"]) ** 2)
