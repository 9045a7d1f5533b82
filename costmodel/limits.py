"""The one owner of a plan's limits: ``Limits(memory_cap_bytes, max_step_time_s)``.

Meaning, the same for every method (the ILP, the policy, the baselines, the env, evaluation):

- ``memory_cap_bytes``: the user's per-device cap. The **effective cap** is
  ``min(device memory, memory_cap_bytes)``, where device memory is ``Problem.usage_limit`` as
  ``build_problem`` set it from the cluster (for an IOPDDL instance, the contest's limit). A cap
  above device memory is therefore documented as not binding: device memory binds, and
  ``Limits.effective_cap`` says so by returning the device figure.
- ``max_step_time_s``: an upper bound on the plan's step time (seconds), for the memory and
  redundancy objectives.
- ``None`` means "no such limit". Anything else must be a finite number > 0; the one error
  message is ``LimitError``'s, naming the field and the value.

Validation happens here and only here: callers build a ``Limits`` (``Limits.of(...)`` accepts
what a user typed, bytes as a number or a string such as "12GiB") and pass it on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.cluster import parse_bytes


class LimitError(ValueError):
    """A limit that is not None and not a finite number > 0."""


def _check(name: str, value) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise LimitError(f"{name} must be a number > 0 (or None for no limit), got {value!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise LimitError(f"{name} must be a finite number > 0 (or None for no limit), got {value!r}")
    return x


@dataclass(frozen=True)
class Limits:
    """Per-device memory cap (bytes) and step-time bound (seconds); None = unlimited."""

    memory_cap_bytes: float | None = None
    max_step_time_s: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "memory_cap_bytes", _check("memory_cap_bytes", self.memory_cap_bytes))
        object.__setattr__(self, "max_step_time_s", _check("max_step_time_s", self.max_step_time_s))

    @classmethod
    def of(cls, memory_cap_bytes=None, max_step_time_s=None) -> Limits:
        """From user input: bytes may be a string with a unit ("12GiB", "800MB")."""
        if isinstance(memory_cap_bytes, str):
            try:
                memory_cap_bytes = parse_bytes(memory_cap_bytes)
            except ValueError as exc:
                raise LimitError(f"memory_cap_bytes: {exc}") from None
        return cls(memory_cap_bytes, max_step_time_s)

    def effective_cap(self, device_limit_bytes: float | None) -> float | None:
        """min(device memory, user cap), ignoring the ones that are None."""
        caps = [c for c in (device_limit_bytes, self.memory_cap_bytes) if c is not None]
        return float(min(caps)) if caps else None

    def apply(self, problem):
        """``problem`` with its usage limit set to the effective cap: what every solver reads."""
        cap = self.effective_cap(problem.usage_limit)
        return problem if cap == problem.usage_limit else problem.with_usage_limit(cap)
