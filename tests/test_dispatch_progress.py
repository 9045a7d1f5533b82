"""Every ``solve(method="ilp")`` path takes ``progress=`` (session 12): before, only the capped core
(a binding cap on a graph ``solvers.capped.milp_ok`` admits) did, and the plain guarded ILP raised
a TypeError, so experiments/anytime.py re-derived dispatch's choice to decide whether to pass it.
Each path logs its answer's step time; the guarded ILP also the streamed plans that fit."""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import shardgym as sg
from env.workloads import random_problem
from solvers.capped import milp_ok
from solvers.dispatch import binding_cap

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import random_problem as tiny_problem  # noqa: E402
from test_edge_memory import _with_random_copies  # noqa: E402

_COST = re.compile(r"^(?P<phase>[^:]+): (?P<cost>[-+0-9.eE]+)(?: \(|$)")


def _costs(log):
    return [float(m["cost"]) for m in map(_COST.match, log) if m and "bound" not in m["phase"]]


@pytest.mark.parametrize("case", ["uncapped", "capped", "memory", "memory_bounded", "copies_memory"])
def test_every_ilp_path_takes_progress_and_logs_its_answer(case):
    rng = np.random.default_rng(7)
    p = random_problem(rng, 40, 4, memory_cap_fraction=0.4)
    kw = {}
    if case == "uncapped":
        p = p.with_usage_limit(None)
    elif case == "capped":
        assert binding_cap(p) is not None and milp_ok(p)   # the capped core's path
    elif case == "memory":
        kw["objective"] = "memory"
    elif case == "memory_bounded":
        free = sg.solve(p.with_usage_limit(None), method="ilp", time_limit_s=5)
        kw.update(objective="memory", max_step_time_s=1.2 * sg.evaluate(p, free).total)
    else:
        p = _with_random_copies(rng, tiny_problem(rng, 6, kmax=3, limit_q=None))
        kw["objective"] = "memory"
    log = []
    plan = sg.solve(p, method="ilp", time_limit_s=5, progress=log.append, **kw)
    c = sg.evaluate(p, plan)
    assert c.feasible
    costs = _costs(log)
    assert costs, log
    # the guarded ILP logs its answer last; the capped core logs each new best (the answer among them)
    assert costs[-1] == pytest.approx(c.total, rel=1e-9) or (case == "capped" and min(costs) <= c.total * (1 + 1e-9))
