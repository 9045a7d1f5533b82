"""Validation and clean stopping for the factor-graph trainer (agent/fgnn_train.py).

* ``is_validation(name, every)``: whether a training-split problem is held out of training as a
  validation problem (a stable hash of its name: about one in ``every``; never trained on, never
  DAgger'd). Validation problems come from the training distribution (zoo models on the training
  clusters, random graphs), not from the evaluation split (``fgnn_data.heldout_split``), so choosing
  a checkpoint on them does not look at the evaluation problems.
* ``Validator``: the raw plan (one forward pass + the masked decode, ``FGNN.plan``) of every
  validation problem, priced by ``evaluate`` against its ILP label. ``score`` is the geometric mean
  of cost / label, a plan that breaks the cap (or no plan) counted as ``OVER_CAP_RATIO``; the
  trainer keeps the parameters with the lowest score, the untrained ones (step 0) included, so the
  checkpoint it ships is never worse on validation than its initialisation (Lagrangian BP for
  ``base="lagrangian"``; for ``base="plain"``, Lagrangian BP's plan with the warm hint, plain BP without). Inputs are built once per problem (``FGInputs``).
* ``StopFlag``: SIGINT / SIGTERM set a flag instead of raising, so a jitted step is never cut in
  half; the trainer checks it (and its budget) between steps and saves a resumable checkpoint.
  A second signal of the same kind raises KeyboardInterrupt as usual.
"""
from __future__ import annotations

import hashlib
import math
import signal

import numpy as np

from agent.fgnn import FGNN, FGInputs
from costmodel.problem import evaluate

OVER_CAP_RATIO = 3.0      # a validation plan over the cap (or none) counts as this cost / label


def is_validation(name: str, every: int) -> bool:
    """About one in ``every`` problem names (0: none), by a stable hash."""
    if every <= 0:
        return False
    return int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) % every == 0


class Validator:
    """Raw-plan cost / ILP label over fixed problems: ``items`` are (name, problem, label cost)."""

    def __init__(self, items: list, warm: bool):
        self.items = [(n, p, float(c), FGInputs.of(p, warm=warm)) for n, p, c in items if c > 0]

    def ratios(self, net: FGNN, params=None) -> list[float]:
        out = []
        for _, p, lab, inp in self.items:
            try:
                c = evaluate(p, net.plan(p, params=params, inputs=inp))
                out.append(c.total / lab if c.feasible else OVER_CAP_RATIO)
            except ValueError:          # no decode fits the cap
                out.append(OVER_CAP_RATIO)
        return out

    def score(self, net: FGNN, params=None) -> dict:
        """{"score": geometric mean ratio, "median", "max", "over_cap", "n"} (score inf when empty)."""
        r = np.minimum(np.asarray(self.ratios(net, params), np.float64), OVER_CAP_RATIO)
        if not len(r):
            return {"score": math.inf, "median": math.nan, "max": math.nan, "over_cap": 0, "n": 0}
        return {"score": float(np.exp(np.mean(np.log(np.maximum(r, 1e-12))))), "median": float(np.median(r)),
                "max": float(r.max()), "over_cap": int((r >= OVER_CAP_RATIO).sum()), "n": int(len(r)),
                "ratios": [round(float(v), 6) for v in r]}


class StopFlag:
    """Context manager: SIGINT/SIGTERM set ``stop`` (and ``signum``); the old handlers come back at exit."""

    def __init__(self):
        self.stop, self.signum, self._old = False, None, {}

    def _handler(self, signum, frame):
        if self.stop and signum == self.signum:
            raise KeyboardInterrupt()      # asked twice: stop now
        self.stop, self.signum = True, signum

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:             # not the main thread: no handlers, never set
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False
