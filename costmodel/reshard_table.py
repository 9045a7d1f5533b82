"""Resharding as XLA does it: tables of measured transitions, loaded per mesh shape and JAX version.

A table holds, per (mesh shape, source spec, destination spec) — specs in Alpa notation over mesh
axis indices (``spec_name``: "S01RR", "RRS1", ...; the name's length is the tensor's rank) — what
XLA's SPMD partitioner compiled for ``with_sharding_constraint(x, src)`` followed by
``with_sharding_constraint(x, dst)`` on the CPU backend (``runtime.reshard_probe`` builds it):

* ``collectives``: (kind, mesh axes, bytes_frac, wire_frac, count) per collective instruction,
  with bytes_frac = the per-device buffer the collective works on (runtime/hlo.py ``bytes``:
  all-gather result, all-to-all / all-reduce / permute operand) and wire_frac = what one device
  sends (ring formulas), both as fractions of the whole tensor's bytes;
* ``sent_frac``: Σ wire_frac x count — the bytes each device sends, over the tensor's bytes;
* ``remat``: XLA rematerialised the whole tensor on every device on the way (a collective buffer
  the size of the whole tensor although dst is not replicated: its "involuntary full
  rematerialization", e.g. S1RR -> RRS0 on 2x4);
* ``temp_frac``: XLA's temp bytes (memory_analysis) over the tensor's bytes;
* ``stable``: the fractions agreed on two probe shapes (dims multiples of the device count).

Fractions are exact for dims divisible by their shard counts; a padded dim's extra elements are
not in them (under-count by the padding, ceil(d/n)·n/d − 1). Rank > 4, meshes not probed, and
pairs a table lacks fall back to the hand rules (``costmodel.cost.reshard_rules``); the builder
counts those fallbacks in ``ProblemMeta.reshard_stats`` and warns.

Files: ``costmodel/reshard_tables/jax-<version>/mesh-<AxB>.json`` ship with the package; tables
built locally go to ``$SHARDGYM_CACHE_DIR`` (default ``~/.cache/shardgym``)``/reshard_tables/...``
and add to (or replace entries of) the shipped one. A table of another JAX version is not used.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

FORMAT = "shardgym.ReshardTable/1"
SHIPPED_DIR = Path(__file__).resolve().parent / "reshard_tables"


@dataclass(frozen=True)
class Transition:
    """One measured src -> dst resharding (fractions of the whole tensor's bytes; see module doc)."""

    collectives: tuple  # ((kind, axes tuple, bytes_frac, wire_frac, count), ...)
    sent_frac: float
    remat: bool
    temp_frac: float
    stable: bool = True

    def to_json(self) -> dict:
        return {"c": [[k, list(a), b, w, n] for k, a, b, w, n in self.collectives], "sent": self.sent_frac,
                "remat": self.remat, "temp": self.temp_frac, "stable": self.stable}

    @classmethod
    def from_json(cls, d: dict) -> Transition:
        return cls(tuple((str(k), tuple(int(x) for x in a), float(b), float(w), int(n)) for k, a, b, w, n in d["c"]),
                   float(d["sent"]), bool(d["remat"]), float(d["temp"]), bool(d.get("stable", True)))


@lru_cache(maxsize=1)
def jax_version() -> str:
    """The installed jax's version (tables are per version); "none" without jax. Cached: reading
    package metadata takes milliseconds and every resharding lookup asks."""
    try:
        return metadata.version("jax")
    except metadata.PackageNotFoundError:
        return "none"


def mesh_tag(mesh_shape) -> str:
    return "x".join(str(int(n)) for n in mesh_shape)


def pair_key(src_name: str, dst_name: str) -> str:
    return f"{src_name}>{dst_name}"


def cache_dir() -> Path:
    return Path(os.environ.get("SHARDGYM_CACHE_DIR", Path.home() / ".cache" / "shardgym")) / "reshard_tables"


def table_paths(mesh_shape, version: str | None = None) -> list[Path]:
    """Where the table of ``mesh_shape`` is looked for: shipped first, then the user cache."""
    v = version or jax_version()
    name = f"mesh-{mesh_tag(mesh_shape)}.json"
    return [SHIPPED_DIR / f"jax-{v}" / name, cache_dir() / f"jax-{v}" / name]


_TABLES: dict[tuple, dict[str, Transition]] = {}
_VERSION: list[str] = []   # the version the loaded tables are for (lookup's fast path)


def read(path) -> tuple[dict, dict[str, Transition]]:
    """(header, entries) of a table file; ValueError naming the file when it is not one."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable resharding table ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a resharding table (missing format {FORMAT!r}); rebuild it with "
                         "python -m runtime.reshard_probe")
    return doc, {k: Transition.from_json(v) for k, v in doc["entries"].items()}


def write(path, mesh_shape, entries: dict[str, Transition], header: dict | None = None) -> Path:
    """Write ``entries`` (merged over the file's existing ones) as a table for ``mesh_shape``."""
    path = Path(path)
    old = read(path)[1] if path.exists() else {}
    old.update(entries)
    doc = {"format": FORMAT, "jax": jax_version(), "mesh_shape": [int(n) for n in mesh_shape], **(header or {}),
           "entries": {k: old[k].to_json() for k in sorted(old)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")).replace('},"', '},\n"'))
    os.replace(tmp, path)
    _TABLES.clear()
    return path


def table(mesh_shape) -> dict[str, Transition]:
    """Every measured transition for ``mesh_shape`` under the installed JAX (empty when none)."""
    key = (tuple(int(n) for n in mesh_shape), jax_version())
    got = _TABLES.get(key)
    if got is None:
        got = {}
        for p in table_paths(key[0], key[1]):
            if p.exists():
                got.update(read(p)[1])
        _TABLES[key] = got
        _VERSION[:] = [key[1]]
    return got


def lookup(mesh_shape, src_name: str, dst_name: str) -> Transition | None:
    """The measured src -> dst transition on ``mesh_shape``, or None when it was not probed."""
    got = _TABLES.get((mesh_shape, _VERSION[0])) if _VERSION else None
    return (got if got is not None else table(mesh_shape)).get(pair_key(src_name, dst_name))


def clear_cache() -> None:
    """Forget loaded tables (after writing one, or when tests swap the cache dir)."""
    _TABLES.clear()
