"""Per-primitive rules for the tracer: classification, FLOPs, and JSON-able params.

A rule sees only the primitive name, its params and its operand/result types (``Tensor``), so it
applies equally to real jaxpr equations and to the ones the tracer synthesises when it unrolls a
``scan``. FLOP conventions (one multiply-add = 2 FLOPs; all counts are for the whole, unsharded op):

- ``dot_general``: 2 · prod(result) · prod(lhs contracting dim sizes).
- ``conv_general_dilated``: 2 · prod(result) · prod(kernel spatial dims) · kernel in-feature size
  (the kernel's in-feature dim already equals in_features / feature_group_count). The same
  formula prices the transposed convolutions of the backward pass.
- ``fft``: 5 · N · log2(N) per transform, N = prod(fft_lengths), times the number of transforms
  (prod of the non-FFT leading dims). This is the complex-FFT count; RFFT/IRFFT really cost about
  half, which we accept as an approximation.
- element-wise (arithmetic, comparisons, select_n, conversions, transcendentals): prod(result);
  a transcendental (exp, tanh, erf, ...) counts 1 like an add.
- reductions and scans over an axis (reduce_*, argmax, cumsum, ...): prod(operand).
- windowed reductions (pooling): prod(result) · prod(window).
- ``scatter-add`` (and segment_sum, which lowers to it): prod(updates); plain scatter: 0.
- ``sort``: prod(operand) · ceil(log2(sorted dim)) comparisons.
- RNG primitives (random_bits, threefry2x32): prod(result).
- data movement (reshape, transpose, broadcast, slice, gather, concatenate, pad, ...): 0.

``flops`` returns None for a primitive without a rule: the tracer keeps such an op as a
replicate-only node (``supported=False``) and warns once.
"""
from __future__ import annotations

import enum
import functools
import math

import numpy as np

from costmodel.graph import Tensor

ELEMENTWISE = frozenset({
    # arithmetic
    "neg", "sign", "floor", "ceil", "round", "abs", "add", "add_any", "sub", "mul", "div", "rem",
    "max", "min", "pow", "integer_pow", "sqrt", "rsqrt", "cbrt", "square", "reciprocal", "clamp",
    "nextafter", "atan2", "real", "imag", "complex", "conj",
    # transcendental
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma", "polygamma", "zeta",
    "igamma", "igammac", "igamma_grad_a", "random_gamma_grad", "bessel_i0e", "bessel_i1e", "erf",
    "erfc", "erf_inv", "regularized_incomplete_beta",
    # logic and comparisons
    "not", "and", "or", "xor", "population_count", "clz", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "eq", "ne", "ge", "gt", "le", "lt", "eq_to", "le_to", "lt_to", "is_finite",
    "select_n",
    # conversions
    "convert_element_type", "bitcast_convert_type", "reduce_precision",
})

REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
    "argmax", "argmin", "reduce", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp",
})

WINDOWED = frozenset({
    "reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window",
    "select_and_gather_add",
})

DATA_MOVEMENT = frozenset({
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "gather", "rev", "iota", "copy", "copy_p", "split",
    "scatter", "device_put", "sharding_constraint", "optimization_barrier", "random_wrap",
    "random_unwrap", "random_seed", "random_fold_in", "random_split", "stop_gradient",
    "mesh_cast", "reshard", "pvary", "full_like", "stack", "unstack",
})

SCATTER_COMBINE = frozenset({"scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min",
                             "scatter_min", "scatter-max", "scatter_max", "scatter-sub", "scatter_sub"})

RNG = frozenset({"random_bits", "threefry2x32"})

#: element-wise primitives the tracer may fold into their producer (Alpa "follow" ops).
FOLDABLE = ELEMENTWISE | frozenset({"copy", "copy_p", "stop_gradient"})

#: call-like primitives whose sub-jaxpr is inlined (param name of the sub-jaxpr).
INLINE = {
    "jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr", "named_call": "call_jaxpr",
    "custom_lin": "jaxpr",
}


def _prod(xs) -> int:
    return int(math.prod(int(x) for x in xs))


@functools.lru_cache(maxsize=65536)
def size_of(t: Tensor) -> int:
    """Number of elements (same as ``Tensor.size``, cached, without numpy overhead)."""
    return int(math.prod(t.shape))


@functools.lru_cache(maxsize=65536)
def nbytes_of(t: Tensor) -> int:
    """Bytes of ``t`` (same as ``Tensor.nbytes``, cached)."""
    return size_of(t) * np.dtype(t.dtype).itemsize


def flops(prim: str, params: dict, in_types, out_types) -> float | None:
    """FLOPs of one application of ``prim`` (see the module docstring), or None without a rule."""
    out0 = size_of(out_types[0]) if out_types else 0
    if prim == "dot_general":
        (lc, _rc), _ = params["dimension_numbers"]
        return 2.0 * out0 * _prod(in_types[0].shape[d] for d in lc)
    if prim == "conv_general_dilated":
        dn = params["dimension_numbers"]
        rhs_spec = dn.rhs_spec if hasattr(dn, "rhs_spec") else dn[1]
        rhs = in_types[1].shape
        return 2.0 * out0 * _prod(rhs[d] for d in rhs_spec[2:]) * rhs[rhs_spec[1]]
    if prim == "fft":
        lengths = tuple(params["fft_lengths"])
        n = _prod(lengths)
        if n <= 1:
            return 0.0
        batch = _prod(in_types[0].shape[: len(in_types[0].shape) - len(lengths)])
        return 5.0 * n * math.log2(n) * batch
    if prim in ELEMENTWISE or prim in RNG:
        return float(sum(size_of(t) for t in out_types))
    if prim in REDUCTIONS:
        return float(size_of(in_types[0])) if in_types else 0.0
    if prim in WINDOWED:
        win = params.get("window_dimensions", ())
        return float(out0 * _prod(win))
    if prim == "select_and_scatter_add":
        return float(size_of(in_types[0]) * _prod(params.get("window_dimensions", ())))
    if prim in SCATTER_COMBINE:
        return float(size_of(in_types[2])) if len(in_types) > 2 else float(out0)
    if prim == "sort":
        dim = in_types[0].shape[params.get("dimension", -1)] if in_types[0].shape else 1
        return float(size_of(in_types[0]) * math.ceil(math.log2(dim))) if dim > 1 else 0.0
    if prim in DATA_MOVEMENT:
        return 0.0
    return None


def bytes_read(in_types) -> float:
    """Bytes of all operands (literals included; they are scalars)."""
    return float(sum(nbytes_of(t) for t in in_types))


def bytes_written(out_types) -> float:
    return float(sum(nbytes_of(t) for t in out_types))


# ---- params -------------------------------------------------------------------------------
class _Skip(Exception):
    pass


def _to_json(v):
    if isinstance(v, (float, np.floating)):  # strict JSON has no NaN/inf: keep those as strings
        return float(v) if math.isfinite(v) else str(float(v))
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.dtype):
        return str(v)
    if isinstance(v, type) and issubclass(v, np.generic):
        return np.dtype(v).name
    if isinstance(v, enum.Enum):
        return v.name
    if hasattr(v, "_asdict"):  # NamedTuple dimension numbers (Gather/Scatter/Conv)
        return {k: _to_json(x) for k, x in v._asdict().items()}
    if isinstance(v, (tuple, list)):
        return [_to_json(x) for x in v]
    if hasattr(v, "dtype") and hasattr(v, "shape") and not hasattr(v, "eqns"):
        raise _Skip
    # jax dtype objects (e.g. DType classes) stringify to their name
    if type(v).__name__.endswith("DType"):
        return str(v)
    raise _Skip


def json_params(prim: str, params: dict) -> dict:
    """A JSON-able subset of an equation's params, normalised where the enumerator needs it.

    dot_general ``dimension_numbers`` -> ``[[lhs_contract, rhs_contract], [lhs_batch, rhs_batch]]``;
    conv ``dimension_numbers`` -> ``{"lhs_spec", "rhs_spec", "out_spec"}`` (dim index lists);
    gather/scatter dimension numbers -> dicts of their fields; fft ``fft_type`` -> enum name.
    Non-finite floats (e.g. gather's ``fill_value`` NaN) become strings ("nan", "inf").
    Params that are jaxprs, functions, shardings or meshes are dropped.
    """
    out = {}
    for k, v in params.items():
        if k in ("jaxpr", "call_jaxpr", "branches", "body_jaxpr", "cond_jaxpr", "update_jaxpr",
                 "update_consts", "out_sharding", "sharding", "in_shardings", "out_shardings",
                 "ctx_mesh", "in_layouts", "out_layouts"):
            continue
        try:
            out[k] = _to_json(v)
        except _Skip:
            continue
    if prim == "dot_general":
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        out["dimension_numbers"] = [[list(lc), list(rc)], [list(lb), list(rb)]]
    elif prim == "conv_general_dilated":
        dn = params["dimension_numbers"]
        out["dimension_numbers"] = {"lhs_spec": list(dn.lhs_spec), "rhs_spec": list(dn.rhs_spec),
                                    "out_spec": list(dn.out_spec)}
    elif prim == "fft":
        ft = params["fft_type"]
        out["fft_type"] = getattr(ft, "name", str(ft))
        out["fft_lengths"] = [int(x) for x in params["fft_lengths"]]
    return out


def tensor_of(aval) -> Tensor:
    """The Tensor of an abstract value. PRNG key arrays become their uint32 words (shape + key
    shape); float0 tangents become bool; tokens and other non-arrays become a 0-d bool."""
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    dt = getattr(aval, "dtype", None)
    if dt is None:
        return Tensor((), "bool")
    try:
        import jax
        if jax.dtypes.issubdtype(dt, jax.dtypes.extended):
            impl = getattr(dt, "_impl", None)
            key_shape = tuple(getattr(impl, "key_shape", ()))
            return Tensor(shape + key_shape, "uint32")
        if dt == jax.dtypes.float0:
            return Tensor(shape, "bool")
    except (TypeError, AttributeError):
        pass
    return Tensor(shape, np.dtype(dt).name)
