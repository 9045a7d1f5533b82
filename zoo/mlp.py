"""MLP: a plain multi-layer perceptron classifier (Dense + relu, softmax cross-entropy)."""
from __future__ import annotations

from dataclasses import dataclass

import flax.linen as nn

from zoo.common import classification_batch, cross_entropy


@dataclass(frozen=True)
class MLPConfig:
    in_dim: int
    hidden: int
    n_layers: int  # number of Dense layers, including the output layer
    n_classes: int
    batch: int

    @property
    def dims(self) -> tuple[int, ...]:
        """Feature sizes in -> hidden ... -> classes (n_layers + 1 entries)."""
        return (self.in_dim,) + (self.hidden,) * (self.n_layers - 1) + (self.n_classes,)


# n_classes is 16 (not 10) in `tiny` so every dim divides by 8 on a 2x4 mesh.
SIZES = {
    "tiny": MLPConfig(in_dim=32, hidden=64, n_layers=3, n_classes=16, batch=16),
    "large": MLPConfig(in_dim=4096, hidden=4096, n_layers=8, n_classes=1024, batch=1024),
}


class MLP(nn.Module):
    cfg: MLPConfig

    @nn.compact
    def __call__(self, batch):
        x = batch["x"]
        dims = self.cfg.dims
        for i, width in enumerate(dims[1:]):
            x = nn.Dense(width, name=f"Dense_{i}")(x)
            if i < len(dims) - 2:
                x = nn.relu(x)
        return x


def model(cfg: MLPConfig) -> nn.Module:
    if cfg.n_layers < 1:
        raise ValueError(f"MLPConfig.n_layers must be >= 1, got {cfg.n_layers}")
    return MLP(cfg)


def make_batch(cfg: MLPConfig, key) -> dict:
    """Random inputs (N(0, 1) features) and class labels."""
    return classification_batch(cfg, key, "x", (cfg.in_dim,))


def loss(module, params, batch):
    return cross_entropy(module.apply({"params": params}, batch), batch["labels"])
