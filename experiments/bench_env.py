"""Steps per second of the sharding env on a 2,000-node problem, next to CartPole-v1 in the same run.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python experiments/bench_env.py [--seconds 3]

Rows: CartPole-v1 (gymnasium.make, random actions from action_space.sample()) and
shardgym/Sharding-v0 on ``random_problem(rng, 2000, max_strategies=16, min_strategies=8)``, random
valid actions (uniform over ``np.flatnonzero(obs["action_mask"])``), single env with persistent
observation arrays (``copy_obs=False``) and with a fresh observation per step (the default, as
``check_env`` requires: read-only arrays in buffers recycled once the caller drops them,
env/obs_pool.py), and both
vectorised with SyncVectorEnv(copy=False) (4 envs; steps/s counts env steps = 4 x vector
steps; the vector env still copies each env's observation into its batch buffer) and with
AsyncVectorEnv(shared_memory=True, copy=False) (workers write into shared memory). Episodes
reset as they end (2,000-node episodes are ~1,800 decisions). steps/s counts the whole loop
(action choice included); step_only_per_s times env.step alone; cpu_steps_per_s counts the
process's CPU time instead of wall time (less sensitive to other jobs on a shared machine). Rows run
in interleaved rounds and report medians (vs_cartpole: the median of the per-round ratios), since
the machine may be shared. Writes results/bench_env.json.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import env  # noqa: E402,F401  (registers shardgym/Sharding-v0)
from env.workloads import random_problem  # noqa: E402
from experiments.common import print_table, write_results  # noqa: E402


def _masked_sampler(rng):
    """A uniformly random valid action (gymnasium's Discrete.sample(mask=...) does the same, slower)."""
    def act(obs):
        valid = np.flatnonzero(obs["action_mask"])
        return int(valid[rng.integers(len(valid))])
    return act


def bench_single(e, seconds: float, masked: bool) -> dict:
    e.action_space.seed(0)
    obs, _ = e.reset(seed=0)
    act = _masked_sampler(np.random.default_rng(0)) if masked else (lambda obs: e.action_space.sample())
    steps = episodes = 0
    step_time = 0.0
    c0 = time.process_time()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(200):
            a = act(obs)
            ts = time.perf_counter()
            obs, r, term, trunc, _ = e.step(a)
            step_time += time.perf_counter() - ts
            steps += 1
            if term or trunc:
                obs, _ = e.reset()
                episodes += 1
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {"steps": steps, "episodes": episodes, "steps_per_s": steps / wall, "step_only_per_s": steps / step_time,
            "cpu_steps_per_s": steps / cpu}


def bench_vector(venv, seconds: float, masked: bool) -> dict:
    n = venv.num_envs
    venv.action_space.seed(0)
    obs, _ = venv.reset(seed=0)
    pick = _masked_sampler(np.random.default_rng(0))
    steps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(50):
            if masked:
                a = np.array([pick({"action_mask": m}) for m in obs["action_mask"]])
            else:
                a = venv.action_space.sample()
            obs, r, term, trunc, _ = venv.step(a)
            steps += n
    wall = time.perf_counter() - t0
    return {"steps": steps, "steps_per_s": steps / wall}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per row, split over the rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--max-strategies", type=int, default=16)
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()

    t = time.perf_counter()
    problem = random_problem(np.random.default_rng(args.seed), args.nodes, args.max_strategies,
                             min_strategies=max(1, args.max_strategies // 2))
    gen_s = time.perf_counter() - t
    make = functools.partial(gym.make, "shardgym/Sharding-v0", workloads=problem)
    t = time.perf_counter()
    make(copy_obs=False).reset(seed=0)
    build_s = time.perf_counter() - t

    # Rows are measured in interleaved rounds (the machine may be shared); each figure is the
    # median over rounds, and vs_cartpole the median of the per-round ratios.
    single = {"cart": [], "shard": [], "shard_copy": []}
    envs = {"cart": gym.make("CartPole-v1"), "shard": make(copy_obs=False), "shard_copy": make(copy_obs=True)}
    per = args.seconds / args.rounds
    for _ in range(args.rounds):
        for key, e in envs.items():
            single[key].append(bench_single(e, per, masked=key != "cart"))
    vec = {"cart": [], "shard": []}
    venvs = {"cart": gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * args.num_envs, copy=False),
             "shard": gym.vector.SyncVectorEnv([functools.partial(make, copy_obs=False)] * args.num_envs, copy=False)}
    for _ in range(args.rounds):
        for key, v in venvs.items():
            vec[key].append(bench_vector(v, per, masked=key != "cart"))
    # AsyncVectorEnv with shared memory: each worker writes its observation straight into the
    # shared batch buffer (no copy in the parent with copy=False)
    avec = {"cart": [], "shard": []}
    avenvs = {"cart": gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * args.num_envs,
                                                shared_memory=True, copy=False),
              "shard": gym.vector.AsyncVectorEnv([functools.partial(make, copy_obs=False)] * args.num_envs,
                                                 shared_memory=True, copy=False)}
    for _ in range(args.rounds):
        for key, v in avenvs.items():
            avec[key].append(bench_vector(v, per, masked=key != "cart"))
    for v in list(venvs.values()) + list(avenvs.values()):
        v.close()

    def summary(runs, base):
        out = {"steps": int(sum(r["steps"] for r in runs)),
               "steps_per_s": float(np.median([r["steps_per_s"] for r in runs])),
               "vs_cartpole": float(np.median([r["steps_per_s"] / b["steps_per_s"] for r, b in zip(runs, base)]))}
        for key in ("step_only", "cpu_steps"):
            if f"{key}_per_s" in runs[0]:
                out[f"{key}_per_s"] = float(np.median([r[f"{key}_per_s"] for r in runs]))
                out[f"{key}_vs_cartpole"] = float(np.median(
                    [r[f"{key}_per_s"] / b[f"{key}_per_s"] for r, b in zip(runs, base)]))
        out["rounds_steps_per_s"] = [r["steps_per_s"] for r in runs]
        return out

    rows = [
        {"env": "CartPole-v1", "mode": "single", **summary(single["cart"], single["cart"])},
        {"env": "Sharding-v0", "mode": "single, copy_obs=False", **summary(single["shard"], single["cart"])},
        {"env": "Sharding-v0", "mode": "single, copy_obs=True (default)", **summary(single["shard_copy"], single["cart"])},
        {"env": "CartPole-v1", "mode": f"SyncVectorEnv x{args.num_envs}", **summary(vec["cart"], vec["cart"])},
        {"env": "Sharding-v0", "mode": f"SyncVectorEnv x{args.num_envs}", **summary(vec["shard"], vec["cart"])},
        {"env": "CartPole-v1", "mode": f"AsyncVectorEnv x{args.num_envs}", **summary(avec["cart"], avec["cart"])},
        {"env": "Sharding-v0", "mode": f"AsyncVectorEnv x{args.num_envs}", **summary(avec["shard"], avec["cart"])},
    ]
    print_table(rows, ["env", "mode", "steps", "steps_per_s", "vs_cartpole", "step_only_vs_cartpole", "cpu_steps_vs_cartpole"],
                title=f"env steps/s: {problem.num_nodes}-node problem, K<={args.max_strategies}, {problem.num_edges} edges")
    obs_bytes = sum(v.nbytes for v in make(copy_obs=False).observation_space.sample().values())
    print(f"problem generation {gen_s:.2f}s, env build (reference plan, features) {build_s:.2f}s, "
          f"observation size {obs_bytes / 1e6:.1f} MB")
    payload = {"rows": rows, "problem": {"nodes": problem.num_nodes, "edges": problem.num_edges,
                                         "strategies": int(len(problem.node_costs))},
               "generate_s": gen_s, "build_s": build_s, "observation_bytes": obs_bytes,
               "single_vs_cartpole": rows[1]["vs_cartpole"], "default_obs_vs_cartpole": rows[2]["vs_cartpole"],
               "load_average_before": load_before, "load_average": os.getloadavg(), "goal": 0.3}
    path = write_results("bench_env", payload, config=vars(args), seed=args.seed)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
