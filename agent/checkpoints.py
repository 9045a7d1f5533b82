"""Checkpoints: one msgpack file (flax.serialization) holding params, optimizer state, RNG key,
update counter and the config that made them; written atomically (tmp file + os.replace).

Format ``shardgym.agent/2``: the weights (params, opt_state, rng, update) are one msgpack payload
stored as bytes beside its SHA-256 (``checksum``); loading recomputes it and a mismatch (a flipped
byte, a truncated copy) is a ValueError naming the file. Files of format ``/1`` (no checksum) still
load. Layout of the restored dict: ``{"format", "params": {...}, "opt_state": {...} or None,
"rng": uint32 key data or None, "update": int, "config": {...}, "extra": {...}}``.
Float arrays round-trip bit-exactly.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from flax import serialization

FORMAT = "shardgym.agent/2"
_FORMATS = ("shardgym.agent/1", FORMAT)


def save_checkpoint(path, params, config: dict, opt_state=None, rng=None, update: int = 0,
                    extra: dict | None = None) -> str:
    """Write a checkpoint to ``path`` atomically; returns the path."""
    import jax
    weights = {
        "params": serialization.to_state_dict(jax.device_get(params)),
        "opt_state": None if opt_state is None else serialization.to_state_dict(jax.device_get(opt_state)),
        "rng": None if rng is None else np.asarray(jax.random.key_data(rng) if _is_typed_key(rng) else rng),
        "update": int(update),
    }
    payload = serialization.msgpack_serialize(weights)
    state = {
        "format": FORMAT,
        "weights": payload,
        "checksum": hashlib.sha256(payload).hexdigest(),
        "config": json.dumps(config, sort_keys=True, default=str),
        "extra": json.dumps(extra or {}, sort_keys=True, default=str),
    }
    return write_atomic(path, serialization.msgpack_serialize(state))


def write_atomic(path, data: bytes) -> str:
    """Write ``data`` to ``path`` via a tmp file, fsync and os.replace: a reader (or a kill) sees
    the old file or the new one, never half of one. Returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def weights_digest(path) -> str:
    """SHA-256 of a checkpoint's weights (params, optimizer state, key, update): equal digests mean
    bit-identical training state, whatever the config and extra fields say."""
    from flax import serialization as ser
    state = load_checkpoint(path)
    return hashlib.sha256(ser.msgpack_serialize({k: state[k] for k in ("params", "opt_state", "rng", "update")}))\
        .hexdigest()


def _is_typed_key(x) -> bool:
    import jax
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def load_checkpoint(path) -> dict:
    """Read a checkpoint; a missing file raises FileNotFoundError, anything unreadable or
    incomplete a ValueError naming the file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    with open(path, "rb") as f:
        data = f.read()
    try:
        state = serialization.msgpack_restore(data)
    except Exception as exc:  # msgpack raises a zoo of exception types on garbage
        raise ValueError(f"checkpoint {path!r} is corrupt or not a shardgym agent checkpoint "
                         f"({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or state.get("format") not in _FORMATS:
        raise ValueError(f"checkpoint {path!r} is not a shardgym agent checkpoint (missing format {FORMAT!r})")
    if state["format"] == FORMAT:
        payload = state.pop("weights", None)
        if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != state.get("checksum"):
            raise ValueError(f"checkpoint {path!r} is damaged: the checksum of its weights does not match "
                             "(a changed or truncated file); restore it from a clean copy")
        try:
            state.update(serialization.msgpack_restore(payload))
        except Exception as exc:
            raise ValueError(f"checkpoint {path!r} has unreadable weights ({type(exc).__name__}: {exc})") from exc
    missing = [k for k in ("params", "config", "update") if k not in state]
    if missing:
        raise ValueError(f"checkpoint {path!r} is incomplete: missing {', '.join(missing)}")
    try:
        state["config"] = json.loads(state["config"])
        state["extra"] = json.loads(state.get("extra") or "{}")
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"checkpoint {path!r} has a malformed config ({exc})") from exc
    state["update"] = int(state["update"])
    return state
