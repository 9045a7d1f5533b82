"""The sharding env: API conformance, exact reward accounting, masks, features, vector envs, workloads."""
import math
import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import env as env_pkg
from costmodel.problem import Problem, evaluate
from env.features import ACTION_FEATURES, ACTION_INDEX, EDGE_FEATURES, NODE_FEATURES, NODE_INDEX
from env.sharding_env import ShardingEnv
from env.workloads import (
    HELDOUT_MODELS,
    HELDOUT_PRESETS,
    TRAIN_MODELS,
    TRAIN_PRESETS,
    RandomProblemSampler,
    Workload,
    heldout_workloads,
    peak_bounds,
    random_cluster,
    random_problem,
    sample_workload,
    train_workloads,
)
from solvers.local import decision_order, greedy_by_cost

HERE = os.path.dirname(__file__)
IOPDDL = os.path.join(HERE, "..", "..", "shared", "iopddl")
EXAMPLE = os.path.join(IOPDDL, "example.json")
B_PATH = os.path.join(IOPDDL, "asplos-2025-iopddl-B.json.gz")
MIXED = {"time": 1.0, "memory": 0.7, "redundancy": 0.3, "balance": 2.0}


@pytest.fixture(scope="module")
def example():
    return Problem.from_iopddl(EXAMPLE)


@pytest.fixture(scope="module")
def mlp_problem():
    return Workload("mlp", "tiny", "cpu-2x4").build()


def run_episode(e, seed, action_rng, keep=False):
    """Random valid actions; returns (rewards, final info, observations seen if ``keep``)."""
    obs, info = e.reset(seed=seed)
    rewards, seen = [], [obs]
    while True:
        a = int(action_rng.choice(np.flatnonzero(obs["action_mask"])))
        obs, r, term, trunc, info = e.step(a)
        assert not trunc
        rewards.append(r)
        if keep:
            seen.append(obs)
        if term:
            return rewards, info, seen


def weighted(info):
    c, w = info["cost"], info["weights"]
    return (w["time"] * c.total + w["memory"] * info["memory_scale"] * c.peak_memory_bytes
            + w["redundancy"] * info["redundancy_scale"] * c.redundant_memory_bytes + w["balance"] * c.imbalance_s)


# ---- hand-worked example ---------------------------------------------------------------------------
def test_example_rewards_by_hand(example):
    # greedy reference: [0, 0, 1, 1, 0] costs 15+85+55+85+175 = 415 (worked out in the docstring of
    # greedy_by_cost's rule: node cost + resharding to decided neighbours)
    assert greedy_by_cost(example, avoid_forbidden=True) == [0, 0, 1, 1, 0]
    e = ShardingEnv(example)
    obs, info = e.reset(seed=0)
    assert info["reference_cost"] == 415.0
    # nodes 0 and 4 have one strategy: auto-applied; decisions are nodes 1, 2, 3
    assert obs["current_node"][0] == 1
    assert list(obs["action_mask"][:3]) == [1, 1, 0]
    # node 0 is decided, so node 1's resharding feature is log1p(E01[0, :] / cost_unit), cost_unit = 415 / 5
    af = obs["action_features"]
    np.testing.assert_allclose(af[1, :2, ACTION_INDEX["reshard_decided"]], np.log1p(np.array([30, 40]) / 83.0), rtol=1e-6)
    assert obs["node_features"][0, NODE_INDEX["decided"]] == 1 and obs["node_features"][1, NODE_INDEX["current"]] == 1
    obs, r1, *_ = e.step(0)           # node 1 -> 0: (15 + 55 + 30) / 415, node 0 included
    assert r1 == pytest.approx(-100 / 415, rel=1e-12)
    assert obs["current_node"][0] == 2
    # memory cap 50: node 2's strategy 1 (usage 20) would lift [50, 70) to 10 + 25 + 20 = 55
    assert e.K == 3 and list(obs["action_mask"]) == [1, 0, 1]
    obs, r2, *_ = e.step(2)           # node 2 -> 2: 35 + E02[0, 2] = 40
    assert r2 == pytest.approx(-75 / 415, rel=1e-12)
    obs, r3, term, _, info = e.step(1)  # node 3 -> 1: 75 + E13[0, 1] = 10; node 4: 95 + 30 + 60
    assert term and r3 == pytest.approx(-270 / 415, rel=1e-12)
    assert info["plan"] == [0, 0, 2, 1, 0] and info["cost"].total == 445.0 and info["cost"].feasible
    assert info["cost"] == evaluate(example, [0, 0, 2, 1, 0])


def test_example_peak_memory_term_by_hand(example):
    e = ShardingEnv(example, weights={"memory": 1.0})
    e.reset(seed=0)
    # the reference plan [0,0,1,1,0] peaks at 55 bytes, so the memory scale is 415 / 55 per byte
    _, r1, *_ = e.step(0)   # live on [40, 70): 10 + 25 = 35, a rise of 35
    _, r2, *_ = e.step(2)   # node 2 adds 15 on [50, 120): 50, a rise of 15
    _, r3, term, _, info = e.step(1)   # [110, 140): 15 + 10 + 15 = 40, no rise
    assert r1 == pytest.approx(-(100 / 415 + 35 / 55), rel=1e-12)
    assert r2 == pytest.approx(-(75 / 415 + 15 / 55), rel=1e-12)
    assert r3 == pytest.approx(-270 / 415, rel=1e-12)
    assert info["objective"] == pytest.approx(445 + 415 / 55 * 50, rel=1e-12)


def test_memory_mask_off_lets_an_infeasible_plan_through_with_a_penalty(example):
    e = ShardingEnv(example, mask_memory=False, infeasible_penalty=0.5)
    obs, _ = e.reset(seed=0)
    _, r1, *_ = e.step(0)
    _, r2, *_ = e.step(1)   # now allowed: peak 55 > 50
    _, r3, term, _, info = e.step(1)
    assert term and not info["cost"].feasible and info["cost"].peak_memory_bytes == 55
    assert info["cost"].total == 415
    assert r1 + r2 + r3 == pytest.approx(-415 / 415 - 0.5, rel=1e-12)


def test_masked_action_is_penalised_and_not_applied(example):
    e = ShardingEnv(example, invalid_penalty=0.25)
    e.reset(seed=0)
    e.step(0)
    before = {k: v.copy() for k, v in e._obs.items()}
    for bad in (1, 3, -1):   # 1: memory-masked; 3 and -1: outside the action space
        obs, r, term, trunc, info = e.step(bad)
        assert r == -0.25 and not term and not trunc and info["invalid_action"]
        for k in before:
            np.testing.assert_array_equal(obs[k], before[k])
    _, _, term, _, _ = e.step(2)
    _, _, term, _, info = e.step(1)
    assert term and info["plan"] == [0, 0, 2, 1, 0]


def test_forbidden_costs_are_masked_with_forward_checking():
    F = 1e18   # IOPDDL's "impossible"
    # chain 0 -> 1 -> 2. Node 0 strategy 1 is cheap but forbids every strategy of node 1;
    # node 1 strategy 0 is forbidden outright for node 2's strategy... via edge (1, 2) column 0.
    p = Problem.from_lists("forbid", node_costs=[[5, 1], [2, 3], [1, 1]], node_usages=[[0, 0], [0, 0], [0, 0]],
                           intervals=[[0, 1], [1, 2], [2, 3]], edges=[[0, 1], [1, 2]],
                           edge_costs=[[0, 0, F, F], [F, F, 0, 4]])
    assert greedy_by_cost(p, avoid_forbidden=True) == [0, 1, 0]   # 5 + 3 + 0 + 1 + 0
    assert greedy_by_cost(p) == [1, 0, 0]   # without the check: node 0 -> 1, then only forbidden choices
    e = ShardingEnv(p)
    obs, info = e.reset(seed=0)
    assert info["reference_cost"] == 9.0
    assert list(obs["action_mask"]) == [1, 0]   # 1 would leave node 1 only forbidden strategies
    obs, *_ = e.step(0)
    assert list(obs["action_mask"]) == [0, 1]   # node 1 strategy 0 forbids both of node 2's
    obs, r, *_ = e.step(1)
    obs, r, term, _, info = e.step(0)
    assert term and info["cost"].total == 9.0
    e2 = ShardingEnv(p, mask_forbidden=False)
    obs, _ = e2.reset(seed=0)
    assert list(obs["action_mask"]) == [1, 1]


def test_step_after_end_raises(example):
    e = ShardingEnv(example)
    e.reset(seed=0)
    for a in (0, 2, 1):
        e.step(a)
    with pytest.raises(RuntimeError, match="reset"):
        e.step(0)


# ---- exact accounting on many problems ---------------------------------------------------------------
def _problems(mlp):
    rng = np.random.default_rng(7)
    return [
        ("example", Problem.from_iopddl(EXAMPLE)),
        ("random-small", random_problem(rng, 30, 4)),
        ("random-capped", random_problem(rng, 150, 8, memory_cap_fraction=0.4)),
        ("random-single-node", random_problem(rng, 1, 3)),
        ("random-all-trivial", random_problem(rng, 12, 1, min_strategies=1)),
        ("iopddl-B", Problem.from_iopddl(B_PATH)),
        ("mlp-tiny", mlp),
    ]


@pytest.mark.parametrize("weights", [None, MIXED], ids=["time", "mixed"])
def test_rewards_sum_to_minus_objective(weights, mlp_problem):
    for name, p in _problems(mlp_problem):
        for skip in (True, False):
            e = ShardingEnv(p, weights=weights, skip_trivial=skip)
            for seed in range(2):
                rewards, info, _ = run_episode(e, seed, np.random.default_rng(seed + 10))
                cost = info["cost"]
                assert cost == evaluate(p, info["plan"]), name
                assert info["reference_cost"] > 0
                penalty = 0.0 if cost.feasible else e.infeasible_penalty
                if weights is None:
                    assert info["objective"] == cost.total
                want = -weighted(info) / info["reference_cost"] - penalty
                assert math.isclose(sum(rewards), want, rel_tol=1e-9, abs_tol=1e-12), (name, sum(rewards), want)
                assert math.isclose(info["objective"], weighted(info), rel_tol=1e-12)
                if p.num_strategies.max() > 1 and skip:
                    assert len(rewards) == int((p.num_strategies > 1).sum())
                if not skip:
                    assert len(rewards) == p.num_nodes


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), kmax=st.integers(1, 6),
       cap=st.one_of(st.none(), st.floats(0.0, 1.0)), w=st.tuples(*[st.floats(0.0, 3.0)] * 4),
       skip=st.booleans(), mask_memory=st.booleans())
def test_reward_identity_property(seed, n, kmax, cap, w, skip, mask_memory):
    rng = np.random.default_rng(seed)
    p = random_problem(rng, n, kmax, min_strategies=1, memory_cap_fraction=cap)
    weights = dict(zip(("time", "memory", "redundancy", "balance"), w))
    if sum(w) == 0:
        weights["time"] = 1.0
    e = ShardingEnv(p, weights=weights, skip_trivial=skip, mask_memory=mask_memory)
    rewards, info, _ = run_episode(e, seed % 1000, rng)
    assert info["cost"] == evaluate(p, info["plan"])
    penalty = 0.0 if info["cost"].feasible else e.infeasible_penalty
    want = -weighted(info) / info["reference_cost"] - penalty
    assert math.isclose(sum(rewards), want, rel_tol=1e-9, abs_tol=1e-12)
    if cap is not None and mask_memory:
        assert info["cost"].feasible   # random_problem caps lie between the min and max peaks


def test_memory_mask_keeps_capped_episodes_feasible():
    rng = np.random.default_rng(3)
    for frac in (0.0, 0.2, 0.5):
        p = random_problem(rng, 120, 8, memory_cap_fraction=frac)
        lo, hi = peak_bounds(p)
        assert lo <= p.usage_limit <= hi
        e = ShardingEnv(p)
        for seed in range(3):
            _, info, _ = run_episode(e, seed, np.random.default_rng(seed))
            assert info["cost"].feasible, (frac, info["cost"].peak_memory_bytes, p.usage_limit)


def test_memory_cap_kwarg_tightens_the_problem_limit(example):
    """The env's cap means what it means for every method: min(problem.usage_limit, cap)
    (costmodel.limits.Limits); above the problem's limit it does not bind, <= 0 is a LimitError."""
    from costmodel.limits import LimitError
    own = example.usage_limit
    assert own is not None
    e = ShardingEnv(example, memory_cap_bytes=10 * own)
    e.reset(seed=0)
    assert e.problem.usage_limit == own
    e2 = ShardingEnv(example, memory_cap_bytes=0.5 * own)
    assert e2.reset(seed=0)[0] is not None and e2.problem.usage_limit == 0.5 * own
    assert e2.episode.memory_cap_bytes == 0.5 * own
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(LimitError, match="memory_cap_bytes"):
            ShardingEnv(example, memory_cap_bytes=bad)


def test_episode_is_the_public_frozen_spec(example):
    import dataclasses
    e = ShardingEnv(example)
    assert e.episode is None
    _, info = e.reset(seed=0)
    ep = e.episode
    assert ep.problem is e.problem and ep.reference_cost == info["reference_cost"] == 415.0
    assert ep.reference_name == "greedy" and ep.reference_plan == (0, 0, 1, 1, 0)
    assert ep.order.tolist() == decision_order(example).tolist()
    assert ep.num_decisions == 3          # nodes 0 and 4 have one strategy
    with pytest.raises(dataclasses.FrozenInstanceError):
        ep.reference_cost = 1.0
    with pytest.raises(ValueError):
        ep.order[0] = 1


def test_same_seed_same_episode():
    rng = np.random.default_rng(0)
    problems = [random_problem(rng, int(n), 6) for n in (20, 40, 60)]
    e = ShardingEnv(problems)
    runs = [run_episode(e, 123, np.random.default_rng(5), keep=True) for _ in range(2)]
    (r1, i1, o1), (r2, i2, o2) = runs
    assert r1 == r2 and i1["plan"] == i2["plan"] and i1["cost"] == i2["cost"]
    for a, b in zip(o1, o2):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    names = {e.reset(seed=s)[1]["problem"] for s in range(20)}
    assert len(names) == 3   # the seed picks among the problems


def test_features_stay_in_space_and_update():
    p = random_problem(np.random.default_rng(11), 80, 8, memory_cap_fraction=0.5)
    e = ShardingEnv(p)
    rewards, info, seen = run_episode(e, 0, np.random.default_rng(1), keep=True)
    for obs in seen:
        assert obs in e.observation_space
        assert np.isfinite(obs["action_features"]).all() and np.isfinite(obs["node_features"]).all()
    last = seen[-1]
    nf = last["node_features"]
    assert (nf[:p.num_nodes, NODE_INDEX["decided"]] == 1).all() and (nf[p.num_nodes:] == 0).all()
    chosen = last["action_features"][:p.num_nodes, :, ACTION_INDEX["chosen"]]
    assert (chosen.argmax(axis=1) == np.array(info["plan"])).all() and (chosen.sum(axis=1) == 1).all()
    ef = last["edge_features"][:p.num_edges]
    assert (ef[:, EDGE_FEATURES.index("src_decided")] == 1).all() and (ef[:, EDGE_FEATURES.index("dst_decided")] == 1).all()
    assert last["edge_mask"].sum() == p.num_edges and last["node_mask"].sum() == p.num_nodes
    np.testing.assert_array_equal(last["edge_index"][:p.num_edges], p.edges)
    assert env_pkg.NODE_FEATURES == NODE_FEATURES and len(ACTION_FEATURES) == e.observation_space["action_features"].shape[2]


def test_context_features_and_cap_independent_preprocessing(example):
    def sampler(rng):   # the same problem under a random cap each episode
        return example.with_usage_limit(float(rng.choice([45.0, 60.0])))
    e = ShardingEnv(sampler, weights={"memory": 0.5}, max_nodes=8, max_edges=8, max_strategies=3)
    seen = {}
    for s in range(8):
        obs, info = e.reset(seed=s)
        seen[info["memory_cap_bytes"]] = obs["node_features"][:5]
    assert set(seen) == {45.0, 60.0} and len(e._compiled) == 1   # preprocessing shared across caps
    for cap, nf in seen.items():
        np.testing.assert_allclose(nf[:, NODE_INDEX["cap_ratio"]], cap / 55.0, rtol=1e-6)  # ref plan peaks at 55
        assert (nf[:, NODE_INDEX["has_cap"]] == 1).all() and (nf[:, NODE_INDEX["weight_memory"]] == 0.5).all()
        assert (nf[:, NODE_INDEX["weight_time"]] == 1).all() and (nf[:, NODE_INDEX["weight_balance"]] == 0).all()
    # with cap 45, node 2's strategy 1 (usage 20) is masked as before; the capped plan is feasible
    obs, info = e.reset(options={"problem": example.with_usage_limit(45.0)})
    assert info["memory_cap_bytes"] == 45.0
    obs, *_ = e.step(0)
    assert list(obs["action_mask"]) == [1, 0, 1] and list(e.action_masks()) == [True, False, True]


def test_zoo_problem_has_meta_features(mlp_problem):
    e = ShardingEnv(mlp_problem)
    obs, info = e.reset(seed=0)
    assert info["reference"] == "dp"
    nf = obs["node_features"][:mlp_problem.num_nodes]
    kinds = [n for n in NODE_FEATURES if n.startswith("kind_")]
    roles = [n for n in NODE_FEATURES if n.startswith("role_")]
    assert (nf[:, [NODE_INDEX[k] for k in kinds]].sum(axis=1) == 1).all()
    assert (nf[:, [NODE_INDEX[k] for k in roles]].sum(axis=1) == 1).all()
    assert nf[:, NODE_INDEX["kind_matmul"]].sum() >= 3 and nf[:, NODE_INDEX["role_param"]].sum() >= 6
    assert (nf[:, NODE_INDEX["has_meta"]] == 1).all() and nf[:, NODE_INDEX["log_flops"]].max() > 0


# ---- order, padding, sources ---------------------------------------------------------------------------
def _relabel(p, perm):
    """The same problem with node i renamed perm[i] (strategies, intervals and edges moved along)."""
    inv = np.argsort(perm)
    k = p.num_strategies
    costs = [p.node_costs[p.node_slice(int(i))] for i in inv]
    usages = [p.node_usages[p.node_slice(int(i))] for i in inv]
    ecosts = [p.edge_costs[p.edge_offsets[e]:p.edge_offsets[e + 1]] for e in range(p.num_edges)]
    del k
    return Problem.from_lists("relabelled", costs, usages, p.intervals[inv], perm[p.edges], ecosts)


def test_decision_order_is_topological():
    traced = random_problem(np.random.default_rng(0), 60, 4)
    assert decision_order(traced).tolist() == list(range(60))   # already topological: node order
    perm = np.random.default_rng(1).permutation(60)
    p = _relabel(traced, perm)
    assert not (p.edges[:, 0] < p.edges[:, 1]).all()
    order = decision_order(p)
    rank = np.empty(60, int)
    rank[order] = np.arange(60)
    assert (rank[p.edges[:, 0]] < rank[p.edges[:, 1]]).all()
    # IOPDDL-B has cycles: the order is still a permutation, and cycles are broken, not looped on
    b = Problem.from_iopddl(B_PATH)
    assert sorted(decision_order(b).tolist()) == list(range(b.num_nodes))


def test_problem_larger_than_padding_is_a_clear_error(example):
    with pytest.raises(ValueError, match="max_nodes=3"):
        ShardingEnv(example, max_nodes=3, max_edges=64, max_strategies=8)
    with pytest.raises(ValueError, match="max_strategies=2"):
        ShardingEnv(example, max_nodes=8, max_edges=64, max_strategies=2)
    e = ShardingEnv(RandomProblemSampler(nodes=(5, 10)), max_nodes=8, max_edges=64, max_strategies=8)
    with pytest.raises(ValueError, match="max_nodes"):
        for s in range(50):
            e.reset(seed=s)
    with pytest.raises(ValueError, match="weight"):
        ShardingEnv(example, weights={"speed": 1})


def test_sources_sampler_paths_and_options(example):
    e = ShardingEnv(RandomProblemSampler(nodes=(10, 40), max_strategies=5))
    assert (e.N, e.K) == (40, 5)
    sizes = {e.reset(seed=s)[1]["num_nodes"] for s in range(6)}
    assert len(sizes) > 1
    e2 = ShardingEnv(EXAMPLE)
    assert e2.reset(seed=0)[1]["problem"] == "example"
    e3 = ShardingEnv([EXAMPLE, example], max_nodes=16)
    assert e3.N == 16
    obs, info = e3.reset(seed=0, options={"problem": random_problem(np.random.default_rng(0), 9, 3)})
    assert info["num_nodes"] == 9 and obs["node_mask"].sum() == 9


# ---- gymnasium conformance ----------------------------------------------------------------------------
def test_check_env_small(example):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(ShardingEnv(example))
        check_env(ShardingEnv(random_problem(np.random.default_rng(0), 40, 6, memory_cap_fraction=0.5)))
        check_env(gym.make(env_pkg.ENV_ID, workloads=example).unwrapped)


def test_default_env_is_gpt_tiny_on_cpu_2x4():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = gym.make("shardgym/Sharding-v0")
        obs, info = e.reset(seed=0)
        assert info["problem"] and info["reference"] == "dp" and info["num_nodes"] > 100
        assert e.unwrapped.problem.meta.cluster_name == "cpu-2x4"
        check_env(e.unwrapped)


_VECTOR_SCRIPT = """
import functools, sys
import gymnasium as gym
import numpy as np
from env.sharding_env import ShardingEnv
from env.workloads import random_problem

def main(kind):
    problems = [random_problem(np.random.default_rng(s), 25, 5) for s in range(3)]
    fns = [functools.partial(ShardingEnv, problems, copy_obs=False, max_nodes=32, max_edges=96) for _ in range(2)]
    if kind == "sync":
        venv = gym.vector.SyncVectorEnv(fns)
    else:
        venv = gym.vector.AsyncVectorEnv(fns, shared_memory=True, context="spawn")
    obs, info = venv.reset(seed=[1, 2])
    assert obs["action_features"].shape[:3] == (2, 32, 5), obs["action_features"].shape
    ends = 0
    for _ in range(60):
        actions = np.array([int(np.flatnonzero(m)[0]) for m in obs["action_mask"]])
        obs, r, term, trunc, info = venv.step(actions)
        assert r.shape == (2,) and (r <= 0).all(), r
        ends += int(term.sum())
    venv.close()
    assert ends >= 2, ends
    print("ok", kind, ends)

if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_vector_envs_step(kind, tmp_path):
    # In a fresh interpreter: worker processes forked or spawned from a pytest-xdist worker that has
    # JAX loaded make its shutdown flaky, and the check is about the env, not about that.
    script = tmp_path / "vec.py"
    script.write_text(_VECTOR_SCRIPT)
    root = os.path.dirname(HERE)
    envvars = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(script), kind], cwd=root, env=envvars, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().startswith(f"ok {kind}")


# ---- workloads -----------------------------------------------------------------------------------------
def test_workload_split_is_disjoint_and_seeded():
    train, held = train_workloads(), heldout_workloads()
    tm = {(w.model, w.size) for w in train}
    hm = {(w.model, w.size) for w in held}
    assert tm == set(TRAIN_MODELS) and hm == set(HELDOUT_MODELS) and not tm & hm
    tc = {w.cluster if isinstance(w.cluster, str) else w.cluster.name for w in train}
    hc = {w.cluster for w in held}
    assert set(TRAIN_PRESETS) <= tc and hc == set(HELDOUT_PRESETS) and not tc & hc
    a = [sample_workload(np.random.default_rng(4), "heldout") for _ in range(2)]
    assert a[0] == a[1] and (a[0].model, a[0].size) in HELDOUT_MODELS
    with pytest.raises(ValueError, match="split"):
        sample_workload(np.random.default_rng(0), "test")


def test_random_cluster():
    shapes = set()
    for s in range(30):
        c = random_cluster(np.random.default_rng(s))
        assert c.num_devices == 8
        shapes.add(c.mesh_shape)
        assert c.axis_bandwidth_Bps[-1] == max(c.axis_bandwidth_Bps)
    assert len(shapes) >= 3
    assert random_cluster(np.random.default_rng(3)) == random_cluster(np.random.default_rng(3))


def test_workload_memory_cap_fraction(mlp_problem):
    lo, hi = peak_bounds(mlp_problem)
    assert 0 < lo < hi
    p = Workload("mlp", "tiny", "cpu-2x4", memory_cap_fraction=0.25).build()
    assert p.name == "mlp-tiny@cpu-2x4" and p.node_costs is mlp_problem.node_costs   # cached, shared arrays
    assert p.usage_limit == pytest.approx(lo + 0.25 * (hi - lo))
    assert Workload("mlp", "tiny", "cpu-2x4", memory_cap_bytes=1e6).build().usage_limit == 1e6
    with pytest.raises(ValueError, match="memory_cap_fraction"):
        Workload("mlp", "tiny", memory_cap_fraction=2.0)
