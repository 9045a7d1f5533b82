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


def test_ab_table_pairs_the_variants_and_reads_the_seed_path():
    from experiments.bench_capped import ab_markdown, seed_path

    def row(v, frac, cost, policy, gap, log):
        return {"problem": "fno:tiny", "cluster": "tpu-4x4", "cap_fraction": frac, "variant": v, "ilp_cost": cost,
                "ilp_feasible": True, "gap": gap, "policy_cost": policy, "policy_feasible": True,
                "ilp_over_policy": round(cost / policy, 4), "load_avg_before": [1.2, 1.0, 1.0], "log": log}
    search = ["0.1s pruned", "11.2s policy seed: 0.0001440936428 (11.2s)"]
    raw = ["0.2s policy seed: 0.0001629752618 (0.2s)"]
    rows = [row("before", 0.5, 1.441e-4, 1.441e-4, 0.12, search), row("after", 0.5, 1.630e-4, 1.441e-4, 0.156, raw),
            row("after", 0.75, 1.119e-4 * (1 - 5e-6), 1.119e-4, 0.0,       # the same plan but for a tie: equal
                ["24.0s policy seed: still running after 24.0s: beside the core"]),
            row("before", 0.75, 1.119e-4, 1.119e-4, 0.01, ["27.5s late seed: 0.0001119 after 27.5s (3.1s)"])]
    assert [seed_path(r) for r in rows] == ["inline 11.2 s", "inline 0.2 s", "late", "beside"]
    assert seed_path({"log": ["1.0s policy seed: none (nothing fits)"]}) == "none" and seed_path({}) == "—"
    after = ["2.1s policy seed: 0.0002552516466 (2.1s): the planner's search goes on beside the core"]   # s27a's log
    assert seed_path({"log": after}) == "inline 2.1 s, search late"
    assert seed_path({"log": after + ["45.6s late seed: 0.0002552516466 after 43.4s (43.0s)",
                                      "45.9s late seed: 0.0002552516466 (43.3s)"]}) == "inline 2.1 s, search at 45.6 s"
    text = ab_markdown({"rows": rows, "complete": True})
    assert ("| fno:tiny | tpu-4x4 | 50% | 0.0001441 / 0.000163 | 12.0% / 15.6% | 1.000 / 1.131 | 0.0001441 | "
            "inline 11.2 s / inline 0.2 s | 1.2 / 1.2 |") in text
    assert ("2 cells: the ILP's plan is cheaper before in 1, equal in 1, dearer in 0; gap <= 2 %: before 1, after 1; "
            "the ILP worse than the policy: before 0, after 1.") in text
    text = ab_markdown({"rows": rows, "complete": False}, labels=("search", "raw"))
    assert "| ILP / policy search / raw |" in text and "cheaper search in 1" in text and "(partial run)" in text
