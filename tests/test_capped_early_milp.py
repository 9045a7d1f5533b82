"""The capped MILP with its memory rows as running sums, resharded copies included, and the capped core's
early MILP phase (``CappedConfig.milp_early_share``, ``milp_dense_nonzeros``), against brute force."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from costmodel.problem import evaluate
from solvers.capped import CappedConfig, solve_capped
from solvers.ilp import IlpConfig, solve_ilp

sys.path.insert(0, os.path.dirname(__file__))
from ilp_helpers import brute_force, random_problem  # noqa: E402
from test_edge_memory import _with_random_copies  # noqa: E402


def _capped(seed: int):
    """A random 5-node problem with copy groups, its cap at the 4th lowest peak of 8 random plans."""
    rng = np.random.default_rng(300 + seed)
    p = _with_random_copies(rng, random_problem(rng, 5, kmax=3, limit_q=None))
    plans = [[int(rng.integers(k)) for k in p.num_strategies] for _ in range(8)]
    return p.with_usage_limit(max(sorted(evaluate(p, s).peak_memory_bytes for s in plans)[3], 0.5))


@pytest.mark.parametrize("seed", range(6))
def test_running_sums_with_copies_give_the_brute_force_optimum(seed):
    """Memory as running sums (``IlpConfig(dense_memory_nonzeros=-1)``), the copies' z columns entering the
    sums at their spans' ends: the same optimum as the dense rows and as enumeration priced by evaluate."""
    p = _capped(seed)
    best, bc = brute_force(p, "time")
    if best is None:
        return
    for dense in (-1, IlpConfig().dense_memory_nonzeros):
        plan, info = solve_ilp(p, time_limit_s=10, relax_cap=False, config=IlpConfig(dense_memory_nonzeros=dense))
        c = evaluate(p, plan)
        assert info.status == "optimal" and c.feasible and c.total == pytest.approx(bc.total)


def test_early_milp_phase_reaches_the_optimum_and_a_valid_bound():
    """The core with the capped MILP (running sums) before the Lagrangian: the brute-force optimum, its bound
    at or below it, the MILP run once (one "milp:" line in the log), before any Lagrangian round; on seed 2 the
    earlier phases do not close the gap, so the early MILP is what proves it."""
    ran = []
    for seed in range(4):
        p = _capped(seed)
        best, bc = brute_force(p, "time")
        log = []
        r = solve_capped(p, 6.0, progress=log.append,
                         config=CappedConfig(milp_early_share=0.5, milp_dense_nonzeros=-1, uncapped_share=0.15))
        if best is None:
            assert r.plan is None
            continue
        opt = bc.total
        assert r.plan is not None and evaluate(p, r.plan).feasible and r.cost == pytest.approx(opt)
        assert r.bound <= opt + 1e-6 * abs(opt)
        at = [i for i, m in enumerate(log) if m.startswith("milp:")]
        assert len(at) <= 1
        if at:
            assert not any("lagrange" in m for m in log[:at[0]])
            ran.append(seed)
    assert 2 in ran
