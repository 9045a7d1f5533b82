"""Live-memory profiles: the one implementation of "bytes live at each time point".

A profile is a step function over a sorted grid of time points: an interval [start, end) holding
``amount`` bytes adds them at every grid point t with start <= t < end. Everything that builds one
calls these two functions: ``costmodel.problem.usage_profile`` and ``evaluate`` (the exact
profile a plan is priced on), ``CopyGroups.upper_profile`` (copies), the local-search library's
compressed profiles (``solvers.local.LocalCosts.profile``), the env's running and lower-bound
profiles and beam search's bound.

* ``step_sum(lo, hi, amounts, length)``: intervals already mapped to grid indices [lo, hi).
* ``live_on(times, starts, ends, amounts)``: intervals in time units, mapped onto ``times``.
* ``starts(counts)``: where each of a run of segments starts in a flat array (the solvers' flat
  strategy and edge-entry layouts: ``solvers.local.costs`` re-exports it).
"""
from __future__ import annotations

import numpy as np


def starts(counts: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums: where each of a run of segments of these sizes starts."""
    out = np.zeros(len(counts), dtype=np.int64)
    if len(counts) > 1:
        np.cumsum(counts[:-1], out=out[1:])
    return out


def step_sum(lo: np.ndarray, hi: np.ndarray, amounts, length: int) -> np.ndarray:
    """Per grid index 0..length-1: Σ amounts of the intervals with lo <= index < hi (a difference
    array, starts added before ends, then a cumulative sum)."""
    acc = np.zeros(int(length) + 1)
    np.add.at(acc, lo, amounts)
    np.add.at(acc, hi, -np.asarray(amounts, dtype=np.float64))
    return np.cumsum(acc)[:-1]


def live_on(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, amounts) -> np.ndarray:
    """Per time in the sorted grid ``times``: Σ amounts of the intervals [start, end) covering it
    (an interval starting between grid points counts from the next one)."""
    return step_sum(np.searchsorted(times, starts, side="left"), np.searchsorted(times, ends, side="left"),
                    amounts, len(times))
