"""Numerics of a sharded run against the unsharded one (DESIGN.md, "Numerics").

``max_rel_err`` is the largest per-leaf ‖sharded − ref‖₂ / ‖ref‖₂ (AdamW turns 1e-9 gradient noise
into lr-sized elementwise differences where |g| ~ eps, so an elementwise relative error would be
meaningless); ``max_abs_err`` is the largest elementwise |sharded − ref|; the loss is compared on
its own (``loss_index``). Parameters whose gradient is exactly zero in exact arithmetic (attention
key biases) get roundoff-only gradients that AdamW scales to lr-sized steps: they are reported
apart (``zero_gradient_leaves``) and left out of max_rel_err / max_abs_err. ``reference`` is the
plain single-device ``jax.jit`` run they are held to.
"""
from __future__ import annotations

import time

import jax
import numpy as np

ZERO_GRAD_RTOL = 1e-6


def _leaf_suffix(path: str) -> str:
    """The parameter part of an output path: ``[1][0].mu['block_0']['w']`` -> ``['block_0']['w']``."""
    i = path.find("['")
    return path[i:] if i >= 0 else path


def zero_gradient_leaves(ref, paths: list[str]) -> set[str]:
    """Parameter suffixes whose gradient is numerically zero in the reference run.
    Detected from the AdamW first moment (optax's ``mu``, the zoo's optimizer): a parameter whose
    ``mu`` leaf has ‖mu‖₂ <= ZERO_GRAD_RTOL x the largest ‖mu‖₂ of any leaf got a gradient made of
    roundoff only (e.g. an attention key bias: softmax is invariant to adding the same q·b_k to
    every logit of a row, so ∂loss/∂b_k = 0 exactly). AdamW normalises that roundoff to lr-sized
    steps, so such a leaf (its param, mu and nu) differs between any two correct programs by O(1)
    relative; its error is reported apart (``zero_grad_rel_err``) and not in ``max_rel_err``.
    Without ``mu`` leaves in the outputs the set is empty.
    """
    mu = {}
    for b, p in zip(ref, paths):
        if ".mu[" in p or p.endswith(".mu"):
            arr = np.asarray(b, dtype=np.float64)
            mu[_leaf_suffix(p)] = float(np.linalg.norm(arr)) if arr.size else 0.0
    if not mu:
        return set()
    top = max(mu.values())
    return {k for k, v in mu.items() if top > 0 and v <= ZERO_GRAD_RTOL * top}


def compare(out, ref, paths: list[str], exclude: set[str] = frozenset()) -> tuple[float, float, str, float]:
    """(max_abs_err, max_rel_err, worst leaf path, zero_grad_rel_err) over matching leaves: rel err
    of a leaf = ‖out − ref‖₂ / ‖ref‖₂ (‖out − ref‖₂ when ‖ref‖₂ = 0); leaves whose parameter suffix
    is in ``exclude`` count only towards zero_grad_rel_err (see zero_gradient_leaves)."""
    max_abs, max_rel, worst, zero_rel = 0.0, 0.0, "", 0.0
    for a, b, p in zip(out, ref, paths):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"output {p}: sharded shape {a.shape} differs from reference {b.shape}")
        if a.size == 0:
            continue
        d = a - b
        ab = float(np.max(np.abs(d)))
        nb = float(np.linalg.norm(b))
        rel = float(np.linalg.norm(d)) / nb if nb > 0 else float(np.linalg.norm(d))
        if not np.isfinite(ab) or not np.isfinite(rel):
            ab = rel = float("inf")
        if _leaf_suffix(p) in exclude:
            zero_rel = max(zero_rel, rel)
            continue
        max_abs = max(max_abs, ab)
        if rel > max_rel or not worst:
            max_rel, worst = rel, p
    return max_abs, max_rel, worst, zero_rel


def loss_index(out_shape) -> int | None:
    """Flat index of the loss: output [2] of the zoo's (params, opt_state, loss) convention, else
    the last scalar output."""
    leaves = jax.tree.leaves(out_shape)
    if isinstance(out_shape, (tuple, list)) and len(out_shape) == 3 and len(jax.tree.leaves(out_shape[2])) == 1:
        return len(jax.tree.leaves(out_shape[0])) + len(jax.tree.leaves(out_shape[1]))
    for i in range(len(leaves) - 1, -1, -1):
        if leaves[i].shape == ():
            return i
    return None


def reference(fn, host_args, dev0):
    """Outputs (host arrays) and step time of plain ``jax.jit(fn)`` on one device."""
    ref_jit = jax.jit(fn)
    ref_args = jax.device_put(host_args, dev0)
    block(ref_jit(*ref_args))
    t = time.perf_counter()
    ref_out = block(ref_jit(*ref_args))
    ref_step = time.perf_counter() - t
    return [np.asarray(x) for x in jax.tree.leaves(ref_out)], ref_step


def block(x):
    return jax.block_until_ready(x)
