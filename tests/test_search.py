"""Large-instance heuristics and the IOPDDL command body."""
from __future__ import annotations

import io
import json
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402

from costmodel.iopddl_cli import main_iopddl  # noqa: E402
from costmodel.problem import Problem, evaluate  # noqa: E402
from costmodel.search import solve_large  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "iopddl")
EXAMPLE = os.path.join(SHARED, "example.json")
B = os.path.join(SHARED, "asplos-2025-iopddl-B.json.gz")


def test_solve_large_small_random_is_feasible_and_often_optimal():
    hits = 0
    for seed in range(10):
        p = random_problem(np.random.default_rng(seed), 6, kmax=3, limit_q=0.5)
        plan = solve_large(p, 0.5, use_lns=False, seed=seed)
        best, bc = brute_force(p)
        assert plan is not None and evaluate(p, plan).feasible
        assert evaluate(p, plan).total >= bc.total - 1e-9
        hits += evaluate(p, plan).total == bc.total
    assert hits >= 5        # forest DP + ICM on 6-node graphs finds most optima


def test_solve_large_reports_no_plan_when_nothing_fits():
    p = Problem.from_iopddl(EXAMPLE).with_usage_limit(49)   # the lowest peak is 50
    assert solve_large(p, 2.0) is None


def test_solve_large_on_B_within_budget():
    p = Problem.from_iopddl(B)
    t0 = time.perf_counter()
    plan = solve_large(p, 10.0, seed=0)
    wall = time.perf_counter() - t0
    assert wall < 11.0
    c = evaluate(p, plan)
    assert c.feasible and c.total < 1e15      # no 1e18 "impossible" strategy


def test_main_iopddl_example_last_line():
    buf = io.StringIO()
    t0 = time.perf_counter()
    plan = main_iopddl(EXAMPLE, 5, out=buf)
    assert time.perf_counter() - t0 < 5
    last = buf.getvalue().strip().splitlines()[-1]
    assert json.loads(last) == plan == [0, 0, 2, 1, 0]     # the proven optimum, cost 445


def test_main_iopddl_infeasible_prints_empty(tmp_path):
    p = Problem.from_iopddl(EXAMPLE).with_usage_limit(49)
    path = str(tmp_path / "tight.json")
    p.to_iopddl(path)
    buf = io.StringIO()
    assert main_iopddl(path, 5, out=buf) == []
    assert buf.getvalue().strip().splitlines()[-1] == "[]"


def test_main_iopddl_bad_timeout():
    with pytest.raises(ValueError, match="TIMEOUT_S"):
        main_iopddl(EXAMPLE, 0, out=io.StringIO())
