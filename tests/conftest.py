"""Test-wide environment: 8 virtual CPU devices, CPU only, no wandb. Must run before jax is imported."""
import os

_flag = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("XLA_FLAGS", _flag)
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + _flag
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["WANDB_MODE"] = "disabled"
