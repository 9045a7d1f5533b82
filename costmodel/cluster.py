"""Cluster: the simulated machine a plan is priced on.

An n-D device mesh with axis names; per mesh axis the link bandwidth (bytes/s each device can
send along that axis) and latency (s per collective step); per device the memory (bytes) and peak
FLOP/s, which may differ from device to device (heterogeneous clusters, slow devices); and an
efficiency factor (achieved / peak FLOP/s) applied to all compute; and the ``backend`` XLA
compiles for, where it changes what runs: "cpu" lowers a reduce-scatter to an all-reduce plus a
slice fused into the consumers (measured, DESIGN.md), so it sends 2x the bytes and the whole reduced
tensor lives as long as the output; "gpu" and "tpu" run a real reduce-scatter.

Devices are laid out in row-major mesh order: device d has mesh coordinates
``np.unravel_index(d, mesh_shape)``. By convention the LAST axis is the fastest (within a node):
Megatron-style tensor parallelism uses it, data parallelism the others.

Presets: ``Cluster.preset(name)``; ``Cluster.presets()`` lists them. Files: ``Cluster.from_file``
reads TOML or JSON with the same keys as ``Cluster.to_dict()``; ``device_memory_bytes`` and
``device_flops`` may be one number for all devices, and memory may be a string like "80GiB".
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, replace

import numpy as np

GiB = 1024 ** 3
BACKENDS = ("cpu", "gpu", "tpu")
_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 1024, "mib": 1024 ** 2, "gib": GiB, "tib": 1024 ** 4}


def parse_bytes(text) -> float:
    """'40GiB' -> 42949672960.0; '1.5 GB' -> 1.5e9; numbers pass through. ValueError otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size in bytes (examples: 40GiB, 512MiB, 1.5e9)")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class Cluster:
    name: str
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    axis_bandwidth_Bps: tuple[float, ...]
    axis_latency_s: tuple[float, ...]
    device_memory_bytes: tuple[float, ...]
    device_flops: tuple[float, ...]
    efficiency: float = 0.5
    backend: str = "gpu"

    def __post_init__(self):
        nd = len(self.mesh_shape)
        if nd == 0 or any(int(s) < 1 for s in self.mesh_shape):
            raise ValueError(f"cluster {self.name!r}: mesh_shape must be positive integers, got {self.mesh_shape}")
        for fld in ("axis_names", "axis_bandwidth_Bps", "axis_latency_s"):
            if len(getattr(self, fld)) != nd:
                raise ValueError(f"cluster {self.name!r}: {fld} needs one entry per mesh axis ({nd}), "
                                 f"got {len(getattr(self, fld))}")
        if len(set(self.axis_names)) != nd:
            raise ValueError(f"cluster {self.name!r}: axis_names must be distinct, got {self.axis_names}")
        n = self.num_devices
        for fld in ("device_memory_bytes", "device_flops"):
            v = getattr(self, fld)
            if len(v) != n:
                raise ValueError(f"cluster {self.name!r}: {fld} needs one entry per device ({n}) or a single number")
            if any(not (x > 0) for x in v):
                raise ValueError(f"cluster {self.name!r}: {fld} must be positive")
        if any(not (b > 0) for b in self.axis_bandwidth_Bps):
            raise ValueError(f"cluster {self.name!r}: axis_bandwidth_Bps must be positive")
        if any(lat < 0 for lat in self.axis_latency_s):
            raise ValueError(f"cluster {self.name!r}: axis_latency_s must be >= 0")
        if not (0 < self.efficiency <= 1):
            raise ValueError(f"cluster {self.name!r}: efficiency must be in (0, 1], got {self.efficiency}")
        if self.backend not in BACKENDS:
            raise ValueError(f"cluster {self.name!r}: backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")

    # ---- derived -----------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return int(math.prod(self.mesh_shape))

    @property
    def ndim(self) -> int:
        return len(self.mesh_shape)

    def axis_size(self, axis) -> int:
        return int(self.mesh_shape[self.axis_index(axis)])

    def axis_index(self, axis) -> int:
        if isinstance(axis, int):
            return axis
        try:
            return self.axis_names.index(axis)
        except ValueError:
            raise ValueError(f"cluster {self.name!r} has no mesh axis {axis!r} (axes: {self.axis_names})") from None

    def flops_grid(self) -> np.ndarray:
        """Peak FLOP/s per device as an array of mesh_shape."""
        return np.asarray(self.device_flops, dtype=np.float64).reshape(self.mesh_shape)

    def memory_grid(self) -> np.ndarray:
        return np.asarray(self.device_memory_bytes, dtype=np.float64).reshape(self.mesh_shape)

    @property
    def memory_limit_bytes(self) -> float:
        """The per-device memory cap a plan must respect: the smallest device's memory."""
        return float(min(self.device_memory_bytes))

    @property
    def is_heterogeneous(self) -> bool:
        return len(set(self.device_flops)) > 1 or len(set(self.device_memory_bytes)) > 1

    # ---- I/O ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str = "cluster") -> Cluster:
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a table of cluster fields")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"{source}: unknown field(s) {sorted(unknown)}; valid fields: {sorted(known)}")
        missing = [k for k in ("mesh_shape", "axis_bandwidth_Bps", "device_memory_bytes", "device_flops") if k not in d]
        if missing:
            raise ValueError(f"{source}: missing field(s) {missing}")
        try:
            mesh = tuple(int(s) for s in d["mesh_shape"])
        except (TypeError, ValueError):
            raise ValueError(f"{source}: field 'mesh_shape' must be a list of integers, got {d['mesh_shape']!r}") from None
        n, nd = int(math.prod(mesh)) if mesh else 0, len(mesh)

        def per(key, count, conv=float, default=None):
            v = d.get(key, default)
            if v is None:
                raise ValueError(f"{source}: missing field {key!r}")
            try:
                if isinstance(v, (list, tuple)):
                    return tuple(conv(x) for x in v)
                return (conv(v),) * count
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{source}: field {key!r}: {exc}") from None

        try:
            return cls(
                name=str(d.get("name", os.path.basename(source))),
                mesh_shape=mesh,
                axis_names=tuple(str(a) for a in d.get("axis_names", [f"a{i}" for i in range(nd)])),
                axis_bandwidth_Bps=per("axis_bandwidth_Bps", nd),
                axis_latency_s=per("axis_latency_s", nd, default=0.0),
                device_memory_bytes=per("device_memory_bytes", n, parse_bytes),
                device_flops=per("device_flops", n),
                efficiency=float(d.get("efficiency", 0.5)),
                backend=str(d.get("backend", "gpu")),
            )
        except ValueError as exc:
            msg = str(exc)
            raise ValueError(msg if msg.startswith(source) else f"{source}: {msg}") from None

    @classmethod
    def from_file(cls, path: str) -> Cluster:
        """Read a cluster from TOML (.toml) or JSON. Errors name the file and the bad field."""
        try:
            if str(path).endswith(".toml"):
                import tomllib
                with open(path, "rb") as f:
                    d = tomllib.load(f)
            else:
                with open(path) as f:
                    d = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"cluster file {path} does not exist") from None
        except Exception as exc:  # tomllib.TOMLDecodeError, json.JSONDecodeError
            raise ValueError(f"{path}: cannot parse cluster file ({exc})") from None
        d = d.get("cluster", d) if isinstance(d, dict) else d
        return cls.from_dict(d, source=str(path))

    def to_file(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    # ---- presets -----------------------------------------------------------------------
    @staticmethod
    def presets() -> list[str]:
        return list(_PRESETS)

    @classmethod
    def preset(cls, name: str) -> Cluster:
        if name not in _PRESETS:
            raise ValueError(f"unknown cluster preset {name!r}; presets: {', '.join(_PRESETS)}")
        return _PRESETS[name]()

    def with_(self, **kw) -> Cluster:
        return replace(self, **kw)


def _uniform(name, mesh, axes, bw, lat, mem, flops, eff=0.5, backend="gpu") -> Cluster:
    n = int(math.prod(mesh))
    return Cluster(name, tuple(mesh), tuple(axes), tuple(float(b) for b in bw), tuple(float(x) for x in lat),
                   (float(mem),) * n, (float(flops),) * n, eff, backend)


def _hetero() -> Cluster:
    c = _uniform("a100-hetero-2x4", (2, 4), ("node", "gpu"), (25e9, 300e9), (10e-6, 3e-6), 40 * GiB, 156e12)
    # devices 4..7 (the second node) are an older generation: half the FLOP/s, 16 GiB less memory.
    flops = tuple(156e12 if d < 4 else 78e12 for d in range(8))
    mem = tuple(40 * GiB if d < 4 else 24 * GiB for d in range(8))
    return replace(c, device_flops=flops, device_memory_bytes=mem)


# Figures: per-device unidirectional link bandwidth and a per-step latency; FLOP/s at TF32/fp32-class
# rates since the zoo trains in float32. CPU figures are nominal (the 8 virtual devices share 2 cores).
_PRESETS = {
    "cpu-2x4": lambda: _uniform("cpu-2x4", (2, 4), ("x", "y"), (5e9, 10e9), (20e-6, 10e-6), 2 * GiB, 50e9,
                                backend="cpu"),
    "a100-1x8": lambda: _uniform("a100-1x8", (1, 8), ("node", "gpu"), (25e9, 300e9), (10e-6, 3e-6), 80 * GiB, 156e12),
    "h100-2x8": lambda: _uniform("h100-2x8", (2, 8), ("node", "gpu"), (50e9, 450e9), (10e-6, 3e-6), 80 * GiB, 495e12),
    "tpu-4x4": lambda: _uniform("tpu-4x4", (4, 4), ("x", "y"), (90e9, 90e9), (5e-6, 5e-6), 32 * GiB, 275e12,
                                backend="tpu"),
    "a100-hetero-2x4": _hetero,
}
