"""When HiGHS ends without a plan of its own, the ILP answers with its start plan only if that plan
meets the request's cap and step-time bound (a seed priced without copies can break the cap)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import all_plans, random_problem  # noqa: E402

from costmodel.problem import evaluate  # noqa: E402
from solvers.ilp import reduced  # noqa: E402
from solvers.ilp.types import IlpConfig, Request, RunOptions  # noqa: E402


def _no_incumbent(*args, **kwargs):
    return "time_limit", None, float("nan"), float("nan")


def test_start_plan_is_the_answer_only_within_the_cap(monkeypatch):
    p = random_problem(np.random.default_rng(0), 6, limit_q=None)
    plans = sorted(all_plans(p), key=lambda s: evaluate(p, list(s)).peak_memory_bytes)
    low, high = list(plans[0]), list(plans[-1])
    cap = evaluate(p, low).peak_memory_bytes
    assert evaluate(p, high).peak_memory_bytes > cap
    monkeypatch.setattr(reduced, "run_model", _no_incumbent)
    o = RunOptions(t0=time.perf_counter(), deadline=time.perf_counter() + 5, reduce=True, threads=1,
                   rel_gap=1e-6, verbose=False, forbid=True, memory_cap_bytes=None, config=IlpConfig())
    plan, info = reduced.core(p, o, Request(cap=cap, start=low))
    assert plan == low and info.status == "time_limit"
    with pytest.raises(RuntimeError, match="no feasible plan"):
        reduced.core(p, o, Request(cap=cap, start=high))
    fast = evaluate(p, low).total
    slow = max((list(s) for s in plans), key=lambda s: evaluate(p, s).total)
    if evaluate(p, slow).total > fast:
        with pytest.raises(RuntimeError, match="no feasible plan"):
            reduced.core(p, o, Request(max_step_time_s=fast, start=slow))
