"""experiments/anytime.py's core on a tiny capped random problem with short limits: every curve is
time-ordered and never rises, and the summary names the ILP's final cost as the target."""
import numpy as np
import pytest

from env.workloads import random_problem
from experiments.anytime import monotone, run_problem


def test_monotone_keeps_only_improvements_in_time_order():
    assert monotone([(2.0, 5.0), (1.0, 7.0), (3.0, 6.0), (4.0, None), (5.0, 4.0)]) == [[1.0, 7.0], [2.0, 5.0], [5.0, 4.0]]


def test_run_problem_curves_are_anytime():
    p = random_problem(np.random.default_rng(3), 60, 4, memory_cap_fraction=0.4)
    r = run_problem(p, ilp_seconds=3.0, search_seconds=1.0)
    assert r["ilp_summary"]["cost"] is not None
    for k in ("policy", "bp", "ilp"):
        pts = r[k]
        assert pts, k
        ts, cs = [t for t, _ in pts], [c for _, c in pts]
        assert ts == sorted(ts) and all(b < a for a, b in zip(cs, cs[1:])), (k, pts)
    assert r["ilp"][-1][1] == r["ilp_summary"]["cost"] or r["ilp"][-1][1] < r["ilp_summary"]["cost"]
    assert r["ilp_reach_s"] is not None and r["ilp_reach_s"] <= r["ilp_summary"]["wall_s"]
    assert isinstance(r["planner_within_25pct"], bool)


def test_ilp_curve_passes_progress_on_every_path():
    """Uncapped, ``solve(method="ilp")`` runs the plain guarded ILP (not the capped core): the curve
    still gets its points from the progress log (before session 12 anytime.py re-derived dispatch's
    choice and passed no ``progress`` there, since that path raised a TypeError)."""
    from experiments.anytime import ilp_curve
    p = random_problem(np.random.default_rng(3), 60, 4, memory_cap_fraction=0.4).with_usage_limit(None)
    pts, summary = ilp_curve(p, 3.0)
    assert summary["cost"] is not None and summary["phase_log"] >= 1
    assert pts[-1][1] == pytest.approx(summary["cost"], rel=1e-9)


@pytest.mark.parametrize("beside, said", [(False, "policy seed"), (True, "late seed")])
def test_unseeded_ilp_curve_runs_without_the_planner(monkeypatch, beside, said):
    """``seeded=False`` runs the same dispatch without the planner's plan as a seed: the capped core's
    log has no line of the planner's there (with the seed: "policy seed" when it runs first, inline, on a
    busy machine; "late seed" when it runs beside the core on an idle one, ``solvers.dispatch._beside``,
    fixed here so the test does not depend on the machine's load), and both return a plan that fits.
    (The seed is taken from a 30-s limit on, ``POLICY_SEED_MIN_S``; lowered here to keep it short.)"""
    import solvers.dispatch
    from experiments.anytime import ilp_curve
    monkeypatch.setattr(solvers.dispatch, "POLICY_SEED_MIN_S", 0.0)
    monkeypatch.setattr(solvers.dispatch, "_beside", lambda: beside)
    p = random_problem(np.random.default_rng(3), 60, 4, memory_cap_fraction=0.4)
    _, free = ilp_curve(p, 3.0, seeded=False)
    _, seeded = ilp_curve(p, 3.0)
    assert free["cost"] is not None and seeded["cost"] is not None
    assert not any("policy seed" in line or "late seed" in line for line in free["log"])
    assert any(said in line for line in seeded["log"]), seeded["log"]


def test_default_points_take_the_decodes_log_then_the_search_phases():
    """``default_points`` (session 28): numpy BP's ``decode_found`` points as logged, then the search's start at
    the decode's end (``plan_time_s`` - the search's wall) and each phase at its end; the log alone without a
    budgeted search."""
    from experiments.anytime import default_points
    info = {"plan_time_s": 10.0, "decode_found": [(1.0, 9.0), (2.5, 7.0)],
            "search": {"wall_s": 6.0, "start": 7.0, "union": 6.5, "t_union": 2.0, "polish": None, "t_polish": 3.0}}
    assert default_points(info, 10.5) == [(1.0, 9.0), (2.5, 7.0), (4.0, 7.0), (6.0, 6.5)]
    assert default_points({"decode_found": [(1.0, 9.0)]}, 3.0) == [(1.0, 9.0)]
    assert default_points({}, 3.0) == []
