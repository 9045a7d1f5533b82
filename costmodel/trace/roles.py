"""Module paths, roles and output aliases for ``costmodel.trace`` (conventions in its docstring).

``module_path_of(stack)``: the Flax scope path of a name stack, transforms and einsum specs dropped;
``raw_stack``: the name stack as JAX prints it; ``is_grad``: produced by reverse-mode
differentiation (a ``transpose`` transform on the stack); ``arg_roles(nargs)``: param / opt_state /
batch / other per positional argument; ``output_aliases``: the flat input each output replaces.
"""
from __future__ import annotations

import functools
import re

import jax

EINSUM = re.compile(r",|->")  # jnp.einsum pushes its spec ("bqhd,bkhd->bhqk") as a scope


@functools.lru_cache(maxsize=16384)
def module_path_of(stack) -> str:
    return "/".join(e.name for e in stack if type(e).__name__ == "Scope" and not EINSUM.search(e.name))


@functools.lru_cache(maxsize=16384)
def raw_stack(stack) -> str:
    from jax._src import source_info_util as siu
    try:
        return str(siu.NameStack(tuple(stack)))
    except Exception:  # pragma: no cover - name stack internals changed
        return module_path_of(stack)


@functools.lru_cache(maxsize=16384)
def is_grad(stack) -> bool:
    return any(type(e).__name__ == "Transform" and e.name == "transpose" for e in stack)


def arg_roles(nargs: int) -> list[str]:
    if nargs == 1:
        return ["param"]
    if nargs == 3:
        return ["param", "opt_state", "batch"]
    return ["param"] + ["other"] * (nargs - 2) + ["batch"]


def output_aliases(args, out_shape, in_leaves, out_leaves, roles) -> list:
    aliases = [None] * len(out_leaves)
    if not isinstance(out_shape, (tuple, list)):
        return aliases
    in_off, out_off = 0, 0
    in_offsets, out_offsets = [], []
    for a in args:
        in_offsets.append(in_off)
        in_off += len(jax.tree.leaves(a))
    for o in out_shape:
        out_offsets.append(out_off)
        out_off += len(jax.tree.leaves(o))
    for k in range(min(len(args), len(out_shape))):
        if roles[k] == "batch":
            break
        if jax.tree.structure(args[k]) != jax.tree.structure(out_shape[k]):
            break
        n = len(jax.tree.leaves(args[k]))
        ok = all(in_leaves[in_offsets[k] + j] == out_leaves[out_offsets[k] + j] for j in range(n))
        if not ok:
            break
        for j in range(n):
            aliases[out_offsets[k] + j] = in_offsets[k] + j
    return aliases
