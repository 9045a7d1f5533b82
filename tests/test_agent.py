"""The agent: PPO learns on a small fixed problem, checkpoints round-trip and resume exactly,
masked actions are never chosen, the planner's plans are feasible under a memory cap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent.checkpoints import load_checkpoint, save_checkpoint
from agent.gnn import model_input
from agent.ppo import PPOConfig, PPOTrainer, pad_inputs, problem_env_fn
from costmodel.problem import evaluate
from env.workloads import random_problem

CFG = PPOConfig(seed=0, hidden=32, rounds=2, num_envs=4, num_steps=32, epochs=4, minibatches=4,
                learning_rate=1e-3, wandb=False)


@pytest.fixture(scope="module")
def small_problem():
    return random_problem(np.random.default_rng(0), 10, 6)


def _params_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def test_ppo_improves_return_on_fixed_problem(small_problem):
    tr = PPOTrainer(CFG, env_fn=problem_env_fn(small_problem))
    first = tr.update()["charts/episodic_return"]
    for _ in range(11):
        last = tr.update()
    after = last["charts/episodic_return"]
    # returns are -cost/reference cost; the untrained (near-uniform) policy is far worse
    assert after > first + 0.2, (first, after)
    assert last["charts/cost_ratio"] == pytest.approx(-after, rel=1e-6)


def test_checkpoint_round_trip_and_exact_resume(small_problem, tmp_path):
    straight = PPOTrainer(CFG, env_fn=problem_env_fn(small_problem))
    for _ in range(4):
        straight.update()
    part = PPOTrainer(CFG, env_fn=problem_env_fn(small_problem))
    for _ in range(2):
        part.update()
    path = tmp_path / "ck.msgpack"
    part.save(path)
    resumed = PPOTrainer.load(path, env_fn=problem_env_fn(small_problem))
    assert _params_equal(resumed.params, part.params)
    assert _params_equal(resumed.opt_state, part.opt_state)
    assert resumed.update_count == 2
    assert np.array_equal(np.asarray(resumed.key), np.asarray(part.key))
    for _ in range(2):
        resumed.update()
    assert _params_equal(resumed.params, straight.params)
    assert resumed.history[-1]["charts/episodic_return"] == straight.history[-1]["charts/episodic_return"]


def test_masked_actions_never_chosen(small_problem):
    tr = PPOTrainer(CFG, env_fn=problem_env_fn(small_problem))
    env = tr.envs[0]
    obs, _ = env.reset(seed=0)
    x = model_input(obs)
    rng = np.random.default_rng(1)
    K = len(x["action_mask"])
    xs = []
    for _ in range(32):
        y = dict(x)
        m = (rng.random(K) < 0.3).astype(np.int8)
        m[rng.integers(K)] = 1
        y["action_mask"] = m
        y["cur_action"] = rng.random(x["cur_action"].shape).astype(np.float32) * 5
        xs.append(y)
    batch = pad_inputs(xs)
    key = jax.random.PRNGKey(0)
    for _ in range(50):
        key, k = jax.random.split(key)
        a, logp, _, greedy = tr._act(tr.params, batch, k)
        a, greedy = np.asarray(a), np.asarray(greedy)
        assert np.all(batch["action_mask"][np.arange(len(a)), a] == 1)
        assert np.all(batch["action_mask"][np.arange(len(a)), greedy] == 1)
        assert np.all(np.isfinite(np.asarray(logp)))


def test_corrupt_checkpoint_raises_value_error(tmp_path):
    bad = tmp_path / "policy.msgpack"
    bad.write_bytes(b"\x00not a checkpoint\xff" * 10)
    with pytest.raises(ValueError, match="policy.msgpack"):
        load_checkpoint(bad)
    good = tmp_path / "ok.msgpack"
    save_checkpoint(good, {"params": {"w": jnp.ones(3)}}, {"hidden": 8})
    data = good.read_bytes()
    (tmp_path / "trunc.msgpack").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="trunc.msgpack"):
        load_checkpoint(tmp_path / "trunc.msgpack")
    st = load_checkpoint(good)
    assert st["config"] == {"hidden": 8} and np.array_equal(st["params"]["params"]["w"], np.ones(3))


def test_local_costs_match_evaluate_and_polish_improves():
    from solvers.local import LocalCosts, polish
    p = random_problem(np.random.default_rng(3), 25, 5)
    rng = np.random.default_rng(4)
    plan = np.array([rng.integers(k) for k in p.num_strategies])
    lc = LocalCosts.of(p)
    tot = lc.local(plan)
    base = evaluate(p, plan).total
    off = p.strategy_offsets
    for i in range(p.num_nodes):
        for s in range(int(p.num_strategies[i])):
            q = plan.copy()
            q[i] = s
            # changing one node changes the total by exactly the change of its local cost
            assert evaluate(p, q).total - base == pytest.approx(tot[off[i] + s] - tot[off[i] + plan[i]], abs=1e-9)
    better = polish(p, plan, lc=lc)
    assert evaluate(p, better).total < base
    # a polished plan is a 1-opt local optimum: no single-node change improves it
    tot = lc.local(np.array(better))
    for i in range(p.num_nodes):
        seg = tot[off[i]:off[i + 1]]
        assert seg[better[i]] <= seg.min() + 1e-9


def test_planner_feasible_under_memory_cap(small_problem, tmp_path):
    from agent.planner import Planner
    tr = PPOTrainer(CFG, env_fn=problem_env_fn(small_problem))
    path = tmp_path / "policy.msgpack"
    tr.save(path)
    planner = Planner.load(str(path))
    p = random_problem(np.random.default_rng(5), 40, 6, memory_cap_fraction=0.15)
    assert p.usage_limit is not None
    for mode, samples, pol in (("greedy", 1, False), ("greedy", 1, True), ("sample", 3, True)):
        plan, info = planner.plan(p, mode=mode, samples=samples, polish=pol, return_info=True)
        c = evaluate(p, plan)
        assert c.feasible and c.peak_memory_bytes <= p.usage_limit
        assert c.total <= min(t["total"] for t in info["candidates"] if t["feasible"]) + 1e-12
    # an explicit cap tightens the problem's own limit, never relaxes it; an impossible one is a
    # clear ValueError, a cap <= 0 the one LimitError of costmodel.limits
    loose = planner.plan(p, memory_cap_bytes=100 * p.usage_limit, polish=False)
    assert evaluate(p, loose).feasible
    with pytest.raises(ValueError, match="memory cap"):
        planner.plan(p, memory_cap_bytes=1.0)
    from costmodel.limits import LimitError
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(LimitError, match="memory_cap_bytes"):
            planner.plan(p, memory_cap_bytes=bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Planner.load(str(tmp_path / "missing.msgpack"))
    (tmp_path / "bad.msgpack").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="bad.msgpack"):
        Planner.load(str(tmp_path / "bad.msgpack"))


def test_numpy_encoder_matches_flax():
    """The planner embeds graphs with agent.gnn.np_encode (no jit); it must be the Flax network."""
    from agent.gnn import ShardingGNN, np_encode
    from agent.planner import Planner
    from env.sharding_env import ShardingEnv
    pl = Planner.load("pretrained")
    model = ShardingGNN(hidden=pl.config.hidden, rounds=pl.config.rounds)
    env = ShardingEnv(workloads=random_problem(np.random.default_rng(3), num_nodes=60), copy_obs=False)
    obs, _ = env.reset(seed=0)
    for _ in range(10):                      # some decisions made: action features are not all fresh
        obs, *_ = env.step(int(np.argmax(obs["action_mask"])))
    x = model_input(obs)
    h_ref, g_ref = model.apply(pl.params, x, method=ShardingGNN.embed_graph)
    params = jax.tree.map(np.asarray, jax.device_get(pl.params))
    h, g = np_encode(params, x["nodes"], x["edge_index"], x["edge_features"], pl.config.rounds)
    np.testing.assert_allclose(h, np.asarray(h_ref), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g, np.asarray(g_ref), rtol=1e-4, atol=1e-4)


def test_planner_refines_only_when_the_cap_binds(monkeypatch):
    """A limit far above every plan's peak (as the builder's device memory usually is) does not
    bind: no refine. A limit at the least possible peak does: refine runs, and the plan fits it."""
    import agent.planner as planner_module
    from agent.planner import Planner
    from env.workloads import peak_bounds
    from solvers.local import REFINE_TIME_LIMIT_S
    calls = []
    real = planner_module.refine
    monkeypatch.setattr(planner_module, "refine", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    planner = Planner.load("pretrained")
    p = random_problem(np.random.default_rng(7), 60, 6)
    lo, hi = peak_bounds(p)
    plan, info = planner.plan(p, memory_cap_bytes=10 * hi, return_info=True)
    assert not info["cap_binds"] and calls == []
    assert any(c["uncapped_start"] for c in info["candidates"])
    plan, info = planner.plan(p, memory_cap_bytes=lo, refine_time_limit_s=None, return_info=True)
    assert info["cap_binds"] and calls == [REFINE_TIME_LIMIT_S]
    assert evaluate(p.with_usage_limit(lo), plan).feasible


def test_solve_policy_search_false_is_the_raw_decode():
    """sg.solve(method="policy", search=False) is the default planner's plan without polish or
    refine (the GNN policy's with checkpoint="pretrained"), and it honours memory_cap_bytes."""
    import shardgym as sg
    from agent.planner import DEFAULT_POLICY, Planner
    p = random_problem(np.random.default_rng(7), 30, 5)
    for name in (DEFAULT_POLICY, "pretrained"):
        raw = Planner.load(name).plan(p, polish=False)
        kw = {} if name == DEFAULT_POLICY else {"checkpoint": name}
        plan = sg.solve(p, method="policy", search=False, **kw)
        assert list(plan.strategies) == list(raw)
    least = sg.evaluate(p, [int(np.argmin(p.node_usages[a:b])) for a, b in
                            zip(p.strategy_offsets[:-1], p.strategy_offsets[1:])]).peak_memory_bytes
    capped = sg.solve(p, method="policy", search=False, memory_cap_bytes=1.5 * least)
    assert sg.evaluate(p.with_usage_limit(1.5 * least), capped).feasible


def test_shipped_checkpoint_carries_a_checksum():
    """The shipped policy is format /2: its weights are covered by a SHA-256, so a flipped byte in
    them is an error, not a silently different policy."""
    import os

    from flax import serialization

    from agent.checkpoints import FORMAT
    path = os.path.join(os.path.dirname(__import__("agent").__file__), "pretrained", "policy.msgpack")
    with open(path, "rb") as f:
        state = serialization.msgpack_restore(f.read())
    assert state["format"] == FORMAT and len(state["checksum"]) == 64
    load_checkpoint(path)   # the checksum matches
