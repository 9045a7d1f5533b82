"""experiments/bench_capped.py's command line: ``--compare``'s overrides of the capped core's
configuration, and the README table's summary per variant."""
from __future__ import annotations

import pytest

from experiments.bench_capped import _overrides, markdown


def test_compare_overrides_take_each_fields_type_and_name_a_bad_field():
    assert _overrides("cfn_copies_max_s=inf,lagrange_share=0.45,lagrange_restart=0") == {
        "cfn_copies_max_s": float("inf"), "lagrange_share": 0.45, "lagrange_restart": False}
    assert _overrides(None) == {}
    assert _overrides("policy_beside=0") == {"policy_beside": False}   # solvers.dispatch.POLICY_SEED_BESIDE
    assert _overrides("policy_search=1") == {"policy_search": True}    # solvers.dispatch.POLICY_SEED_SEARCH
    assert _overrides("lagrange_step=polyak") == {"lagrange_step": "polyak"}   # a str field
    with pytest.raises(SystemExit, match="lagrange_shar=0.4"):
        _overrides("lagrange_shar=0.4")
    with pytest.raises(SystemExit, match="'milp_share'"):
        _overrides("milp_share")


def test_compare_sets_and_restores_the_dispatch_setting():
    import solvers.dispatch as dispatch
    from experiments.bench_capped import _traced_config
    with _traced_config({"policy_beside": False, "lagrange_share": 0.3}):
        assert dispatch.POLICY_SEED_BESIDE is False and dispatch.TRACED.lagrange_share == 0.3
    assert dispatch.POLICY_SEED_BESIDE is True and dispatch.TRACED.lagrange_share != 0.3


def test_table_counts_each_variant_on_its_own():
    def row(v, gap, ratio):
        return {"problem": "gpt:tiny", "cluster": "cpu-2x4", "nodes": 9, "cap_fraction": 0.25, "ilp_cost": 1.0,
                "ilp_feasible": True, "status": "time_limit", "gap": gap, "source": "lagrange", "ilp_s": 60,
                "policy_cost": 1.0 / ratio, "policy_feasible": True, "ilp_over_policy": ratio, "policy_s": 3,
                "load_avg_before": [4.0, 4.0, 4.0], "variant": v}
    text = markdown({"rows": [row("before", 0.30, 1.0), row("after", 0.01, 0.9)], "complete": True})
    assert "| gpt:tiny (before) |" in text and "| gpt:tiny (after) |" in text
    assert "after: 1 cells; the ILP's plan fits in 1; gap <= 2 % in 1 (median gap 1.0%)" in text
    assert "before: 1 cells; the ILP's plan fits in 1; gap <= 2 % in 0 (median gap 30.0%)" in text
