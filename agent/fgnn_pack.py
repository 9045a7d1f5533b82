"""Padding and packing of the factor-graph network's inputs (agent/fgnn.py): per-problem raw
arrays padded to shape buckets (powers of √2, or of 2 with ``coarse``; at least ``MIN_BUCKET``) so
one compiled forward or training step serves every problem of a similar size, and disjoint unions
of several problems (``pack``) for batched training, and the trainer's epoch of packed batches
(``epoch_batches``: first-fit into one shape; larger problems alone in their own bucket). Padded slots and entries point at a spare last
slot whose masks are 0.
"""
from __future__ import annotations

import math

import numpy as np

MIN_BUCKET = {"S": 256, "U": 512, "V": 512, "N": 4096, "n": 128, "m": 256, "T": 128}   # small problems: one shape


def _bucket(x: int, lo: int = 64, step: float = 0.5) -> int:
    """Smallest power of 2**step (rounded up to an integer) ≥ x + 1 (one spare slot), at least ``lo``."""
    b = max(lo, x + 1)
    e = math.ceil(math.log2(b) / step)
    return int(math.ceil(2 ** (e * step)))


def _pad(a: np.ndarray, size: int, fill) -> np.ndarray:
    out = np.full(size, fill, dtype=a.dtype)
    out[:len(a)] = a
    return out


# the raw arrays of one problem: index arrays and what they index (for offsets when packing)
_INDEX = {"node_of": "n", "u_flat": "S", "v_flat": "S", "eu_slot": "m", "ev_slot": "m", "row_slot": "U",
          "col_slot": "V", "lo": "T", "hi": "T"}
_LEN = {"c": "S", "un": "S", "node_of": "S", "smask": "S", "sbinds": "S", "u_flat": "U", "eu_slot": "U",
        "umask": "U", "v_flat": "V", "ev_slot": "V", "vmask": "V", "row_slot": "N", "col_slot": "N", "ec": "N",
        "espr": "m", "lo": "n", "hi": "n", "live": "n", "pmin": "T", "pmax": "T", "tmask": "T", "tbinds": "T",
        "tlam0": "T", "tbase": "T", "tcap": "T", "hint": "S", "cls": "S", "w": "n"}   # cls, w: the trainer's targets


def pack(raws: list, sizes: dict, dtype=np.float32) -> dict:
    """Concatenate problems' raw arrays (disjoint union: indices offset) and pad each to ``sizes``
    (keys S, U, V, N, n, m, T; each at least one more than the total), the values as ``dtype`` (the
    planning forward's float64: ``padded_sizes`` of float32 ones). Padded entries point at
    the spare last slot of what they index; masks are 0 there."""
    tot = {k: sum(r["_sizes"][k] for r in raws) for k in "SUVNnmT"}
    for k in tot:
        if sizes[k] < tot[k] + 1:
            raise ValueError(f"pack: {tot[k]} {k} do not fit {sizes[k]}")
    out = {}
    for key, dim in _LEN.items():
        if key not in raws[0]:
            continue
        parts, off = [], 0
        for r in raws:
            a = r[key]
            if key in _INDEX:
                a = a + off
                off += r["_sizes"][_INDEX[key]]
            parts.append(a)
        a = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        fill = sizes[_INDEX[key]] - 1 if key in _INDEX and key not in ("lo", "hi") else (1 if key == "tlam0" else 0)
        out[key] = _pad(a.astype(np.int32 if key in _INDEX else dtype), sizes[dim], fill)
    return out


def padded_sizes(arrays: dict) -> dict:
    """The ``sizes`` packed ``arrays`` were padded to."""
    return {dim: arrays[key].shape[0] for dim, key in (("S", "c"), ("U", "u_flat"), ("V", "v_flat"), ("N", "ec"),
                                                        ("n", "lo"), ("m", "espr"), ("T", "pmin"))}


def bucket_sizes(sz: dict, coarse: bool = False) -> dict:
    """Padded sizes for real sizes ``sz`` (powers of √2, or of 2 with ``coarse``; U and V alike)."""
    st = 1.0 if coarse else 0.5
    out = {k: _bucket(sz[k], MIN_BUCKET[k], step=st) for k in "SNnm"}
    out["T"] = _bucket(sz["T"] + 1, MIN_BUCKET["T"], st)
    out["U"] = out["V"] = _bucket(max(sz["U"], sz["V"]), MIN_BUCKET["U"], step=st)
    return out


def make_batches(samples: list, sizes: dict, rng) -> list:
    """Pack ``samples`` (in a random order) first-fit into disjoint unions of at most ``sizes``."""
    bins: list = []
    for j in rng.permutation(len(samples)).tolist():
        sz = samples[j].raw["_sizes"]
        for b in bins:
            if all(b["tot"][k] + sz[k] + 1 <= sizes[k] for k in sz):
                b["idx"].append(j)
                for k in sz:
                    b["tot"][k] += sz[k]
                break
        else:
            bins.append({"idx": [j], "tot": dict(sz)})
    return [pack([samples[j].raw for j in b["idx"]], sizes) for b in bins]


def bin_sizes(samples: list) -> dict:
    """One shape for every packed batch: each dimension the largest sample's power-of-2 bucket."""
    return {k: max(s.bucket[k] for s in samples) for k in "SUVNnmT"}


def epoch_batches(data: list, batch_entries: int, rng) -> list:
    """The epoch's batches: samples up to ``batch_entries`` edge-cost entries packed into one shape
    (``make_batches``), larger ones alone in their own bucket (one compile per distinct bucket)."""
    small = [s for s in data if s.bucket["N"] <= batch_entries]
    big = [s for s in data if s.bucket["N"] > batch_entries]
    out = []
    if small:
        sizes = bin_sizes(small)
        grow = 1 << max(0, int(np.floor(np.log2(max(batch_entries, 1) / sizes["N"]))))
        out = make_batches(small, {k: v * grow for k, v in sizes.items()}, rng)
    out += [s.arrays() for s in big]
    return [out[j] for j in rng.permutation(len(out))]
