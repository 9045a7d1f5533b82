"""ViT: a vision transformer classifier (float32, one Python loop over layers).

Patch embedding = nn.Conv with kernel = stride = patch (a conv_general_dilated), learned position
embedding, pre-LayerNorm encoder blocks (zoo.gpt.Block with non-causal attention), final
LayerNorm, mean pool over patches (no CLS token, so the token count stays (image/patch)^2),
Dense classifier head; loss = mean softmax cross-entropy.
"""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn

from zoo.common import check_divides, classification_batch, cross_entropy
from zoo.gpt import Block


@dataclass(frozen=True)
class ViTConfig:
    image: int
    patch: int
    channels: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_classes: int
    batch: int

    @property
    def n_patches(self) -> int:
        return (self.image // self.patch) ** 2


# n_classes is 16 in `tiny` (not 10) so it divides by 8.
SIZES = {
    "tiny": ViTConfig(image=32, patch=8, channels=3, d_model=64, n_layers=2, n_heads=4, d_ff=256, n_classes=16, batch=8),
    "base": ViTConfig(image=224, patch=16, channels=3, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                      n_classes=1000, batch=32),
}


class ViT(nn.Module):
    cfg: ViTConfig

    @nn.compact
    def __call__(self, batch):
        cfg = self.cfg
        p = cfg.patch
        x = nn.Conv(cfg.d_model, (p, p), strides=(p, p), padding="VALID", name="patch_embed")(batch["images"])
        b = x.shape[0]
        x = x.reshape(b, -1, cfg.d_model)
        pos = self.param("pos_embed", nn.initializers.normal(0.02), (cfg.n_patches, cfg.d_model))
        x = x + pos[None]
        for i in range(cfg.n_layers):
            x = Block(cfg.n_heads, cfg.d_ff, causal=False, name=f"block_{i}")(x)
        x = nn.LayerNorm(name="ln_f")(x)
        return nn.Dense(cfg.n_classes, name="head")(x.mean(axis=1))


def model(cfg: ViTConfig) -> nn.Module:
    check_divides(cfg, "image", "patch")
    check_divides(cfg, "d_model", "n_heads")
    return ViT(cfg)


def make_batch(cfg: ViTConfig, key) -> dict:
    """Random images (N(0, 1) pixels) and class labels."""
    return classification_batch(cfg, key, "images", (cfg.image, cfg.image, cfg.channels))


def loss(module, params, batch):
    return cross_entropy(module.apply({"params": params}, batch), batch["labels"])
