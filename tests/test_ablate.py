"""Beam search (agent/beam.py) against brute force, and one minimal ablation run (experiments/ablate.py)."""
import itertools
import json

import numpy as np
import pytest

from agent.beam import beam_search
from agent.planner import greedy_by_cost
from costmodel.problem import Problem, evaluate
from env.workloads import peak_bounds, random_problem


def brute_force(problem: Problem):
    """(best total, best plan) over every feasible complete plan."""
    best, arg = np.inf, None
    for plan in itertools.product(*[range(int(k)) for k in problem.num_strategies]):
        c = evaluate(problem, list(plan))
        if c.feasible and c.total < best:
            best, arg = c.total, list(plan)
    return best, arg


@pytest.mark.parametrize("seed", range(12))
def test_wide_beam_is_optimal(seed):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, num_nodes=6, max_strategies=3, memory_cap_fraction=0.35 if seed % 2 else None)
    best, _ = brute_force(p)
    plan = beam_search(p, width=int(np.prod(p.num_strategies)))
    c = evaluate(p, plan)
    assert c.feasible
    assert c.total == pytest.approx(best, rel=1e-12)
    # a narrower beam is never better than the optimum and still feasible
    narrow = evaluate(p, beam_search(p, width=2))
    assert narrow.feasible and narrow.total >= best - 1e-12


def test_tight_cap_feasible_and_optimal():
    """Caps at the least possible peak: only the memory-minimal layouts fit; the beam must find the best of them."""
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        p = random_problem(rng, num_nodes=7, max_strategies=3)
        lo, hi = peak_bounds(p)
        for frac in (0.0, 0.1, 0.5):
            q = p.with_usage_limit(lo + frac * (hi - lo))
            best, _ = brute_force(q)
            for width in (1, 3):
                plan = beam_search(q, width=width)
                assert evaluate(q, plan).feasible, (seed, frac, width)
            wide = beam_search(q, width=int(np.prod(q.num_strategies)))
            assert evaluate(q, wide).total == pytest.approx(best, rel=1e-12)
            # memory_cap_bytes overrides the problem's own limit
            assert beam_search(p, width=int(np.prod(p.num_strategies)), memory_cap_bytes=q.usage_limit) == wide


def test_hand_worked_chain():
    """Two nodes, one edge: greedy takes node 0's cheap strategy and pays resharding; the beam sees past it.
    node 0: costs [1, 2]; node 1: costs [5, 5]; edge E = [[10, 10], [0, 0]] (s0 = 0 costs 10 to reshard).
    Greedy: s0 = 0 (1 < 2), then s1 = 0: 1 + 5 + 10 = 16. Optimum: s0 = 1, s1 = 0: 2 + 5 + 0 = 7."""
    p = Problem.from_lists("chain", [[1.0, 2.0], [5.0, 5.0]], [[1.0, 1.0], [1.0, 1.0]], [[0, 2], [1, 2]],
                           [(0, 1)], [[10.0, 10.0, 0.0, 0.0]])
    assert beam_search(p, width=1) == [0, 0] == greedy_by_cost(p)
    assert evaluate(p, [0, 0]).total == 16.0
    assert beam_search(p, width=2) == [1, 0]
    assert evaluate(p, beam_search(p, width=2)).total == 7.0
    # memory: node 0 strategy 1 uses 3 bytes; a cap of 2 forbids it, so the beam must pay 16
    q = Problem.from_lists("chain-cap", [[1.0, 2.0], [5.0, 5.0]], [[1.0, 3.0], [1.0, 1.0]], [[0, 2], [1, 2]],
                           [(0, 1)], [[10.0, 10.0, 0.0, 0.0]], usage_limit=2.0)
    assert beam_search(q, width=4) == [0, 0]
    with pytest.raises(ValueError, match="memory cap"):
        beam_search(q, width=4, memory_cap_bytes=1.5)


@pytest.mark.parametrize("seed", range(8))
def test_width_one_is_greedy_by_cost(seed):
    p = random_problem(np.random.default_rng(seed), num_nodes=60, max_strategies=6)
    assert beam_search(p, width=1) == greedy_by_cost(p)


def test_beam_improves_with_width_and_respects_budget():
    p = random_problem(np.random.default_rng(7), num_nodes=300, max_strategies=8, memory_cap_fraction=0.3)
    totals = []
    for w in (1, 4, 32):
        plan, info = beam_search(p, width=w, return_info=True)
        assert info["feasible"] and evaluate(p, plan).feasible
        totals.append(info["total"])
    assert totals[2] <= totals[0]
    plan, info = beam_search(p, width=64, time_limit_s=0.0, return_info=True)
    assert info["truncated"] and evaluate(p, plan).feasible and len(plan) == p.num_nodes


def test_beam_bad_input():
    p = random_problem(np.random.default_rng(0), num_nodes=5)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="width"):
            beam_search(p, width=bad)


# ---- the ablation runner -----------------------------------------------------------------------------
def test_config_parsing():
    from experiments.ablate import AblationConfig, config_for, config_from_wandb, parse_reward
    assert parse_reward("time+memory=0.5") == {"time": 1.0, "memory": 0.5, "redundancy": 0.0, "balance": 0.0}
    with pytest.raises(ValueError, match="unknown reward term"):
        parse_reward("time+speed")
    base = AblationConfig()
    assert config_for("depth", "6", base).rounds == 6
    assert config_for("beam", "16", base).method == "beam"
    assert config_for("imitation", "on", base).imitation is True
    with pytest.raises(ValueError, match="ablation"):
        config_for("nope", "1", base)
    with pytest.raises(ValueError, match="action_features"):
        config_for("action_features", "half", base)
    c = config_from_wandb({"rounds": 2, "action_features": False, "reward": "time+memory"}, base)
    assert (c.ablation, c.rounds, c.action_features, c.weights()["memory"]) == ("sweep", 2, "off", 1.0)
    with pytest.raises(ValueError, match="not an AblationConfig field"):
        config_from_wandb({"depth": 3}, base)


def test_feature_mask_wrapper():
    from env.features import ACTION_FEATURES, ACTION_INDEX
    from experiments.ablate import AblationConfig, make_env
    p = random_problem(np.random.default_rng(3), num_nodes=12, max_strategies=4)
    full = make_env(p, AblationConfig())
    static = make_env(p, AblationConfig(action_features="static"))
    off = make_env(p, AblationConfig(action_features="off"))
    o_full, o_static, o_off = full.reset(seed=0)[0], static.reset(seed=0)[0], off.reset(seed=0)[0]
    for _ in range(3):   # some decisions so that the dynamic columns are non-zero
        a = int(np.argmax(o_full["action_mask"]))
        o_full, o_static, o_off = full.step(a)[0], static.step(a)[0], off.step(a)[0]
    af = o_full["action_features"]
    assert np.abs(af[..., ACTION_INDEX["incremental"]]).sum() > 0
    assert np.all(o_static["action_features"][..., ACTION_INDEX["incremental"]] == 0)
    assert np.array_equal(o_static["action_features"][..., ACTION_INDEX["node_cost"]], af[..., ACTION_INDEX["node_cost"]])
    keep = [ACTION_INDEX["valid"]]
    drop = [j for j in range(len(ACTION_FEATURES)) if j not in keep]
    assert np.all(o_off["action_features"][..., drop] == 0)
    assert np.array_equal(o_off["action_features"][..., keep], af[..., keep])
    assert np.array_equal(o_off["action_mask"], o_full["action_mask"])   # masking never changes the env


@pytest.mark.slow
def test_minimal_ablation_run(tmp_path, monkeypatch):
    """One PPO ablation run with a 1-update budget on one training problem, evaluated on one small
    random problem against its ILP optimum, then the CLI's resume path and the outputs."""
    import experiments.ablate as ab
    from experiments.common import git_rev

    small = random_problem(np.random.default_rng(5), num_nodes=14, max_strategies=4, name="tiny-eval")
    train = random_problem(np.random.default_rng(6), num_nodes=16, max_strategies=4, name="tiny-train")
    monkeypatch.setattr(ab, "train_problems", lambda cfg: [train])
    monkeypatch.setattr(ab, "eval_problems", lambda cfg: [("tiny-eval/uncapped", small)])
    cfg = ab.config_for("depth", "1", ab.AblationConfig(updates=1, num_envs=2, num_steps=8, epochs=1,
                                                          minibatches=1, hidden=8, random_start=0.0,
                                                          ilp_seconds=10))
    ilp = {}
    rec = ab.run_one(cfg, ilp, wandb_mode="disabled")
    assert rec["config"]["rounds"] == 1 and rec["seed"] == 0 and rec["git_rev"] == git_rev()
    assert rec["train"]["updates_done"] == 1
    m = rec["metrics"]
    best, _ = brute_force(small)
    assert ilp["tiny-eval/uncapped"]["total"] == pytest.approx(best, rel=1e-6)
    row = rec["rows"][0]
    assert row["feasible"] and row["ratio"] == pytest.approx(row["cost"] / best, rel=1e-6)
    assert row["ratio"] >= 1 - 1e-9 and m["median_cost_ratio"] == row["ratio"] == m["max_cost_ratio"]
    assert m["feasible_rate"] == 1.0 and m["median_plan_time_s"] > 0

    # the CLI: beam rows (no training) into a results file, then a resumed run skips them
    out = tmp_path / "ablate.json"
    argv = ["--ablation", "beam", "--values", "1,64", "--results", str(out), "--wandb", "disabled", "--no-progress",
            "--ilp-seconds", "10", "--markdown"]
    assert ab.main(argv) == 0
    data = json.loads(out.read_text())
    assert set(data["runs"]) == {"beam=1@seed0", "beam=64@seed0"}
    assert data["git_rev"] and data["config"]["ablation"] == "beam"
    r1, r64 = data["runs"]["beam=1@seed0"], data["runs"]["beam=64@seed0"]
    assert r1["rows"][0]["cost"] == pytest.approx(evaluate(small, greedy_by_cost(small)).total)
    assert r64["metrics"]["median_cost_ratio"] <= r1["metrics"]["median_cost_ratio"]
    assert (tmp_path / "ablate.png").stat().st_size > 10_000
    stamp = r64["timestamp"]
    assert ab.main(argv) == 0
    assert json.loads(out.read_text())["runs"]["beam=64@seed0"]["timestamp"] == stamp   # skipped, not rerun

