"""Shared helpers for experiment scripts: git revision, results JSON, a rich table.

Every experiment writes ``results/<name>.json`` with its full config, seed and git revision next to
its numbers (see docs/INTERFACES.md, "Benchmarks").
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "results"


def cpu_devices(n: int = 8) -> None:
    """Before jax is imported: JAX on the CPU with ``n`` virtual host devices (appended to the
    caller's XLA_FLAGS unless those already set a device count)."""
    flag = f"--xla_force_host_platform_device_count={n}"
    os.environ.setdefault("XLA_FLAGS", flag)
    if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " " + flag
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def git_rev(short: bool = False) -> str:
    """The repository's HEAD commit (``"-dirty"`` appended when tracked files changed); ``"unknown"`` without git."""
    try:
        args = ["git", "rev-parse", "--short" if short else "--verify", "HEAD"]
        rev = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _jsonable(x):
    """Best-effort conversion of configs/results (dataclasses, numpy, tuples, paths) to JSON types."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(x).items()}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "tolist"):  # numpy arrays and scalars, jax arrays
        return x.tolist()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


def write_results(name: str, payload: dict, config=None, seed: int | None = None,
                  results_dir: str | Path | None = None) -> Path:
    """Write ``results/<name>.json`` with ``payload`` plus config, seed, git revision and environment
    (python, platform, XLA_FLAGS, jax, the CPU count and the load average when written).

    ``config`` and ``seed`` may also be given inside ``payload`` (keys ``"config"``, ``"seed"``);
    explicit arguments win. Returns the path written.
    """
    if not name or any(c in name for c in "/\\"):
        raise ValueError(f"results name must be a plain file stem, got {name!r}")
    if not isinstance(payload, dict):
        raise ValueError(f"payload must be a dict, got {type(payload).__name__}")
    out_dir = Path(results_dir) if results_dir is not None else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    record = dict(payload)
    if config is not None:
        record["config"] = config
    if seed is not None:
        record["seed"] = seed
    record.setdefault("config", None)
    record.setdefault("seed", None)
    record["git_rev"] = git_rev()
    record["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    record["env"] = {"python": sys.version.split()[0], "platform": platform.platform(),
                     "xla_flags": os.environ.get("XLA_FLAGS", ""), "cpu_count": os.cpu_count()}
    if hasattr(os, "getloadavg"):   # the machine is shared: timings mean little without its load
        record["env"]["loadavg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    try:
        import jax
        record["env"]["jax"] = jax.__version__
    except ImportError:  # pragma: no cover
        pass
    path = out_dir / f"{name}.json"
    with open(path, "w") as f:
        json.dump(_jsonable(record), f, indent=1)
    return path


def _fmt(v) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1e4 or abs(v) < 1e-3:
            return f"{v:.3g}"
        return f"{v:.3f}".rstrip("0").rstrip(".")
    return str(v)


def print_table(rows: list[dict], columns: list[str] | None = None, title: str | None = None) -> None:
    """Print ``rows`` (dicts) as a rich table with ``columns`` (default: keys of the first row)."""
    from rich.console import Console
    from rich.table import Table

    if columns is None:
        columns = list(rows[0].keys()) if rows else []
    table = Table(title=title)
    for c in columns:
        table.add_column(str(c), justify="left" if rows and isinstance(rows[0].get(c), str) else "right")
    for r in rows:
        table.add_row(*[_fmt(r.get(c, "")) for c in columns])
    Console(width=max(120, 14 * len(columns))).print(table)
