"""The peak LNS (solvers/minmem_lns.py) on chains that only move as a whole, checked by brute force."""
from __future__ import annotations

import itertools
import time

import pytest

from costmodel.problem import Problem, evaluate

CHAINS, LENGTH = 3, 3


def _chains(t_bound: float):
    """CHAINS chains of LENGTH nodes, all live over the whole step. Strategy 0 (replicated): 4 bytes,
    1 s; strategy 1 (sharded): 1 byte, 1.1 s; an edge between unlike neighbours costs 10 s (a
    resharding). From the all-replicated plan (36 B, 9 s) every single-node move pays >= 10 s: only a
    whole chain moves (-9 B, +0.3 s)."""
    n = CHAINS * LENGTH
    edges = [(c * LENGTH + j, c * LENGTH + j + 1) for c in range(CHAINS) for j in range(LENGTH - 1)]
    p = Problem.from_lists("chains", [[1.0, 1.1]] * n, [[4.0, 1.0]] * n, [(0, 10)] * n, edges,
                           [[0.0, 10.0, 10.0, 0.0]] * len(edges))
    return p, t_bound


def _brute(p: Problem, t_bound: float) -> float:
    return min(c.peak_memory_bytes for c in (evaluate(p, list(s)) for s in itertools.product((0, 1), repeat=p.num_nodes))
               if c.total <= t_bound)


@pytest.mark.parametrize("t_bound, want", [(9.95, 9.0), (9.65, 18.0)])
def test_peak_lns_moves_whole_chains_to_the_brute_force_optimum(t_bound, want):
    """All chains sharded within 9.95 s (9 B); within 9.65 s only two (18 B). Neighbourhoods of 4 of
    the 9 nodes (a chain and a bit): the LNS reaches the optimum, where no single-node move from the
    start stays within the bound."""
    from solvers.minmem_lns import peak_lns

    p, t = _chains(t_bound)
    start = [0] * p.num_nodes
    assert _brute(p, t) == want
    for i in range(p.num_nodes):     # no single move is within the bound: a one-node search is stuck
        s = list(start)
        s[i] = 1
        assert evaluate(p, s).total > t
    t0 = time.perf_counter()
    plan, info = peak_lns(p, start, t, t0 + 4.0, size=4)
    assert time.perf_counter() - t0 < 4.0 + 0.5
    c = evaluate(p, plan)
    assert c.total <= t and c.peak_memory_bytes == want
    assert info["peak_before"] == 36.0 and info["peak_after"] == want and info["kept"] >= 1


def test_peak_lns_rejects_a_start_beyond_the_bound():
    from solvers.minmem_lns import peak_lns

    p, _ = _chains(9.95)
    with pytest.raises(ValueError, match="step-time bound"):
        peak_lns(p, [0] * p.num_nodes, 8.0, time.perf_counter() + 1.0)


def test_lns_after_reports_the_lower_plan_in_the_solve_info():
    """solve_exact's last phase: the plan's figures, source "peak_lns", the gap against the bound; a start
    beyond the bound is left as it is."""
    from solvers.minmem_lns import lns_after

    p, t = _chains(9.95)
    info = {"status": "optimal", "objective": 36.0, "bound": 9.0, "gap": 0.75, "peak_memory_bytes": 36.0,
            "step_time_s": 9.0, "source": None}
    plan, out = lns_after(p, [0] * p.num_nodes, info, t, time.perf_counter() + 3.0)
    assert evaluate(p, plan).peak_memory_bytes == 9.0
    assert out["source"] == "peak_lns" and out["objective"] == 9.0 and out["peak_memory_bytes"] == 9.0
    assert out["step_time_s"] == pytest.approx(9.9) and out["gap"] == 0.0 and out["status"] == "time_limit"
    assert out["peak_lns"]["peak_before"] == 36.0 and info["source"] is None   # the caller's dict untouched
    plan, out = lns_after(p, [0] * p.num_nodes, {"source": "seed"}, 8.0, time.perf_counter() + 1.0)
    assert plan == [0] * p.num_nodes and out == {"source": "seed"}
