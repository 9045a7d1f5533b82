"""The env's default observations (env/obs_pool.py: recycled read-only buffers) against the env's
in-place arrays (``copy_obs=False``, copied at every step, which is what the default returned before):
equal at every step and across episodes, unchanged while the caller holds them, never sharing memory."""
import math
import os

import numpy as np
import pytest
from gymnasium.utils.env_checker import data_shares_objects

from costmodel.problem import Problem
from env.sharding_env import ShardingEnv
from env.workloads import Workload, random_problem

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "iopddl", "example.json")


def _problems():
    rng = np.random.default_rng(7)
    return [
        ("random-capped", [random_problem(rng, 60, 7, min_strategies=1, memory_cap_fraction=0.4)]),
        ("random-three", [random_problem(rng, n, 5) for n in (20, 45, 33)]),   # padding changes per episode
        ("iopddl-example", [Problem.from_iopddl(EXAMPLE)]),
        ("mlp-tiny", [Workload("mlp", "tiny", "cpu-2x4").build()]),
    ]


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name,problems", _problems(), ids=[n for n, _ in _problems()])
def test_default_observation_equals_the_in_place_arrays(name, problems):
    ref, env = ShardingEnv(problems, copy_obs=False), ShardingEnv(problems)
    rng = np.random.default_rng(0)
    kept = []   # (default observation, a copy taken when it was returned)
    for episode in range(4):
        o_ref, _ = ref.reset(seed=episode)
        obs, _ = env.reset(seed=episode)
        total, invalid = 0.0, 0
        while True:
            assert _equal(obs, o_ref), (name, episode)
            assert obs in env.observation_space
            assert not any(v.flags.writeable for v in obs.values())
            if rng.random() < 0.3:   # the caller keeps some observations (or a slice of one)
                kept.append((obs, {k: v.copy() for k, v in obs.items()}))
            elif rng.random() < 0.2:
                part = obs["action_features"][:5]
                kept.append(({"part": part}, {"part": part.copy()}))
            if rng.random() < 0.05:
                a = int(rng.integers(env.K))   # possibly masked: penalised, state unchanged
            else:
                a = int(rng.choice(np.flatnonzero(obs["action_mask"])))
            invalid += not obs["action_mask"][a]
            o_ref, r_ref, t_ref, _, info_ref = ref.step(a)
            obs, r, term, _, info = env.step(a)
            assert r == r_ref and term == t_ref and info["invalid_action"] == info_ref["invalid_action"]
            total += r
            if term:
                break
        assert _equal(obs, o_ref)
        penalty = 0.0 if info["feasible"] else env.infeasible_penalty
        assert math.isclose(total, -info["cost"].total / info["reference_cost"] - penalty - invalid * env.invalid_penalty,
                            rel_tol=1e-9, abs_tol=1e-12)
    for obs, copy in kept:   # what the caller held was never rewritten
        assert _equal(obs, copy)
    assert len(env._pool.slots) <= env._pool.max_slots


def test_observations_never_share_memory_and_dropped_buffers_are_reused():
    p = random_problem(np.random.default_rng(1), 80, 6)
    env = ShardingEnv(p)
    obs, _ = env.reset(seed=0)
    held = [obs]
    for _ in range(6):   # kept: every observation is new memory
        obs, *_ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        held.append(obs)
    for i in range(len(held)):
        for j in range(i):
            assert not data_shares_objects(held[i], held[j])
    with pytest.raises(ValueError):
        held[0]["node_features"].setflags(write=True)
    del held
    pool = env._pool
    before = pool.partial_copies
    buffers = set()
    for _ in range(20):   # dropped: two buffers alternate, each caught up by the rows a step wrote
        obs, *_ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        buffers.add(id(obs["node_features"].base))
    assert pool.partial_copies - before == 20 and len(buffers) == 2


def test_env_copies_and_pickles_between_episodes():
    import copy
    import pickle
    p = random_problem(np.random.default_rng(2), 40, 5, memory_cap_fraction=0.5)
    env = ShardingEnv(p)
    obs, _ = env.reset(seed=0)
    env.step(int(np.flatnonzero(obs["action_mask"])[0]))
    for other in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        runs = []
        for e in (env, other):
            obs, _ = e.reset(seed=3)
            seen = [obs]
            while True:
                obs, r, term, *_ = e.step(int(np.flatnonzero(obs["action_mask"])[-1]))
                seen.append(obs)
                if term:
                    break
            runs.append(seen)
        assert len(runs[0]) == len(runs[1]) and all(_equal(a, b) for a, b in zip(*runs))
