"""Where a model comes from: a zoo model (name, size) or the user's own ``make_step`` (``--fn``).

``--fn FILE.py:FUNC`` or ``--fn package.module:FUNC``: ``FUNC()`` returns ``(train_step, args)`` as
``zoo.build`` does; args may be real arrays or ``jax.ShapeDtypeStruct``. If FUNC takes an
``abstract`` keyword it is called with ``abstract=True`` to plan and ``abstract=False`` to run;
otherwise planning uses the args' shapes only and ``shardgym run`` fills ShapeDtypeStruct leaves
with seeded values (floats ~ N(0, 0.02²), integers 0, PRNG keys ``jax.random.key(0)``).

A plan records its source in ``plan.meta`` (``model``/``size``, or ``fn`` as an absolute path, and
``recompute`` when the step was traced with a recompute policy, ``--recompute``) so ``shardgym run``
rebuilds and replays the same program.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import zoo


@dataclass(frozen=True)
class ModelSource:
    model: str | None = None
    size: str | None = None
    fn: str | None = None   # "FILE.py:FUNC" (absolute path) or "module:FUNC"
    recompute: str | None = None   # the recompute policy it is traced with (costmodel.trace.recompute)

    @classmethod
    def from_args(cls, model: str, size: str, fn: str | None, recompute: str | None = None) -> ModelSource:
        _check_recompute(recompute, "--recompute")
        if fn:
            return cls(fn=_normalise(fn), recompute=recompute)
        zoo.sizes(model)           # ValueError naming the model
        if size not in zoo.sizes(model):
            raise ValueError(f"--size {size!r}: not a size of zoo model {model!r}; sizes: {', '.join(zoo.sizes(model))}")
        return cls(model, size, recompute=recompute)

    @classmethod
    def from_meta(cls, meta: dict, where: str = "plan") -> ModelSource:
        meta = meta or {}
        recompute = meta.get("recompute")
        _check_recompute(recompute, f"{where}: meta.recompute")
        if meta.get("fn"):
            return cls(fn=str(meta["fn"]), recompute=recompute)
        model, size = meta.get("model"), meta.get("size")
        if not model or not size:
            raise ValueError(f"{where}: the plan does not say which model it was made for (meta.model/meta.size "
                             "or meta.fn); make it with `shardgym plan --model ... --out plan.json`")
        if model not in zoo.names():
            raise ValueError(f"{where}: meta.model {model!r} is not a zoo model; valid names: {', '.join(zoo.names())}")
        if size not in zoo.sizes(model):
            raise ValueError(f"{where}: meta.size {size!r} is not a size of {model!r}; sizes: {', '.join(zoo.sizes(model))}")
        return cls(str(model), str(size), recompute=recompute)

    @property
    def label(self) -> str:
        base = f"--fn {self.fn}" if self.fn else f"{self.model} {self.size}"
        return base if self.recompute is None else f"{base} (recompute {self.recompute})"

    @property
    def name(self) -> str:
        return self.fn.rpartition(":")[2] if self.fn else f"{self.model}-{self.size}"

    def meta(self) -> dict:
        m = {"fn": self.fn} if self.fn else {"model": self.model, "size": self.size}
        return m if self.recompute is None else {**m, "recompute": self.recompute}

    def with_recompute(self, recompute: str | None) -> ModelSource:
        _check_recompute(recompute, "recompute")
        return ModelSource(self.model, self.size, self.fn, recompute)

    def build(self, abstract: bool):
        """(train_step, args); ``abstract``: args as ShapeDtypeStructs, else concrete arrays."""
        if not self.fn:
                return zoo.build(self.model, self.size, abstract=abstract)
        make = load_callable(self.fn)
        try:
            takes_abstract = "abstract" in inspect.signature(make).parameters
        except (TypeError, ValueError):
            takes_abstract = False
        try:
            res = make(abstract=abstract) if takes_abstract else make()
        except Exception as exc:  # the user's code: one line naming it
            raise ValueError(f"--fn {self.fn}: calling it raised {type(exc).__name__}: {exc}") from exc
        if not (isinstance(res, (tuple, list)) and len(res) == 2 and callable(res[0])
                and isinstance(res[1], (tuple, list))):
            raise ValueError(f"--fn {self.fn}: must return (train_step, args) with args a tuple of positional "
                             f"arguments, as zoo.build does; got {type(res).__name__}")
        fn, args = res[0], tuple(res[1])
        return fn, (_abstract(args) if abstract else _concrete(args))


def _check_recompute(policy, where: str) -> None:
    from costmodel.trace.recompute import POLICIES  # lazy: the tracer
    if policy not in POLICIES:
        named = ", ".join(p for p in POLICIES if p is not None)
        raise ValueError(f"{where} {policy!r}: not a recompute policy; choose one of {named} (or leave it out)")


def _normalise(spec: str) -> str:
    path, sep, attr = spec.rpartition(":")
    if not sep or not path or not attr.isidentifier():
        raise ValueError(f"--fn {spec!r}: expected FILE.py:FUNCTION or package.module:FUNCTION")
    if path.endswith(".py") or os.sep in path:
        if not os.path.isfile(path):
            raise ValueError(f"--fn {spec!r}: no such file {path!r}")
        path = os.path.abspath(path)
    load_callable(f"{path}:{attr}")   # fail now, with a clear line, not after tracing
    return f"{path}:{attr}"


def load_callable(spec: str):
    path, _, attr = spec.rpartition(":")
    if path.endswith(".py") or os.sep in path:
        name = "shardgym_user_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        module = sys.modules.get(name)
        if module is None:
            if not os.path.isfile(path):
                raise ValueError(f"--fn {spec}: no such file {path!r}")
            mspec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mspec)
            sys.modules[name] = module
            try:
                mspec.loader.exec_module(module)
            except Exception as exc:
                sys.modules.pop(name, None)
                raise ValueError(f"--fn {spec}: importing {path} raised {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(path)
        except ImportError as exc:
            raise ValueError(f"--fn {spec}: cannot import module {path!r} ({exc})") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"--fn {spec}: {path} has no function {attr!r}")
    return fn


def _abstract(args):
    return jax.tree.map(lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(x.shape, x.dtype),
                        args)


def _concrete(args):
    """Real arrays for ShapeDtypeStruct leaves (seeded); real leaves kept."""
    rng = np.random.default_rng(0)

    def fill(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.split(jax.random.key(0), x.shape) if x.shape else jax.random.key(0)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return jnp.asarray(rng.normal(0.0, 0.02, x.shape), dtype=x.dtype)
        return jnp.zeros(x.shape, x.dtype)
    return jax.tree.map(fill, args)
