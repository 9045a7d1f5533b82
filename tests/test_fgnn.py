"""The factor-graph network (agent/fgnn.py) and its trainer (agent/fgnn_train.py): zero corrections
are Lagrangian BP (plain BP uncapped), the training forward is the planning one, plans are scale-free, the decode honours the cap, the imitation loss falls, checkpoints round-trip and a
resumed run ends bit-identical. Tiny shapes and few rounds (one compile per shape is the cost)."""
from __future__ import annotations

import numpy as np
import pytest

from agent.checkpoints import load_checkpoint, weights_digest
from agent.fgnn import FGNN, TABLE, FGConfig, FGInputs
from costmodel.problem import evaluate
from solvers import bp
from solvers.local import LocalCosts, Pruning
from tests.ilp_helpers import brute_force, random_problem
from tests.test_bp import _tree

ROUNDS = 8


@pytest.fixture(scope="module")
def net():
    return FGNN(FGConfig(rounds=ROUNDS, hidden=8))


@pytest.mark.parametrize("seed", [0, 1])
def test_zero_corrections_equal_bp(net, seed):
    """With every learned correction at zero the network's messages are bp.py's after the same
    rounds (to float32 rounding) and its plan is bp_solve's (plain BP, pruned)."""
    rng = np.random.default_rng(200 + seed)
    p = random_problem(rng, 9, kmax=4, edge_p=0.5, limit_q=None)
    z = FGNN.zero_corrections(net.params)
    inp = FGInputs.of(p, pruned=False)
    c, tu, tv = net.forward(inp, z)
    mp = inp.mp
    u, v = np.zeros(int(mp.su[-1])), np.zeros(int(mp.sv[-1]))
    for _ in range(ROUNDS):
        u, v = mp.update(mp.cost, u, v, 0.5)
    scale = max(np.abs(u).max(), np.abs(v).max(), 1e-12)
    assert np.abs(tu - u).max() <= 1e-5 * scale and np.abs(tv - v).max() <= 1e-5 * scale
    assert np.allclose(c, mp.cost, rtol=1e-6)
    ref = bp.bp_solve(p, rounds=ROUNDS, memory_prices=False, bound=False).plan
    assert net.plan(p, params=z) == ref


@pytest.mark.parametrize("seed", range(4))
def test_zero_corrections_equal_lagrangian_bp(net, seed):
    """Under a binding limit the untrained network (every MLP output starts at zero) and the
    zero-correction one plan what Lagrangian BP plans (bp_solve with memory prices, the same
    rounds: its price updates, its decodes at each and the cheapest that fits). The plans are
    identical, or of the same cost where float32 rounding breaks a tie the other way."""
    p = random_problem(np.random.default_rng(600 + seed), 9, kmax=4, edge_p=0.5, limit_q=0.35)
    ref = bp.bp_solve(p, rounds=ROUNDS, memory_prices=True, bound=False)
    assert ref.plan is not None
    for params in (net.params, FGNN.zero_corrections(net.params)):
        x = net.plan(p, params=params)
        assert x == ref.plan or evaluate(p, x).total == pytest.approx(ref.cost, rel=1e-9)
        assert evaluate(p, x).feasible


def _capped_with_copies(seed: int):
    """A random 10-node problem with random copy groups, capped 40 % of the way from the least-usage
    plan's peak to plain BP's plan's (copies included): the limit binds BP's argmin plan."""
    from dataclasses import replace

    from solvers.local import least_usage_plan
    from tests.test_edge_memory import _with_random_copies
    rng = np.random.default_rng(900 + seed)
    p = _with_random_copies(rng, random_problem(rng, 10, kmax=3, edge_p=0.5, limit_q=None))
    free = evaluate(p, bp.bp_plan(p, rounds=ROUNDS, memory_prices=False)).peak_memory_bytes
    least = evaluate(p, least_usage_plan(p)).peak_memory_bytes
    return replace(p, usage_limit=float(least + 0.4 * (free - least)))


@pytest.mark.parametrize("seed", [1, 25, 57])
def test_zero_corrections_follow_bp_into_the_copy_priced_phase(net, seed):
    """With copy groups under a binding limit bp_solve prices the copies on their edges, every
    ``COPY_PRICE_EVERY`` rounds for ``COPY_ROUNDS`` times the rounds (``bp.PriceSchedule``); the untrained
    and the zero-correction network plan bp_solve's plan exactly. Before session 25 the network ran
    ``rounds`` rounds on node-usage prices alone: on these three, 471 / 521 / 532 against 466 / 505 / 496."""
    p = _capped_with_copies(seed)
    ref = bp.bp_solve(p, rounds=ROUNDS, bound=False)
    assert ref.rounds == bp.COPY_ROUNDS * ROUNDS and evaluate(p, ref.plan).feasible   # the copy-priced phase ran
    for params in (net.params, FGNN.zero_corrections(net.params)):
        assert net.plan(p, params=params) == ref.plan


def test_training_forward_is_the_planning_forward():
    """The one-jit differentiable forward (``logits``' path, Lagrangian rule inside the jit) ends
    with the messages and scores of ``plan``'s blocks (rule in numpy between them), for random
    non-zero corrections on a capped problem without copy groups; and the plan is unchanged when
    every cost is scaled by 1000 (corrections are in units of each problem's cost scale)."""
    import dataclasses

    import jax
    cfg = FGConfig(rounds=ROUNDS, hidden=8)
    net = FGNN(cfg)
    rng = np.random.default_rng(5)
    params = jax.tree.map(lambda a: a + 0.3 * rng.standard_normal(np.shape(a)).astype(np.float32), net.params)
    p = random_problem(np.random.default_rng(700), 9, kmax=4, edge_p=0.5, limit_q=0.35)
    inp = FGInputs.of(p)
    c, tu, tv = net.forward(inp, params)
    c2, tu2, tv2 = (np.asarray(a, np.float64) * inp.scale for a in net._fns["forward"](params, inp.arrays))
    S, U, V = inp.sizes[:3]
    scale = max(np.abs(tu).max(), np.abs(c).max(), 1e-12)
    assert np.abs(c2[:S] - c).max() <= 1e-4 * scale and np.abs(tu2[:U] - tu).max() <= 1e-4 * scale
    assert np.abs(tv2[:V] - tv).max() <= 1e-4 * scale
    big = dataclasses.replace(p, node_costs=p.node_costs * 1000.0, edge_costs=p.edge_costs * 1000.0)
    assert net.plan(big, params=params) == net.plan(p, params=params)


def test_zero_corrections_exact_on_a_tree(net):
    """On a tree the zero-correction network (plain BP) decodes the brute-force optimum."""
    p = _tree(2, n=6)
    _, bc = brute_force(p)
    z = FGNN.zero_corrections(net.params)
    assert evaluate(p, net.plan(p, params=z)).total == pytest.approx(bc.total, rel=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_masked_strategies_never_chosen(net, seed):
    """Under a binding limit and forbidden entries, the (untrained) network's plan fits the limit
    and uses no strategy that pruning removed (forbidden, or no memory-feasible plan uses it)."""
    rng = np.random.default_rng(300 + seed)
    p = random_problem(rng, 8, kmax=3, edge_p=0.5, limit_q=0.3, forbid_p=0.1)
    best, _ = brute_force(p)
    assert best is not None
    x = net.plan(p)
    c = evaluate(p, x)
    assert c.feasible and c.peak_memory_bytes <= p.usage_limit
    keep = Pruning(LocalCosts(p)).keep
    assert keep[p.strategy_offsets[:-1] + np.asarray(x)].all()


def test_loss_falls_on_a_fixed_problem():
    """Thirty Adam steps of imitation on one problem lower its loss by at least 10%."""
    from agent.fgnn_data import ilp_label
    from agent.fgnn_train import Sample, Trainer
    p = random_problem(np.random.default_rng(7), 10, kmax=4, edge_p=0.5, limit_q=None)
    lab = ilp_label(p, 30.0, cache=False)
    s = Sample("fixed", p, lab["plan"], lab["cost"])
    tr = Trainer(FGConfig(rounds=3, hidden=8), lr=1e-2)   # the resume test's shapes: one compile for both
    first = tr.loss(s)
    for _ in range(30):
        tr.step(s)
    assert tr.loss(s) < 0.9 * first


def test_resume_is_identical_and_checkpoint_round_trips(tmp_path, monkeypatch):
    """Two epochs in one go, and a run stopped by SIGTERM between the two steps of its second epoch
    + ``--resume`` (mid-epoch: the harder case than an epoch boundary), end with the same weights; the best-on-validation
    checkpoint (step 0 counted) is the lowest score seen and loads as a planner that plans."""
    import json
    import os
    import signal

    from agent import fgnn_train
    from agent.fgnn_train import main
    from agent.fgnn_val import Validator, is_validation
    from agent.planner import Planner
    monkeypatch.setenv("SHARDGYM_CACHE_DIR", str(tmp_path / "cache"))
    common = ["--no-workloads", "--random-problems", "2", "--random-nodes", "8,12", "--lr", "0.01", "--rounds", "3",
              "--hidden", "8", "--dagger-every", "1",
              "--dagger-problems", "2", "--dagger-cuts", "0.5", "--batch-entries", "1024", "--ilp-seconds", "5",
              "--no-progress", "--seed", "3", "--val-every", "2"]   # one problem trains, one validates
    a, c = str(tmp_path / "a"), str(tmp_path / "c")
    assert main(common + ["--epochs", "2", "--out", a]) == 0
    real = fgnn_train.Trainer.step
    calls = []

    def step_then_term(self, batch):
        out = real(self, batch)
        calls.append(1)
        if len(calls) == 2:    # epoch 1's first of two steps (its DAgger problem is the second)
            os.kill(os.getpid(), signal.SIGTERM)    # handled between steps: the step has finished
        return out
    monkeypatch.setattr(fgnn_train.Trainer, "step", step_then_term)
    assert main(common + ["--epochs", "2", "--out", c]) == 0
    with open(f"{c}/state.json") as f:
        st = json.load(f)
    assert st["phase"] == "interrupted" and st["epoch"] == 1 and len(calls) == 2
    assert load_checkpoint(f"{c}/fgnn.msgpack")["extra"]["step"] == 1
    monkeypatch.setattr(fgnn_train.Trainer, "step", real)
    assert main(["--resume", c, "--epochs", "2"]) == 0
    assert weights_digest(f"{a}/fgnn.msgpack") == weights_digest(f"{c}/fgnn.msgpack")
    # best.msgpack is the lowest validation score seen, step 0 (the untrained network) counted,
    # and re-scores to it
    d = a
    with open(f"{d}/state.json") as f:
        st = json.load(f)
    best = st["best"]
    assert best["n"] == 1 and best["score"] <= st["step0_validation"]["score"]
    assert all(h["val_score"] >= best["score"] for h in st["history"])
    pl = Planner.load(f"{d}/best.msgpack")
    s0 = next(s for s in fgnn_train._labelled(fgnn_train.build_parser().parse_args(common), 0.0, print,
                                               only=st["labelled"])[0] if is_validation(s.name, 2))
    assert Validator([(s0.name, s0.orig, s0.label_cost)], True).score(pl.net)["score"] == pytest.approx(best["score"])
    p = random_problem(np.random.default_rng(9), 6, kmax=3, edge_p=0.5, limit_q=0.5)
    x = pl.plan(p, polish=False)
    assert evaluate(p, x).feasible


def test_warm_hint_starts_at_lagrangian_bp_and_zero_corrections_stay_plain_bp():
    """A ``base="plain"`` network (every checkpoint before session 7) with the warm hint (Lagrangian
    BP's plan) plans what Lagrangian BP plans; with zero corrections it is plain BP, hint ignored."""
    wn = FGNN(FGConfig(rounds=ROUNDS, hidden=8, warm=True, base="plain"))
    z = FGNN.zero_corrections(wn.params)
    for seed in range(3):
        p = random_problem(np.random.default_rng(400 + seed), 10, kmax=4, edge_p=0.5, limit_q=0.4)
        assert wn.plan(p) == bp.bp_plan(p, memory_prices=True)
        assert wn.plan(p, params=z) == bp.bp_solve(p, rounds=ROUNDS, memory_prices=False, bound=False).plan


@pytest.mark.parametrize("tune", ["readout", "all"])
def test_finetune_improves_the_raw_decode(tmp_path, monkeypatch, tune):
    """Fine-tuning (the readout with its table, or every parameter with DAgger's ILP completions) on
    one problem whose zero-shot raw plan is 2.5% over the optimum lowers the raw plan's cost, never
    below the brute-force optimum; an old checkpoint's parameters (no warm entries) load. Uncapped: the
    label is the in-process ILP (a capped one starts solve_guarded's child, seconds of start-up)."""
    from agent.fgnn_planner import FGPlanner
    monkeypatch.setenv("SHARDGYM_CACHE_DIR", str(tmp_path / "cache"))
    p = random_problem(np.random.default_rng(504), 12, kmax=4, edge_p=0.8, limit_q=None)
    _, bc = brute_force(p)
    net = FGNN(FGConfig(rounds=3, hidden=8))   # the loss test's shapes: the step compiles once
    old = {k: v for k, v in net.params.items() if k not in ("warm", "wgate")}
    pl = FGPlanner.from_state({"config": net.config.to_dict(), "params": old, "update": 0}, "test")
    before = evaluate(p, pl.plan(p, polish=False))
    assert before.total > 1.02 * bc.total
    stats = pl.finetune(p, 600.0, seed=0, max_blocks=4, tune=tune)   # blocks, not seconds: the same under load
    after = evaluate(p, pl.plan(p, polish=False))
    assert after.feasible and bc.total * (1 - 1e-9) <= after.total < before.total
    assert stats[-1]["best_raw_cost"] == pytest.approx(after.total)


def test_finetune_under_a_cap_reaches_the_optimum_for_its_problem_alone(tmp_path, monkeypatch):
    """Under a binding cap, where the zero-shot raw plan (Lagrangian BP, 3 rounds) is 12% over the
    brute-force optimum: fine-tuning the readout (its per-problem table, teacher-forced on the decode's
    scores along the ILP label) makes the planner's raw decode (one forward pass + the masked decodes)
    the optimum; the table is that problem's alone: another problem plans as zero-shot."""
    from agent.fgnn_planner import FGPlanner
    monkeypatch.setenv("SHARDGYM_CACHE_DIR", str(tmp_path / "cache"))
    p = random_problem(np.random.default_rng(522), 10, kmax=3, edge_p=0.6, limit_q=0.3)
    other = random_problem(np.random.default_rng(500), 10, kmax=3, edge_p=0.6, limit_q=0.3)
    _, bc = brute_force(p)
    net = FGNN(FGConfig(rounds=3, hidden=8))
    pl = FGPlanner(net.params, net.config.to_dict(), source="test")
    before, other_before = evaluate(p, pl.plan(p, polish=False)), pl.plan(other, polish=False)
    assert before.feasible and before.total > 1.1 * bc.total
    stats = pl.finetune(p, 600.0, seed=0, max_blocks=4)   # blocks, not seconds: the same under load
    after = evaluate(p, pl.plan(p, polish=False))
    assert after.feasible and after.total == pytest.approx(bc.total, rel=1e-9) and after.total < before.total
    assert stats[-1]["best_raw_cost"] == pytest.approx(after.total)
    assert pl.plan(other, polish=False) == other_before
    assert TABLE not in pl.params and len(pl.tables) == 1    # the shared parameters carry no table


def test_same_class_tells_edges_apart_under_large_usages():
    """Two strategies of equal cost and usage (1 GB) whose edge rows differ (1 ms apart) are not one
    class: before session 24 one summed signature let the usage swamp the edge costs."""
    from agent.fgnn_data import same_class
    from costmodel.problem import Problem
    p = Problem.from_lists("t", [np.array([1.0, 1.0]), np.array([0.0, 0.0, 0.0])],
                           [np.array([1e9, 1e9]), np.array([0.0, 0.0, 0.0])], np.array([[0, 1], [1, 2]]),
                           [(0, 1)], [np.array([0.0, 1e-3, 0.0, 1e-3, 0.0, 1e-3])])
    assert same_class(p, [0, 0]).tolist() == [True, False, True, False, True]


def _with_last_layer(params, key: str, rng) -> dict:
    """``params`` with MLP ``key``'s output layer (zero at initialisation) set to small random values."""
    import jax
    mlp = dict(params[key])
    last = max(mlp, key=lambda k: int(k.rsplit("_", 1)[-1]))
    mlp[last] = jax.tree.map(lambda a: np.asarray(rng.normal(0.0, 0.3, np.shape(a)), np.float32), mlp[last])
    return {**params, key: mlp}


@pytest.mark.parametrize("seed", range(3))
def test_skipped_corrections_change_nothing(net, monkeypatch, seed):
    """The planning forward skips the corrections ``live_parts`` finds exactly zero (5x faster
    untrained); forcing every part on gives bit-identical scores and messages and the same plan,
    for the untrained network and for ones with some learned parts switched on."""
    import agent.fgnn as fgnn
    rng = np.random.default_rng(900 + seed)
    p = random_problem(rng, 12, kmax=4, edge_p=0.4, limit_q=(None, 0.35, 0.35)[seed])
    some = _with_last_layer(_with_last_layer(net.params, "price", rng), "read", rng)
    some["soft"] = np.full(ROUNDS, 0.3, np.float32)
    cases = [(net.params, set()), (FGNN.zero_corrections(some), set()), (some, {"price", "read", "soft"}),
             (_with_last_layer(some, "msg", rng), set(fgnn.PARTS))]
    inp = FGInputs.of(p)
    for params, live in cases:
        assert fgnn.live_parts(params) == live
        fast_out, fast_plan = net.forward(inp, params), net.plan(p, params=params)
        with monkeypatch.context() as m:
            m.setattr(fgnn, "live_parts", lambda params: fgnn.PARTS)
            slow_out, slow_plan = net.forward(inp, params), net.plan(p, params=params)
        assert all(np.array_equal(a, b) for a, b in zip(fast_out, slow_out)) and fast_plan == slow_plan
